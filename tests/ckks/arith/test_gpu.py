"""The GPU client (caramel.ckks.arith.gpu) gives the host client's bits.

Without a GPU its code (formulas, draws replayed "on the device", the array NTT on device copies of
the tables) runs on NumPy posing as the array module: ``GpuArith(array_module=numpy, cuda_ntt=False)``.
The tests marked for a GPU run it on CuPy and caramel's CUDA NTT kernels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import caramel
from caramel.ckks import Secrets
from caramel.ckks import device as devmod
from caramel.ckks.arith import GpuArith, HOST
from caramel.ckks.encrypt import decrypt, encrypt
from caramel.ckks.keys import generate_evalkeys
from caramel.ckks.keyset import generate_keyset
from caramel.ckks.rns import to_ntt

from ckks_helpers import KEY_IDS, context, gpu

#: The GPU's code on NumPy; small chunks of rows for the array NTT, so that it runs several.
POSED = GpuArith(array_module=np, cuda_ntt=False, chunk_residues=2 * 256)


@pytest.mark.parametrize("n", [256, 2048])
def test_gpu_code_on_numpy_equals_the_host_client(n):
    """Keys, encryption, decryption and encoding, and the generator afterwards, on both."""
    ctx = context(n)
    sec = Secrets.generate(n, 5)
    rngs = np.random.default_rng(8), np.random.default_rng(8)
    host = generate_evalkeys(ctx, KEY_IDS, sec, rngs[0], device=HOST)
    posed = generate_evalkeys(ctx, KEY_IDS, sec, rngs[1], device=POSED)
    for k in KEY_IDS:
        assert np.array_equal(host[k].c0, posed[k].c0) and np.array_equal(host[k].c1, posed[k].c1)
    assert rngs[0].bit_generator.state == rngs[1].bit_generator.state
    coeffs = np.random.default_rng(1).integers(-2**40, 2**40, n)
    limbs = (0, 1, 2, 5, 63)
    a = encrypt(ctx, sec.s, coeffs, limbs, 3, device=HOST)
    b = encrypt(ctx, sec.s, coeffs, limbs, 3, device=POSED)
    assert np.array_equal(a.c0, b.c0) and np.array_equal(a.c1, b.c1)
    assert np.array_equal(decrypt(ctx, sec.s, a, device=HOST), decrypt(ctx, sec.s, a, device=POSED))
    big = coeffs.astype(object) << 80
    for c in (coeffs, big):
        assert np.array_equal(to_ntt(c, ctx, limbs), POSED.to_ntt_rows(c, ctx, limbs))


def test_gpu_transform_equals_the_ring_and_copies_tables_once():
    ctx = context(256)
    limbs = [3, 3, 0, 9, 63]
    rng = np.random.default_rng(2)
    a = np.stack([rng.integers(0, ctx.q(l), 256) for l in limbs]).astype(np.uint32)
    assert np.array_equal(POSED.transform(a, ctx, limbs), ctx.ntt(a, limbs))
    assert np.array_equal(POSED.transform(a, ctx, limbs, inverse=True), ctx.intt(a, limbs))
    table = ctx.ntt_table(3)
    w, wp = POSED._twiddles(table, True)
    assert POSED._twiddles(table, True)[0] is w and w.dtype == np.uint64
    assert np.array_equal(w, table.kernel_tables(True)[0]) and np.array_equal(wp, table.kernel_tables(True)[1])


def test_gpu_client_without_cupy_is_a_caramel_error(monkeypatch):
    """No CuPy: the GPU client's first use says so (a CaramelError, no traceback in the CLI)."""
    import sys

    from caramel.errors import CaramelError

    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(CaramelError, match="needs CuPy"):
        GpuArith().xp  # noqa: B018


@pytest.mark.skipif(not gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_client_equals_cpu_client():
    program = caramel.load_program(Path(__file__).resolve().parents[3] / "programs" / "Mul_4L_2c")
    ctx = context(1024)
    cpu = generate_keyset(program, ctx, 7, device="cpu")
    on_gpu = generate_keyset(program, ctx, 7, device="gpu")
    for k, key in cpu.keys.items():
        assert np.array_equal(key.c0, on_gpu.keys[k].c0) and np.array_equal(key.c1, on_gpu.keys[k].c1)
    sec = cpu.secrets
    coeffs = np.arange(1024) - 512
    a = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3, device="cpu")
    b = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3, device="gpu")
    assert np.array_equal(a.c0, b.c0) and np.array_equal(a.c1, b.c1)
    assert np.array_equal(decrypt(ctx, sec.s, a, device="cpu"), decrypt(ctx, sec.s, a, device="gpu"))
    c1 = caramel.run_program(program, ctx=ctx, backend="cpu", seed=2, client="cpu")
    c2 = caramel.run_program(program, ctx=ctx, backend="cpu", seed=2, client="gpu")
    assert c1.digest == c2.digest


