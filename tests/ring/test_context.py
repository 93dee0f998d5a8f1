"""context: validation, shapes and caching of the Context facade."""

from __future__ import annotations

import math

import numpy as np
import pytest

from caramel.ring import PRIMES, BaseConverter, Context, Mode, NttTable, crt_reconstruct, ntt, sud_lift


@pytest.fixture(scope="module")
def ctx() -> Context:
    return Context(n=64)


def test_defaults():
    c = Context()
    assert c.n == 65536 and c.primes == PRIMES
    assert c.conjugation_element == 131071
    assert c.galois_element(1) == 5 and c.galois_element(-1) == pow(5, 32767, 131072)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        pytest.param({"n": 48}, "power of two", id="context/n=48"),
        pytest.param({"n": 8}, "power of two >= 16", id="context/n=8"),
        pytest.param({"n": 64.0}, "integer", id="context/n=float"),
        pytest.param({"n": 64, "primes": ()}, "empty", id="context/no-primes"),
        pytest.param({"n": 64, "primes": (97,)}, "not 1 mod 2N", id="context/not-ntt-friendly"),
        pytest.param({"n": 64, "primes": (129 * 128 + 1,)}, "not prime", id="context/composite"),
        pytest.param({"n": 64, "primes": ((1 << 30) + 3 * 128 + 1,)}, "2\\^30", id="context/too-large"),
        pytest.param({"n": 64, "primes": (PRIMES[0], PRIMES[1], PRIMES[0])}, "repeats", id="context/duplicate"),
        pytest.param({"n": 131072}, "not 1 mod 2N", id="context/n=131072"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Context(**kwargs)


def test_limbs_and_moduli(ctx):
    assert ctx.q(0) == PRIMES[0] and ctx.q(63) == PRIMES[63]
    m = ctx.moduli([0, 5, 63])
    assert m.dtype == np.uint64 and m.shape == (3, 1) and m[:, 0].tolist() == [PRIMES[0], PRIMES[5], PRIMES[63]]
    for bad in (64, -1, 1.0, True):
        with pytest.raises(ValueError, match="limb index (-1 is outside|64 is outside|must be an integer)"):
            ctx.q(bad)
    for limbs in ([0, 5, 63], np.array([0, 5, 63], dtype=np.int32), np.array([63, 5], dtype=np.uint64), []):
        assert np.array_equal(ctx.moduli(limbs)[:, 0], [ctx.q(int(l)) for l in limbs])
    for bad in ([3, 64], np.array([3, -1]), np.array([1, 64]), np.array([True, False]), [2.0]):
        with pytest.raises(ValueError, match="limb index (-1 is outside|64 is outside|must be an integer)"):
            ctx.moduli(bad)


def test_ntt_shapes_and_values(ctx, rng, expect_equal, residues):
    limbs = [3, 0, 63]
    a = residues(rng, [PRIMES[l] for l in limbs], 64)
    have = ctx.ntt(a, limbs)
    assert have.dtype == np.uint32 and have.shape == (3, 64)
    for r, l in enumerate(limbs):
        expect_equal(have[r], ntt(a[r], NttTable(PRIMES[l], 64)), f"ctx.ntt row {r} limb {l}")
        expect_equal(ctx.ntt(a[r], l), have[r], f"ctx.ntt single limb {l}")
        expect_equal(ctx.intt(have[r], l), a[r], f"ctx.intt single limb {l}")
    expect_equal(ctx.intt(have, tuple(limbs)), a, "ctx.intt")
    assert ctx.ntt_table(3) is ctx.ntt_table(3)
    with pytest.raises(ValueError, match=r"2 limbs must have shape \(2, 64\), got \(3, 64\)"):
        ctx.ntt(a, [0, 1])
    with pytest.raises(ValueError, match=r"1 limbs must have shape \(1, 64\), got \(64,\)"):
        ctx.ntt(a[0], [0])
    with pytest.raises(ValueError, match=r"one limb must have shape \(64,\), got \(32,\)"):
        ctx.ntt(np.zeros(32, np.uint32), 0)


def test_automorphism(ctx, rng):
    g = ctx.galois_element(3)
    perm = ctx.permutation(g)
    assert ctx.permutation(g) is perm and not perm.flags.writeable
    a = rng.integers(0, 1000, (2, 3, 64), dtype=np.uint32)
    have = ctx.automorphism(a, g)
    assert have.dtype == np.uint32 and np.array_equal(have, a[..., perm])
    assert np.array_equal(ctx.automorphism(a, ctx.conjugation_element), a[..., ctx.permutation(127)])
    with pytest.raises(ValueError, match=r"last axis must have length N = 64, got shape \(32,\)"):
        ctx.automorphism(np.zeros(32, np.uint32), g)


def test_base_converter_cache(ctx, rng, expect_equal, residues):
    conv = ctx.base_converter([0, 1], [62, 63])
    assert isinstance(conv, BaseConverter) and ctx.base_converter((0, 1), (62, 63)) is conv
    assert conv.in_primes == (PRIMES[0], PRIMES[1]) and conv.out_primes == (PRIMES[62], PRIMES[63])
    x = residues(rng, conv.in_primes, 64)
    for mode in Mode:
        expect_equal(conv.convert(x, mode), BaseConverter(conv.in_primes, conv.out_primes).convert(x, mode), mode.value)


def test_sud_lift_crt_rsv(ctx, rng, expect_equal, residues):
    rb = rng.integers(0, PRIMES[63], 64, dtype=np.uint32)
    expect_equal(ctx.sud_lift(rb, 63, 2, Mode.EXACT), sud_lift(rb, PRIMES[63], PRIMES[2], "exact"), "ctx.sud_lift")
    limbs = [4, 1, 9]
    x = residues(rng, [PRIMES[l] for l in limbs], 64)
    values = ctx.crt(x, limbs)
    assert values.tolist() == crt_reconstruct(x, [PRIMES[l] for l in limbs]).tolist()
    assert all(0 <= v < math.prod(PRIMES[l] for l in limbs) for v in values)
    words = np.zeros((3, 64), np.uint32)
    for r, l in enumerate(limbs):
        words = ctx.rsv_accumulate(words, x[r], limbs, l)
    for l in (0, 4, 63):
        expect_equal(ctx.mod_reduce(words, l), np.array([v % PRIMES[l] for v in values], np.uint32), f"mod {l}")
    with pytest.raises(ValueError, match="not in the rsv basis"):
        ctx.rsv_accumulate(words, x[0], limbs, 5)


def test_full_size_round_trip(rng, expect_equal, residues):
    """N = 65536 with the default primes: batched transforms over a few limbs match one limb at a time."""
    c = Context()
    limbs = [0, 1, 50, 63]
    a = residues(rng, [PRIMES[l] for l in limbs], c.n)
    have = c.ntt(a, limbs)
    expect_equal(have[2], c.ntt(a[2], 50), "batched vs single limb")
    expect_equal(c.intt(have, limbs), a, "round trip")
    assert c.ntt(np.zeros((0, c.n), np.uint32), []).shape == (0, c.n)
