"""Batched negacyclic NTT and INTT over arena rows, one prime per row.

Convention (ISA.md section 3, SEAL's Harvey NTT): ``ntt`` maps coefficients a_0..a_{N-1} to
A[j] = sum_i a_i psi^((2 br(j) + 1) i) mod q (bit-reversed output); ``intt`` is its exact inverse
(N^-1 included). Inputs and outputs are canonical residues.

Algorithm: the radix-2 Cooley-Tukey loop with psi powers in bit-reversed order (stage m = 2^s uses
``psi^br(m + i)`` for group i; Gentleman-Sande with the inverse powers for ``intt``), with Harvey's
lazy butterflies (values in [0, 4q) forward, [0, 2q) inverse) and Shoup twiddle products. With
LAZY and primes below 2^28 the forward butterflies reduce only at the first stage of each pass
(values below 16q <= 2^32; see ct_bfly_lazy), none in the transform's first pass (canonical inputs: CANON), and the
inverse butterflies only where a value's bound, known at compile time, requires it (LAZY_INV; see gs_sum_diff).
Data is staged in shared memory; stages run in passes of up to RADIX_LOG (4) stages held in
registers (16 points per virtual thread; the thesis' scheme is 3 stages, 8 points), with a
__syncthreads between passes (a __syncwarp in the warp-tile row kernels). Conditional subtractions
are an add and an unsigned min (csub); 2q, 4q and 8q are read from the prime table, so that x + 2q - t is one add
and the lazy reduction by 8q one fused add-and-min (built from 2q, the compiler makes it a multiply-add and a min).

* N <= 4096: one kernel, one block per row, the whole transform in shared memory.
* N >= 8192: two kernels. Write the index j = hi * 256 + lo. The "column" kernel does the first
  log2(N) - 8 stages (butterflies along hi, 32 columns per block, 256 threads); the "row" kernel
  does the last 8 stages (butterflies along lo). Stage s of a 256-point row transform uses twiddle index
  2^s (2^a + hi) + i_local, a = log2(N) - 8, i_local < 2^s; the row kernel takes it as the product
  of tw[2^s (2^a + hi)] (one per row and stage) and tw[i_local] (shared by all rows):
  psi^br(x + y) = psi^br(x) psi^br(y) when x and y have no common bit. Stages below SPLIT_FROM
  read the one table entry instead (one product). The row kernel is _ROWW: each warp owns 4 rows and,
  after one block barrier, synchronizes with no other warp, so that the warps of a multiprocessor
  drift apart and overlap their loads with others' butterflies; its one-product twiddles and row
  factors come from a per-warp table and the split factors from a per-block table in shared memory
  (laid out so that lanes read consecutive entries or broadcasts), copied with cp.async beside the
  data loads from one device array a ring and direction (warp_tables: a prime's split factors, then every warp
  tile's table as one contiguous range, so that the copy needs no index arithmetic). The column passes read a
  stage's twiddles from one base pointer into a copy of the prime's first 2^(log2(N) - 8) table entries in shared
  memory (col_twiddles, COL_SMEM_TW), made by the tile's threads beside its data loads.
  ``intt`` runs the row kernel first, then the column kernel, which also multiplies by N^-1.

Memory order (N >= 8192): the two passes read their limbs through L2 only (LOAD_CG; a column tile copies its data
straight into shared memory, COL_ASYNC); the first pass reads the transform's input evict-first (FIRST_CS, where it
loads into registers), and the second pass takes the limbs in reverse order
(SECOND_REVERSED), so that it starts on the intermediate the first pass wrote last, which L2 still holds
(read oldest-first, an LRU cache misses throughout). A two-kernel launch therefore finishes its rows last-first
(:mod:`caramel.plan.order` counts on this); a fused one (below) finishes them first-first. The passes store evict-last
(EVICT_LAST, store16; a fused transform's last pass evict-first, FUSED_CS), so that the kernel that reads their output
next finds more of it in L2 while other streams' kernels stream through it.

Rows are independent; each block reads its whole tile before writing it, so ``in_slot == out_slot``
(in place) works. Output slots must not be read by another row of the same launch.

One kernel (N >= 8192, FUSED; by default the inverse only): the two passes' pieces (column tiles, row items of 8 warp
tiles) are the blocks of one launch, taken in the order blocks start, a limb's second pass 48 limbs (FUSED_LAG) behind
its first and waiting on a per-limb counter (_FUSED, fused_item); the intermediate is read back from L2.

Epilogues (N >= 8192): a *half* forward NTT (``_launch(half=True)``, ``ntt(half=True)``) runs the column kernel
only; the elementwise kernel that reads its output (``FusedProgram.transformed``) runs the row pass of its tile
in its load (:data:`_EPILOGUE`), so that the transform's output is never written in full and read back.
"""

from __future__ import annotations

import weakref

import numpy as np

from caramel.backends.cuda.context import CudaRing, cupy, index_array

THREADS = 256  # threads a block of the column kernels and the one-kernel transforms
COLS = 32  # columns per block in the column kernel
RADIX_LOG = 4  # stages per pass held in registers (2^RADIX_LOG points per virtual thread)
ROW_LOG = 8  # log2 of the row length
# Configurations compared in docs/PERFORMANCE.md (scripts/gpu_variants.py).
#: Row kernels: stages s < SPLIT_FROM (forward, inverse) read the whole twiddle from the table (one product),
#: later ones a row factor times a factor shared by all rows (see warp_split_from).
SPLIT_FROM = (5, 5)
LAZY = True  # forward butterflies reduce once per pass (28-bit primes: values stay below 16q)
#: With LAZY, the inverse butterflies reduce only where a value's bound, known at compile time, requires it (see
#: gs_sum_diff): 12 conditional subtractions a pass of 16 values where one a butterfly took 32.
LAZY_INV = True
WARPS = 4  # warps a block of the warp-tile row kernels (a divisor of 2^(log2(N) - 10))
#: The warp tiles' layout (see wsidx): 16-byte chunks XOR-swizzled within each row, rows 272 words apart (on), or
#: 4 words of padding after every 16 points, rows 336 words apart (off: session 8's layout, a fifth larger).
TILE_SWIZZLE = True
LOAD_CG = True  # data loads of the column and row kernels through L2 only (ld.global.cg; see LOAD16)
FIRST_CS = True  # the first pass reads its input evict-first (ld.global.cs; see LOAD_FIRST)
SECOND_REVERSED = True  # the second pass takes the limbs last-written first (see SECOND_REVERSED in _SRC)
#: Resident blocks a multiprocessor asked of an epilogue kernel's __launch_bounds__, in order: it takes the first
#: under which it compiles without spilling (no local memory), else the last (see elementwise.fused).
EPILOGUE_MIN_BLOCKS = (4, 3, 2)
EPILOGUE_WARPS = 8  # warps a block of the epilogue kernels (one or two row passes each)
EPILOGUE_MAX = 2 * EPILOGUE_WARPS  # transformed operands an epilogue kernel takes at most
EPILOGUE_APART = True  # each group of an epilogue block evaluates its program with its own warps (see _EPILOGUE)
#: The first split stage of the epilogue kernels' row passes (as SPLIT_FROM's forward entry for the row kernel).
EPILOGUE_SPLIT_FROM = 5
#: With one group a block (F >= 5 transformed operands), the plain operands are copied into shared memory (cp.async)
#: while the row passes run, as many as fit beside the row passes' tiles (see epilogue_staged).
EPILOGUE_STAGE = True
#: With one group a block and at least this many transformed operands, the epilogue kernels evaluate their program
#: one residue a thread at a time (_EVAL_SCALAR): fewer registers than 4 a thread (16-byte words), for the launch
#: bounds of more resident blocks (EPILOGUE_MAX + 1: never).
EPILOGUE_SCALAR_FROM = 5
#: With one group a block, its 2 F row pairs' passes are dealt over the warps (F = 12: 3 a warp), not its F row
#: passes (F = 12: 2 or 1 a warp, 4 or 2 row pairs).
EPILOGUE_BALANCE = True
SMEM_SM = 228 * 1024  # shared memory of a multiprocessor (H100, H200); each resident block also reserves 1 KiB
#: N >= 8192, (forward, inverse): a whole transform is one kernel whose column tiles and row items interleave
#: (_FUSED), not two kernels.
FUSED = (False, True)
#: Limbs by which a fused transform's second pass trails its first (see fused_item): the intermediates of about
#: that many limbs wait in L2.
FUSED_LAG = 48
FUSED_MIN_BLOCKS = 4  # the fused kernels' launch bound: resident blocks a multiprocessor (64 registers)
FUSED_CS = True  # the fused kernels' last pass stores evict-first (store16)
#: The column and row passes' stores that are not evict-first (FUSED_CS) are evict-last in L2 (see store16).
EVICT_LAST = True
#: The column passes read their twiddles from a copy in shared memory (col_twiddles), not through L1.
COL_SMEM_TW = True
#: (forward, inverse): the column tiles copy their data straight into shared memory (cp.async through L2 only:
#: col_load), where 16-byte loads into registers and stores to shared memory took twice the memory instructions and 32
#: registers a thread while the loads were in flight: +8% batched NTT, -1.4% replay time on an H200 (session 21). The
#: inverse's column pass, which reads the intermediate from L2, ran its batched INTT 1.6% faster without (False); the
#: replay of that mix is not measured yet, so both directions copy (the configuration the device tests passed).
COL_ASYNC = (True, True)
#: Resident blocks a multiprocessor the forward column kernel's launch bounds ask (0: none): 6 keeps it at 40 registers
#: (with COL_SMEM_TW the compiler otherwise holds a pass's twiddles in 62). The inverse column kernel (no bound: 40
#: registers, 59 before the column tiles' addresses of session 21) and the prologue column kernel keep theirs.
COL_MIN_BLOCKS = 6
PRO_LIMB_MAJOR = True  # the prologue column kernel of a lift or mod load runs limb by limb (see LIMB_MAJOR in _COL_PRO)

