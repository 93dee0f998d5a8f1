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


def to_residues(coeffs, ctx, limbs) -> np.ndarray:
    """Coefficient-form residues [c mod q_l], shape (len(limbs), N) uint32.

    ``coeffs``: int64 (fast path, vectorised) or object array of Python ints (one object-array
    ``%`` per limb).
    """
    c = np.asarray(coeffs)
    if c.shape != (ctx.n,):
        raise ArgumentError(f"expected {ctx.n} coefficients, got shape {c.shape}")
    if c.dtype == object:
        return np.stack([(c % ctx.q(int(l))).astype(np.int64) for l in limbs]).astype(np.uint32)
    if not np.issubdtype(c.dtype, np.integer):
        raise ArgumentError(f"coefficients must be integers, got dtype {c.dtype}")
    qs = np.array([ctx.q(int(l)) for l in limbs], dtype=np.int64)
    return np.mod(c.astype(np.int64)[None, :], qs[:, None]).astype(np.uint32)


def to_ntt(coeffs, ctx, limbs) -> np.ndarray:
    """NTT-form residues of integer coefficients on the host, shape (len(limbs), N) uint32
    (:func:`caramel.ckks.device.to_ntt` runs it on the current client device)."""
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


def mulmod(a: np.ndarray, b, q) -> np.ndarray:
    """(a * b) mod q for residues < 2^32 (uint64 products; q may broadcast, e.g. shape (k, 1))."""
    return (np.asarray(a, dtype=np.uint64) * np.asarray(b, dtype=np.uint64)) % np.asarray(q, dtype=np.uint64)


def prime_column(ctx, limbs) -> np.ndarray:
    """The primes of ``limbs`` as a (k, 1) uint64 column, for broadcasting against (k, N) rows."""
    return np.array([ctx.q(int(l)) for l in limbs], dtype=np.uint64)[:, None]
