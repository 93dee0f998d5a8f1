"""Batched negacyclic NTT and INTT over arena rows, one prime per row.

Convention (ISA.md section 3, SEAL's Harvey NTT): ``ntt`` maps coefficients a_0..a_{N-1} to
A[j] = sum_i a_i psi^((2 br(j) + 1) i) mod q (bit-reversed output); ``intt`` is its exact inverse
(N^-1 included). Inputs and outputs are canonical residues.

Algorithm: the radix-2 Cooley-Tukey loop with psi powers in bit-reversed order (stage m = 2^s uses
``psi^br(m + i)`` for group i; Gentleman-Sande with the inverse powers for ``intt``), with Harvey's
lazy butterflies (values in [0, 4q) forward, [0, 2q) inverse) and Shoup twiddle products.
Data is staged in shared memory; stages run in passes of up to RADIX_LOG (4) stages held in
registers (16 points per virtual thread; the thesis' scheme is 3 stages, 8 points), with a
__syncthreads between passes.

* N <= 4096: one kernel, one block per row, the whole transform in shared memory.
* N >= 8192: two kernels. Write the index j = hi * 256 + lo. The "column" kernel does the first
  log2(N) - 8 stages (butterflies along hi, 32 columns per block, 256 threads); the "row" kernel
  does the last 8 stages (butterflies along lo, ROWS = 16 rows of 256 points per block). Stage s of a
  256-point row transform uses twiddle index 2^s (2^a + hi) + i_local, a = log2(N) - 8. ``intt``
  runs the row kernel first, then the column kernel, which also multiplies by N^-1.

Rows are independent; each block reads its whole tile before writing it, so ``in_slot == out_slot``
(in place) works. Output slots must not be read by another row of the same launch.
"""

from __future__ import annotations

from caramel.backends.cuda.context import CudaRing, index_array

THREADS = 256
COLS = 32  # columns per block in the column kernel
# Measured on an H200, N = 65536, 512 limbs (2026-11-21): (ROWS, RADIX_LOG) = (16, 4) gives 2.01 M
# NTT/s and 1.96 M INTT/s; (8, 3) 1.90 and 1.78; (16, 3) 1.93 and 1.80; (8, 4) 1.76 and 1.78.
ROWS = 16  # 256-point rows per block in the row kernel (a multiple of 4, at most 2^(log2 N - 8))
RADIX_LOG = 4  # stages per pass held in registers (2^RADIX_LOG points per virtual thread): 3 or 4
ROW_LOG = 8  # log2 of the row length

