"""Modular arithmetic on residue arrays (one modulus, or one per row via a (k, 1) column).

Conventions of the ring package: inputs are canonical residues (in [0, q)) in any unsigned integer dtype,
moduli are below 2^30 so every product of two residues fits in uint64, results are np.uint32 in [0, q).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from caramel.errors import ArgumentError

_U64 = np.uint64


def as_u64(a) -> np.ndarray:
    """as_u64 returns ``a`` as a uint64 ndarray (no copy when it already is one)."""
    return np.asarray(a, dtype=_U64)


def inv_mod(a: int, q: int) -> int:
    """inv_mod returns a^-1 mod q in [0, q); raises ValueError when gcd(a, q) != 1."""
    try:
        return pow(int(a), -1, int(q))
    except ValueError:
        raise ArgumentError(f"{a} has no inverse modulo {q}") from None


#: The elementwise operations by name (the ISA's ``add``/``ads``, ``sub``/``sus``,
#: ``mul``/``mup``/``mus``, ``neg``, and the operations of fused expressions) on canonical residues
#: held in uint64 (q < 2^30, so a * b is exact): (a + b) % q, (a + (q - b)) % q, a * b % q,
#: (q - a) % q, each ``f(q, *args)``. The reference interpreter and the NumPy backend evaluate
#: exactly these, which keeps them bit-identical.
ELEMENTWISE: dict[str, Callable[..., np.ndarray]] = {
    "add": lambda q, a, b: (a + b) % q,
    "sub": lambda q, a, b: (a + (q - b)) % q,
    "mul": lambda q, a, b: (a * b) % q,
    "neg": lambda q, a: (q - a) % q,
}


def add_mod(a, b, q) -> np.ndarray:
    """add_mod returns (a + b) mod q for canonical a, b."""
    q = as_u64(q)
    s = as_u64(a) + as_u64(b)
    return np.minimum(s, s - q).astype(np.uint32)


def sub_mod(a, b, q) -> np.ndarray:
    """sub_mod returns (a - b) mod q for canonical a, b."""
    q = as_u64(q)
    d = as_u64(a) + q - as_u64(b)
    return np.minimum(d, d - q).astype(np.uint32)


def neg_mod(a, q) -> np.ndarray:
    """neg_mod returns (-a) mod q for canonical a (0 stays 0)."""
    q = as_u64(q)
    d = q - as_u64(a)
    return np.minimum(d, d - q).astype(np.uint32)


def mul_mod(a, b, q) -> np.ndarray:
    """mul_mod returns (a * b) mod q for canonical a, b (the product is exact in uint64)."""
    return (as_u64(a) * as_u64(b) % as_u64(q)).astype(np.uint32)


def reduce_mod(a, q) -> np.ndarray:
    """reduce_mod returns a mod q for any non-negative integers a (< 2^64)."""
    return (as_u64(a) % as_u64(q)).astype(np.uint32)


def shoup(w, q) -> np.ndarray:
    """shoup returns w' = floor(w * 2^32 / q) (uint64), the precomputed quotient of Shoup's product."""
    return (as_u64(w) << _U64(32)) // as_u64(q)


def mul_shoup_lazy(a, w, w_shoup, q) -> np.ndarray:
    """mul_shoup_lazy returns a * w mod q in [0, 2q) (uint64) for a < 2^32, w < q < 2^30.

    r = a*w - floor(a*w' / 2^32) * q, computed modulo 2^64; Shoup's bound puts r in [0, 2q).
    """
    a = as_u64(a)
    quot = (a * as_u64(w_shoup)) >> _U64(32)
    return a * as_u64(w) - quot * as_u64(q)