_SRC = r"""
#define LOGN {logn}
#define NN (1 << LOGN)
#define A_BITS {a_bits}
#define WARPS {warps}
#define LAZY {lazy}
#define LAZY_INV ({lazy_inv} && LAZY)
#define TW_FAKE {tw_fake}
#define COL_SMEM {col_smem}  // words of a column tile and its twiddles (col_smem_words, col_twiddles)
// TW_FAKE (timing only, wrong results): every twiddle a constant, no twiddle loads or addresses.
#define TWLD(p) (TW_FAKE ? make_uint2(0x1234567u, 0x89abcdu) : __ldg(p))
#define NTHREADS {threads}
#define LOAD_CG {load_cg}
// The data loads of the column and row kernels: through L2 only (LOAD_CG: ld.global.cg, the limb is read once,
// so it takes no L1 lines from the twiddles), or plain.
#define LOAD16(p) (LOAD_CG ? __ldcg(p) : *(p))
// The first pass's loads of the transform's input (the forward column kernel, the inverse row kernel): with
// FIRST_CS, ld.global.cs (evict first: read once, so that L2 keeps the intermediate the first pass writes).
#define FIRST_CS {first_cs}
#define LOAD_FIRST(p) (FIRST_CS ? __ldcs(p) : LOAD16(p))
// SECOND_REVERSED: the second pass (the forward row kernel, the inverse column kernel) takes the limbs in
// reverse order, the last written first, while they are still in L2 (an LRU cache read oldest-first misses
// throughout).
#define SECOND_REVERSED {second_reversed}

// The constants of prime pi that the butterflies read from the prime table pt: q, 2q, 4q and 8q (see the docstring;
// 4q serves the lazy inverse butterflies alone, 8q both lazy directions).
#define PRIME_CONSTANTS(pt, pi) \
    const u32 q = prime_q(pt, pi), two_q = __ldg(pt + 8 * (pi) + 1), four_q = __ldg(pt + 8 * (pi) + 7), \
              eight_q = __ldg(pt + 8 * (pi) + 6); \
    (void)four_q; (void)eight_q

// x - c if x >= c, else x (0 < c < 2^32): min(x, x - c) as unsigned (x - c wraps above x when x < c);
// two instructions (add, min) where the compare-and-select form takes three.
__device__ __forceinline__ u32 csub(u32 x, u32 c) {{ return min(x, x - c); }}

// Forward Cooley-Tukey butterfly, Harvey lazy: x, y in [0, 4q) -> [0, 4q); t = y * w in [0, 2q).
__device__ __forceinline__ void ct_bfly(u32& x, u32& y, u32 t, u32 two_q) {{
    x = csub(x, two_q);
    y = x + two_q - t;
    x = x + t;
}}

// LAZY forward butterfly (q < 2^28, so 16q <= 2^32): values of a pass stay below 16q. The first
// stage of a pass (RED) brings x from [0, 16q) to [0, 8q); each stage adds at most 2q (t < 2q):
// after the 4 stages of a pass, x, y < 8q + 4 * 2q = 16q. Inputs < 16q, outputs < 16q.
template <bool RED>
__device__ __forceinline__ void ct_bfly_lazy(u32& x, u32& y, u32 t, u32 two_q, u32 eight_q) {{
    if (RED) x = csub(x, eight_q);  // 8q from the prime table: one fused add-and-min (4 two_q took a multiply-add)
    y = x + two_q - t;
    x = x + t;
}}

// Inverse (Gentleman-Sande) butterfly at stage dd of a pass (RADIX_LOG or fewer stages; the pair k, k + 2^dd):
// x <- x + y and y <- x - y + c, the difference that the caller multiplies by the twiddle (a Shoup product: below 2q).
// Not LAZY_INV: values below 2q, the sum reduced every stage (c = 2q). LAZY_INV (q < 2^28, so 16q < 2^32): the bound of
// every value, in multiples of q, is known at compile time (inv_bound; k and dd are constants once unrolled): a pass's
// inputs are below INV_IN q; after stage j, position k holds a Shoup product (below 2q) if bit j of k is set, else the
// sum of two values with the stage's input bound b (below 2b q). Before a stage whose sum could pass 16q, its inputs
// are brought below 8q (a conditional subtraction of 8q each); c is the inputs' bound times q, so that the difference
// is positive and below 16q. gs_pass_end brings a pass's outputs below INV_IN q for the next pass (the INTT's last
// pass skips it: the product by N^-1 takes any input below 2^32). A pass of 4 stages and 16 values then reduces 12
// times (2 before its third stage, 6 at its end) instead of 32.
#define INV_IN 4
// That bound before stage dd (< 5): from the last stage j < dd whose product position k holds (the highest set bit of
// k's low dd bits), 2 doubled at each later stage, or with none INV_IN doubled at each stage; at most 16 (the inputs
// of a stage with bound 16 are brought to 8 first). A closed form, so that the compiler folds it.
__host__ __device__ constexpr int inv_bound(int k, int dd) {{
    const int low = k & ((1 << dd) - 1);
    const int last = low >= 8 ? 3 : low >= 4 ? 2 : low >= 2 ? 1 : 0;  // the highest set bit of low (low > 0)
    const int b = low == 0 ? INV_IN << dd : 2 << (dd - 1 - last);
    return b > 16 ? 16 : b;
}}
__device__ __forceinline__ void gs_sum_diff(u32& x, u32& y, int k, int dd, u32 two_q, u32 four_q, u32 eight_q) {{
    if (!LAZY_INV) {{
        const u32 sum = csub(x + y, two_q);
        y = x + two_q - y;
        x = sum;
        return;
    }}
    const int b = inv_bound(k, dd);
    if (b > 8) {{
        x = csub(x, eight_q);
        y = csub(y, eight_q);
    }}
    const u32 c = b <= 2 ? two_q : b == 4 ? four_q : eight_q;
    const u32 sum = x + y;
    y = x + c - y;
    x = sum;
}}
__device__ __forceinline__ u32 gs_pass_end(u32 x, int k, int stages, u32 four_q, u32 eight_q) {{
    if (LAZY_INV && inv_bound(k, stages) > 8) x = csub(x, eight_q);
    if (LAZY_INV && inv_bound(k, stages) > 4) x = csub(x, four_q);
    return x;
}}

// a * W mod q in [0, 2q) for the twiddle W = tw[(bt << s) + il] (a Shoup product); SMEM: tw is in shared memory.
template <bool SMEM>
__device__ __forceinline__ u32 tw_mul(u32 a, const uint2* __restrict__ tw, int bt, int s, int il, u32 q) {{
    const uint2 w = SMEM && !TW_FAKE ? tw[(bt << s) + il] : TWLD(tw + (bt << s) + il);
    return shoup_lazy(a, w.x, w.y, q);
}}

// The column stages' twiddles tw[0 .. 2^A_BITS) of one prime (every index a column pass reads, see ntt_pass) copied
// to tws in shared memory, one entry a thread; the block barrier after the tile's data loads publishes them. A warp's
// lanes are columns of one sub-transform, so every twiddle read is a broadcast from shared memory, where a read
// through L1 took a 64-bit address and a longer wait.
// (COL_SMEM_TW off: the table in global memory, read through L1.)
#define COL_SMEM_TW {col_smem_tw}
__device__ __forceinline__ const uint2* col_twiddles(uint2* tws, const uint2* __restrict__ tw) {{
    if (!COL_SMEM_TW) return tw;
    for (int i = threadIdx.x; i < (1 << A_BITS); i += blockDim.x) tws[i] = __ldg(tw + i);
    return tws;
}}

// Shared-memory position of point p of sub-transform `sub`.
// MODE 0: one transform (p). MODE 1: 32 columns, column-minor (bank = column).
template <int MODE>
__device__ __forceinline__ int sidx(int sub, int p) {{
    return MODE == 0 ? p : p * 32 + sub;
}}

// Stages S0 .. S0+R-1 of G independent 2^LOGM-point sub-transforms held in shared memory (the
// one-kernel transform: G = 1, MODE 0; the column kernel: G = 32 columns, MODE 1).
// Virtual thread u of a sub-transform owns points base + k*T (k < 2^R); stage S0+d pairs k and
// k + 2^(R-1-d) with group index i_local = g*2^d + (k >> (R-d)) and twiddle 2^s + i_local of the
// table tw, read through L1 (a warp reads one or a few contiguous twiddles) from one base pointer
// tw + (g << d) a stage and a constant offset each.
// CANON (forward, the transform's first pass): the inputs are canonical, so its first stage needs no reduction (after
// R <= 4 stages the values stay below q + 2q R <= 9q, as the next pass's reduction expects: below 16q).
template <int LOGM, int G, int MODE, int S0, int R, bool INV, bool CANON = false>
__device__ __forceinline__ void ntt_pass(u32* sm, const uint2* __restrict__ tw, u32 q, u32 two_q, u32 four_q,
                                         u32 eight_q) {{
    constexpr int LOGT = LOGM - S0 - R;
    constexpr int T = 1 << LOGT;
    constexpr int NV = 1 << (LOGM - R);
    for (int item = threadIdx.x; item < NV * G; item += blockDim.x) {{
        int sub, u;
        if (MODE == 1) {{
            sub = item % G; u = item / G;
        }} else {{
            u = item % NV; sub = item / NV;
        }}
        const int off = u & (T - 1);
        const int g = u >> LOGT;
        const int base = (g << (LOGT + R)) + off;
        u32 v[1 << R];
#pragma unroll
        for (int k = 0; k < (1 << R); ++k) v[k] = sm[sidx<MODE>(sub, base + k * T)];
#pragma unroll
        for (int dd = 0; dd < R; ++dd) {{
            const int d = INV ? R - 1 - dd : dd;
            const int half = 1 << (R - 1 - d);
            const int s = S0 + d;
            const uint2* __restrict__ twg = tw + (g << d);
#pragma unroll
            for (int k = 0; k < (1 << R); ++k) {{
                if (k & half) continue;
                const int il = k >> (R - d);
                if (INV) {{
                    u32 x = v[k], y = v[k + half];
                    gs_sum_diff(x, y, k, dd, two_q, four_q, eight_q);
                    v[k + half] = tw_mul<MODE == 1 && COL_SMEM_TW>(y, twg, 1, s, il, q);
                    v[k] = x;
                }} else {{
                    const u32 t = tw_mul<MODE == 1 && COL_SMEM_TW>(v[k + half], twg, 1, s, il, q);
                    if (!LAZY) ct_bfly(v[k], v[k + half], t, two_q);
                    else if (d == 0 && !CANON) ct_bfly_lazy<true>(v[k], v[k + half], t, two_q, eight_q);
                    else ct_bfly_lazy<false>(v[k], v[k + half], t, two_q, eight_q);
                }}
            }}
        }}
#pragma unroll
        for (int k = 0; k < (1 << R); ++k)
            sm[sidx<MODE>(sub, base + k * T)] = INV && S0 > 0 ? gs_pass_end(v[k], k, R, four_q, eight_q) : v[k];
    }}
}}

// 16-byte asynchronous copies global -> shared (cp.async, sm_80+), for the twiddle tables of the warp-tile row
// kernels and the epilogues' tiles.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(gmem) : "memory");
}}
__device__ __forceinline__ void cp_async_commit() {{ asm volatile("cp.async.commit_group;\n" ::: "memory"); }}
template <int N>
__device__ __forceinline__ void cp_async_wait() {{ asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }}

// 16 bytes of a column tile from global memory g to shared memory dst: with ASYNC (COL_ASYNC) a cp.async copy (through
// L2 only, not committed; the first pass's copies are not evict-first: a cache hint on them failed on the device, see
// docs/PERFORMANCE.md), else a 16-byte load (FIRST: LOAD_FIRST, else LOAD16) and a store.
template <bool ASYNC, bool FIRST>
__device__ __forceinline__ void col_load(u32* dst, const u32* __restrict__ g) {{
    if (ASYNC) cp_async16(dst, g);
    else *(uint4*)dst = FIRST ? LOAD_FIRST((const uint4*)g) : LOAD16((const uint4*)g);
}}

// A 16-byte store of a column or row pass: evict-first (st.global.cs) when CS: the last pass's output, read by no
// kernel soon, should not push out of L2 the intermediates a fused transform still has to read (_FUSED); else, with
// EVICT_LAST, evict-last (st.global.L2::cache_hint under a createpolicy evict_last policy): the intermediate that the
// row pass or an epilogue reads next, or a transform's output, stays in L2 against the other streams' traffic.
#define EVICT_LAST {evict_last}
template <bool CS>
__device__ __forceinline__ void store16(uint4* p, uint4 v) {{
    if (CS) {{
        __stcs(p, v);
    }} else if (EVICT_LAST) {{
        u64 pol;
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {{%1, %2, %3, %4}}, %5;" :: "l"(p), "r"(v.x), "r"(v.y),
                     "r"(v.z), "r"(v.w), "l"(pol) : "memory");
    }} else {{
        *p = v;
    }}
}}

// Forward output -> canonical. Not LAZY: x in [0, 4q), two conditional subtractions. LAZY: x in [0, 16q), a 32-bit
// Barrett step with m32 = floor(2^32 / q) (prime_m32): k = floor(x m32 / 2^32) is
// floor(x / q) or one less (x < 2^32), so x - k q lies in [0, 2q); one conditional subtraction. Three instructions
// where the four subtractions (8q, 4q, 2q, q) took about six.
__device__ __forceinline__ u32 fwd_final(u32 x, u32 q, u32 two_q, u32 m32) {{
    if (LAZY) {{
        u32 r;  // x + k (-q) as one multiply-add (written plainly, the compiler negates k first: an extra instruction)
        asm("mad.lo.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(__umulhi(x, m32)), "r"(0u - q), "r"(x));
        return csub(r, q);
    }}
    return csub(csub(x, two_q), q);
}}

// Row kernels with warp tiles: warp w of the block owns 4 rows of 256 points in shared memory, point p of row x
// (x < 4) at word wsidx(x, p), rows WPITCH words apart (16 mod 32: the two rows a warp reads at once land on the two
// halves of the banks). Pass A (stages 0-3): item (x, u), u < 16, owns points u + 16 k; a half-warp reads or writes
// the 16 points of group k of its row at once. Pass B (stages 4-7): item (x, g) owns points 16 g .. 16 g + 15, four
// 16-byte chunks c (points 16 g + 4 c ..); a quarter-warp (8 lanes) reads or writes chunk c of 8 groups at once.
// SWIZZLE (TILE_SWIZZLE, WPITCH = 272): chunk c of group g at chunk c ^ h, h = (g / 2) mod 4, i.e. wsidx(x, p) =
// WPITCH x + (p ^ 4 ((p >> 5) & 3)): a group's 16 points stay in its 16 words (pass A: conflict-free), and the 8
// groups of a quarter-warp take 8 distinct 16-byte bank groups (16 (g mod 2) + 4 (c ^ h)). Else 4 words of padding
// after every 16 points (WPITCH = 336): wsidx(x, p) = WPITCH x + p + 4 (p / 16), bank groups 5 g mod 8. A 16-byte
// chunk stays whole in both (p a multiple of 4 maps to one).
#define WPITCH {wpitch}
#define SWIZZLE {swizzle}
__device__ __forceinline__ int wsidx(int x, int p) {{
    return x * WPITCH + (SWIZZLE ? p ^ (((p >> 5) & 3) << 2) : p + ((p >> 4) << 2));
}}
// wsidx of the passes' own points, written so that k and c (unrolled) stay constants: pass A's point u + 16 k
// (u < 16: its group is k) and pass B's chunk c of group g (point 16 g + 4 c).
__device__ __forceinline__ int wsidx_a(int x, int u, int k) {{
    return x * WPITCH + 16 * k + (SWIZZLE ? u ^ (((k >> 1) & 3) << 2) : u + 4 * k);
}}
__device__ __forceinline__ int wsidx_b(int x, int g, int c) {{
    return x * WPITCH + (SWIZZLE ? 16 * g + 4 * (c ^ ((g >> 1) & 3)) : 20 * g + 4 * c);
}}

// Pass A (S0 = 0) or B (S0 = 4) of the warp's 4 rows x = 0..3 (rows bt0 + x of the table's numbering,
// bt0 = 2^A_BITS + first row; see ntt_pass for the twiddle indices: stage s = S0 + d of row bt uses
// tw[(bt << s) + (g << d) + j], j = k >> (4 - d), g = 0 in pass A). Stages s >= SF (SF >= 4) take it as
// tw[bt << s] x tw[(g << d) + j] (two Shoup products; the row factor from wt, the second from tl); the
// earlier ones one table entry, from the warp's table wt for s < SFT (see _ROWW), else from tw.
// Rows 2 it + (lane >> 4) for it0 <= it < it1 (default: all 4).
template <int S0, bool INV, int SF, int SFT>
__device__ __forceinline__ void wpass(u32* sm, const uint2* __restrict__ tw, const uint2* tl, const uint2* wt,
                                      int bt0, int lane, u32 q, u32 two_q, u32 four_q, u32 eight_q, int it0 = 0,
                                      int it1 = 2) {{
#pragma unroll
    for (int it = it0; it < it1; ++it) {{
        const int x = (lane >> 4) + 2 * it, u = lane & 15;
        u32 v[16];
        if (S0 == 4) {{
#pragma unroll
            for (int c = 0; c < 4; ++c) {{
                const uint4 y = *(const uint4*)(sm + wsidx_b(x, u, c));
                v[4 * c] = y.x; v[4 * c + 1] = y.y; v[4 * c + 2] = y.z; v[4 * c + 3] = y.w;
            }}
        }} else {{
#pragma unroll
            for (int k = 0; k < 16; ++k) v[k] = sm[wsidx_a(x, u, k)];
        }}
#pragma unroll
        for (int dd = 0; dd < 4; ++dd) {{
            const int d = INV ? 3 - dd : dd;
            const int half = 8 >> d;
            const int s = S0 + d;
            const bool split_s = s >= SF;  // constant once unrolled
            const int g = S0 == 4 ? u : 0;
            const uint2* __restrict__ tws = tw + (((bt0 + x) << s) + (g << d));  // stages SFT <= s < SF
            const uint2* wts = wt + 4 * ((1 << s) - 1) + (x << s) + (g << d);    // stages s < SFT
            const uint2 rf = split_s ? (TW_FAKE ? make_uint2(0x1234567u, 0x89abcdu)
                                                : wt[4 * ((1 << SFT) - 1) + 4 * (s - SF) + x]) : make_uint2(0u, 0u);
            const uint2* tls = tl + 16 * ((1 << d) - 1) + u;
#pragma unroll
            for (int k = 0; k < 16; ++k) {{
                if (k & half) continue;
                const int j = k >> (4 - d);
                const uint2 w1 = TW_FAKE ? make_uint2(0x1234567u, 0x89abcdu)
                                 : split_s ? tls[16 * j] : s < SFT ? wts[j] : __ldg(tws + j);
                if (INV) {{
                    u32 x = v[k], y = v[k + half];
                    gs_sum_diff(x, y, k, dd, two_q, four_q, eight_q);
                    u32 t = shoup_lazy(y, w1.x, w1.y, q);
                    if (split_s) t = shoup_lazy(t, rf.x, rf.y, q);
                    v[k] = x;
                    v[k + half] = t;
                }} else {{
                    u32 t = shoup_lazy(v[k + half], w1.x, w1.y, q);
                    if (split_s) t = shoup_lazy(t, rf.x, rf.y, q);
                    if (!LAZY) ct_bfly(v[k], v[k + half], t, two_q);
                    else if (d == 0) ct_bfly_lazy<true>(v[k], v[k + half], t, two_q, eight_q);
                    else ct_bfly_lazy<false>(v[k], v[k + half], t, two_q, eight_q);
                }}
            }}
        }}
        if (INV) {{
#pragma unroll
            for (int k = 0; k < 16; ++k) v[k] = gs_pass_end(v[k], k, 4, four_q, eight_q);
        }}
        if (S0 == 4) {{
#pragma unroll
            for (int c = 0; c < 4; ++c)
                *(uint4*)(sm + wsidx_b(x, u, c)) =
                    make_uint4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
        }} else {{
#pragma unroll
            for (int k = 0; k < 16; ++k) sm[wsidx_a(x, u, k)] = v[k];
        }}
    }}
}}

// A warp tile's loads (_ROWW, _EPILOGUE): wtile_load issues the 16-byte loads of its 4 rows at src into y (FIRST:
// LOAD_FIRST, else LOAD16); wtile_table the cp.async copies (not committed) of its table wt: the one-product
// twiddles of stages s < SFT of rows bt0 .. bt0 + 3 (tw[(bt0 << s) .. + 4 2^s) at wt[4 (2^s - 1)]) and their row
// factors of the split stages s >= SF (warp_table_index), from WARP_TABLE; wtile_store writes y to the warp's shared
// memory sm (wsidx); wtile_async (_EPILOGUE) copies the tile straight to sm with cp.async (LOAD16's path, through
// L2 only; not committed), no registers held while the copies are in flight.
template <bool FIRST>
__device__ __forceinline__ void wtile_load(const uint4* __restrict__ src, uint4 (&y)[8], int lane) {{
#pragma unroll
    for (int it = 0; it < 8; ++it) y[it] = FIRST ? LOAD_FIRST(src + it * 32 + lane) : LOAD16(src + it * 32 + lane);
}}
// Prime pi's row of warp_tables (tl_all): its split-factor table tl (240 entries), then the table wt of every warp
// tile (WT entries; tile t: rows 2^A_BITS + 4 t ..), each a contiguous range that the kernels copy as it is.
#define TABLE_ROW(tl_all, pi, WT) ((tl_all) + (u64)(pi) * (240 + ((1 << A_BITS) / 4) * (WT)))
#define WARP_TABLE(tl_all, pi, tile, WT) (TABLE_ROW(tl_all, pi, WT) + 240 + (tile) * (WT))
template <int WT>
__device__ __forceinline__ void wtile_table(uint2* wt, const uint2* __restrict__ src, int lane) {{
    for (int c = lane; c < WT / 2; c += 32) cp_async16(wt + 2 * c, src + 2 * c);
}}
__device__ __forceinline__ void wtile_async(u32* sm, const uint4* __restrict__ src, int lane) {{
#pragma unroll
    for (int it = 0; it < 8; ++it) cp_async16(sm + wsidx(it >> 1, ((it & 1) * 32 + lane) * 4), src + it * 32 + lane);
}}
__device__ __forceinline__ void wtile_store(u32* sm, const uint4 (&y)[8], int lane) {{
#pragma unroll
    for (int it = 0; it < 8; ++it) *(uint4*)(sm + wsidx(it >> 1, ((it & 1) * 32 + lane) * 4)) = y[it];
}}

{kernels}
"""