_SRC = r"""
#define LOGN {logn}
#define NN (1 << LOGN)
#define A_BITS {a_bits}
#define ROWS {rows}
#define RADIX_LOG {radix_log}

// Forward Cooley-Tukey butterfly, Harvey lazy: x, y in [0, 4q) -> [0, 4q).
__device__ __forceinline__ void ct_bfly(u32& x, u32& y, u32 w, u32 wp, u32 q, u32 two_q) {{
    if (x >= two_q) x -= two_q;
    const u32 t = shoup_lazy(y, w, wp, q);
    y = x + two_q - t;
    x = x + t;
}}
// Inverse Gentleman-Sande butterfly: x, y in [0, 2q) -> [0, 2q).
__device__ __forceinline__ void gs_bfly(u32& x, u32& y, u32 w, u32 wp, u32 q, u32 two_q) {{
    u32 u = x + y;
    if (u >= two_q) u -= two_q;
    y = shoup_lazy(x + two_q - y, w, wp, q);
    x = u;
}}

// Shared-memory position of point p of sub-transform `sub`.
// MODE 0: one transform (p). MODE 1: 32 columns, column-minor (bank = column).
// MODE 2: 256-point rows with an XOR swizzle of the low 5 bits that makes every pass of the
// pass plan bank-conflict free ([3, 3, 2] stages for RADIX_LOG 3; [4, 4] for RADIX_LOG 4, where a
// warp spans two rows, hence the row parity in the swizzle).
template <int MODE>
__device__ __forceinline__ int sidx(int sub, int p) {{
    if (MODE == 0) return p;
    if (MODE == 1) return p * 32 + sub;
    const int x = p >> 5;
    if (RADIX_LOG == 4) return sub * 256 + (p ^ x ^ ((sub & 1) * 24));
    return sub * 256 + (p ^ (x << 2) ^ (x & 3));
}}

// Stages S0 .. S0+R-1 of G independent 2^LOGM-point sub-transforms held in shared memory.
// Virtual thread u of a sub-transform owns points base + k*T (k < 2^R); stage S0+d pairs k and
// k + 2^(R-1-d) with group index i_local = g*2^d + (k >> (R-d)) and twiddle (bt << s) + i_local of
// the table tw, bt = bt0 + bt_step * sub (read through L1: a warp reads one or a few
// contiguous twiddles; building the row twiddles in shared memory from two table entries each
// measured slower, 2026-11-21).
template <int LOGM, int G, int MODE, int S0, int R, bool INV>
__device__ __forceinline__ void ntt_pass(u32* sm, const uint2* __restrict__ tw, int bt0, int bt_step,
                                         u32 q, u32 two_q) {{
    constexpr int LOGT = LOGM - S0 - R;
    constexpr int T = 1 << LOGT;
    constexpr int NV = 1 << (LOGM - R);
    for (int item = threadIdx.x; item < NV * G; item += blockDim.x) {{
        int sub, u;
        if (MODE == 1) {{ sub = item % G; u = item / G; }} else {{ u = item % NV; sub = item / NV; }}
        const int off = u & (T - 1);
        const int g = u >> LOGT;
        const int base = (g << (LOGT + R)) + off;
        const int bt = bt0 + bt_step * sub;
        u32 v[1 << R];
#pragma unroll
        for (int k = 0; k < (1 << R); ++k) v[k] = sm[sidx<MODE>(sub, base + k * T)];
#pragma unroll
        for (int dd = 0; dd < R; ++dd) {{
            const int d = INV ? R - 1 - dd : dd;
            const int half = 1 << (R - 1 - d);
            const int s = S0 + d;
#pragma unroll
            for (int k = 0; k < (1 << R); ++k) {{
                if (k & half) continue;
                const int il = (g << d) + (k >> (R - d));
                const uint2 w = __ldg(tw + (bt << s) + il);
                if (INV) gs_bfly(v[k], v[k + half], w.x, w.y, q, two_q);
                else ct_bfly(v[k], v[k + half], w.x, w.y, q, two_q);
            }}
        }}
#pragma unroll
        for (int k = 0; k < (1 << R); ++k) sm[sidx<MODE>(sub, base + k * T)] = v[k];
    }}
}}

__device__ __forceinline__ u32 fwd_final(u32 x, u32 q, u32 two_q) {{
    if (x >= two_q) x -= two_q;
    return x >= q ? x - q : x;
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
    const u32 q = prime_q(pt, pi), two_q = 2 * q;
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
extern "C" __global__ void __launch_bounds__(256) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all) {{
    __shared__ u32 sm[32 << A_BITS];
    constexpr int TILES = (1 << (LOGN - A_BITS)) / 32;
    const int r = blockIdx.x / TILES;
    const int c0 = (blockIdx.x % TILES) * 32;
    const int pi = prime_idx[r];
    const u32 q = prime_q(pt, pi), two_q = 2 * q;
    const uint2* tw = tw_all + (u64)pi * NN;
    const u32* src = arena + (u64)in_slots[r] * NN + c0;
    u32* dst = arena + (u64)out_slots[r] * NN + c0;
    // 16-byte accesses, all issued before the first use (blockDim.x == 256).
#pragma unroll
    for (int it = 0; it < (8 << A_BITS) / 256; ++it) {{
        const int e = it * 256 + threadIdx.x;
        *(uint4*)(sm + e * 4) = *(const uint4*)(src + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4);
    }}
    __syncthreads();
{passes}
    __syncthreads();
{store}
}}
"""

