"""Batched Galois automorphisms in NTT form (ISA section 3), one Galois element per row.

out[j] = in[ br( ((g (2 br(j) + 1)) mod 2N - 1) / 2 ) ], br = bit reversal on log2 N bits, computed
in the kernel with ``__brev`` (no permutation tables). The permutation does not depend on the
prime. Input and output slots of a row must differ (the kernel gathers from the whole input row).
"""

from __future__ import annotations

from functools import lru_cache

from caramel.backends.cuda.compiler import function, read_cuh
from caramel.backends.cuda.context import COMMON_SRC, CudaRing, cupy, index_array

THREADS = 256


@lru_cache(maxsize=None)
def source() -> str:
    """The CUDA source of ``automorphism``."""
    return COMMON_SRC + read_cuh(__package__, "automorphism.cuh")


def automorphism(ring: CudaRing, arena, in_slots, out_slots, galois) -> None:
    """arena[out_slots[r]] = arena[in_slots[r]] under X -> X^galois[r] (NTT form), for every row r.

    galois: int32 (R,) odd Galois elements in [1, 2N) (``ctx.galois_element(step)`` or
    ``ctx.conjugation_element``). in_slots[r] != out_slots[r] is required.
    """
    ring.check_arena(arena)
    rows = index_array(galois, name="galois").shape[0]
    index_array(in_slots, rows, name="in_slots")
    index_array(out_slots, rows, name="out_slots")
    if rows == 0:
        return
    cp = cupy()
    tiles = max(1, ring.n // 1024)
    threads = min(THREADS, ring.n // 4)
    kernel = function(source(), "automorphism")
    kernel((rows * tiles,), (threads,), (arena, in_slots, out_slots, galois, cp.int32(ring.logn), cp.int32(tiles)))
