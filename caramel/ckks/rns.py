"""Moving integer polynomials in and out of RNS (residue number system) form.

A coefficient vector c (integers, possibly larger than 64 bits) is represented on limbs l_0..l_{k-1}
by the rows [c mod q_{l_r}] (coefficient form) or their NTTs (evaluation form, what memory holds).
Back from residues: CRT reconstruction X in [0, Q), Q = prod q_l, then the *centred* representative
[X]_Q in (-Q/2, Q/2] (a decryption is small only in that representative). A second, smaller modulus
M can be applied to the centred integers: [X]_M, used for BootstrapModRaise (ISA.md 5.5), where the
result is Delta*m + e + Q3*I and reducing centred modulo Q3 = q_0 q_1 q_2 removes the Q3*I term.
"""

from __future__ import annotations

import numpy as np
from caramel.errors import ArgumentError


def modulus(ctx, limbs) -> int:
    """Q = prod_{l in limbs} q_l (Python int)."""
    out = 1
    for l in limbs:
        out *= ctx.q(int(l))
    return out


def to_residues(coeffs, ctx, limbs, xp=np):
    """Coefficient-form residues [c mod q_l], shape (len(limbs), N) uint32, an array of module ``xp``.

    ``coeffs`` (host): int64 (fast path, vectorised, computed with ``xp``) or object array of
    Python ints (on the host, :func:`_object_residues`).
    """
    c = np.asarray(coeffs)
    if c.shape != (ctx.n,):
        raise ArgumentError(f"expected {ctx.n} coefficients, got shape {c.shape}")
    if c.dtype == object:
        return xp.asarray(_object_residues(c, [ctx.q(int(l)) for l in limbs]))
    if not np.issubdtype(c.dtype, np.integer):
        raise ArgumentError(f"coefficients must be integers, got dtype {c.dtype}")
    qs = prime_column(ctx, limbs, xp).astype(np.int64)
    return xp.mod(xp.asarray(c, dtype=np.int64)[None, :], qs).astype(np.uint32)


#: Bits per word when a big integer is cut into words (word * (2^(30 i) mod q) < 2^60 fits uint64).
_WORD_BITS = 30


def _object_residues(c: np.ndarray, qs: list[int]) -> np.ndarray:
    """[c mod q] for every q of ``qs``, c an object array of Python ints, as (len(qs), N) uint32.

    |c| = sum_i w_i 2^(30 i) with words w_i < 2^30 (a few object-array passes for all limbs, instead
    of one Python-int ``%`` per limb); then per q: r = sum_i w_i (2^(30 i) mod q) mod q, and
    q - r (mod q) where c < 0."""
    k, n = len(qs), c.shape[0]
    if k == 0:
        return np.empty((0, n), dtype=np.uint32)
    neg = np.asarray(c < 0, dtype=bool)
    mag = np.abs(c)
    q = np.array(qs, dtype=np.uint64)[:, None]
    acc = np.zeros((k, n), dtype=np.uint64)
    mask = (1 << _WORD_BITS) - 1
    shift = 0
    while True:
        word = np.asarray(mag & mask, dtype=np.uint64)
        factor = np.array([pow(2, shift, int(p)) for p in qs], dtype=np.uint64)[:, None]
        acc += word[None, :] * factor  # < 2q + 2^60: no overflow
        np.remainder(acc, q, out=acc)
        mag = mag >> _WORD_BITS
        shift += _WORD_BITS
        if not np.any(mag != 0):
            break
    acc = np.where(neg[None, :], q - acc, acc)
    return np.minimum(acc, acc - q).astype(np.uint32)  # q - 0 = q -> 0


def to_ntt(coeffs, ctx, limbs) -> np.ndarray:
    """NTT-form residues of integer coefficients by the ring's NTT, shape (len(limbs), N) uint32
    (:func:`caramel.ckks.device.to_ntt` computes the same on the current client device)."""
    limbs = list(limbs)
    return np.asarray(ctx.ntt(to_residues(coeffs, ctx, limbs), limbs), dtype=np.uint32)


def centre(x, m: int) -> np.ndarray:
    """[x]_m: the representative of x modulo m in (-m/2, m/2] (object array of Python ints)."""
    r = np.asarray(x, dtype=object) % m
    return np.where(r > m // 2, r - m, r)


def from_residues(residues, ctx, limbs, reduce_modulus: int | None = None) -> np.ndarray:
    """Centred integer coefficients of coefficient-form residues (k, N) on ``limbs``.

    CRT gives X in [0, Q); the result is [X]_Q, then, if ``reduce_modulus`` M is given, [[X]_Q]_M.
    Returns an object array of Python ints, shape (N,).
    """
    limbs = list(limbs)
    x = np.asarray(ctx.crt(np.asarray(residues), limbs), dtype=object)
    out = centre(x, modulus(ctx, limbs))
    if reduce_modulus is not None:
        out = centre(out, int(reduce_modulus))
    return out


def mulmod(a, b, q, xp=np):
    """(a * b) mod q for residues < 2^32 (uint64 products; q may broadcast, e.g. shape (k, 1)), with
    array module ``xp``; uint64 result."""
    t = xp.multiply(a, b, dtype=np.uint64)
    return xp.remainder(t, xp.asarray(q, dtype=np.uint64), out=t)


def prime_column(ctx, limbs, xp=np):
    """The primes of ``limbs`` as a (k, 1) uint64 column of module ``xp``, for broadcasting against
    (k, N) rows."""
    return xp.asarray(np.array([ctx.q(int(l)) for l in limbs], dtype=np.uint64)[:, None])