_SMALL = r"""
extern "C" __global__ void __launch_bounds__(256) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all) {{
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
}}
"""

_COL = r"""
// One column tile of {name}: the 32 columns c0 .. c0 + 31 of row r (limb in_slots[r] -> limb out_slots[r], prime
// prime_idx[r]); 2^A_BITS points a column, all NTHREADS threads of the block (sm: COL_SMEM words, the tile's 32 <<
// A_BITS, then its prime's column twiddles, col_twiddles). CS_OUT: stores evict-first.
template <bool CS_OUT>
__device__ __forceinline__ void {name}_tile(u32* sm, u32* arena, const int* __restrict__ in_slots,
                                            const int* __restrict__ out_slots, const int* __restrict__ prime_idx,
                                            int r, int c0, const u32* __restrict__ pt,
                                            const uint2* __restrict__ tw_all) {{
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const uint2* tw = col_twiddles((uint2*)(sm + (32 << A_BITS)), tw_all + (u64)pi * NN);
    const u32* src = arena + (u64)in_slots[r] * NN + c0;
    u32* dst = arena + (u64)out_slots[r] * NN + c0;
    // 16-byte accesses, all issued before the first use (blockDim.x == NTHREADS).
    // Element e = it NTHREADS + threadIdx.x of the tile: 16 bytes of row e / 8, at sm + 4 e.
    const u32* g = src + ((threadIdx.x >> 3) << (LOGN - A_BITS)) + (threadIdx.x & 7) * 4;
#pragma unroll
    for (int it = 0; it < (8 << A_BITS) / NTHREADS; ++it)
        col_load<{async_}, {first}>(sm + 4 * (it * NTHREADS + threadIdx.x),
                                    g + ((it * NTHREADS / 8) << (LOGN - A_BITS)));
    if ({async_}) {{
        cp_async_commit();
        cp_async_wait<0>();
    }}
    __syncthreads();
{passes}
    __syncthreads();
{store}
}}

extern "C" __global__ void __launch_bounds__(NTHREADS{bound}) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all) {{
    __shared__ __align__(16) u32 sm[COL_SMEM];
    constexpr int TILES = (1 << (LOGN - A_BITS)) / 32;
    const int r0 = blockIdx.x / TILES;
    const int r = {second} && SECOND_REVERSED ? gridDim.x / TILES - 1 - r0 : r0;  // see SECOND_REVERSED
    {name}_tile<false>(sm, arena, in_slots, out_slots, prime_idx, r, (blockIdx.x % TILES) * 32, pt, tw_all);
}}
"""

