"""The transform kernels: the small transform (N <= 4096), the column and row kernels (N >= 8192), and their launch.

* N <= 4096: one kernel, one block per row, the whole transform in shared memory.
* N >= 8192: two passes. Write the index j = hi * 256 + lo. The *column* pass does the first log2(N) - 8 stages
  (butterflies along hi, 32 columns per block, 256 threads); the *row* pass does the last 8 stages (butterflies along
  lo) in warp tiles (warp_tiles.cuh): each warp owns 4 rows and, after one block barrier, synchronizes with no other
  warp, so that the warps of a multiprocessor drift apart and overlap their loads with others' butterflies. Stage s of
  a 256-point row transform uses twiddle index 2^s (2^a + hi) + i_local, a = log2(N) - 8, i_local < 2^s: from one
  table entry below the split stage, else a row factor times a factor shared by all rows (:mod:`.tables`). The column
  passes read a stage's twiddles from a copy of the prime's first 2^a table entries in shared memory.
  ``intt`` runs the row pass first, then the column pass, which also multiplies by N^-1; by default as one kernel
  (:mod:`.fused`).

Memory order (N >= 8192): the passes read their limbs through L2 only (a column tile copies its data straight into
shared memory with cp.async); the first pass reads the transform's input evict-first where it loads into registers,
and the second pass of two kernels takes the limbs in reverse order, so that it starts on the intermediate the first
pass wrote last, which L2 still holds (read oldest-first, an LRU cache misses throughout). A two-kernel launch
therefore finishes its rows last-first (the backend's :class:`~caramel.target.Target` tells the planner); the
one-kernel inverse finishes them first-first. The passes store evict-last (store16), so that the kernel that reads
their output next finds more of it in L2 while other streams' kernels stream through it.

Rows are independent; each block reads its whole tile before writing it, so ``in_slot == out_slot`` (in place)
works. Output slots must not be read by another row of the same launch.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from caramel.backends.cuda.compiler import function
from caramel.backends.cuda.config import KernelConfig, NttConfig
from caramel.backends.cuda.context import CudaRing, cupy, index_array
from caramel.backends.cuda.ntt.common import COLS, ROW_LOG, THREADS, fill, header, pass_calls, ring_lazy
from caramel.backends.cuda.ntt.fused import counter_words, fused_items, fused_smem, fused_source
from caramel.backends.cuda.ntt.tables import col_smem_words, split_stage, warp_smem, warp_tables

_SMALL = r"""
extern "C" __global__ void __launch_bounds__(256) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all) {
    __shared__ u32 sm[NN];
    const int r = blockIdx.x;
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const uint2* tw = tw_all + (u64)pi * NN;
    const u32* src = arena + (u64)in_slots[r] * NN;
    u32* dst = arena + (u64)out_slots[r] * NN;
    for (int i = threadIdx.x; i < NN; i += blockDim.x) sm[i] = src[i];
    __syncthreads();
{passes}
    __syncthreads();
{store}
}
"""

_SMALL_FWD_STORE = """    const u32 m32 = prime_m32(pt, pi);
    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = fwd_final(sm[i], q, two_q, m32);"""
_SMALL_INV_STORE = """    const u32 ni = __ldg(pt + 8 * pi + 2), nip = __ldg(pt + 8 * pi + 3);
    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = shoup(sm[i], ni, nip, q);"""

_COL = r"""
// One column tile of {name}: the 32 columns c0 .. c0 + 31 of row r (limb in_slots[r] -> limb out_slots[r], prime
// prime_idx[r]); 2^A_BITS points a column, all NTHREADS threads of the block (sm: COL_SMEM words, the tile's 32 <<
// A_BITS, then its prime's column twiddles, col_twiddles). CS_OUT: stores evict-first.
template <bool CS_OUT>
__device__ __forceinline__ void {name}_tile(u32* sm, u32* arena, const int* __restrict__ in_slots,
                                            const int* __restrict__ out_slots, const int* __restrict__ prime_idx,
                                            int r, int c0, const u32* __restrict__ pt,
                                            const uint2* __restrict__ tw_all) {
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const uint2* tw = col_twiddles((uint2*)(sm + (32 << A_BITS)), tw_all + (u64)pi * NN);
    const u32* src = arena + (u64)in_slots[r] * NN + c0;
    u32* dst = arena + (u64)out_slots[r] * NN + c0;
    // 16-byte copies straight to shared memory (cp.async through L2 only), all issued before the first use
    // (blockDim.x == NTHREADS). Element e = it NTHREADS + threadIdx.x of the tile: 16 bytes of row e / 8, at sm + 4 e.
    const u32* g = src + ((threadIdx.x >> 3) << (LOGN - A_BITS)) + (threadIdx.x & 7) * 4;
#pragma unroll
    for (int it = 0; it < (8 << A_BITS) / NTHREADS; ++it)
        cp_async16(sm + 4 * (it * NTHREADS + threadIdx.x), g + ((it * NTHREADS / 8) << (LOGN - A_BITS)));
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
{passes}
    __syncthreads();
    const u32 ni = __ldg(pt + 8 * pi + 2), nip = __ldg(pt + 8 * pi + 3);
    (void)ni; (void)nip;
#pragma unroll
    for (int it = 0; it < (8 << A_BITS) / NTHREADS; ++it) {
        const int e = it * NTHREADS + threadIdx.x;
        uint4 v = *(const uint4*)(sm + e * 4);
{finish}        store16<CS_OUT>((uint4*)(dst + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4), v);
    }
}

