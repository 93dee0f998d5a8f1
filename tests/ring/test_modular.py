"""modular: elementwise residue arithmetic against Python ints, per-row moduli included."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ring import PRIMES, add_mod, inv_mod, mul_mod, neg_mod, reduce_mod, sub_mod
from caramel.ring.modular import mul_shoup_lazy, shoup

OPS = {
    "add": (add_mod, lambda a, b, q: (a + b) % q),
    "sub": (sub_mod, lambda a, b, q: (a - b) % q),
    "mul": (mul_mod, lambda a, b, q: a * b % q),
}


@pytest.mark.parametrize("op", list(OPS), ids=lambda o: f"modular/{o}/limbs=3")
def test_binary_ops_per_row(op, rng, expect_equal, residues):
    primes = [PRIMES[0], PRIMES[31], PRIMES[63]]
    a, b = residues(rng, primes, 100), residues(rng, primes, 100)
    a[:, 0], b[:, 0] = 0, [q - 1 for q in primes]
    a[:, 1], b[:, 1] = [q - 1 for q in primes], [q - 1 for q in primes]
    fn, model = OPS[op]
    q = np.array(primes, dtype=np.uint64)[:, None]
    want = np.array([[model(int(x), int(y), p) for x, y in zip(a[r], b[r])] for r, p in enumerate(primes)])
    have = fn(a, b, q)
    assert have.dtype == np.uint32
    expect_equal(have, want.astype(np.uint32), op)


def test_neg_reduce_inv(rng, expect_equal):
    q = PRIMES[5]
    a = rng.integers(0, q, 50, dtype=np.uint64)
    a[0] = 0
    expect_equal(neg_mod(a, q), np.array([(-int(v)) % q for v in a], dtype=np.uint32), "neg")
    big = rng.integers(0, 1 << 63, 50, dtype=np.uint64)
    expect_equal(reduce_mod(big, q), np.array([int(v) % q for v in big], dtype=np.uint32), "reduce")
    assert inv_mod(3, q) * 3 % q == 1
    with pytest.raises(ValueError, match="no inverse"):
        inv_mod(q, q)


def test_shoup_product(rng, expect_equal):
    q = (1 << 30) - 35  # any modulus below 2^30
    w = rng.integers(0, q, 100, dtype=np.uint64)
    a = rng.integers(0, 1 << 32, 100, dtype=np.uint64)
    have = mul_shoup_lazy(a, w, shoup(w, q), q)
    assert np.all(have < 2 * q), "lazy product must lie in [0, 2q)"
    expect_equal(have % np.uint64(q), np.array([int(x) * int(y) % q for x, y in zip(a, w)], dtype=np.uint64), "shoup")
