"""The inverse transform in one kernel (N >= 8192): both passes' pieces as the blocks of one launch.

Each limb's intermediate is read back from L2 soon after it was written (DRAM sees one read and one write a limb, as
a one-pass transform, while each piece of work stays a short independent tile as in the two kernels). A block of
THREADS threads is one *item*: a row item (THREADS / 32 warp tiles, 32 rows, as the row kernel) of the first pass or
a column tile (32 columns, as the column kernel) of the second. A limb has P row items and Q column tiles. Blocks take
tickets in the order they start (an atomic counter, ctr[0]), and ticket t is item :func:`fused_item`: the first-pass
items of limb k, then the second-pass items of limb k - lag, for k = 0, 1, ... A second-pass item waits (thread 0
spins on ctr[1 + limb]) until the P first-pass items of its limb have stored their tiles; every item it waits for
holds an earlier ticket, so it runs or has run: no deadlock, whatever the residency. The counters reset themselves
(the last ticket zeroes ctr[0], the last of a limb's Q second-pass items its ctr[1 + limb]), so that a zeroed ctr
serves every launch on one stream, replays of a CUDA graph included. A wait longer than FUSED_SPIN_LIMIT sleeps
traps (an error, not a hang). Publication: the P items' stores, a block barrier, then thread 0's fence and atomic
add; the reader's acquire load and a block barrier, then loads through L2. The second pass stores evict-first: its
output should not push out of L2 the intermediates still to be read. A launch finishes its limbs first-first.
"""

from __future__ import annotations

from caramel.backends.cuda.compiler import read_cuh
from caramel.backends.cuda.config import NttConfig
from caramel.backends.cuda.ntt.common import COLS, ROW_LOG, THREADS, fill
from caramel.backends.cuda.ntt.tables import col_smem_words, warp_smem

# The tickets and waits (fused.cuh), then the kernel.
_FUSED = "\n" + read_cuh(__package__, "fused.cuh") + r"""extern "C" __global__ void __launch_bounds__(NTHREADS, {min_blocks}) ntt_inv_fused(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const uint2* __restrict__ tl_all, int* ctr, int rows, int lag) {
    extern __shared__ __align__(16) u32 dyn[];
    __shared__ int ticket;
    constexpr int P = {p}, Q = {q};
    if (threadIdx.x == 0) {
        const int t = atomicAdd(ctr, 1);
        if (t == rows * (P + Q) - 1) atomicExch(ctr, 0);
        else if ((unsigned)t >= rows * (P + Q)) __trap();  // counters not zeroed: an error, not a wild limb
        ticket = t;
    }
    __syncthreads();
    const FusedItem it = fused_item(ticket, rows, lag, P, Q);
    const int L = it.limb, pi = prime_idx[L], out = out_slots[L];
    int* done = ctr + 1 + L;
    if (it.first) {
        ntt_inv_row_tile<false>(dyn, arena, in_slots[L], out, pi, (it.tile * (NTHREADS / 32) + (threadIdx.x >> 5)) * 4, threadIdx.x >> 5, pt, tw_all, tl_all);
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(done, 1);
        }
    } else {
        if (threadIdx.x == 0) fused_wait(done, P, P + Q);
        __syncthreads();
        ntt_inv_col_tile<true>(dyn, arena, out_slots, out_slots, prime_idx, L, it.tile * 32, pt, tw_all);
    }
}
"""


def fused_item(t: int, rows: int, lag: int, p: int, q: int) -> tuple[bool, int, int]:
    """Item (first pass?, limb, tile) of ticket ``t`` in a one-kernel transform of ``rows`` limbs with ``p``
    first-pass and ``q`` second-pass items a limb: step k = 0, 1, ... takes the p first-pass items of limb k
    (k < rows), then the q second-pass items of limb k - d (k >= d), d = min(lag, rows). fused_item in the kernel
    computes the same."""
    d = min(lag, rows)
    if t < p * d:
        return True, t // p, t % p
    t -= p * d
    mid = (rows - d) * (p + q)
    if t < mid:
        k, w = divmod(t, p + q)
        return (True, d + k, w) if w < p else (False, k, w - p)
    t -= mid
    return False, rows - d + t // q, t % q


def fused_items(logn: int) -> tuple[int, int]:
    """(row items, column tiles) of one limb of 2^logn points: the first and second pass's items."""
    return (1 << (logn - ROW_LOG)) // 4 // (THREADS // 32), (1 << ROW_LOG) // COLS


def fused_smem(logn: int, sf: int) -> int:
    """Dynamic shared memory of a block: a column tile and its twiddles, or a row item's warp tiles and tables."""
    return max(4 * col_smem_words(logn - ROW_LOG), warp_smem(THREADS // 32, sf))


def counter_words(rows: int) -> int:
    """int32 words of the counters a one-kernel transform of ``rows`` limbs needs (a ticket and one a limb)."""
    return 1 + rows


def fused_source(logn: int, config: NttConfig) -> str:
    """The kernel ``ntt_inv_fused`` (after the transform module's tiles, :func:`~.transform.transform_source`)."""
    p, q = fused_items(logn)
    return fill(_FUSED, min_blocks=config.fused_min_blocks, p=p, q=q)