extern "C" __global__ void __launch_bounds__(NTHREADS{bound}) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all) {
    __shared__ __align__(16) u32 sm[COL_SMEM];
    constexpr int TILES = (1 << (LOGN - A_BITS)) / 32;
    const int r0 = blockIdx.x / TILES;
    const int r = {row};
    {name}_tile<false>(sm, arena, in_slots, out_slots, prime_idx, r, (blockIdx.x % TILES) * 32, pt, tw_all);
}
"""

_COL_INV_FINISH = "".join(f"        v.{c} = shoup(v.{c}, ni, nip, q);\n" for c in "xyzw")

# Row kernel with warp tiles: warp tile t = blockIdx.x * WARPS + warp is rows 4 (t mod TILES) ..
# + 3 of limb t / TILES (WARPS divides TILES, so a block is one limb and one prime). Dynamic shared memory:
# the block's table tl (a copy of the prime's split-factor table, see warp_tables), then per warp its 4 rows
# (4 WPITCH words) and its table wt of WT entries: the one-product twiddles of stages s < SFT of its rows
# (tw[(bt0 << s) .. + 4 2^s), a contiguous range, at wt[4 (2^s - 1)]) and the row factors tw[(bt0 + x) << s]
# of the split stages s >= SF (at wt[4 (2^SFT - 1) + 4 (s - SF) + x]). A warp issues its 16-byte data loads, then
# the copies of both tables (cp.async, no registers), so that every twiddle read of the passes is a shared-memory
# read and all global reads are in flight at once; one block barrier, then the two passes and the stores with
# only __syncwarp: the warps drift apart, so that on a multiprocessor some load while others compute.
_ROW = r"""
// The warp tile of warp `warp` of {name}: rows hi0 .. hi0 + 3 of limb in_slot (prime pi) -> limb out_slot, the
// block's table tl and the warp's tile at dyn (see above; every thread of the block copies tl). CS_OUT: stores
// evict-first.
template <bool CS_OUT>
__device__ __forceinline__ void {name}_tile(u32* dyn, u32* arena, int in_slot, int out_slot, int pi, int hi0,
                                            int warp, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
                                            const uint2* __restrict__ tl_all) {
    constexpr int SF = {sf}, SFT = {sft}, WT = 4 * ((1 << SFT) - 1) + 4 * (8 - SF);
    uint2* tl = (uint2*)dyn;
    const int lane = threadIdx.x & 31;
    const int bt0 = (1 << A_BITS) + hi0;
    PRIME_CONSTANTS(pt, pi);
    const u32 m32 = prime_m32(pt, pi);  // for fwd_final (forward)
    (void)m32;
    const uint2* tw = tw_all + (u64)pi * NN;
    u32* sm = dyn + 480 + warp * (4 * WPITCH + 2 * WT);
    uint2* wt = (uint2*)(sm + 4 * WPITCH);
    const uint4* src = (const uint4*)(arena + (u64)in_slot * NN + hi0 * 256);
    uint4* dst = (uint4*)(arena + (u64)out_slot * NN + hi0 * 256);
    uint4 y[8];
    wtile_load<{first}>(src, y, lane);
    if (SF < 8)
        for (int c = threadIdx.x; c < 120; c += blockDim.x) cp_async16(tl + 2 * c, TABLE_ROW(tl_all, pi, WT) + 2 * c);
    wtile_table<WT>(wt, WARP_TABLE(tl_all, pi, hi0 / 4, WT), lane);
    cp_async_commit();
    wtile_store(sm, y, lane);
    cp_async_wait<0>();
    __syncthreads();
{passes}
    __syncwarp();
#pragma unroll
    for (int it = 0; it < 8; ++it) {
        uint4 v = *(const uint4*)(sm + wsidx(it >> 1, ((it & 1) * 32 + lane) * 4));
{finish}
        store16<CS_OUT>(dst + it * 32 + lane, v);
    }
}

