"""Random polynomials for key generation and encryption (all draws from a ``numpy.random.Generator``).

* uniform residues: a_l[i] uniform in [0, q_l), independently per limb (the ``a`` of RLWE samples);
* dense ternary: s_i uniform in {-1, 0, 1};
* sparse ternary with Hamming weight h: exactly h positions (uniform without replacement) hold +-1
  (each sign with probability 1/2), the rest 0;
* centred binomial error CBD(k): e_i = sum_{j<k} (b_j - b'_j) with fair coins b, b', i.e.
  Bin(k, 1/2) - Bin(k, 1/2); variance k/2, so k = 21 gives sigma = sqrt(10.5) ~ 3.24 (the usual 3.2).
"""

from __future__ import annotations

import numpy as np

#: Coin pairs of the centred binomial error: sigma = sqrt(CBD_K / 2) ~ 3.2.
CBD_K = 21


def rng_of(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A Generator from a Generator, a seed or None (fresh entropy)."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def uniform_residues(ctx, limbs, rng: np.random.Generator) -> np.ndarray:
    """Uniform residues, shape (len(limbs), N) uint32, row r uniform in [0, q_{limbs[r]})."""
    qs = np.array([ctx.q(int(l)) for l in limbs], dtype=np.int64)
    return rng.integers(0, qs[:, None], size=(len(qs), ctx.n), dtype=np.int64).astype(np.uint32)


def dense_ternary(n: int, rng: np.random.Generator) -> np.ndarray:
    """N coefficients uniform in {-1, 0, 1} (int64)."""
    return rng.integers(-1, 2, size=n, dtype=np.int64)


def sparse_ternary(n: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """N coefficients with exactly h non-zeros, each +-1 (int64)."""
    if not 0 <= h <= n:
        raise ValueError(f"Hamming weight must be in [0, {n}], got {h}")
    out = np.zeros(n, dtype=np.int64)
    pos = rng.choice(n, size=h, replace=False)
    out[pos] = rng.integers(0, 2, size=h, dtype=np.int64) * 2 - 1
    return out


def cbd(n: int, rng: np.random.Generator, k: int = CBD_K) -> np.ndarray:
    """N centred-binomial coefficients Bin(k,1/2) - Bin(k,1/2) (int64), in [-k, k]."""
    return rng.binomial(k, 0.5, size=n).astype(np.int64) - rng.binomial(k, 0.5, size=n).astype(np.int64)