# Row kernel with warp tiles: warp tile t = blockIdx.x * WARPS + warp is rows 4 (t mod TILES) ..
# + 3 of limb t / TILES (WARPS divides TILES, so a block is one limb and one prime). Dynamic shared memory:
# the block's table tl (a copy of the prime's split-factor table, see warp_tables), then per warp its 4 rows
# (4 WPITCH words) and its table wt of WT entries: the one-product twiddles of stages s < SFT of its rows
# (tw[(bt0 << s) .. + 4 2^s), a contiguous range, at wt[4 (2^s - 1)]) and the row factors tw[(bt0 + x) << s]
# of the split stages s >= SF (at wt[4 (2^SFT - 1) + 4 (s - SF) + x]). A warp issues its 16-byte data loads, then
# the copies of both tables (cp.async, no registers), so that every twiddle read of the passes is a shared-memory
# read and all global reads are in flight at once; one block barrier, then the two passes and the stores with
# only __syncwarp: the warps drift apart, so that on a multiprocessor some load while others compute.
_ROWW = r"""
// The warp tile of warp `warp` of {name}: rows hi0 .. hi0 + 3 of limb in_slot (prime pi) -> limb out_slot, the
// block's table tl and the warp's tile at dyn (see above; every thread of the block copies tl). CS_OUT: stores
// evict-first.
template <bool CS_OUT>
__device__ __forceinline__ void {name}_tile(u32* dyn, u32* arena, int in_slot, int out_slot, int pi, int hi0,
                                            int warp, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
                                            const uint2* __restrict__ tl_all) {{
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
    for (int it = 0; it < 8; ++it) {{
        uint4 v = *(const uint4*)(sm + wsidx(it >> 1, ((it & 1) * 32 + lane) * 4));
{finish}
        store16<CS_OUT>(dst + it * 32 + lane, v);
    }}
}}

extern "C" __global__ void __launch_bounds__(32 * WARPS, 32 / WARPS) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const uint2* __restrict__ tl_all) {{
    extern __shared__ __align__(16) u32 dyn[];
    constexpr int TILES = (1 << A_BITS) / 4;
    const int warp = threadIdx.x >> 5;
    const int t = blockIdx.x * WARPS + warp;
    const int r0 = t / TILES;
    const int r = {second} && SECOND_REVERSED ? gridDim.x * WARPS / TILES - 1 - r0 : r0;  // see SECOND_REVERSED
    {name}_tile<false>(dyn, arena, in_slots[r], out_slots[r], prime_idx[r], (t % TILES) * 4, warp, pt, tw_all,
                       tl_all);
}}
"""


# Both passes of a transform in one kernel (FUSED, N >= 8192), so that each limb's intermediate is read back from L2
# soon after it was written (DRAM sees one read and one write a limb, as a one-pass transform, while each piece of
# work stays a short independent tile as in the two kernels). A block of NTHREADS threads is one *item*: a column
# tile (32 columns, as _COL) or a row item (NTHREADS / 32 warp tiles, 32 rows, as _ROWW). A limb has P items of its
# first pass (forward: column tiles; inverse: row items) and Q of its second. Blocks take tickets in the order they
# start (an atomic counter, ctr[0]), and ticket t is item fused_item(t): the first-pass items of limb k, then the
# second-pass items of limb k - lag, for k = 0, 1, ... A second-pass item waits (thread 0 spins on ctr[1 + limb])
# until the P first-pass items of its limb have stored their tiles; every item it waits for holds an earlier ticket,
# so it runs or has run: no deadlock, whatever the residency. The counters reset themselves (the last ticket
# zeroes ctr[0], the last of a limb's Q second-pass items its ctr[1 + limb]), so that a zeroed ctr serves every
# launch on one stream, replays of a CUDA graph included. A wait longer than FUSED_SPIN_LIMIT sleeps traps (an
# error, not a hang). Publication: the P items' stores, a block barrier, then thread 0's fence and atomic add; the
# reader's acquire load and a block barrier, then loads through L2 (LOAD16 with LOAD_CG).
_FUSED = r"""
#define FUSED_CS {fused_cs}
#define FUSED_SPIN_LIMIT (1 << 25)
struct FusedItem {{ int first, limb, tile; }};
__device__ __forceinline__ FusedItem fused_item(int t, int rows, int lag, int p, int q) {{
    const int d = min(lag, rows);
    if (t < p * d) return {{1, t / p, t % p}};
    t -= p * d;
    const int mid = (rows - d) * (p + q);
    if (t < mid) {{
        const int k = t / (p + q), w = t % (p + q);
        return w < p ? FusedItem{{1, d + k, w}} : FusedItem{{0, k, w - p}};
    }}
    t -= mid;
    return {{0, rows - d + t / q, t % q}};
}}
__device__ __forceinline__ void fused_wait(int* done, int p, int all) {{
    int v = 0;
    for (int spins = 0;; ++spins) {{
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(done) : "memory");
        if (v >= p) break;
        if (spins == FUSED_SPIN_LIMIT) __trap();
        __nanosleep(100);
    }}
    if (atomicAdd(done, 1) == all - 1) atomicExch(done, 0);
}}
"""