extern "C" __global__ void __launch_bounds__(32 * WARPS, 32 / WARPS) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const uint2* __restrict__ tl_all) {
    extern __shared__ __align__(16) u32 dyn[];
    constexpr int TILES = (1 << A_BITS) / 4;
    const int warp = threadIdx.x >> 5;
    const int t = blockIdx.x * WARPS + warp;
    const int r0 = t / TILES;
    const int r = {row};
    {name}_tile<false>(dyn, arena, in_slots[r], out_slots[r], prime_idx[r], (t % TILES) * 4, warp, pt, tw_all,
                       tl_all);
}
"""

_ROW_FWD_FINISH = "\n".join(f"        v.{c} = fwd_final(v.{c}, q, two_q, m32);" for c in "xyzw")


def row_passes(inverse: bool, sf: int) -> str:
    """The two passes of a warp tile (pass A = stages 0-3, B = 4-7; reversed for the inverse)."""
    inv = "true" if inverse else "false"
    calls = [f"    wpass<{s0}, {inv}, {sf}, {min(sf, 6)}>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q);"
             for s0 in (0, 4)]
    return "\n    __syncwarp();\n".join(calls[::-1] if inverse else calls)


def kernel_names(logn: int) -> tuple[str, ...]:
    """The kernels of :func:`transform_source`'s module for N = 2^logn."""
    if logn <= 12:
        return "ntt_fwd", "ntt_inv"
    return "ntt_fwd_col", "ntt_fwd_row", "ntt_inv_row", "ntt_inv_col", "ntt_inv_fused"


@lru_cache(maxsize=None)
def transform_source(logn: int, lazy: bool, config: NttConfig = NttConfig()) -> str:
    """CUDA source of the transform kernels for N = 2^logn: ``ntt_fwd`` and ``ntt_inv`` (N <= 4096), else the column
    kernels ``ntt_{fwd,inv}_col``, the row kernels ``ntt_{fwd,inv}_row`` and ``ntt_inv_fused`` (:mod:`.fused`).
    ``lazy``: :func:`~.common.ring_lazy` of the ring."""
    if logn <= 12:
        kernels = fill(_SMALL, name="ntt_fwd", passes=pass_calls(logn, 1, 0, False, True), store=_SMALL_FWD_STORE) + \
            fill(_SMALL, name="ntt_inv", passes=pass_calls(logn, 1, 0, True), store=_SMALL_INV_STORE)
        return header(logn, logn, lazy) + kernels
    a = logn - ROW_LOG
    if (1 << a) // 4 % config.warps:
        raise ValueError(f"{config.warps} warps a block do not divide the warp tiles of a limb")
    parts = [f"#define WARPS {config.warps}\n#define NTHREADS {THREADS}\n#define COL_SMEM {col_smem_words(a)}  "
             "// words of a column tile and its twiddles (col_smem_words, col_twiddles)\n"]
    for d, inverse in (("fwd", False), ("inv", True)):
        # The second pass (the forward row kernel, the inverse column kernel) takes the limbs last-written first.
        second = "gridDim.x / TILES - 1 - r0" if inverse else "gridDim.x * WARPS / TILES - 1 - r0"
        col = fill(_COL, name=f"ntt_{d}_col", passes=pass_calls(a, COLS, 1, inverse, not inverse),
                   row=second if inverse else "r0", finish=_COL_INV_FINISH if inverse else "",
                   bound=f", {config.col_min_blocks}" if config.col_min_blocks and not inverse else "")
        sf = split_stage(config.split_from[inverse])
        row = fill(_ROW, name=f"ntt_{d}_row", sf=sf, sft=min(sf, 6), passes=row_passes(inverse, sf),
                   row="r0" if inverse else second, first="true" if inverse else "false",
                   finish="" if inverse else _ROW_FWD_FINISH)
        parts += [col, row] if not inverse else [row, col]
    return header(logn, a, lazy) + "".join(parts) + fused_source(logn, config)