_ROW = r"""
extern "C" __global__ void __launch_bounds__(256) {name}(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all) {{
    __shared__ u32 sm[ROWS * 256];
    constexpr int TILES = (1 << A_BITS) / ROWS;
    const int r = blockIdx.x / TILES;
    const int hi0 = (blockIdx.x % TILES) * ROWS;
    const int pi = prime_idx[r];
    const u32 q = prime_q(pt, pi), two_q = 2 * q;
    const uint2* tw = tw_all + (u64)pi * NN;
    const uint4* src = (const uint4*)(arena + (u64)in_slots[r] * NN + hi0 * 256);
    uint4* dst = (uint4*)(arena + (u64)out_slots[r] * NN + hi0 * 256);
#pragma unroll
    for (int it = 0; it < ROWS / 4; ++it) {{
        const int e = it * 256 + threadIdx.x;
        const uint4 v = src[e];
        const int sub = e >> 6, p = (e & 63) * 4;
        sm[sidx<2>(sub, p)] = v.x;
        sm[sidx<2>(sub, p + 1)] = v.y;
        sm[sidx<2>(sub, p + 2)] = v.z;
        sm[sidx<2>(sub, p + 3)] = v.w;
    }}
    __syncthreads();
{passes}
    __syncthreads();
#pragma unroll
    for (int it = 0; it < ROWS / 4; ++it) {{
        const int e = it * 256 + threadIdx.x;
        const int sub = e >> 6, p = (e & 63) * 4;
        uint4 v;
        v.x = sm[sidx<2>(sub, p)];
        v.y = sm[sidx<2>(sub, p + 1)];
        v.z = sm[sidx<2>(sub, p + 2)];
        v.w = sm[sidx<2>(sub, p + 3)];
{finish}
        dst[e] = v;
    }}
}}
"""


def _pass_calls(logm: int, g: int, mode: int, inverse: bool, bt0: str, bt_step: str, radix_log: int) -> str:
    plan, s = [], 0
    while s < logm:
        r = min(radix_log, logm - s)
        plan.append((s, r))
        s += r
    if inverse:
        plan.reverse()
    inv = "true" if inverse else "false"
    calls = [
        f"    ntt_pass<{logm}, {g}, {mode}, {s0}, {r}, {inv}>(sm, tw, {bt0}, {bt_step}, q, two_q);"
        for s0, r in plan
    ]
    return "\n    __syncthreads();\n".join(calls)


