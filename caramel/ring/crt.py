"""Chinese remaindering: the rsv/mod accumulator of ISA 4.5 and CRT reconstruction for decryption.

The accumulator of ``rsi``/``rsv``/``mod`` is a group of m registers (words); per residue position i it
holds the big integer X[i] = sum_w words[w][i] * 2^(32 w) (little-endian 32-bit words). The kernels here
work on the words with vectorised multi-word uint64 arithmetic (no per-position Python integers);
``crt_reconstruct`` returns Python integers (object arrays) for decryption.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from caramel.ring.modular import inv_mod
from caramel.errors import ArgumentError

_U64 = np.uint64
_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT32 = np.uint64(32)


def int_to_words(value: int, m: int) -> np.ndarray:
    """int_to_words returns the m little-endian 32-bit words of 0 <= value < 2^(32 m) (uint64, shape (m,))."""
    if not 0 <= value < 1 << (32 * m):
        raise ArgumentError(f"{value} does not fit in {m} 32-bit words")
    return np.array([(value >> (32 * w)) & 0xFFFFFFFF for w in range(m)], dtype=_U64)


def words_to_ints(words) -> np.ndarray:
    """words_to_ints returns X[i] = sum_w words[w][i] * 2^(32 w) as an object array of Python ints (N,)."""
    words = np.asarray(words)
    x = np.zeros(words.shape[1], dtype=object)
    for w in range(words.shape[0] - 1, -1, -1):
        x = (x << 32) + words[w].astype(object)
    return x


def ints_to_words(values, m: int) -> np.ndarray:
    """ints_to_words returns the (m, N) uint32 words of non-negative Python ints values (< 2^(32 m))."""
    values = np.asarray(values, dtype=object)
    out = np.empty((m, values.shape[0]), dtype=np.uint32)
    for w in range(m):
        out[w] = ((values >> (32 * w)) & 0xFFFFFFFF).astype(np.int64)
    if m and np.any(values >> (32 * m)):
        raise ArgumentError(f"values do not fit in {m} 32-bit words")
    return out


@lru_cache(maxsize=256)
def _rsv_constants(basis: tuple[int, ...], index: int) -> tuple[int, int, int]:
    """_rsv_constants returns (Q_B, Q_B / q_l, (Q_B / q_l)^-1 mod q_l) for l = basis[index]."""
    qb = math.prod(basis)
    q_l = basis[index]
    qhat = qb // q_l
    return qb, qhat, inv_mod(qhat % q_l, q_l)


def rsv_accumulate(words, rs, basis_primes: Sequence[int], l_index_in_basis: int) -> np.ndarray:
    """rsv_accumulate returns the words of X <- (X + [rs * (Q_B/q_l)^-1]_{q_l} * (Q_B/q_l)) mod Q_B.

    words: (m, N) accumulator words (values < 2^32), X[i] = sum_w words[w][i] 2^(32 w); rs: (N,)
    coefficient residues mod q_l, q_l = basis_primes[l_index_in_basis]; Q_B = prod(basis_primes),
    m = len(basis_primes). Result: (m, N) uint32. After one call per prime of B starting from X = 0,
    X is the CRT value in [0, Q_B). An accumulator that holds X >= Q_B is first reduced mod Q_B.
    """
    basis = tuple(int(q) for q in basis_primes)
    words = np.asarray(words)
    m = len(basis)
    if words.ndim != 2 or words.shape[0] != m:
        raise ArgumentError(f"accumulator of shape {words.shape}; want ({m}, N) for a basis of {m} primes")
    if not 0 <= l_index_in_basis < m:
        raise ArgumentError(f"limb position {l_index_in_basis} is outside the basis of {m} primes")
    qb, qhat, qhat_inv = _rsv_constants(basis, l_index_in_basis)
    q_l = basis[l_index_in_basis]
    x = words.astype(_U64)
    qb_words = int_to_words(qb, m)
    if np.any(~_less_than(x, qb_words)):
        x = ints_to_words(words_to_ints(x) % qb, m).astype(_U64)
    c = np.asarray(rs).astype(_U64) * _U64(qhat_inv) % _U64(q_l)
    # X + c * qhat with carries: each word sum < 2^32 + 2^30 * 2^32 + 2^31 < 2^64. The sum is < 2 Q_B.
    carry = np.zeros(x.shape[1], dtype=_U64)
    for w, qw in enumerate(int_to_words(qhat, m)):
        s = x[w] + c * qw + carry
        x[w] = s & _MASK32
        carry = s >> _SHIFT32
    # Subtract Q_B where X >= Q_B (at most once).
    ge = ~_less_than(x, qb_words)
    if np.any(ge):
        diff = _subtract_words(x, qb_words)
        x[:, ge] = diff[:, ge]
    return x.astype(np.uint32)


def _less_than(x: np.ndarray, b_words: np.ndarray) -> np.ndarray:
    """_less_than returns X[i] < B for words x (m, N) and the words of a constant B (boolean (N,))."""
    borrow = np.zeros(x.shape[1], dtype=np.int64)
    for w in range(x.shape[0]):
        d = x[w].astype(np.int64) - np.int64(b_words[w]) - borrow
        borrow = (d < 0).astype(np.int64)
    return borrow.astype(bool)


def _subtract_words(x: np.ndarray, b_words: np.ndarray) -> np.ndarray:
    """_subtract_words returns the words of X - B mod 2^(32 m) (uint64 (m, N))."""
    out = np.empty_like(x)
    borrow = np.zeros(x.shape[1], dtype=np.int64)
    for w in range(x.shape[0]):
        d = x[w].astype(np.int64) - np.int64(b_words[w]) - borrow
        borrow = (d < 0).astype(np.int64)
        out[w] = (d & 0xFFFFFFFF).astype(_U64)
    return out


def mod_reduce(words, q: int) -> np.ndarray:
    """mod_reduce returns X mod q = sum_w words[w] * [2^(32 w)]_q mod q (uint32, shape (N,))."""
    words = np.asarray(words).astype(_U64)
    qq = _U64(q)
    acc = np.zeros(words.shape[1], dtype=_U64)
    for w in range(words.shape[0]):
        acc += words[w] * _U64(pow(2, 32 * w, q))  # < 2^30 + 2^32 * 2^30
        np.remainder(acc, qq, out=acc)
    return acc.astype(np.uint32)


def crt_reconstruct(residues, primes: Sequence[int]) -> np.ndarray:
    """crt_reconstruct returns X in [0, Q) with X = residues[k] mod primes[k] (object array of ints, (N,)).

    Primes are taken in pairs (a, b) = (q_2j, q_2j+1), M_j = q_a q_b (the last one alone when their count
    is odd). Each pair is combined exactly in uint64: Y_j = x_a + q_a [(x_b - x_a) q_a^-1]_{q_b} in
    [0, M_j). Then X = (sum_j Y_j * E_j) mod Q with E_j = (Q/M_j) * [(Q/M_j)^-1]_{M_j}, Q = prod q_k.
    """
    primes = tuple(int(q) for q in primes)
    residues = np.asarray(residues)
    if residues.ndim != 2 or residues.shape[0] != len(primes):
        raise ArgumentError(f"residues of shape {residues.shape}; want ({len(primes)}, N)")
    big_q = math.prod(primes)
    acc = np.zeros(residues.shape[1], dtype=object)
    for j in range(0, len(primes), 2):
        q_a = primes[j]
        y = residues[j].astype(_U64) % _U64(q_a)
        group = q_a
        if j + 1 < len(primes):
            q_b = primes[j + 1]
            x_b = residues[j + 1].astype(_U64) % _U64(q_b)
            d = (x_b + _U64(q_b) - y % _U64(q_b)) * _U64(inv_mod(q_a, q_b)) % _U64(q_b)
            y = y + d * _U64(q_a)
            group = q_a * q_b
        cofactor = big_q // group
        acc = acc + y.astype(object) * (cofactor * inv_mod(cofactor % group, group))
    return acc % big_q


def centered(values, modulus: int) -> np.ndarray:
    """centered returns the representative of values mod Q in [-(Q-1)/2, Q/2]: v if v <= (Q-1)/2 else v - Q.

    values: integers in [0, Q) (object array or integer ndarray); returns an object array of Python ints.
    """
    values = np.asarray(values).astype(object)
    return np.where(values > (modulus - 1) // 2, values - modulus, values)
