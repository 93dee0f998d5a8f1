"""primes: the fixed list and the generator that reproduces it."""

from __future__ import annotations

import pytest

from caramel.ring import PRIMES, is_prime, ntt_primes


def test_generator_reproduces_prime_list():
    have = ntt_primes(64, bits=28, log_modulus=17)
    assert have == PRIMES, f"want {PRIMES}, have {have}"


def test_prime_list_properties():
    assert len(PRIMES) == 64
    assert PRIMES[0] == 204865537 and PRIMES[1] == 205651969 and PRIMES[63] == 268042241, PRIMES
    assert list(PRIMES) == sorted(set(PRIMES)), "primes must be distinct and ascending"
    for q in PRIMES:
        assert q < 1 << 28 and (q - 1) % (1 << 17) == 0 and is_prime(q), q
    # No prime of the right form is skipped between q_0 and 2^28.
    between = [q for q in range(PRIMES[0], 1 << 28, 1 << 17) if is_prime(q)]
    assert tuple(between) == PRIMES, f"want {between}, have {PRIMES}"


def _trial_division(n: int) -> bool:
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def test_is_prime_small_numbers():
    for n in range(-3, 3000):
        assert is_prime(n) == _trial_division(n), f"n={n}: want {_trial_division(n)}, have {is_prime(n)}"


@pytest.mark.parametrize(
    "n",
    [561, 1105, 1729, 2047, 3215031751, 2152302898747, 3474749660383, 341550071728321, 3825123056546413051],
    ids=lambda n: f"pseudoprime={n}",
)
def test_is_prime_rejects_pseudoprimes(n):
    assert not is_prime(n)


def test_is_prime_large_primes():
    for p in (2**31 - 1, 2**61 - 1, 1000000007, 998244353, 18446744073709551557):
        assert is_prime(p), p
    assert not is_prime((2**31 - 1) * (2**61 - 1))


def test_ntt_primes_too_many():
    with pytest.raises(ValueError, match="only"):
        ntt_primes(10, bits=20, log_modulus=17)