@pytest.mark.skipif(not gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("n", [4096, 65536])  # caramel's CUDA NTT kernels: one kernel, then two passes
def test_gpu_client_on_cuda_kernels_equals_cpu_client(n):
    """Keys (copied back at once, or in the background), secrets' rows, encryption and decryption."""
    ctx = context(n)
    sec = Secrets.generate(n, 5)
    cpu = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="cpu")
    on_gpu = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="gpu")
    later = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="gpu", background=True)
    kept = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="gpu", on_device=True)
    for k in KEY_IDS:
        for got in (on_gpu[k], later[k]):
            assert np.array_equal(cpu[k].c0, got.c0) and np.array_equal(cpu[k].c1, got.c1)
        assert np.array_equal(cpu[k].c0, kept[k].c0.get()) and np.array_equal(cpu[k].c1, kept[k].c1.get())
    coeffs = np.random.default_rng(1).integers(-2**20, 2**20, n)
    limbs = tuple(range(6))
    a = encrypt(ctx, sec.s, coeffs, limbs, 3, device="cpu")
    b = encrypt(ctx, sec.s, coeffs, limbs, 3, device="gpu")
    assert np.array_equal(a.c0, b.c0) and np.array_equal(a.c1, b.c1)
    assert np.array_equal(decrypt(ctx, sec.s, a, device="cpu"), decrypt(ctx, sec.s, a, device="gpu"))
    assert np.array_equal(to_ntt(coeffs, ctx, limbs), devmod.GPU.get(devmod.GPU.to_ntt_rows(coeffs, ctx, limbs)))


def _plaintexts(n: int):
    """Three plaintexts' int64 coefficients (the int64 extremes among them) and their limb groups."""
    coeffs = np.random.default_rng(n).integers(-2**61, 2**61, (3, n))
    coeffs[1, :2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    return coeffs, [(0, 1, 2), (5,), (63, 3, 0, 9)]


def test_gpu_plaintext_rows_on_numpy_equal_the_host_client():
    ctx = context(256)
    coeffs, groups = _plaintexts(256)
    want = HOST.plaintext_rows(coeffs, ctx, groups)
    assert np.array_equal(POSED.plaintext_rows(coeffs, ctx, groups), want)
    assert np.array_equal(POSED.to_ntt_rows(coeffs[2], ctx, groups[2]), want[4:])


@pytest.mark.skipif(not gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("n", [4096, 65536])
def test_gpu_plaintext_rows_on_cuda_kernels_equal_the_host_client(n):
    """One residue launch and one NTT for every row of several plaintexts; one plaintext the same way."""
    ctx = context(n)
    coeffs, groups = _plaintexts(n)
    want = HOST.plaintext_rows(coeffs, ctx, groups)
    gpu_arith = devmod.GPU
    assert np.array_equal(gpu_arith.get(gpu_arith.plaintext_rows(coeffs, ctx, groups)), want)
    assert np.array_equal(gpu_arith.get(gpu_arith.to_ntt_rows(coeffs[2], ctx, groups[2])), want[4:])
    assert gpu_arith.plaintext_rows(coeffs[:0], ctx, []).shape == (0, n)


def _encode_parts(n: int):
    """Five rows of slot parts and their scales: 2^56 near the int64 limit, 2^80 a row of Python ints."""
    parts = np.random.default_rng(n).uniform(-1, 1, (5, n))
    return parts, [2.0**40, 2.0**30, 2.0**56, 2.0**80, 1.0]


def _same_rows(got, want) -> bool:
    got = [g if isinstance(g, np.ndarray) else g.get() for g in got]
    return len(got) == len(want) and all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want))


def test_gpu_encode_rows_on_numpy_equal_the_host_client():
    n = 256
    parts, scales = _encode_parts(n)
    want = HOST.encode_rows(parts, scales, n, np.empty((5, n), np.int64))
    assert [w.dtype for w in want] == [np.int64] * 3 + [object, np.int64]
    assert _same_rows(POSED.encode_rows(parts, scales, n, np.empty((5, n), np.int64)), want)


@pytest.mark.skipif(not gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("n", [16, 4096, 65536])
def test_gpu_encode_rows_on_cupy_equal_the_host_client(n):
    """The transform as CuPy array operations gives the host's bits: the float64 transform itself, and the
    rounded coefficients (a row of Python ints included)."""
    import cupy as cp
    from caramel.ckks.encoding import encode_tables, fft_rows

    parts, scales = _encode_parts(n)
    want = HOST.encode_rows(parts, scales, n, np.empty((5, n), np.int64))
    assert _same_rows(devmod.GPU.encode_rows(parts, scales, n, cp.empty((5, n), np.int64)), want)
    m, tables = n // 2, encode_tables(n)
    host = fft_rows(parts[:, :m].copy(), parts[:, m:].copy(), tables)
    dev = fft_rows(cp.asarray(parts[:, :m]), cp.asarray(parts[:, m:]), tables.on(cp.asarray), cp)
    assert all(np.array_equal(h.view(np.uint64), d.get().view(np.uint64)) for h, d in zip(host, dev))
