"""Pinned, chunked host <-> device copies (caramel.backends.cuda.transfer) equal CuPy's own copies."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
from caramel.backends.cuda import available  # noqa: E402

pytestmark = pytest.mark.skipif(not available(), reason="needs a CUDA GPU")


@pytest.fixture
def small_stage(monkeypatch):
    from caramel.backends.cuda import transfer

    monkeypatch.setattr(transfer, "STAGE_BYTES", 4096)  # many chunks, odd tails
    monkeypatch.setattr(transfer, "SMALL_BYTES", 64)  # through the pinned buffers from 64 bytes on
    monkeypatch.setattr(transfer, "PARALLEL_COPY_BYTES", 1024)  # host copies split over threads
    monkeypatch.setattr(transfer, "_local", type(transfer._local)())  # fresh buffers of that size
    return transfer


@pytest.mark.parametrize("shape", [(7, 1000), (3, 64), (1, 5)])
def test_download_equals_get(small_stage, shape):
    a = cp.asarray(np.random.default_rng(1).integers(0, 2**32, shape, dtype=np.uint32))
    got = small_stage.download(a)
    assert got.shape == shape and got.dtype == np.uint32 and np.array_equal(got, a.get())
    b = a[:, ::2]  # not contiguous
    assert np.array_equal(small_stage.download(b), b.get())


def test_upload_rows_equals_fancy_assignment(small_stage):
    rng = np.random.default_rng(2)
    arena = cp.asarray(rng.integers(0, 2**32, (50, 256), dtype=np.uint32))
    want = arena.copy()
    rows = rng.permutation(50)[:37]
    data = rng.integers(0, 2**32, (37, 256), dtype=np.uint32)
    want[cp.asarray(rows)] = cp.asarray(data)
    small_stage.upload_rows(arena, rows, data)
    cp.cuda.get_current_stream().synchronize()
    assert np.array_equal(arena.get(), want.get())
    with pytest.raises(ValueError):
        small_stage.upload_rows(arena, rows, data[:30])


def test_upload_rows_from_a_list_of_rows(small_stage):
    rng = np.random.default_rng(3)
    arena = cp.asarray(rng.integers(0, 2**32, (50, 256), dtype=np.uint32))
    want = arena.copy()
    rows = rng.permutation(50)[:37]
    data = rng.integers(0, 2**31, (37, 256), dtype=np.int64)
    want[cp.asarray(rows)] = cp.asarray(data.astype(np.uint32))
    small_stage.upload_rows(arena, rows, [r for r in data])  # int64 rows, converted as astype does
    cp.cuda.get_current_stream().synchronize()
    assert np.array_equal(arena.get(), want.get())
    with pytest.raises(ValueError, match="row 4"):
        small_stage.upload_rows(arena, rows, [r if i != 4 else r[:10] for i, r in enumerate(data)])
    with pytest.raises(ValueError):
        small_stage.upload_rows(arena, rows, [r for r in data[:30]])


def test_row_maxima_equal_the_host_maxima():
    from caramel.backends.cuda.transfer import row_maxima

    rng = np.random.default_rng(4)
    for n in (300, 65536):  # a row shorter than a block, and one that blocks stride over
        host = rng.integers(0, 2**31, (40, n), dtype=np.uint32)
        host[3, n - 1] = 2**32 - 1
        host[5] = 0
        rows = np.concatenate([[3, 5], rng.permutation(40)[:25]])
        assert np.array_equal(row_maxima(cp.asarray(host), rows), host[rows].max(axis=1))
    assert row_maxima(cp.asarray(host), []).shape == (0,)


def test_upload_rows_with_several_fill_threads(small_stage, monkeypatch):
    monkeypatch.setattr(small_stage, "FILL_THREADS", 3)
    rng = np.random.default_rng(5)
    arena = cp.zeros((60, 256), dtype=np.uint32)
    rows = rng.permutation(60)[:41]
    data = rng.integers(0, 2**32, (41, 256), dtype=np.uint32)
    small_stage.upload_rows(arena, rows, list(data))
    small_stage.upload_rows(arena[:, :], rows[::-1], data[::-1].copy())  # the array path too
    cp.cuda.get_current_stream().synchronize()
    assert np.array_equal(arena.get()[rows], data)


def test_upload_rows_takes_rows_already_on_the_device(small_stage, monkeypatch):
    monkeypatch.setattr(small_stage, "DEVICE_ROWS_PER_COPY", 3)  # several gathers
    rng = np.random.default_rng(6)
    arena = cp.zeros((40, 256), dtype=cp.uint32)
    rows = rng.permutation(40)[:23]
    host = rng.integers(0, 2**32, (23, 256), dtype=np.uint32)
    data = [cp.asarray(r) if i % 3 else r for i, r in enumerate(host)]  # mixed device and host rows
    small_stage.upload_rows(arena, rows, data)
    cp.cuda.Device().synchronize()
    want = np.zeros((40, 256), dtype=np.uint32)
    want[rows] = host
    assert np.array_equal(arena.get(), want)
    with pytest.raises(ValueError, match="shape"):
        small_stage.upload_rows(arena, rows[:1], [cp.zeros(7, dtype=cp.uint32)])


@pytest.mark.parametrize("kind", ["views", "strided", "int64"])
def test_device_rows_gathered_or_stacked_equal_the_host(small_stage, monkeypatch, kind):
    """Rows of two device arrays in any order: views (contiguous uint32: one gather kernel reading each
    row at its address), strided views or another dtype (CuPy's stack and cast, several gathers)."""
    monkeypatch.setattr(small_stage, "DEVICE_ROWS_PER_COPY", 4)
    rng = np.random.default_rng(7)
    n = 300
    host = [rng.integers(0, 2**31, (k, n), dtype=np.uint32) for k in (9, 14)]
    if kind == "views":
        dev = [cp.asarray(h) for h in host]
    elif kind == "strided":
        dev = [cp.asarray(np.stack([h, h + 1], axis=-1))[..., 0] for h in host]
    else:
        dev = [cp.asarray(h.astype(np.int64)) for h in host]
    pairs = [(a, r) for a in range(2) for r in range(len(host[a]))]
    order = rng.permutation(len(pairs))
    rows = rng.permutation(40)[: len(pairs)]
    arena = cp.zeros((40, n), dtype=cp.uint32)
    small_stage.upload_rows(arena, rows, [dev[pairs[i][0]][pairs[i][1]] for i in order])
    cp.cuda.Device().synchronize()
    want = np.zeros((40, n), dtype=np.uint32)
    want[rows] = np.stack([host[pairs[i][0]][pairs[i][1]] for i in order])
    assert np.array_equal(arena.get(), want)
    got = small_stage._row_pointers(arena, [dev[0][0], dev[1][3]], [0, 1])
    assert (got is not None) == (kind == "views")


def test_pinned_scratch_is_reused_and_upload_pinned_equals_the_host():
    import cupy as cp

    from caramel.backends.cuda.transfer import pinned_scratch, upload_pinned

    a = pinned_scratch(1000)
    assert a.dtype == np.uint8 and a.shape == (1000,)
    b = pinned_scratch(500)
    assert b.ctypes.data == a.ctypes.data  # the thread's buffer, kept
    c = pinned_scratch(1 << 20)
    assert c.shape == (1 << 20,)
    rows = c[64:64 + 4 * 3 * 1000].view(np.uint32).reshape(3, 1000)
    rows[:] = np.random.default_rng(1).integers(0, 2**32, size=(3, 1000), dtype=np.uint32)
    got = upload_pinned(rows)
    assert isinstance(got, cp.ndarray) and np.array_equal(got.get(), rows)
    with pytest.raises(ValueError):
        upload_pinned(rows[:, ::2])


def test_backend_read_equals_the_arena_rows(small_stage):
    """CupyBackend.read (gathered, then copied down through the pinned buffers) = the arena's rows."""
    from caramel.backends.cuda.backend import CupyBackend
    from caramel.ring import Context

    backend = CupyBackend(Context(n=1024), 30)
    rng = np.random.default_rng(8)
    host = rng.integers(0, 2**32, (30, 1024), dtype=np.uint32)
    backend.arena[:] = cp.asarray(host)
    rows = rng.permutation(30)[:17]
    got = backend.read(rows)
    assert got.dtype == np.uint32 and np.array_equal(got, host[rows])
    assert backend.read(rows[:1]).shape == (1, 1024) and backend.read([]).shape == (0, 1024)
