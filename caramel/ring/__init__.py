"""caramel.ring: the pure math layer (NumPy), one concept per module.

primes (the fixed prime list), modular (residue arithmetic), ntt (negacyclic NTT), automorphism (Galois
permutations), modes (rounding modes), basis (base conversion), rescale (`sud`), crt (rsv/mod accumulator
and CRT reconstruction), context (N, primes and cached tables). Formulas are in each function's docstring.
"""

from caramel.ring.automorphism import (
    GALOIS_GENERATOR,
    apply_automorphism,
    automorphism_permutation,
    conjugation_element,
    galois_element,
)
from caramel.ring.basis import BaseConverter
from caramel.ring.context import Context
from caramel.ring.crt import centered, crt_reconstruct, mod_reduce, rsv_accumulate
from caramel.ring.modes import DEFAULT_MODE, Mode
from caramel.ring.modular import add_mod, inv_mod, mul_mod, neg_mod, reduce_mod, sub_mod
from caramel.ring.ntt import NttTable, bit_reverse, intt, ntt, primitive_root_2n
from caramel.ring.primes import PRIMES, is_prime, ntt_primes
from caramel.ring.rescale import sud, sud_lift

__all__ = [
    "DEFAULT_MODE",
    "GALOIS_GENERATOR",
    "PRIMES",
    "BaseConverter",
    "Context",
    "Mode",
    "NttTable",
    "add_mod",
    "apply_automorphism",
    "automorphism_permutation",
    "bit_reverse",
    "centered",
    "conjugation_element",
    "crt_reconstruct",
    "galois_element",
    "intt",
    "inv_mod",
    "is_prime",
    "mod_reduce",
    "mul_mod",
    "neg_mod",
    "ntt",
    "ntt_primes",
    "primitive_root_2n",
    "reduce_mod",
    "rsv_accumulate",
    "sub_mod",
    "sud",
    "sud_lift",
]
