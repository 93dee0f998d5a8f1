"""Galois automorphisms X -> X^g of Z_q[X]/(X^N + 1), applied in NTT form as index permutations.

GALOIS_GENERATOR = 5 generates the slot rotations (the CKKS encoder orders slots by powers of 5, so step
k > 0 rotates slots left); g = 2N - 1 is complex conjugation (ISA section 3 and decision 6).
"""

from __future__ import annotations

import numpy as np

from caramel.ring.ntt import bit_reverse
from caramel.errors import ArgumentError

GALOIS_GENERATOR = 5


def galois_element(step: int, n: int) -> int:
    """galois_element returns g(step) = 5^(step mod N/2) mod 2N (non-negative mod, any signed step)."""
    return pow(GALOIS_GENERATOR, int(step) % (n // 2), 2 * n)


def conjugation_element(n: int) -> int:
    """conjugation_element returns 2N - 1, the Galois element of complex conjugation."""
    return 2 * n - 1


def automorphism_permutation(g: int, n: int) -> np.ndarray:
    """automorphism_permutation returns perm (int64, length N) with NTT(a(X^g)) = NTT(a)[..., perm].

    perm[j] = br( ((g * (2 br(j) + 1)) mod 2N - 1) / 2 ), br = bit reversal on log2(N) bits: output slot j
    evaluates a(X^g) at psi^(2 br(j)+1), which is a at psi^(g (2 br(j)+1)). g must be odd.
    """
    g = int(g) % (2 * n)
    if g % 2 == 0:
        raise ArgumentError(f"Galois element {g} is even: not an automorphism of X^N + 1")
    br = bit_reverse(n)
    exps = (g * (2 * br + 1)) % (2 * n)
    return br[(exps - 1) // 2]


def apply_automorphism(a, perm: np.ndarray) -> np.ndarray:
    """apply_automorphism returns out = a[..., perm] (NTT form, any leading shape) as uint32."""
    return np.asarray(a)[..., perm].astype(np.uint32, copy=False)
