"""The host side of caramel.backends.cuda.transfer (no GPU needed): the split copy out of a pinned buffer."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.backends.cuda import transfer


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 4097, 1 << 16])
def test_split_copy_equals_assignment(monkeypatch, n):
    monkeypatch.setattr(transfer, "PARALLEL_COPY_BYTES", 1024)
    monkeypatch.setattr(transfer, "FILL_THREADS", 3)  # odd parts, on any machine
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)
    transfer._copy(dst, src)
    assert np.array_equal(dst, src)


@pytest.mark.parametrize("rows", [1, 2, 7])
@pytest.mark.parametrize("as_list", [False, True], ids=["array", "rows"])
def test_fill_copies_every_row_with_the_arena_type(monkeypatch, rows, as_list):
    """The staging fill: host[j] = data[r0 + j], split over the fill threads, values cast as astype."""
    monkeypatch.setattr(transfer, "FILL_THREADS", 3)
    data = np.random.default_rng(rows).integers(0, 1 << 31, (rows + 2, 64), dtype=np.int64)
    host = np.zeros((rows, 64), dtype=np.uint32)
    transfer._fill(host, list(data) if as_list else data, 2)
    assert np.array_equal(host, data[2:].astype(np.uint32))


def test_is_device_array_by_type_or_interface():
    """NumPy arrays and plain objects are host data; anything exporting ``__cuda_array_interface__``
    (CuPy's arrays are known by their type first) is a device array."""
    class Exported:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<u4", "data": (0, False), "version": 3}

    assert transfer.is_device_array(Exported())
    assert not transfer.is_device_array(np.zeros(3, dtype=np.uint32))
    assert not transfer.is_device_array([1, 2]) and not transfer.is_device_array(np.uint32(1))
