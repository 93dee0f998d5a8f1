"""rescale: the sud lift in every mode and an end-to-end rescale against exact division with Python ints."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ring import PRIMES, Mode, NttTable, intt, ntt, sud, sud_lift


def model_lift(rb, q_t: int, q_l: int, mode: Mode) -> list[int]:
    out = []
    for v in map(int, rb):
        if mode is Mode.EXACT and v > (q_t - 1) // 2:
            v -= q_t
        out.append(v % q_l)
    return out


@pytest.mark.parametrize(
    "mode,t,l",
    [
        pytest.param(mode, t, l, id=f"sud_lift/{mode.value}/t={t}/l={l}")
        for mode in Mode
        for t, l in [(63, 0), (4, 3), (0, 63)]  # q_t > q_l, q_t slightly > q_l, q_t < q_l
    ],
)
def test_sud_lift(mode, t, l, rng, expect_equal):
    q_t, q_l = PRIMES[t], PRIMES[l]
    rb = rng.integers(0, q_t, 200, dtype=np.uint64)
    rb[:6] = [0, 1, (q_t - 1) // 2, (q_t + 1) // 2, q_t - 1, q_l % q_t]
    have = sud_lift(rb, q_t, q_l, mode)
    assert have.dtype == np.uint32
    expect_equal(have, np.array(model_lift(rb, q_t, q_l, mode), dtype=np.uint32), f"lift {mode.value}")


def test_sud_formula(rng, expect_equal):
    q = PRIMES[9]
    ra = rng.integers(0, q, 100, dtype=np.uint64)
    y = rng.integers(0, q, 100, dtype=np.uint64)
    y[0] = ra[0]
    factor = pow(PRIMES[63], -1, q)
    want = np.array([(int(a) - int(b)) * factor % q for a, b in zip(ra, y)], dtype=np.uint32)
    expect_equal(sud(ra, y, factor, q), want, "sud")


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: f"rescale/{m.value}/N=64")
def test_rescale_is_exact_division(mode, rng, expect_equal):
    """c over limbs {l, t}: sud(c_l, NTT(lift(INTT(c_t))), q_t^-1) is (c - r)/q_t with r = [c]_{q_t}
    (unsigned in textbook/emulator, centred in exact), for big-integer coefficients c."""
    n, l, t = 64, 2, 63
    q_l, q_t = PRIMES[l], PRIMES[t]
    tl, tt = NttTable(q_l, n), NttTable(q_t, n)
    coeffs = [int(v) for v in rng.integers(0, q_l * q_t, n, dtype=np.uint64)]
    c_l = ntt(np.array([c % q_l for c in coeffs], dtype=np.uint32), tl)
    c_t = ntt(np.array([c % q_t for c in coeffs], dtype=np.uint32), tt)
    y = sud_lift(intt(c_t, tt), q_t, q_l, mode)
    have = intt(sud(c_l, ntt(y, tl), pow(q_t, -1, q_l), q_l), tl)
    want = []
    for c in coeffs:
        r = c % q_t
        if mode is Mode.EXACT and r > (q_t - 1) // 2:
            r -= q_t
        assert (c - r) % q_t == 0
        want.append((c - r) // q_t % q_l)
    expect_equal(have, np.array(want, dtype=np.uint32), f"rescale {mode.value}")
