"""Secret-key encryption, decryption, plaintexts and scalars."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks import (
    Ciphertext,
    Secrets,
    decrypt,
    decrypt_values,
    encode,
    encode_plaintext,
    encode_scalar,
    encrypt,
    encrypt_values,
    sparse,
)
from caramel.ckks.rns import mulmod, prime_column

from ckks_helpers import context

CASES = [(64, 1), (64, 2), (256, 3), (1024, 4), (4096, 1), (4096, 10), (4096, 24)]


def _values(rng, n):
    return rng.uniform(-1, 1, n // 2) + 1j * rng.uniform(-1, 1, n // 2)


@pytest.mark.parametrize("n,k", CASES, ids=[f"encrypt/N={n},L={k}" for n, k in CASES])
def test_round_trip(n, k, rng):
    ctx = context(n)
    sec = Secrets.generate(n, rng)
    z = _values(rng, n)
    ct = encrypt_values(ctx, sec.s, z, 2.0**28, range(k), rng)
    assert ct.c0.shape == ct.c1.shape == (k, n) and ct.c0.dtype == np.uint32
    assert ct.limbs == tuple(range(k)) and ct.scale == 2.0**28
    assert np.max(np.abs(decrypt_values(ctx, sec.s, ct) - z)) < 2**-14
    # the wrong key gives garbage
    other = Secrets.generate(n, rng)
    assert np.max(np.abs(decrypt_values(ctx, other.s, ct) - z)) > 1


def test_exact_error_is_small(rng):
    ctx = context(4096)
    sec = Secrets.generate(4096, rng)
    coeffs = rng.integers(-(2**40), 2**40, 4096)
    ct = encrypt(ctx, sec.s, coeffs, [0, 1, 5], rng)
    err = decrypt(ctx, sec.s, ct) - coeffs
    assert max(abs(int(e)) for e in err) <= 21  # CBD(21)


def test_big_scale_and_non_contiguous_limbs(rng):
    ctx = context(4096)
    sec = Secrets.generate(4096, rng)
    z = _values(rng, 4096)
    ct = encrypt_values(ctx, sec.s, z, 2.0**56, [0, 1, 2, 7, 63], rng)
    assert np.max(np.abs(decrypt_values(ctx, sec.s, ct) - z)) < 2**-40
    assert np.array_equal(ct.restrict([0, 7]).c1, ct.c1[[0, 3]])


def test_homomorphic_add_and_plain_mul(rng):
    n, limbs = 4096, (0, 1, 2, 3)
    ctx = context(n)
    sec = Secrets.generate(n, rng)
    x, y, w = _values(rng, n), _values(rng, n), _values(rng, n)
    cx = encrypt_values(ctx, sec.s, x, 2.0**28, limbs, rng)
    cy = encrypt_values(ctx, sec.s, y, 2.0**28, limbs, rng)
    q = prime_column(ctx, limbs)
    s = Ciphertext(((cx.c0.astype(np.uint64) + cy.c0) % q).astype(np.uint32), ((cx.c1.astype(np.uint64) + cy.c1) % q).astype(np.uint32), limbs)
    assert np.max(np.abs(decrypt_values(ctx, sec.s, s, 2.0**28) - (x + y))) < 2**-14
    pw = encode_plaintext(ctx, w, 2.0**28, limbs)
    assert pw.data.shape == (4, n) and np.array_equal(pw.limb(2), pw.data[2])
    prod = Ciphertext(mulmod(cx.c0, pw.data, q).astype(np.uint32), mulmod(cx.c1, pw.data, q).astype(np.uint32), limbs)
    assert np.max(np.abs(decrypt_values(ctx, sec.s, prod, 2.0**56) - x * w)) < 2**-14


def test_scalar_adds_a_constant_to_every_slot(rng):
    n, limbs = 1024, (0, 1, 3)
    ctx = context(n)
    sec = Secrets.generate(n, rng)
    x = _values(rng, n)
    cx = encrypt_values(ctx, sec.s, x, 2.0**28, limbs, rng)
    sc = encode_scalar(ctx, -0.375, 2.0**28, limbs)
    assert sc.value == round(-0.375 * 2**28)
    assert sc.limb(3).shape == () and int(sc.limb(3)) == sc.value % ctx.q(3)
    q = prime_column(ctx, limbs)
    c0 = ((cx.c0.astype(np.uint64) + sc.residues.astype(np.uint64)[:, None]) % q).astype(np.uint32)
    out = decrypt_values(ctx, sec.s, Ciphertext(c0, cx.c1, limbs), 2.0**28)
    assert np.max(np.abs(out - (x - 0.375))) < 2**-14
    with pytest.raises(ValueError, match="a scalar input must be real"):
        encode_scalar(ctx, 1 + 1j, 2.0**28, limbs)
    # exact at big scales
    assert encode_scalar(ctx, 0.1, 2**80, limbs).value == round(__import__("fractions").Fraction(0.1) * 2**80)


def test_decrypt_modulo_smaller_modulus(rng):
    """A message Delta*m + Q3*I decrypts to Delta*m after centring modulo Q3 (ISA.md 5.5)."""
    n = 1024
    ctx = context(n)
    sec = Secrets.generate(n, rng)
    z = _values(rng, n)
    q3 = ctx.q(0) * ctx.q(1) * ctx.q(2)
    coeffs = encode(z, 2.0**28, n).astype(object) + q3 * rng.integers(-16, 17, n).astype(object)
    ct = encrypt(ctx, sec.s, coeffs, range(5), rng)
    assert np.max(np.abs(decrypt_values(ctx, sec.s, ct, 2.0**28) - z)) > 1
    assert np.max(np.abs(decrypt_values(ctx, sec.s, ct, 2.0**28, modulus=q3) - z)) < 2**-14


def test_secret_distributions(rng):
    sec = Secrets.generate(1024, rng, dist=sparse(64))
    assert np.count_nonzero(sec.s.coeffs) == 64
    assert np.count_nonzero(sec.s_eph.coeffs) == 32
    assert set(np.unique(sec.s.coeffs)) <= {-1, 0, 1}
    assert sec.describe() == {"s": "sparse-ternary(h=64)", "s_eph": "sparse-ternary(h=32)"}
    dense = Secrets.generate(4096, rng)
    assert str(dense.s.dist) == "dense-ternary"
    assert 0.25 < np.mean(dense.s.coeffs == 0) < 0.42


def test_ciphertext_shape_checks():
    with pytest.raises(ValueError, match=r"c0 \(2, 16\) and c1 \(3, 16\) must both be \(2, N\)"):
        Ciphertext(np.zeros((2, 16), np.uint32), np.zeros((3, 16), np.uint32), (0, 1))
    ct = Ciphertext(np.zeros((2, 16), np.uint32), np.ones((2, 16), np.uint32), (0, 4))
    assert ct.limb("c1", 4)[0] == 1
    with pytest.raises(KeyError, match="ciphertext has no limb 1"):
        ct.limb("c0", 1)