def launch(ring: CudaRing, arena, in_slots, out_slots, prime_idx, inverse: bool, kernels: KernelConfig | None = None,
           *, only_row: bool = False, half: bool = False, counters=None) -> None:
    """Launch the NTT (or INTT) of rows ``prime_idx`` (int32 device arrays of length R, as :func:`ntt`) under
    ``kernels`` (default ``KernelConfig()``). ``only_row`` (forward, N >= 8192): the row kernel alone, in place on
    ``out_slots`` (a prologue kernel did the column pass, :mod:`.prologue`). ``half`` (forward): the column kernel
    alone when N >= 8192 (its readers run the row pass in their loads, :mod:`.epilogue`), the whole transform below.
    The inverse at N >= 8192 runs as one kernel (:mod:`.fused`) with ``counters`` (a zeroed int32 device array of at
    least counter_words(R) words that no other launch uses at the same time; it is left zeroed) or, when None, fresh
    ones on the current stream (not while it is being captured: then the two kernels run)."""
    config = (kernels or KernelConfig()).ntt
    ring.check_arena(arena)
    rows = index_array(prime_idx, name="prime_idx").shape[0]
    index_array(in_slots, rows, name="in_slots")
    index_array(out_slots, rows, name="out_slots")
    if rows == 0:
        return
    if only_row and (inverse or ring.logn <= 12):
        raise ValueError("only_row is the second pass of a forward NTT with N >= 8192")
    if half and (inverse or only_row):
        raise ValueError("half is the first pass of a forward NTT")
    source = transform_source(ring.logn, ring_lazy(ring), config)
    sf = split_stage(config.split_from[inverse])  # the row passes' first split stage
    tw = ring.twiddles[1 if inverse else 0]
    pt = ring.prime_table

    def run(name, src, dst, blocks_per_row):
        k = function(source, name)
        if name.endswith("_row"):  # blocks_per_row: warp tiles
            smem = warp_smem(config.warps, sf)
            if k.max_dynamic_shared_size_bytes < smem:
                k.max_dynamic_shared_size_bytes = smem
            k((rows * blocks_per_row // config.warps,), (32 * config.warps,),
              (arena, src, dst, prime_idx, pt, tw, warp_tables(ring, inverse, sf)), shared_mem=smem)
        else:
            k((rows * blocks_per_row,), (THREADS,), (arena, src, dst, prime_idx, pt, tw))

    if ring.logn <= 12:
        run("ntt_inv" if inverse else "ntt_fwd", in_slots, out_slots, 1)
        return
    col_blocks, row_tiles = (1 << ROW_LOG) // COLS, (1 << (ring.logn - ROW_LOG)) // 4
    if not inverse:
        if not only_row:
            run("ntt_fwd_col", in_slots, out_slots, col_blocks)
        if not half:
            run("ntt_fwd_row", out_slots, out_slots, row_tiles)
        return
    if counters is None and not cupy().cuda.get_current_stream().is_capturing():
        counters = cupy().zeros(counter_words(rows), dtype=np.int32)
    if counters is None:
        run("ntt_inv_row", in_slots, out_slots, row_tiles)
        run("ntt_inv_col", out_slots, out_slots, col_blocks)
        return
    index_array(counters, name="counters")
    if counters.shape[0] < counter_words(rows):
        raise ValueError(f"counters: {counters.shape[0]} words, {counter_words(rows)} needed")
    k = function(source, "ntt_inv_fused")
    smem = fused_smem(ring.logn, sf)
    if k.max_dynamic_shared_size_bytes < smem:
        k.max_dynamic_shared_size_bytes = smem
    k((rows * sum(fused_items(ring.logn)),), (THREADS,),
      (arena, in_slots, out_slots, prime_idx, pt, tw, warp_tables(ring, inverse, sf), counters, np.int32(rows),
       np.int32(config.fused_lag)), shared_mem=smem)


def ntt(ring: CudaRing, arena, in_slots, out_slots, prime_idx, half: bool = False,
        kernels: KernelConfig | None = None) -> None:
    """Forward NTT: arena[out_slots[r]] = NTT_{q_p}(arena[in_slots[r]]) with p = prime_idx[r]; ``half``: the column
    pass alone when N >= 8192 (its readers are epilogue kernels).

    ``ntt`` maps coefficients a_0..a_{N-1} to A[j] = sum_i a_i psi^((2 br(j) + 1) i) mod q (bit-reversed output;
    ISA.md section 3). All index arguments are int32 cupy arrays of length R. Launches on the current stream.
    """
    launch(ring, arena, in_slots, out_slots, prime_idx, False, kernels, half=half)


def intt(ring: CudaRing, arena, in_slots, out_slots, prime_idx, counters=None,
         kernels: KernelConfig | None = None) -> None:
    """Inverse NTT (exact inverse of :func:`ntt`, N^-1 included), same arguments; ``counters``: see :func:`launch`
    (a CUDA graph needs them)."""
    launch(ring, arena, in_slots, out_slots, prime_idx, True, kernels, counters=counters)
