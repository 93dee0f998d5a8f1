"""The compiled host kernels (caramel.ckks.arith.jit, Numba) give the same bits as the ring's NumPy NTT.

Skipped without Numba (the ``fast`` extra; the ``test`` extra includes it, so CI runs both paths).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from caramel.ckks.arith import HOST
from caramel.ckks.arith import jit as ntt_jit
from caramel.ckks.keyset import generate_keyset
from caramel.ring import PRIMES, Context, NttTable, intt, ntt

ntt_mod = importlib.import_module("caramel.ring.ntt")  # the module (caramel.ring.ntt is also the function)

pytest.importorskip("numba")


def _numpy_only(monkeypatch):
    monkeypatch.setenv(ntt_jit.ENV, "0")


def _jit(a, tables, inverse: bool = False) -> np.ndarray:
    """The compiled transform of every row of ``a``: row r modulo tables[r], or every row modulo
    one table."""
    out = np.empty(a.shape, dtype=np.uint32)
    kernel = ntt_jit.inverse_rows if inverse else ntt_jit.forward_rows
    if isinstance(tables, NttTable):
        kernel(a, out, tables)
    else:
        for r, t in enumerate(tables):
            kernel(a[r : r + 1], out[r : r + 1], t)
    return out


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 1024, 8192])
def test_jit_equals_numpy_on_random_rows(monkeypatch, n):
    tables = [NttTable(q, n) for q in PRIMES[:5]] + [NttTable(PRIMES[-1], n)]
    rng = np.random.default_rng(n)
    a = np.stack([rng.integers(0, t.q, n) for t in tables]).astype(np.uint32)
    a[0, :] = [t.q - 1 for t in tables[:1]] * n  # the largest residues
    a[1, :] = 0
    monkeypatch.delenv(ntt_jit.ENV, raising=False)
    assert ntt_jit.enabled()
    fwd_jit, inv_jit = _jit(a, tables), _jit(a, tables, inverse=True)
    one_jit = _jit(a[2:4], tables[2])
    assert np.array_equal(fwd_jit, ntt(a, tables))
    assert np.array_equal(inv_jit, intt(a, tables))
    assert np.array_equal(one_jit, ntt(a[2:4], tables[2]))
    assert np.array_equal(intt(fwd_jit, tables), a)


@pytest.mark.parametrize("n", [16, 1024])
def test_host_client_transforms_equal_the_ring(monkeypatch, n):
    """The host client's transforms on the compiled kernels and on NumPy equal the ring's NTT."""
    ctx = Context(n=n)
    limbs = [0, 7, 7, 63]
    rng = np.random.default_rng(n)
    a = np.stack([rng.integers(0, ctx.q(l), n) for l in limbs]).astype(np.uint32)
    monkeypatch.delenv(ntt_jit.ENV, raising=False)
    assert ntt_jit.enabled()
    fwd_jit, inv_jit = HOST.transform(a, ctx, limbs), HOST.transform(a, ctx, limbs, inverse=True)
    _numpy_only(monkeypatch)
    assert not ntt_jit.enabled()
    assert np.array_equal(fwd_jit, HOST.transform(a, ctx, limbs)) and np.array_equal(fwd_jit, ctx.ntt(a, limbs))
    assert np.array_equal(inv_jit, HOST.transform(a, ctx, limbs, inverse=True))
    assert np.array_equal(inv_jit, ctx.intt(a, limbs))


def test_jit_matches_definition():
    """A[j] = sum_i a_i psi^((2 br(j) + 1) i) mod q, evaluated directly at N = 16."""
    n, q = 16, PRIMES[0]
    t = NttTable(q, n)
    a = np.random.default_rng(3).integers(0, q, n).astype(np.uint32)
    br = ntt_mod.bit_reverse(n)
    want = [sum(int(a[i]) * pow(t.psi, (2 * int(br[j]) + 1) * i, q) for i in range(n)) % q for j in range(n)]
    assert ntt_jit.enabled()
    assert _jit(a[None], t)[0].tolist() == want


def test_keys_of_a_program_are_the_same_on_both_paths(monkeypatch, small_program):
    ctx = Context(n=1024)
    monkeypatch.delenv(ntt_jit.ENV, raising=False)
    fast = generate_keyset(small_program, ctx, 7)
    _numpy_only(monkeypatch)
    slow = generate_keyset(small_program, ctx, 7)
    assert np.array_equal(fast.secrets.s.coeffs, slow.secrets.s.coeffs)
    assert fast.keys.keys() == slow.keys.keys() and fast.keys
    for k, v in fast.keys.items():
        assert np.array_equal(v.c0, slow.keys[k].c0) and np.array_equal(v.c1, slow.keys[k].c1)


def test_encryptions_are_the_same_on_both_paths(monkeypatch):
    """The compiled c0 of an encryption (the error's NTT and the products in one kernel) equals NumPy's."""
    from caramel.ckks.encrypt import decrypt, encrypt
    from caramel.ckks.keys import Secrets

    ctx = Context(n=1024)
    sec = Secrets.generate(1024, 3)
    coeffs = np.random.default_rng(4).integers(-2**40, 2**40, 1024)
    monkeypatch.delenv(ntt_jit.ENV, raising=False)
    assert ntt_jit.enabled()
    fast = encrypt(ctx, sec.s, coeffs, (0, 2, 63), 5)
    _numpy_only(monkeypatch)
    slow = encrypt(ctx, sec.s, coeffs, (0, 2, 63), 5)
    assert np.array_equal(fast.c0, slow.c0) and np.array_equal(fast.c1, slow.c1)
    assert np.array_equal(decrypt(ctx, sec.s, fast), decrypt(ctx, sec.s, slow))


@pytest.fixture
def small_program():
    import caramel
    from pathlib import Path

    return caramel.load_program(Path(__file__).resolve().parents[3] / "programs" / "MulRotate_4L_1c")


def test_ready_compiles_in_the_background_for_large_rings_only(monkeypatch):
    """Small rings never start the compilation; the first large one starts it in a thread and is
    served by NumPy until the kernels are there."""
    monkeypatch.delenv(ntt_jit.ENV, raising=False)
    monkeypatch.setattr(ntt_jit, "_state", {})
    started = []
    monkeypatch.setattr(ntt_jit, "_compile", lambda: started.append(1) or ("kernels",))
    assert not ntt_jit.ready(1024) and "thread" not in ntt_jit._state
    assert not ntt_jit.ready(ntt_jit.MIN_N)
    ntt_jit._state["thread"].join(10)
    assert started == [1] and ntt_jit.ready(1024)
    monkeypatch.setenv(ntt_jit.ENV, "off")
    assert not ntt_jit.ready(ntt_jit.MIN_N)


@pytest.mark.parametrize("n", [16, 8192])
def test_encode_row_equals_residues_then_ntt(monkeypatch, n):
    """c mod q then the NTT, for every int64 (the extremes too) and the smallest and largest primes."""
    monkeypatch.delenv(ntt_jit.ENV, raising=False)
    assert ntt_jit.enabled()
    rng = np.random.default_rng(n)
    for q in (min(PRIMES), max(PRIMES), PRIMES[7]):
        table = NttTable(q, n)
        for bound in (5, 2**40, 2**62, 2**63 - 1):
            c = rng.integers(-bound, bound, n, dtype=np.int64, endpoint=True)
            c[:6] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0, q, -q]
            out = np.empty(n, dtype=np.uint32)
            ntt_jit.encode_row(c, table, out)
            assert np.array_equal(out, ntt(np.mod(c, q).astype(np.uint32)[None], [table])[0]), (q, bound)