def _source(logn: int, rows: int = ROWS, radix_log: int = RADIX_LOG) -> str:
    """CUDA source of the NTT kernels for N = 2^logn (rows: 256-point rows per row-kernel block;
    radix_log: stages per register pass)."""
    if logn <= 12:
        fwd_store = "    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = fwd_final(sm[i], q, two_q);"
        inv_store = (
            "    const u32 ni = __ldg(pt + 8 * pi + 2), nip = __ldg(pt + 8 * pi + 3);\n"
            "    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = shoup(sm[i], ni, nip, q);"
        )
        kernels = _SMALL.format(
            name="ntt_fwd", passes=_pass_calls(logn, 1, 0, False, "1", "0", radix_log), store=fwd_store
        ) + _SMALL.format(name="ntt_inv", passes=_pass_calls(logn, 1, 0, True, "1", "0", radix_log), store=inv_store)
        return _SRC.format(logn=logn, a_bits=logn, rows=rows, radix_log=radix_log, kernels=kernels)
    a = logn - ROW_LOG
    col_store = (
        "    const u32 ni = __ldg(pt + 8 * pi + 2), nip = __ldg(pt + 8 * pi + 3);\n"
        "    (void)ni; (void)nip;\n"
        "#pragma unroll\n"
        "    for (int it = 0; it < (8 << A_BITS) / 256; ++it) {{\n"
        "        const int e = it * 256 + threadIdx.x;\n"
        "        uint4 v = *(const uint4*)(sm + e * 4);\n"
        "{finish}"
        "        *(uint4*)(dst + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4) = v;\n"
        "    }}"
    )
    col_lazy = col_store.format(finish="")
    col_inv = col_store.format(
        finish="".join(f"        v.{c} = shoup(v.{c}, ni, nip, q);\n" for c in "xyzw")
    )
    row_fwd = "\n".join(
        f"        v.{c} = fwd_final(v.{c}, q, two_q);" for c in "xyzw"
    )
    kernels = (
        _COL.format(name="ntt_fwd_col", passes=_pass_calls(a, COLS, 1, False, "1", "0", radix_log), store=col_lazy)
        + _ROW.format(
            name="ntt_fwd_row",
            passes=_pass_calls(ROW_LOG, rows, 2, False, "(1 << A_BITS) + hi0", "1", radix_log),
            finish=row_fwd,
        )
        + _ROW.format(
            name="ntt_inv_row",
            passes=_pass_calls(ROW_LOG, rows, 2, True, "(1 << A_BITS) + hi0", "1", radix_log),
            finish="",
        )
        + _COL.format(name="ntt_inv_col", passes=_pass_calls(a, COLS, 1, True, "1", "0", radix_log), store=col_inv)
    )
    return _SRC.format(logn=logn, a_bits=a, rows=rows, radix_log=radix_log, kernels=kernels)


def _launch(ring: CudaRing, arena, in_slots, out_slots, prime_idx, inverse: bool,
            rows_per_block: int = ROWS, radix_log: int = RADIX_LOG) -> None:
    ring.check_arena(arena)
    rows = index_array(prime_idx, name="prime_idx").shape[0]
    index_array(in_slots, rows, name="in_slots")
    index_array(out_slots, rows, name="out_slots")
    if rows == 0:
        return
    key = f"ntt{ring.n}" if (rows_per_block, radix_log) == (ROWS, RADIX_LOG) else f"ntt{ring.n}-{rows_per_block}-{radix_log}"
    fwd_tw, inv_tw = ring.twiddles
    tw = inv_tw if inverse else fwd_tw
    pt = ring.prime_table

    def run(name, src, dst, blocks_per_row):
        k = ring.kernel(key, lambda: _source(ring.logn, rows_per_block, radix_log), name)
        k((rows * blocks_per_row,), (THREADS,), (arena, src, dst, prime_idx, pt, tw))

    if ring.logn <= 12:
        run("ntt_inv" if inverse else "ntt_fwd", in_slots, out_slots, 1)
        return
    a = ring.logn - ROW_LOG
    col_blocks = (1 << ROW_LOG) // COLS
    row_blocks = (1 << a) // rows_per_block
    if inverse:
        run("ntt_inv_row", in_slots, out_slots, row_blocks)
        run("ntt_inv_col", out_slots, out_slots, col_blocks)
    else:
        run("ntt_fwd_col", in_slots, out_slots, col_blocks)
        run("ntt_fwd_row", out_slots, out_slots, row_blocks)


def ntt(ring: CudaRing, arena, in_slots, out_slots, prime_idx) -> None:
    """Forward NTT: arena[out_slots[r]] = NTT_{q_p}(arena[in_slots[r]]) with p = prime_idx[r].

    All index arguments are int32 cupy arrays of length R. Launches on the current stream.
    """
    _launch(ring, arena, in_slots, out_slots, prime_idx, inverse=False)


def intt(ring: CudaRing, arena, in_slots, out_slots, prime_idx) -> None:
    """Inverse NTT (exact inverse of :func:`ntt`, N^-1 included), same arguments."""
    _launch(ring, arena, in_slots, out_slots, prime_idx, inverse=True)
