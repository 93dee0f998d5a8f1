"""automorphism: Galois elements and NTT-form permutations against substitution a(X^g) in coefficients."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ring import (
    PRIMES,
    NttTable,
    apply_automorphism,
    automorphism_permutation,
    conjugation_element,
    galois_element,
    ntt,
)


def substitute(a, g: int, q: int) -> np.ndarray:
    """a(X^g) mod (X^N + 1, q): coefficient i moves to i*g mod 2N, negated when that is >= N."""
    n = len(a)
    out = [0] * n
    for i, c in enumerate(a):
        e = i * g % (2 * n)
        if e < n:
            out[e] = (out[e] + int(c)) % q
        else:
            out[e - n] = (out[e - n] - int(c)) % q
    return np.array(out, dtype=np.uint32)


@pytest.mark.parametrize(
    "step,n,want",
    [
        pytest.param(0, 64, 1, id="galois/step=0"),
        pytest.param(1, 64, 5, id="galois/step=1"),
        pytest.param(3, 64, 125, id="galois/step=3"),
        pytest.param(-1, 64, pow(5, 31, 128), id="galois/step=-1"),
        pytest.param(-5, 64, pow(5, 27, 128), id="galois/step=-5"),
        pytest.param(16384, 64, 1, id="galois/step=16384/N=64"),
        pytest.param(-16383, 64, 5, id="galois/step=-16383/N=64"),
        pytest.param(16385, 65536, pow(5, 16385, 131072), id="galois/step=16385/N=65536"),
        pytest.param(-2, 65536, pow(5, 32766, 131072), id="galois/step=-2/N=65536"),
    ],
)
def test_galois_element(step, n, want):
    have = galois_element(step, n)
    assert have == want, f"want {want}, have {have}"


def test_galois_element_is_five_to_the_k_and_inverts():  # the emulator's formula (ISA.md), written here
    n = 256
    for k in range(1, n // 2):
        assert galois_element(k, n) == pow(5, k, 2 * n)  # EM: 5^k for k > 0
        assert galois_element(-k, n) == pow(5, n // 2 - k, 2 * n)  # EM: 5^(N/2 - |k|) for k < 0
        assert galois_element(k, n) * galois_element(-k, n) % (2 * n) == 1, k


def test_conjugation_element():
    assert conjugation_element(64) == 127
    assert conjugation_element(65536) == 131071


CASES = [
    pytest.param(n, g, limb, id=f"automorphism/N={n}/{name}/limb={limb}")
    for n in (16, 64)
    for name, g in [
        ("step=1", galois_element(1, n)),
        ("step=2", galois_element(2, n)),
        ("step=3", galois_element(3, n)),
        ("step=-1", galois_element(-1, n)),
        ("step=-7", galois_element(-7, n)),
        ("step=16384", galois_element(16384, n)),
        ("step=-16383", galois_element(-16383, n)),
        ("step=16387", galois_element(16387, n)),
        ("conjugate", conjugation_element(n)),
        ("g=3", 3),
    ]
    for limb in (0, 63)
]


@pytest.mark.parametrize("n,g,limb", CASES)
def test_permutation_is_substitution(n, g, limb, rng, expect_equal):
    q = PRIMES[limb]
    t = NttTable(q, n)
    a = rng.integers(0, q, n, dtype=np.uint64)
    perm = automorphism_permutation(g, n)
    assert sorted(perm.tolist()) == list(range(n)), "not a permutation"
    want = ntt(substitute(a, g, q), t)
    have = apply_automorphism(ntt(a, t), perm)
    assert have.dtype == np.uint32
    expect_equal(have, want, f"NTT(a(X^{g}))")


def test_permutation_formula_and_composition():
    n = 32
    br = [int(format(j, "05b")[::-1], 2) for j in range(n)]
    g = galois_element(3, n)
    want = [br[((g * (2 * br[j] + 1)) % (2 * n) - 1) // 2] for j in range(n)]
    assert automorphism_permutation(g, n).tolist() == want
    g2 = galois_element(5, n)
    composed = automorphism_permutation(g, n)[automorphism_permutation(g2, n)]
    assert composed.tolist() == automorphism_permutation(g * g2 % (2 * n), n).tolist()
    assert automorphism_permutation(1, n).tolist() == list(range(n))


def test_leading_shape_and_even_g(rng):
    perm = automorphism_permutation(5, 16)
    a = rng.integers(0, 100, (2, 3, 16), dtype=np.uint32)
    assert np.array_equal(apply_automorphism(a, perm), a[:, :, perm])
    with pytest.raises(ValueError, match="even"):
        automorphism_permutation(4, 16)
