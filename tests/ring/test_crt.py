"""crt: the rsv/mod accumulator and CRT reconstruction against Python ints."""

from __future__ import annotations

import math

import numpy as np
import pytest

from caramel.ring import PRIMES, centered, crt_reconstruct, mod_reduce, rsv_accumulate
from caramel.ring.crt import int_to_words, ints_to_words, words_to_ints


def to_int(words, i: int) -> int:
    return sum(int(words[w][i]) << (32 * w) for w in range(len(words)))


def from_ints(values, m: int) -> np.ndarray:
    return np.array([[(v >> (32 * w)) & 0xFFFFFFFF for v in values] for w in range(m)], dtype=np.uint32)


@pytest.mark.parametrize("m", [1, 2, 3, 7, 20], ids=lambda m: f"rsv/m={m}")
def test_rsv_step_against_python(m, rng, expect_equal):
    basis = [int(q) for q in rng.choice(PRIMES, m, replace=False)]
    qb = math.prod(basis)
    n = 40
    start = [int.from_bytes(rng.bytes(32 * m), "little") % qb for _ in range(n)]
    start[0], start[1] = 0, qb - 1
    words = from_ints(start, m)
    for pos in range(m):
        q_l = basis[pos]
        rs = rng.integers(0, q_l, n, dtype=np.uint64)
        rs[1] = q_l - 1
        have = rsv_accumulate(words, rs, basis, pos)
        qhat = qb // q_l
        want = [(x + int(r) * pow(qhat, -1, q_l) % q_l * qhat) % qb for x, r in zip(start, rs)]
        assert have.dtype == np.uint32 and have.shape == (m, n)
        expect_equal(have, from_ints(want, m), f"rsv m={m} position {pos}")


@pytest.mark.parametrize("m", [1, 3, 8], ids=lambda m: f"rsv-resolve/m={m}")
def test_rsv_resolves_crt_value(m, rng, expect_equal, residues):
    """rsi then one rsv per limb of B (any order) gives the CRT value in [0, Q_B); mod reads it back."""
    basis = list(PRIMES[10 : 10 + m])
    x = residues(rng, basis, 64)
    words = np.zeros((m, 64), dtype=np.uint32)
    for pos in rng.permutation(m):
        words = rsv_accumulate(words, x[pos], basis, int(pos))
    want = crt_reconstruct(x, basis)
    expect_equal(words_to_ints(words), want, "resolved value")
    for q in basis + [PRIMES[0], PRIMES[63]]:
        expect_equal(mod_reduce(words, q), np.array([int(v) % q for v in want], dtype=np.uint32), f"mod {q}")


def test_rsv_with_unreduced_accumulator(rng, expect_equal):
    """Words holding X >= Q_B still follow X <- (X + c * Qhat) mod Q_B."""
    basis = list(PRIMES[:3])
    qb = math.prod(basis)
    words = rng.integers(0, 1 << 32, (3, 30), dtype=np.uint64)
    words[:, 0] = 0xFFFFFFFF
    rs = rng.integers(0, basis[1], 30, dtype=np.uint64)
    have = rsv_accumulate(words, rs, basis, 1)
    qhat = qb // basis[1]
    want = [(to_int(words, i) + int(rs[i]) * pow(qhat, -1, basis[1]) % basis[1] * qhat) % qb for i in range(30)]
    expect_equal(have, from_ints(want, 3), "unreduced accumulator")


@pytest.mark.parametrize("m", [1, 2, 5, 20], ids=lambda m: f"mod/m={m}")
def test_mod_reduce_full_words(m, rng, expect_equal):
    words = rng.integers(0, 1 << 32, (m, 50), dtype=np.uint64)
    words[:, 0] = 0xFFFFFFFF
    for q in (PRIMES[0], PRIMES[63], 97):
        want = np.array([to_int(words, i) % q for i in range(50)], dtype=np.uint32)
        expect_equal(mod_reduce(words, q), want, f"mod m={m} q={q}")


@pytest.mark.parametrize("k", [1, 2, 6, 51], ids=lambda k: f"crt/limbs={k}")
def test_crt_reconstruct(k, rng, expect_equal, residues):
    primes = list(PRIMES[:k])
    big_q = math.prod(primes)
    x = residues(rng, primes, 32)
    have = crt_reconstruct(x, primes)
    assert have.dtype == object and have.shape == (32,)
    for i, v in enumerate(have):
        assert type(v) is int and 0 <= v < big_q, v
        have_res = [v % q for q in primes]
        assert have_res == [int(r) for r in x[:, i]], f"column {i}: want {x[:, i].tolist()}, have {have_res}"


def test_centered():
    big_q = 7 * 11
    values = np.array(list(range(big_q)), dtype=object)
    have = centered(values, big_q)
    want = [v if v <= 38 else v - 77 for v in range(77)]
    assert have.tolist() == want
    assert centered(np.array([0, 5, 6], dtype=np.uint32), 11).tolist() == [0, 5, -5]


def test_word_helpers():
    values = [0, 1, (1 << 96) - 1, 123456789 << 40]
    words = ints_to_words(np.array(values, dtype=object), 3)
    assert words.dtype == np.uint32
    assert words_to_ints(words).tolist() == values
    assert int_to_words(1 << 32, 2).tolist() == [0, 1]
    with pytest.raises(ValueError, match="do not fit in 3 32-bit words"):
        ints_to_words(np.array([1 << 96], dtype=object), 3)


def test_errors():
    with pytest.raises(ValueError, match="shape"):
        rsv_accumulate(np.zeros((2, 4), np.uint32), np.zeros(4, np.uint32), PRIMES[:3], 0)
    with pytest.raises(ValueError, match="outside"):
        rsv_accumulate(np.zeros((3, 4), np.uint32), np.zeros(4, np.uint32), PRIMES[:3], 3)
    with pytest.raises(ValueError, match="shape"):
        crt_reconstruct(np.zeros((2, 4), np.uint32), PRIMES[:3])
