"""The compiled host NTT (caramel.ring.ntt_jit, Numba) gives the same bits as the NumPy kernels.

Skipped without Numba (the ``fast`` extra; the ``test`` extra includes it, so CI runs both paths).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from caramel.ckks.keys import Secrets
from caramel.ckks.keyset import generate_keyset
from caramel.ring import PRIMES, Context, NttTable, intt, ntt
from caramel.ring import ntt_jit

ntt_mod = importlib.import_module("caramel.ring.ntt")  # the module (caramel.ring.ntt is also the function)

pytest.importorskip("numba")


def _numpy_only(monkeypatch):
    monkeypatch.setenv(ntt_jit.ENV, "0")


@pytest.mark.parametrize("n", [2, 4, 8, 16, 64, 1024, 8192])
def test_jit_equals_numpy_on_random_rows(monkeypatch, n):
    tables = [NttTable(q, n) for q in PRIMES[:5]] + [NttTable(PRIMES[-1], n)]
    rng = np.random.default_rng(n)
    a = np.stack([rng.integers(0, t.q, n) for t in tables]).astype(np.uint32)
    a[0, :] = [t.q - 1 for t in tables[:1]] * n  # the largest residues
    a[1, :] = 0
    monkeypatch.delenv(ntt_jit.ENV, raising=False)
    assert ntt_jit.enabled()
    fwd_jit, inv_jit = ntt(a, tables), intt(a, tables)
    one_jit = ntt(a[2:4], tables[2])
    _numpy_only(monkeypatch)
    assert not ntt_jit.enabled()
    assert np.array_equal(fwd_jit, ntt(a, tables))
    assert np.array_equal(inv_jit, intt(a, tables))
    assert np.array_equal(one_jit, ntt(a[2:4], tables[2]))
    assert np.array_equal(intt(fwd_jit, tables), a)


def test_jit_matches_definition():
    """A[j] = sum_i a_i psi^((2 br(j) + 1) i) mod q, evaluated directly at N = 16."""
    n, q = 16, PRIMES[0]
    t = NttTable(q, n)
    a = np.random.default_rng(3).integers(0, q, n).astype(np.uint32)
    br = ntt_mod.bit_reverse(n)
    want = [sum(int(a[i]) * pow(t.psi, (2 * int(br[j]) + 1) * i, q) for i in range(n)) % q for j in range(n)]
    assert ntt_jit.enabled()
    assert ntt(a, t).tolist() == want


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


@pytest.fixture
def small_program():
    import caramel
    from pathlib import Path

    return caramel.load_program(Path(__file__).resolve().parents[2] / "programs" / "MulRotate_4L_1c")


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