_FUSED_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(NTHREADS, {min_blocks}) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const uint2* __restrict__ tl_all, int* ctr, int rows, int lag) {{
    extern __shared__ __align__(16) u32 dyn[];
    __shared__ int ticket;
    constexpr int P = {p}, Q = {q};
    if (threadIdx.x == 0) {{
        const int t = atomicAdd(ctr, 1);
        if (t == rows * (P + Q) - 1) atomicExch(ctr, 0);
        else if ((unsigned)t >= rows * (P + Q)) __trap();  // counters not zeroed: an error, not a wild limb
        ticket = t;
    }}
    __syncthreads();
    const FusedItem it = fused_item(ticket, rows, lag, P, Q);
    const int L = it.limb, pi = prime_idx[L], out = out_slots[L];
    int* done = ctr + 1 + L;
    if (it.first) {{
        {first};
        __syncthreads();
        if (threadIdx.x == 0) {{
            __threadfence();
            atomicAdd(done, 1);
        }}
    }} else {{
        if (threadIdx.x == 0) fused_wait(done, P, P + Q);
        __syncthreads();
        {second};
    }}
}}
"""


def fused_item(t: int, rows: int, lag: int, p: int, q: int) -> tuple[bool, int, int]:
    """Item (first pass?, limb, tile) of ticket ``t`` in a fused transform of ``rows`` limbs with ``p`` first-pass
    and ``q`` second-pass items a limb: step k = 0, 1, ... takes the p first-pass items of limb k (k < rows), then
    the q second-pass items of limb k - d (k >= d), d = min(lag, rows). fused_item in _FUSED computes the same."""
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
    """(column tiles, row items) of one limb in a fused transform of 2^logn points (see _FUSED)."""
    return (1 << ROW_LOG) // COLS, (1 << (logn - ROW_LOG)) // 4 // (THREADS // 32)


def col_smem_words(a_bits: int) -> int:
    """COL_SMEM: the shared-memory words of a column tile of 2^a_bits-point columns, 32 of them, and of the column
    twiddles after it (2^a_bits entries of two words, col_twiddles)."""
    return (COLS << a_bits) + 2 * (1 << a_bits)


def fused_smem(logn: int, sf: int, swizzle: bool | None = None) -> int:
    """Dynamic shared memory of a fused transform's block: a column tile or a row item's warp tiles and tables."""
    return max(4 * col_smem_words(logn - ROW_LOG), warp_smem(THREADS // 32, sf, swizzle))


def _fused_kernel(logn: int, inverse: bool, min_blocks: int) -> str:
    """The fused kernel ntt_{fwd,inv}_fused (see _FUSED): calls of the column and row tiles of _COL and _ROWW."""
    d = "inv" if inverse else "fwd"
    cols, rows = fused_items(logn)
    col_in = "out_slots" if inverse else "in_slots"
    col = (f"ntt_{d}_col_tile<{'FUSED_CS' if inverse else 'false'}>(dyn, arena, {col_in}, out_slots, prime_idx, L, "
           "it.tile * 32, pt, tw_all)")
    row_in = "in_slots[L]" if inverse else "out"
    row = (f"ntt_{d}_row_tile<{'false' if inverse else 'FUSED_CS'}>(dyn, arena, {row_in}, out, pi, "
           f"(it.tile * (NTHREADS / 32) + (threadIdx.x >> 5)) * 4, threadIdx.x >> 5, pt, tw_all, tl_all)")
    first, second = (row, col) if inverse else (col, row)
    p, q = (rows, cols) if inverse else (cols, rows)
    return _FUSED_KERNEL.format(name=f"ntt_{d}_fused", min_blocks=min_blocks, p=p, q=q, first=first, second=second)


def _warp_passes(inverse: bool, sf: int) -> str:
    """The two passes of a warp-tile row kernel (pass A = stages 0-3, B = 4-7; reversed for the inverse)."""
    inv = "true" if inverse else "false"
    calls = [f"    wpass<{s0}, {inv}, {sf}, {min(sf, 6)}>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q);"
             for s0 in (0, 4)]
    return "\n    __syncwarp();\n".join(calls[::-1] if inverse else calls)


def warp_split_from(split_from, inverse: bool) -> int:
    """The first split stage SF of the warp-tile row kernels: split_from (an int, or a pair for forward
    and inverse) clamped to 4 .. 8 (they split in pass B only; 8: none). Their warp tables hold the
    stages below SFT = min(SF, 6)."""
    sf = split_from if isinstance(split_from, int) else split_from[1 if inverse else 0]
    return min(max(int(sf), 4), 8)


#: Entry e of a prime's split-factor table for the warp-tile row kernels is tw[TL_INDEX[e]]: stage 4 + d
#: (d < 4) of pass B reads tw[(g << d) + j] (j < 2^d) at entry 16 (2^d - 1) + 16 j + g, so that the 16
#: lanes g of a row read 16 consecutive entries.
TL_INDEX = tuple(((e - 16 * ((1 << d) - 1)) & 15) << d | (e - 16 * ((1 << d) - 1)) >> 4
                 for d in range(4) for e in range(16 * ((1 << d) - 1), 16 * ((1 << (d + 1)) - 1)))
_TL_TABLES: "weakref.WeakKeyDictionary[CudaRing, dict]" = weakref.WeakKeyDictionary()


def warp_table_index(a_bits: int, sf: int) -> np.ndarray:
    """The twiddle indices of every warp tile's table wt (tiles, WT) of a ring with 2^a_bits rows of 256 points and
    split stages from ``sf`` (SFT = min(sf, 6)): tile t (rows bt0 = 2^a_bits + 4 t ..) holds at 4 (2^s - 1) + j the
    one-product twiddle (bt0 << s) + j of stage s < SFT (j < 4 2^s: its 4 rows' 2^s each), then at
    4 (2^SFT - 1) + e the row factor (bt0 + e mod 4) << (sf + e // 4) of split stage sf + e // 4."""
    sft = min(sf, 6)
    bt0 = (1 << a_bits) + 4 * np.arange((1 << a_bits) // 4, dtype=np.int64)[:, None]
    parts = [(bt0 << s) + np.arange(4 << s) for s in range(sft)]
    e = np.arange(4 * (8 - sf))
    parts.append((bt0 + (e & 3)) << (sf + (e >> 2)))
    return np.concatenate(parts, axis=1)


def warp_tables(ring: CudaRing, inverse: bool, sf: int):
    """The warp-tile row kernels' tables of ``ring`` (forward or inverse twiddles), built on first use (like
    ``ring.twiddles``: before any graph capture): a row a prime of 240 + TILES WT entries (WT: warp_table_entries(sf),
    TILES: the warp tiles of a limb), its split-factor table tl (the twiddles at TL_INDEX), then every warp tile's
    table wt (warp_table_index), each a contiguous range that the kernels copy as it is (WARP_TABLE)."""
    tables = _TL_TABLES.setdefault(ring, {})
    if (inverse, sf) not in tables:
        cp = cupy()
        tw = ring.twiddles[1 if inverse else 0]
        index = np.concatenate([np.asarray(TL_INDEX, dtype=np.int64),
                                warp_table_index(ring.logn - ROW_LOG, sf).reshape(-1)])
        tables[inverse, sf] = cp.ascontiguousarray(tw[:, cp.asarray(index)])
    return tables[inverse, sf]


def epilogue_split_from() -> int:
    """The epilogue kernels' first split stage SF: EPILOGUE_SPLIT_FROM (read now) clamped as warp_split_from."""
    return warp_split_from(EPILOGUE_SPLIT_FROM, False)


def warp_table_entries(sf: int) -> int:
    """WT of _ROWW: the entries of a warp tile's table wt (8 bytes each) with split stages from ``sf``."""
    return 4 * ((1 << min(sf, 6)) - 1) + 4 * (8 - sf)


def warp_smem(warps: int, sf: int, swizzle: bool | None = None) -> int:
    """Dynamic shared memory of a warp-tile row kernel: the table tl (240 entries of 8 bytes), then per
    warp its 4 rows (4 WPITCH words, :func:`wpitch`) and its table wt (WT entries, see _ROWW)."""
    return 8 * 240 + warps * (4 * 4 * wpitch(swizzle) + 8 * warp_table_entries(sf))


def _pass_calls(logm: int, g: int, mode: int, inverse: bool, body: bool = True, canonical: bool = False) -> str:
    """The ntt_pass calls of a 2^logm-point transform of g sub-transforms in layout ``mode`` (passes of
    RADIX_LOG stages, the last one shorter; reversed for the inverse); none with body=False. ``canonical``
    (forward): the first pass's inputs are canonical (ntt_pass's CANON)."""
    if not body:
        return ""
    plan, s = [], 0
    while s < logm:
        r = min(RADIX_LOG, logm - s)
        plan.append((s, r))
        s += r
    if inverse:
        plan.reverse()
    inv = "true" if inverse else "false"
    calls = [f"    ntt_pass<{logm}, {g}, {mode}, {s0}, {r}, {inv}{', true' if canonical and s0 == 0 else ''}>"
             "(sm, tw, q, two_q, four_q, eight_q);" for s0, r in plan]
    return "\n    __syncthreads();\n".join(calls)


def wpitch(swizzle: bool | None = None) -> int:
    """WPITCH: words between two rows of a warp tile in the layout ``swizzle`` (default: TILE_SWIZZLE; see wsidx)."""
    return 272 if (TILE_SWIZZLE if swizzle is None else swizzle) else 336


def _header(logn: int, a_bits: int, kernels: str, lazy: bool, tw_fake: bool, warps: int = WARPS,
            load_cg: bool = LOAD_CG, first_cs: bool = FIRST_CS, second_reversed: bool = SECOND_REVERSED,
            swizzle: bool | None = None) -> str:
    """_SRC around ``kernels`` (``swizzle``: the warp tiles' layout, default TILE_SWIZZLE read now)."""
    swizzle = TILE_SWIZZLE if swizzle is None else swizzle
    return _SRC.format(logn=logn, a_bits=a_bits, warps=warps, kernels=kernels, lazy=int(lazy),
                       lazy_inv=int(LAZY_INV), threads=THREADS,
                       tw_fake=int(tw_fake), load_cg=int(load_cg), first_cs=int(first_cs),
                       second_reversed=int(second_reversed), wpitch=wpitch(swizzle), swizzle=int(swizzle),
                       evict_last=int(EVICT_LAST), col_smem_tw=int(COL_SMEM_TW), col_smem=col_smem_words(a_bits))


def _source(logn: int, split_from=SPLIT_FROM, lazy: bool = LAZY, body: bool = True, tw_fake: bool = False,
            warps: int = WARPS, load_cg: bool = LOAD_CG, first_cs: bool = FIRST_CS,
            second_reversed: bool = SECOND_REVERSED, swizzle: bool | None = None,
            fused_min_blocks: int = FUSED_MIN_BLOCKS, fused_cs: bool = FUSED_CS) -> str:
    """CUDA source of the NTT kernels for N = 2^logn: ``ntt_fwd`` and ``ntt_inv`` (N <= 4096), else the column kernels
    ``ntt_{fwd,inv}_col`` and the warp-tile row kernels ``ntt_{fwd,inv}_row`` (``warps`` warps a block; split
    twiddles from warp_split_from(split_from)) and both passes in one kernel, ``ntt_{fwd,inv}_fused`` (_FUSED;
    ``fused_min_blocks``: its launch bound; ``fused_cs``: its last pass stores evict-first). lazy: forward
    butterflies reduce once per pass (see ct_bfly_lazy). Timing only (wrong results): body=False leaves the
    butterflies out (loads and stores alone), tw_fake makes every twiddle a constant; load_cg, first_cs,
    second_reversed: see LOAD16, LOAD_FIRST and SECOND_REVERSED in _SRC; swizzle: the warp tiles' layout (wsidx)."""
    if logn <= 12:
        fwd_store = ("    const u32 m32 = prime_m32(pt, pi);\n"
                     "    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = fwd_final(sm[i], q, two_q, m32);")
        inv_store = (
            "    const u32 ni = __ldg(pt + 8 * pi + 2), nip = __ldg(pt + 8 * pi + 3);\n"
            "    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = shoup(sm[i], ni, nip, q);"
        )
        kernels = _SMALL.format(name="ntt_fwd", passes=_pass_calls(logn, 1, 0, False, body, True), store=fwd_store) + \
            _SMALL.format(name="ntt_inv", passes=_pass_calls(logn, 1, 0, True, body), store=inv_store)
        return _header(logn, logn, kernels, lazy, tw_fake, load_cg=load_cg, first_cs=first_cs,
                       second_reversed=second_reversed, swizzle=swizzle)
    a = logn - ROW_LOG
    if (1 << a) // 4 % warps:
        raise ValueError(f"{warps} warps a block do not divide the warp tiles of a limb")
    col_store = (
        "    const u32 ni = __ldg(pt + 8 * pi + 2), nip = __ldg(pt + 8 * pi + 3);\n"
        "    (void)ni; (void)nip;\n"
        "#pragma unroll\n"
        "    for (int it = 0; it < (8 << A_BITS) / NTHREADS; ++it) {\n"
        "        const int e = it * NTHREADS + threadIdx.x;\n"
        "        uint4 v = *(const uint4*)(sm + e * 4);\n"
        "{finish}"
        "        store16<CS_OUT>((uint4*)(dst + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4), v);\n"
        "    }"
    )
    col_inv_finish = "".join(f"        v.{c} = shoup(v.{c}, ni, nip, q);\n" for c in "xyzw")
    row_fwd = "\n".join(f"        v.{c} = fwd_final(v.{c}, q, two_q, m32);" for c in "xyzw")
    parts = []
    for d, inverse in (("fwd", False), ("inv", True)):
        col = _COL.format(name=f"ntt_{d}_col", passes=_pass_calls(a, COLS, 1, inverse, body, not inverse),
                          second="true" if inverse else "false", first="false" if inverse else "true",
                          async_="true" if COL_ASYNC[int(inverse)] else "false",
                          bound=f", {COL_MIN_BLOCKS}" if COL_MIN_BLOCKS and not inverse else "",
                          store=col_store.replace("{finish}", col_inv_finish if inverse else ""))
        sf = warp_split_from(split_from, inverse)
        row = _ROWW.format(name=f"ntt_{d}_row", sf=sf, sft=min(sf, 6), passes=_warp_passes(inverse, sf) if body else "",
                           second="false" if inverse else "true", first="true" if inverse else "false",
                           finish="" if inverse else row_fwd)
        parts += [col, row] if not inverse else [row, col]
    parts.append(_FUSED.format(fused_cs=int(fused_cs)))
    parts += [_fused_kernel(logn, inverse, fused_min_blocks) for inverse in (False, True)]
    return _header(logn, a, "".join(parts), lazy, tw_fake, warps, load_cg, first_cs, second_reversed, swizzle)


def ring_lazy(ring: CudaRing, lazy: bool = LAZY) -> bool:
    """Whether ``ring``'s forward transforms reduce lazily: ``lazy`` and every prime below 2^28 (the lazy bound 16q
    must fit in 32 bits). The column kernel's intermediate depends on it, so every kernel that reads one asks this."""
    return bool(lazy) and max(ring.primes) < 1 << 28


def counter_words(rows: int) -> int:
    """int32 words of the counters a fused transform of ``rows`` limbs needs (_FUSED: a ticket and one a limb)."""
    return 1 + rows


def _launch(ring: CudaRing, arena, in_slots, out_slots, prime_idx, inverse: bool, split_from=None,
            lazy: bool = LAZY, warps: int | None = None, body: bool = True, tw_fake: bool = False,
            only_row: bool = False, load_cg: bool | None = None, first_cs: bool | None = None,
            second_reversed: bool | None = None, half: bool = False, fused: bool | None = None,
            counters=None) -> None:
    """Launch the NTT (or INTT) kernels of rows ``prime_idx`` with the given configuration (the
    module defaults unless told; see :func:`_source`). ``only_row`` (forward, N >= 8192): the row kernel
    alone, in place on ``out_slots`` (the column pass was done by a prologue kernel, :func:`ntt_prologue`).
    ``half`` (forward): the column kernel alone when N >= 8192 (its consumers run the row pass in their loads,
    :data:`_EPILOGUE`), the whole transform below. ``fused`` (N >= 8192, whole transforms, LOAD_CG): one kernel
    for both passes (_FUSED), with ``counters`` (a zeroed int32 device array of at least counter_words(R) words
    that no other launch uses at the same time; it is left zeroed) or, when None, fresh ones on the current stream
    (not while it is being captured: then the two kernels run)."""
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
    lazy = ring_lazy(ring, lazy)
    # The module settings are read at call time, so that scripts can compare them.
    split_from = SPLIT_FROM if split_from is None else split_from
    sf = warp_split_from(split_from, inverse)  # the row passes' first split stage
    warps = WARPS if warps is None else int(warps)
    load_cg = LOAD_CG if load_cg is None else bool(load_cg)
    first_cs = FIRST_CS if first_cs is None else bool(first_cs)
    second_reversed = SECOND_REVERSED if second_reversed is None else bool(second_reversed)
    swizzle, fused_min_blocks, fused_cs = TILE_SWIZZLE, FUSED_MIN_BLOCKS, FUSED_CS
    config = (split_from, lazy, warps, body, tw_fake, load_cg, first_cs, second_reversed, swizzle, fused_min_blocks,
              fused_cs, EVICT_LAST, COL_SMEM_TW, COL_MIN_BLOCKS, LAZY_INV, COL_ASYNC)
    key = f"ntt{ring.n}-" + "-".join(map(str, config))  # the whole configuration: scripts change module settings
    tw = ring.twiddles[1 if inverse else 0]
    pt = ring.prime_table

    def kernel(name):
        return ring.kernel(key, lambda: _source(ring.logn, split_from, lazy, body, tw_fake, warps, load_cg, first_cs,
                                                second_reversed, swizzle, fused_min_blocks, fused_cs), name)

    def run(name, src, dst, blocks_per_row):
        k = kernel(name)
        if name.endswith("_row"):  # blocks_per_row: warp tiles
            smem = warp_smem(warps, sf, swizzle)
            if k.max_dynamic_shared_size_bytes < smem:
                k.max_dynamic_shared_size_bytes = smem
            k((rows * blocks_per_row // warps,), (32 * warps,),
              (arena, src, dst, prime_idx, pt, tw, warp_tables(ring, inverse, sf)), shared_mem=smem)
        else:
            k((rows * blocks_per_row,), (THREADS,), (arena, src, dst, prime_idx, pt, tw))

    if ring.logn <= 12:
        run("ntt_inv" if inverse else "ntt_fwd", in_slots, out_slots, 1)
        return
    cp = cupy()
    fused = (FUSED[int(inverse)] if fused is None else bool(fused)) and load_cg and not (half or only_row)
    if fused and counters is None:
        if cp.cuda.get_current_stream().is_capturing():
            fused = False
        else:
            counters = cp.zeros(counter_words(rows), dtype=cp.int32)
    if fused:
        index_array(counters, name="counters")
        if counters.shape[0] < counter_words(rows):
            raise ValueError(f"counters: {counters.shape[0]} words, {counter_words(rows)} needed")
        k = kernel(f"ntt_{'inv' if inverse else 'fwd'}_fused")
        smem = fused_smem(ring.logn, sf, swizzle)
        if k.max_dynamic_shared_size_bytes < smem:
            k.max_dynamic_shared_size_bytes = smem
        k((rows * sum(fused_items(ring.logn)),), (THREADS,),
          (arena, in_slots, out_slots, prime_idx, pt, tw, warp_tables(ring, inverse, sf), counters, np.int32(rows),
           np.int32(FUSED_LAG)), shared_mem=smem)
        return
    col_blocks, row_tiles = (1 << ROW_LOG) // COLS, (1 << (ring.logn - ROW_LOG)) // 4
    if inverse:
        run("ntt_inv_row", in_slots, out_slots, row_tiles)
        run("ntt_inv_col", out_slots, out_slots, col_blocks)
    else:
        if not only_row:
            run("ntt_fwd_col", in_slots, out_slots, col_blocks)
        if not half:
            run("ntt_fwd_row", out_slots, out_slots, row_tiles)


def ntt(ring: CudaRing, arena, in_slots, out_slots, prime_idx, half: bool = False, counters=None) -> None:
    """Forward NTT: arena[out_slots[r]] = NTT_{q_p}(arena[in_slots[r]]) with p = prime_idx[r]; ``half``: the column
    pass alone when N >= 8192 (its readers are epilogue kernels, :data:`_EPILOGUE`); ``counters``: see
    :func:`_launch` (a fused transform's; a CUDA graph needs them).

    All index arguments are int32 cupy arrays of length R. Launches on the current stream.
    """
    _launch(ring, arena, in_slots, out_slots, prime_idx, inverse=False, half=half, counters=counters)


def intt(ring: CudaRing, arena, in_slots, out_slots, prime_idx, counters=None) -> None:
    """Inverse NTT (exact inverse of :func:`ntt`, N^-1 included), same arguments."""
    _launch(ring, arena, in_slots, out_slots, prime_idx, inverse=True, counters=counters)


# ---------------------------------------------------------------------------------------------- epilogues

#: An elementwise kernel some of whose operands ("transformed") are read through the forward transform's second
#: pass: their limbs hold what the column kernel wrote (``_launch(half=True)``), and the kernel runs the row pass
#: of its tile of them in its load. Block = G groups of 4 rows of the (N/256) x 256 view (G = 8 // F for F <= 8
#: transformed operands, else 1), 8 warps; its S = F G row passes are slots, slot s the row pass of transformed
#: operand s mod F on group s / F, each with a warp tile of shared memory. Shared memory: the split-factor table tl
#: (copied by all threads), one table wt a group (its slots are the same rows; copied by the group's first warp,
#: wtile_table), then the S warp tiles (copied by warp s mod 8, wtile_async), then the staged operands. Warp w runs
#: slots w and w + 8 (at most PW = 2 a warp, F <= 16) as a warp of _ROWW does (wpass); with one group and S not a
#: multiple of 8 (EPILOGUE_BALANCE), the 2 S row pairs (wpass's it) are dealt over the warps instead (F = 12: 3
#: row pairs a warp, not 4 or 2). Then threads evaluate the program (caramel.backends.cuda.elementwise; {evaluate}:
#: _EVAL_WORDS, 4 residues a thread as the plain elementwise kernels, or with one group from EPILOGUE_SCALAR_FROM
#: operands _EVAL_SCALAR, one residue a thread in 4 steps): the transformed operands from shared memory (fwd_final:
#: canonical), the others from memory, the program, the stores. With EPILOGUE_APART and G > 1, a group's F warps
#: take its 4 rows as soon as their own row passes are done (a named barrier of the group), so that the warps drift
#: apart as _ROWW's do and one group's loads overlap another's row passes; otherwise all threads take every group
#: in turn after a block barrier. With one group (G = 1) and EPILOGUE_STAGE, thread e copies word e of the block's
#: tile of some plain operands into shared memory (cp.async, a commit group of its own, after the tables' and
#: tiles'; :func:`epilogue_staged`) before the row passes and waits for it after them: the body reads those operands
#: from ``stage``. Launch bounds: see EPILOGUE_MIN_BLOCKS.
_EPILOGUE = r"""
extern "C" __global__ void __launch_bounds__({threads}, {min_blocks}) {name}(
        u32* arena, const int* __restrict__ vec_slots, const int* __restrict__ scalar_idx,
        const int* __restrict__ out_slots, const int* __restrict__ prime_idx,
        const u32* __restrict__ scalars, const u32* __restrict__ pt, int n4, int tiles{params},
        const uint2* __restrict__ tw_all, const uint2* __restrict__ tl_all) {{
    constexpr int SF = {sf}, SFT = {sft}, WT = 4 * ((1 << SFT) - 1) + 4 * (8 - SF), F = {f};
    constexpr int G = {g}, S = F * G, PW = (S + {warps} - 1) / {warps};  // see _EPILOGUE's doc (G: epilogue_groups)
    constexpr bool APART = {apart} && G > 1;  // (with one group, all warps evaluate it)
    constexpr bool BALANCE = {balance} && G == 1 && S % {warps} != 0;  // EPILOGUE_BALANCE
    constexpr int TILE = 4 * WPITCH;  // words of a slot's warp tile
    extern __shared__ __align__(16) u32 dyn[];
    uint2* tl = (uint2*)dyn;
    u32* tbase = dyn + 480 + G * 2 * WT;  // after tl and the G groups' tables: slot s at tbase + TILE s
    const int r = blockIdx.x / tiles, tile = blockIdx.x % tiles;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const u64 mu = prime_mu(pt, pi);
    const u32 m32 = (u32)(mu >> 32);  // prime_m32, for fwd_final
    (void)mu;
    const int grp = G == 1 ? 0 : warp / F;  // this warp's group (with one group, warps past F balance its row pairs)
    const int bt0 = (1 << A_BITS) + 4 * (G * tile + grp);  // its 4 rows (every slot of it)
    const uint2* tw = tw_all + (u64)pi * NN;
    uint2* wt = (uint2*)(dyn + 480 + grp * 2 * WT);  // its group's table (its slots' rows)
#pragma unroll
    for (int p = 0; p < PW; ++p) {{
        const int f = (warp + p * {warps}) % F;
        const int k = {operand_of};
        if (warp + p * {warps} < S)
            wtile_async(tbase + (warp + p * {warps}) * TILE,
                        (const uint4*)(arena + (u64)vec_slots[r * {nv} + k] * NN + (bt0 - (1 << A_BITS)) * 256), lane);
    }}
    if (warp < S && warp % F == 0)  // one warp a group
        wtile_table<WT>(wt, WARP_TABLE(tl_all, pi, G * tile + grp, WT), lane);
    if (SF < 8)
        for (int c = threadIdx.x; c < 120; c += blockDim.x) cp_async16(tl + 2 * c, TABLE_ROW(tl_all, pi, WT) + 2 * c);
    cp_async_commit();
{stage_copy}
    cp_async_wait<{pending}>();  // the tables; the staged operands (the last group) may be in flight
    __syncthreads();
    if (APART && warp >= S) return;
    if (BALANCE) {{  // one group: unit u is the row pair u & 1 of slot u >> 1, the 2 S units dealt over the warps
#pragma unroll 1
        for (int u = warp; u < 2 * S; u += {warps}) {{
            u32* sm = tbase + (u >> 1) * TILE;
            wpass<0, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q, u & 1, (u & 1) + 1);
            __syncwarp();
            wpass<4, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q, u & 1, (u & 1) + 1);
            __syncwarp();
        }}
    }} else {{
#pragma unroll
        for (int p = 0; p < PW; ++p) {{
            u32* sm = tbase + (warp + p * {warps}) * TILE;
            if (warp + p * {warps} < S) {{
                wpass<0, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q);
                __syncwarp();
                wpass<4, false, SF, SFT>(sm, tw, tl, wt, bt0, lane, q, two_q, four_q, eight_q);
            }}
        }}
    }}
{stage_wait}
    if (!APART) __syncthreads();
    else if (F == 1) __syncwarp();
    else asm volatile("bar.sync %0, %1;" :: "r"(1 + warp / F), "r"(32 * F) : "memory");  // the group's F warps
{evaluate}
}}
"""

# The program over the block's groups, 4 residues a thread (16-byte words): with APART, a group's F warps take its
# 256 words; else all threads take one of every group.
_EVAL_WORDS = r"""
    const int g0 = APART ? warp / F : 0, g1 = APART ? g0 + 1 : G, e0 = APART ? (warp % F) * 32 + lane : threadIdx.x;
#pragma unroll 1
    for (int g = g0; g < g1; ++g) {{  // one group at a time (its operands' registers, not G groups')
        for (int e = e0; e < 256; e += APART ? 32 * F : 256) {{
            const int i = (G * tile + g) * 256 + e;
            const u32* gs = tbase + g * F * TILE + wsidx(e >> 6, (e & 63) * 4);
{transformed}
{body}
        }}
    }}"""

# The program over the block's one group (G = 1), one residue a thread at a time (EPILOGUE_SCALAR_FROM): point pe =
# 256 c + threadIdx.x of the group (row c of its tile), position j of the limb; a warp's loads and stores are 128
# contiguous bytes, and each operand holds one register, not four.
_EVAL_SCALAR = r"""
#pragma unroll 1
    for (int c = 0; c < 4; ++c) {{
        const int pe = 256 * c + threadIdx.x, j = 1024 * tile + pe;
        const u32* gs = tbase + wsidx(c, threadIdx.x);
{transformed}
{body}
    }}"""


def epilogue_groups(operands: int) -> int:
    """G of :data:`_EPILOGUE`: the groups of 4 rows a block of an epilogue kernel with ``operands`` transformed
    operands takes (F G row passes of :data:`EPILOGUE_WARPS` warps)."""
    return max(1, EPILOGUE_WARPS // operands)


def epilogue_settings() -> str:
    """The module settings an epilogue kernel's source depends on besides its program, for its cache key."""
    return (f"a{int(EPILOGUE_APART)}-s{EPILOGUE_SPLIT_FROM}-st{int(EPILOGUE_STAGE)}-sc{EPILOGUE_SCALAR_FROM}"
            f"-ba{int(EPILOGUE_BALANCE)}-sw{int(TILE_SWIZZLE)}-el{int(EVICT_LAST)}")


def epilogue_fits(operands: int, blocks: int) -> bool:
    """Whether ``blocks`` epilogue blocks with ``operands`` transformed operands (their tiles and tables; the staged
    operands take only the room left, :func:`epilogue_staged`) fit in a multiprocessor's shared memory."""
    return blocks * (epilogue_smem(operands) + 1024) <= SMEM_SM


def epilogue_scalar(operands: int) -> bool:
    """Whether an epilogue kernel with ``operands`` transformed operands evaluates its program one residue a thread
    (:data:`_EVAL_SCALAR`): with one group a block, from EPILOGUE_SCALAR_FROM operands."""
    return operands >= EPILOGUE_SCALAR_FROM and epilogue_groups(operands) == 1


def epilogue_staged(operands: tuple[int, ...], plain: tuple[int, ...], min_blocks: int | None = None) -> tuple[int, ...]:
    """The plain operands an epilogue kernel with transformed ``operands`` stages in shared memory (``stage``, 4 KiB
    each: its block's 256 16-byte words), copied with cp.async before its row passes and read by its program after
    them: with EPILOGUE_STAGE and one group a block (the copy is one word a thread), the first of ``plain`` that fit
    beside its tiles with ``min_blocks`` (default: the last of EPILOGUE_MIN_BLOCKS) blocks on a multiprocessor."""
    if not EPILOGUE_STAGE or epilogue_groups(len(operands)) != 1:
        return ()
    blocks = EPILOGUE_MIN_BLOCKS[-1] if min_blocks is None else min_blocks
    room = SMEM_SM // blocks - 1024 - epilogue_smem(len(operands))
    return tuple(plain[: max(0, room // 4096)])


def epilogue_source(logn: int, name: str, operands: tuple[int, ...], n_vec: int, body: str, lazy: bool = LAZY,
                    params: str = "", min_blocks: int | None = None, staged: tuple[int, ...] = ()) -> str:
    """CUDA source of the :data:`_EPILOGUE` kernel ``name`` (N = 2^logn >= 8192) whose vector operands
    ``operands`` (at most :data:`EPILOGUE_MAX`, ascending) are transformed; ``body`` reads the other operands,
    evaluates the program and stores (as the plain elementwise kernel's; the transformed operands are ``x{k}``: uint4,
    or u32 where :func:`epilogue_scalar`); ``lazy`` as the column kernel that wrote them; ``params``: the body's
    further kernel parameters (gathered operands'), after ``tiles``; ``min_blocks``: the resident blocks a
    multiprocessor its launch bounds ask (default: the last of :data:`EPILOGUE_MIN_BLOCKS`); ``staged``: the plain
    operands copied to shared memory (:func:`epilogue_staged`; the body reads operand ``staged[j]`` at ``stage +
    1024 j``: word ``e``, or point ``pe`` one residue a thread)."""
    if logn <= 12 or not 0 < len(operands) <= EPILOGUE_MAX:
        raise ValueError(f"an epilogue kernel needs N >= 8192 and 1 to {EPILOGUE_MAX} transformed operands")
    sf = epilogue_split_from()
    operand_of = " : ".join(f"f == {w} ? {k}" for w, k in enumerate(operands[:-1])) + (
        " : " if len(operands) > 1 else "") + str(operands[-1])
    if staged and epilogue_groups(len(operands)) != 1:
        raise ValueError("an epilogue kernel stages plain operands only with one group a block")
    copies = [f"    u32* stage = dyn + {epilogue_smem(len(operands)) // 4};  // staged operand j at stage + 1024 j"]
    copies += [f"    cp_async16(stage + {1024 * j} + 4 * threadIdx.x, arena + (u64)vec_slots[r * {n_vec} + {k}] * NN"
               " + 4 * ((u64)tile * 256 + threadIdx.x));" for j, k in enumerate(staged)]
    stage_copy = "\n".join(copies) + "\n    cp_async_commit();" if staged else ""
    reads = []
    scalar = epilogue_scalar(len(operands))
    for w, k in enumerate(operands):
        if scalar:
            reads += [f"        const u32 x{k} = fwd_final(gs[{w} * TILE], q, two_q, m32);"]
            continue
        reads += [f"            uint4 x{k} = *(const uint4*)(gs + {w} * TILE);"]
        reads += [f"            x{k}.{c} = fwd_final(x{k}.{c}, q, two_q, m32);" for c in "xyzw"]
    evaluate = (_EVAL_SCALAR if scalar else _EVAL_WORDS).format(transformed="\n".join(reads), body=body)
    kernel = _EPILOGUE.format(name=name, sf=sf, sft=min(sf, 6), f=len(operands), operand_of=operand_of, nv=n_vec,
                              evaluate=evaluate, params=params,
                              min_blocks=EPILOGUE_MIN_BLOCKS[-1] if min_blocks is None else min_blocks,
                              warps=EPILOGUE_WARPS, threads=32 * EPILOGUE_WARPS, g=epilogue_groups(len(operands)),
                              apart=str(EPILOGUE_APART).lower(), balance=str(EPILOGUE_BALANCE).lower(),
                              stage_copy=stage_copy, pending=int(bool(staged)),
                              stage_wait="    cp_async_wait<0>();  // this thread's staged operands" if staged else "")
    return _header(logn, logn - ROW_LOG, kernel, lazy, False)


def epilogue_smem(operands: int, staged: int = 0) -> int:
    """Dynamic shared memory of an epilogue kernel with ``operands`` transformed operands (tl, a table wt a group and
    a warp tile for each of its F G row passes) and ``staged`` staged plain operands (4 KiB each,
    :func:`epilogue_staged`)."""
    g, wt = epilogue_groups(operands), warp_table_entries(epilogue_split_from())
    return 8 * 240 + g * 8 * wt + operands * g * 16 * wpitch() + 4096 * staged


# ---------------------------------------------------------------------------------------------- prologues

#: Prologue kinds of :func:`ntt_prologue` (the value of the producer's ``Kind``) -> kernel code PK.
PROLOGUE_CODES = {"sud_lift": 0, "mod": 1, "baseconv": 2}

# The value a fused NTT's load computes at 4 consecutive positions pos.. of row r (instead of reading
# one limb), bit-identical to the kernels it replaces (basis.sud_lift, crt.mod, basis.BaseConversion):
# PK 0, the sud lift of ins[r] from prime args[r] to q (MODE 2, exact: centred); PK 1, X mod q of the W
# accumulator words ins[r, :] (Horner, 64-bit Barrett); PK 2, the base conversion of the W inputs
# ins[r, :] to prime index pi in MODE (0 textbook, 1 emulator, 2 exact): cin (W x 4: q_k,
# [Qhat_k^-1]_{q_k}, its Shoup quotient, 0), ctab (P x (W + 1): [Qhat_k]_p (or F_{k,p} in emulator
# mode) for k < W, then [-Q_S]_p), recip (W: 1/q_k); sum_k t_k c_k + v [-Q_S]_p < 2^64 (checked on the
# host), one Barrett reduction.
_PRO_HELPERS = r"""
#define PK {pk}
#define PMODE {pmode}
__device__ __forceinline__ u32 pro_lift1(u32 x, u32 qt, u32 ql, u64 mu, u32 qt_mod_ql) {{
    u32 y = reduce64(x, ql, mu);
    if (PMODE == 2 && x > (qt - 1u) / 2u) y = sub_mod(y, qt_mod_ql, ql);
    return y;
}}
__device__ __forceinline__ uint4 pro_load4(const u32* __restrict__ arena, const int* __restrict__ ins, int W,
        int r, int pi, int pos, const u32* __restrict__ pt, const int* __restrict__ args,
        const u32* __restrict__ cin, const u32* __restrict__ ctab, const double* __restrict__ recip) {{
    const u32 q = prime_q(pt, pi);
    const u64 mu = prime_mu(pt, pi);
    if (PK == 0) {{
        const u32 qt = prime_q(pt, args[r]);
        const u32 qm = reduce64(qt, q, mu);
        const uint4 x = *(const uint4*)(arena + (u64)__ldg(ins + r) * NN + pos);
        return make_uint4(pro_lift1(x.x, qt, q, mu, qm), pro_lift1(x.y, qt, q, mu, qm),
                          pro_lift1(x.z, qt, q, mu, qm), pro_lift1(x.w, qt, q, mu, qm));
    }}
    if (PK == 1) {{
        uint4 y = make_uint4(0u, 0u, 0u, 0u);
        for (int w = W - 1; w >= 0; --w) {{
            const uint4 x = *(const uint4*)(arena + (u64)__ldg(ins + r * W + w) * NN + pos);
            y.x = reduce64(((u64)y.x << 32) | x.x, q, mu);
            y.y = reduce64(((u64)y.y << 32) | x.y, q, mu);
            y.z = reduce64(((u64)y.z << 32) | x.z, q, mu);
            y.w = reduce64(((u64)y.w << 32) | x.w, q, mu);
        }}
        return y;
    }}
    const u32* __restrict__ c = ctab + pi * (W + 1);
    u64 acc[4] = {{0ull, 0ull, 0ull, 0ull}};
    double f[4] = {{0.0, 0.0, 0.0, 0.0}};
#pragma unroll 4
    for (int k = 0; k < W; ++k) {{
        const uint4 x4 = *(const uint4*)(arena + (u64)__ldg(ins + r * W + k) * NN + pos);
        u32 x[4] = {{x4.x, x4.y, x4.z, x4.w}};
        if (PMODE != 1) {{
            const u32 qk = __ldg(cin + 4 * k), w = __ldg(cin + 4 * k + 1), wp = __ldg(cin + 4 * k + 2);
#pragma unroll
            for (int j = 0; j < 4; ++j) x[j] = shoup(x[j], w, wp, qk);
            if (PMODE == 2) {{
                const double rk = __ldg(recip + k);
#pragma unroll
                for (int j = 0; j < 4; ++j) f[j] = __dadd_rn(f[j], __dmul_rn((double)x[j], rk));
            }}
        }}
        const u32 ck = __ldg(c + k);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += (u64)x[j] * ck;
    }}
    if (PMODE == 2) {{
        const u32 negq = __ldg(c + W);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += (u64)floor(__dadd_rn(f[j], 0.5)) * negq;
    }}
    return make_uint4(reduce64(acc[0], q, mu), reduce64(acc[1], q, mu), reduce64(acc[2], q, mu),
                      reduce64(acc[3], q, mu));
}}
"""

# Column kernel with a prologue (N >= 8192): as _COL, but block b is (column tile b / R, row b % R), so
# that the blocks of one tile (every output prime of a conversion) run together and re-read the inputs
# from L2; the load computes the input (pro_load4). The row kernel (ntt_fwd_row) follows.
_COL_PRO = r"""
extern "C" __global__ void __launch_bounds__(256) ntt_fwd_col_pro(
        u32* arena, const int* __restrict__ ins, int W, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const int* __restrict__ args, const u32* __restrict__ cin, const u32* __restrict__ ctab,
        const double* __restrict__ recip, int R) {{
    __shared__ __align__(16) u32 sm[COL_SMEM];
    // LIMB_MAJOR: block (limb r, tile c), limb by limb, so that the last limbs are whole in L2 when the reversed
    // row kernel starts on them; else tile by tile (the blocks of one tile of every limb together: a converting
    // load's rows read the same inputs).
    constexpr int TILES = (1 << (LOGN - A_BITS)) / 32;
    const int r = {limb_major} ? blockIdx.x / TILES : blockIdx.x % R;
    const int c0 = ({limb_major} ? blockIdx.x % TILES : blockIdx.x / R) * 32;
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const uint2* tw = col_twiddles((uint2*)(sm + (32 << A_BITS)), tw_all + (u64)pi * NN);
    u32* dst = arena + (u64)out_slots[r] * NN + c0;
    for (int e = threadIdx.x; e < (8 << A_BITS); e += 256)
        *(uint4*)(sm + e * 4) = pro_load4(arena, ins, W, r, pi, c0 + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4,
                                          pt, args, cin, ctab, recip);
    __syncthreads();
{passes}
    __syncthreads();
#pragma unroll
    for (int it = 0; it < (8 << A_BITS) / 256; ++it) {{
        const int e = it * 256 + threadIdx.x;
        store16<false>((uint4*)(dst + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4), *(const uint4*)(sm + e * 4));
    }}
}}
"""

# The one-kernel transform (N <= 4096) with a prologue: one block a row, the whole limb computed by the
# load into shared memory (rows of one conversion are adjacent blocks).
_SMALL_PRO = r"""
extern "C" __global__ void __launch_bounds__(256) ntt_fwd_pro(
        u32* arena, const int* __restrict__ ins, int W, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const int* __restrict__ args, const u32* __restrict__ cin, const u32* __restrict__ ctab,
        const double* __restrict__ recip, int R) {{
    __shared__ __align__(16) u32 sm[NN];
    const int r = blockIdx.x;
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const uint2* tw = tw_all + (u64)pi * NN;
    u32* dst = arena + (u64)out_slots[r] * NN;
    for (int i = threadIdx.x; i < NN / 4; i += blockDim.x)
        *(uint4*)(sm + 4 * i) = pro_load4(arena, ins, W, r, pi, 4 * i, pt, args, cin, ctab, recip);
    __syncthreads();
{passes}
    __syncthreads();
    const u32 m32 = prime_m32(pt, pi);
    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = fwd_final(sm[i], q, two_q, m32);
}}
"""


def _prologue_source(logn: int, pk: int, pmode: int, lazy: bool, limb_major: bool = False) -> str:
    """CUDA source of the forward NTT's first kernel with prologue ``pk`` in arithmetic mode ``pmode``
    (see _PRO_HELPERS): ``ntt_fwd_pro`` (N <= 4096, the whole transform) or ``ntt_fwd_col_pro`` (the
    column pass; the default module's ``ntt_fwd_row`` does the rest). Same stages and twiddles as
    the default kernels (:func:`_source`). limb_major: the column kernel's blocks limb by limb (LIMB_MAJOR in
    _COL_PRO)."""
    if logn <= 12:
        kernel = _SMALL_PRO.format(passes=_pass_calls(logn, 1, 0, False))
        return _header(logn, logn, _PRO_HELPERS.format(pk=pk, pmode=pmode) + kernel, lazy, False)
    kernel = _COL_PRO.format(passes=_pass_calls(logn - ROW_LOG, COLS, 1, False), limb_major=str(limb_major).lower())
    return _header(logn, logn - ROW_LOG, _PRO_HELPERS.format(pk=pk, pmode=pmode) + kernel, lazy, False)


class PrologueTables:
    """Device tables of a converting load (a ``baseconv`` prologue) from limbs ``in_limbs`` to ANY
    prime of the ring (the kernel picks the row of its output prime): the constants of
    ``ring.ctx.base_converter(in_limbs, all limbs)``, the CPU reference's, laid out as in
    _PRO_HELPERS. Raises ValueError when the 64-bit sum could overflow."""

    def __init__(self, ring: CudaRing, in_limbs):
        import numpy as np

        from caramel.backends.cuda.basis import conversion_constants

        self.in_limbs = tuple(int(l) for l in in_limbs)
        primes = len(ring.primes)
        conv = ring.ctx.base_converter(self.in_limbs, tuple(range(primes)))
        s = len(self.in_limbs)
        cin, negq = conversion_constants(conv, "sum of a converting NTT load")
        tables = np.zeros((2, primes, s + 1), dtype=np.uint32)
        tables[0, :, :s], tables[1, :, :s] = conv.qhat_mod_out, conv.factors
        tables[:, :, s] = negq
        cp = cupy()
        self.cin, self.recip = cp.asarray(cin), cp.asarray(conv.reciprocals.astype(np.float64))
        self.qhat, self.factors = cp.asarray(tables[0]), cp.asarray(tables[1])


def ntt_prologue(ring: CudaRing, arena, kind: str, ins, out_slots, prime_idx, args, mode,
                 tables: PrologueTables | None = None, half: bool = False) -> None:
    """Forward NTT whose load computes its input (fusion across NTT boundaries):
    arena[out_slots[r]] = NTT_{q_p}(y_r), p = prime_idx[r], y_r computed from rows ins (int32 (R, W))
    as ``kind`` says: "sud_lift" (W = 1; from prime args[r], as :func:`basis.sud_lift`), "mod" (W
    words, as :func:`crt.mod`) or "baseconv" (W inputs in the order of ``tables.in_limbs``, to prime
    p, as :class:`basis.BaseConversion`); ``mode`` a :class:`caramel.ring.Mode`. Same bits as those
    kernels followed by :func:`ntt`, without writing y. ``out_slots`` must not be an input row of the
    launch. N <= 4096: one kernel; else the column kernel with the prologue, then the row kernel (not with
    ``half``: epilogue kernels read the outputs, see :func:`ntt`)."""
    from caramel.backends.cuda.basis import mode_code

    ring.check_arena(arena)
    rows = index_array(prime_idx, name="prime_idx").shape[0]
    if ins.ndim != 2:
        raise ValueError("ins must have shape (R, W)")
    w = ins.shape[1]
    index_array(ins, rows, w, "ins")
    index_array(out_slots, rows, name="out_slots")
    index_array(args, rows, name="args")
    if kind not in PROLOGUE_CODES:
        raise ValueError(f"no NTT prologue {kind!r}")
    pk = PROLOGUE_CODES[kind]
    if pk == 2 and (tables is None or len(tables.in_limbs) != w):
        raise ValueError("a converting load needs the PrologueTables of its input limbs")
    if pk == 0 and w != 1:
        raise ValueError("a lifting load reads one limb a row")
    if rows == 0:
        return
    cp = cupy()
    code = mode_code(mode)
    pmode = code if pk != 1 else 0
    lazy = ring_lazy(ring)
    limb_major = PRO_LIMB_MAJOR and pk != 2  # a converting load's rows share their inputs: tile by tile
    key = (f"ntt{ring.n}-pro{pk}{pmode}{'-lazy' if lazy else ''}{'-limb' if limb_major else ''}-el{int(EVICT_LAST)}"
           f"-ct{int(COL_SMEM_TW)}")
    small = ring.logn <= 12
    fn = ring.kernel(key, lambda: _prologue_source(ring.logn, pk, pmode, lazy, limb_major),
                     "ntt_fwd_pro" if small else "ntt_fwd_col_pro")
    pt = ring.prime_table
    if pk == 2:
        cin, ctab, recip = tables.cin, tables.factors if code == 1 else tables.qhat, tables.recip
    else:
        cin, ctab, recip = pt, pt, ring.twiddles[0]  # unused
    blocks = rows if small else rows * ((1 << ROW_LOG) // COLS)
    fn((blocks,), (256,), (arena, ins, cp.int32(w), out_slots, prime_idx, pt, ring.twiddles[0], args, cin, ctab,
                           recip, cp.int32(rows)))
    if not small and not half:
        _launch(ring, arena, out_slots, out_slots, prime_idx, inverse=False, only_row=True)
