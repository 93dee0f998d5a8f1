"""Batched Galois automorphisms in NTT form (ISA section 3), one Galois element per row.

out[j] = in[ br( ((g (2 br(j) + 1)) mod 2N - 1) / 2 ) ], br = bit reversal on log2 N bits, computed
in the kernel with ``__brev`` (no permutation tables). The permutation does not depend on the
prime. Input and output slots of a row must differ (the kernel gathers from the whole input row).
"""

from __future__ import annotations

from caramel.backends.cuda.context import CudaRing, cupy, index_array

THREADS = 256


def _source() -> str:
    return r"""
// A block of B = min(256, N) consecutive outputs reads exactly one aligned block of B inputs (the
// varying low bits of j become the high bits of g (2 br(j) + 1) mod 2N, hence the low bits of the
// source index), so the block stages that input block in shared memory with coalesced loads.
extern "C" __global__ void __launch_bounds__(256) automorphism(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ galois, int logn, int tiles) {
    __shared__ u32 sm[256];
    const int r = blockIdx.x / tiles;
    const u32 j = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    const u32 n = 1u << logn;
    const u32 g = (u32)galois[r];
    const u32 bj = __brev(j) >> (32 - logn);
    // (g (2 br(j) + 1)) mod 2N; 2N divides 2^32, so the wrapped 32-bit product is exact mod 2N.
    const u32 e = (g * (2u * bj + 1u)) & (2u * n - 1u);
    const u32 src = __brev((e - 1u) >> 1) >> (32 - logn);
    const u32 base = src & ~(blockDim.x - 1u);
    sm[threadIdx.x] = arena[(u64)in_slots[r] * n + base + threadIdx.x];
    __syncthreads();
    arena[(u64)out_slots[r] * n + j] = sm[src - base];
}
"""


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
    threads = min(THREADS, ring.n)
    tiles = ring.n // threads
    kernel = ring.kernel("automorphism", _source, "automorphism")
    kernel((rows * tiles,), (threads,), (arena, in_slots, out_slots, galois, cp.int32(ring.logn), cp.int32(tiles)))
