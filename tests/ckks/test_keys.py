"""Evaluation keys (ISA.md 5.3): c0 + c1*s_old = e + P*s_new on digit limbs, e on the others."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks import EvalKey, Secrets, apply_galois, extension_modulus, generate_evalkey
from caramel.ckks.rns import centre, mulmod, prime_column
from caramel.program import EvalKeyId, KeyType

from ckks_helpers import context

N = 1024


def _negacyclic_square(s: np.ndarray) -> np.ndarray:
    full = np.convolve(s, s)  # small ints, exact in int64
    out = full[: len(s)].copy()
    out[: len(s) - 1] -= full[len(s) :]
    return out


def _s_new(kid: EvalKeyId, ctx, sec: Secrets):
    """s_new as integer coefficients, computed independently of caramel.ckks.keys."""
    s, e = sec.s.coeffs, sec.s_eph.coeffs
    n = len(s)
    t = kid.type
    if t == KeyType.RELIN:
        return _negacyclic_square(s)
    if t == KeyType.ROTATION:
        return apply_galois(s, pow(5, kid.rot % (n // 2), 2 * n))
    if t == KeyType.CONJUGATION:
        return apply_galois(s, 2 * n - 1)
    if t == KeyType.EPHEMERAL:
        return s
    qtop = ctx.q(kid.level - 1)
    return (s if t == KeyType.BOOTSTRAP else e).astype(object) * qtop


KEYS = [
    EvalKeyId(KeyType.RELIN, 3, 2, 0, (0, 2)),
    EvalKeyId(KeyType.RELIN, 4, 4, 0, (0, 1, 2, 3)),
    EvalKeyId(KeyType.ROTATION, 3, 3, 5, (0, 1, 2)),
    EvalKeyId(KeyType.ROTATION, 3, 2, -2, (1,)),
    EvalKeyId(KeyType.ROTATION, 2, 1, 16384, (0, 1)),
    EvalKeyId(KeyType.CONJUGATION, 3, 2, 0, (0, 1, 2)),
    EvalKeyId(KeyType.EPHEMERAL, 3, 1, 0, (1,)),
    EvalKeyId(KeyType.BOOTSTRAP, 4, 2, 0, (0, 1, 2, 3)),
    EvalKeyId(KeyType.BOOTSTRAP2, 5, 3, 4, (0, 1, 2, 3, 4)),
]


@pytest.mark.parametrize("kid", KEYS, ids=[f"evalkey/{k.type.name}:{k}" for k in KEYS])
def test_key_relation(kid, rng):
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    key = generate_evalkey(ctx, kid, sec, rng)
    want_limbs = tuple(range(kid.level)) + tuple(range(64 - kid.ext, 64))
    assert key.limbs == want_limbs
    assert key.c0.shape == key.c1.shape == (len(want_limbs), N) and key.c0.dtype == np.uint32
    s_old = (sec.s_eph if kid.type == KeyType.EPHEMERAL else sec.s).ntt_limbs(ctx, key.limbs)
    q = prime_column(ctx, key.limbs)
    dec = (key.c0.astype(np.uint64) + mulmod(key.c1, s_old, q)) % q
    coeff = ctx.intt(dec.astype(np.uint32), list(key.limbs)).astype(np.int64)
    big_p = extension_modulus(ctx, kid.ext)
    assert big_p == np.prod([ctx.q(63 - i) for i in range(kid.ext)], dtype=object)
    s_new = _s_new(kid, ctx, sec)
    errors = []
    for r, l in enumerate(key.limbs):
        ql = ctx.q(l)
        row = coeff[r].astype(object)
        if l in kid.digits:
            row = row - (big_p % ql) * (np.asarray(s_new, dtype=object) % ql)
        errors.append(centre(row, ql).astype(np.int64))
    errors = np.array(errors)
    # one small centred-binomial polynomial e, the same on every limb
    assert np.max(np.abs(errors)) <= 21
    assert np.all(errors == errors[0])
    assert np.std(errors[0]) > 2  # sigma ~ 3.2, not zero


def test_key_is_not_trivially_zero_off_digits(rng):
    """Off-digit Q limbs carry no s_new term; on digit limbs it is there (checked via a wrong relation)."""
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    kid = EvalKeyId(KeyType.RELIN, 3, 2, 0, (0, 2))
    key = generate_evalkey(ctx, kid, sec, rng)
    s_old = sec.s.ntt_limbs(ctx, key.limbs)
    q = prime_column(ctx, key.limbs)
    dec = ctx.intt(((key.c0.astype(np.uint64) + mulmod(key.c1, s_old, q)) % q).astype(np.uint32), list(key.limbs))
    small = [np.max(np.abs(centre(dec[r].astype(object), ctx.q(l)).astype(np.int64))) <= 21 for r, l in enumerate(key.limbs)]
    assert small == [False, True, False, True, True]


def test_limb_access_and_errors(rng):
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    kid = EvalKeyId(KeyType.RELIN, 2, 1, 0, (0, 1))
    key = generate_evalkey(ctx, kid, sec, rng)
    assert isinstance(key, EvalKey)
    assert np.array_equal(key.limb("c0", 63), key.c0[2]) and np.array_equal(key.limb(1, 0), key.c1[0])
    with pytest.raises(KeyError, match="has no limb 5"):
        key.limb(0, 5)
    with pytest.raises(ValueError, match="key half must be 0, 1, 'c0' or 'c1'"):
        key.limb("c2", 0)
    with pytest.raises(ValueError, match=r"digit limbs \[3\] are not among its Q limbs"):
        generate_evalkey(ctx, EvalKeyId(KeyType.RELIN, 2, 1, 0, (0, 3)), sec, rng)


def test_secret_ntt_cache(rng):
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    a = sec.s.ntt(ctx, 3)
    assert a is sec.s.ntt(ctx, 3) and not a.flags.writeable
    assert np.array_equal(ctx.intt(a, 3).astype(np.int64), np.mod(sec.s.coeffs, ctx.q(3)))


@pytest.mark.parametrize("buffered", [False, True], ids=["fresh", "half-kept"])
def test_redraw_a_from_the_key_state_equals_c1(rng, buffered):
    """A key records its generator's state before ``a``; :func:`redraw_a` from it gives c1 bit for bit
    (also when the generator keeps a 32-bit half between draws), without touching ``rng``."""
    from caramel.ckks.keys import generate_evalkeys, redraw_a

    ctx = context(N)
    sec = Secrets.generate(N, rng)
    if buffered:
        rng.integers(0, 7, dtype=np.uint32)  # leaves a kept 32-bit half in the generator
    keys = generate_evalkeys(ctx, KEYS, sec, rng)
    assert any(k.a_state.has_uint32 for k in keys.values()) or not buffered
    after = rng.bit_generator.state
    for kid, key in keys.items():
        assert key.a_state is not None
        assert np.array_equal(redraw_a(ctx, key.limbs, key.a_state), key.c1), kid
    assert rng.bit_generator.state == after


def test_a_state_is_none_for_other_generators():
    ctx = context(N)
    rng = np.random.Generator(np.random.Philox(5))
    key = generate_evalkey(ctx, KEYS[0], Secrets.generate(N, rng), rng)
    assert key.a_state is None
