"""Integers in and out of RNS form (caramel.ckks.rns), and its products on an array module."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks.rns import mulmod, prime_column, to_residues
from caramel.errors import ArgumentError

from ckks_helpers import context


def test_object_residues_equal_python_ints():
    """Residues of big (object) integers by words equal Python's % per limb, signs and zero included."""
    ctx = context(64)
    rng = np.random.default_rng(9)
    c = np.array([int(x) * (1 << 70) + int(y) - (1 << 100) for x, y in zip(rng.integers(0, 2**62, 64),
                                                                         rng.integers(0, 2**62, 64))], dtype=object)
    c[:4] = [0, -1, -(1 << 200), ctx.q(3)]
    limbs = [0, 3, 17, 63]
    want = np.stack([[int(v) % ctx.q(l) for v in c] for l in limbs]).astype(np.uint32)
    assert np.array_equal(to_residues(c, ctx, limbs), want)


def test_int64_residues_equal_python_ints_on_any_array_module():
    """The vectorised residues of int64 coefficients and the products (NumPy as ``xp``) equal Python's %."""
    ctx = context(64)
    c = np.random.default_rng(4).integers(-(2**62), 2**62, 64)
    c[:3] = [0, -1, -(2**62)]
    limbs = [0, 5, 63]
    want = np.stack([[int(v) % ctx.q(l) for v in c] for l in limbs]).astype(np.uint32)
    assert np.array_equal(to_residues(c, ctx, limbs, np), want)
    q = prime_column(ctx, limbs, np)
    assert q.dtype == np.uint64 and q.shape == (3, 1)
    prod = mulmod(want, want[::-1], q, np)
    assert prod.dtype == np.uint64
    assert prod.tolist() == [[int(x) * int(y) % ctx.q(l) for x, y in zip(want[r], want[2 - r])]
                             for r, l in enumerate(limbs)]


def test_residues_refuse_bad_coefficients():
    ctx = context(64)
    with pytest.raises(ArgumentError, match="expected 64 coefficients"):
        to_residues(np.zeros(63, dtype=np.int64), ctx, [0])
    with pytest.raises(ArgumentError, match="must be integers"):
        to_residues(np.zeros(64), ctx, [0])
