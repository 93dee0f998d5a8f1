// Warp tiles (caramel.backends.cuda.ntt): the row passes of the row kernels, the one-kernel transforms' row items and
// the epilogues' load. Needs A_BITS (log2 of a limb's rows of 256 points), LAZY and butterflies.cuh, passes.cuh.

// Row kernels with warp tiles: warp w of the block owns 4 rows of 256 points in shared memory, point p of row x
// (x < 4) at word wsidx(x, p), rows WPITCH words apart (16 mod 32: the two rows a warp reads at once land on the two
// halves of the banks). Pass A (stages 0-3): item (x, u), u < 16, owns points u + 16 k; a half-warp reads or writes
// the 16 points of group k of its row at once. Pass B (stages 4-7): item (x, g) owns points 16 g .. 16 g + 15, four
// 16-byte chunks c (points 16 g + 4 c ..); a quarter-warp (8 lanes) reads or writes chunk c of 8 groups at once.
// The 16-byte chunks are XOR-swizzled within each row (WPITCH = 272): chunk c of group g at chunk c ^ h,
// h = (g / 2) mod 4, i.e. wsidx(x, p) = WPITCH x + (p ^ 4 ((p >> 5) & 3)): a group's 16 points stay in its 16 words
// (pass A: conflict-free), the 8 groups of a quarter-warp take 8 distinct 16-byte bank groups (16 (g mod 2) +
// 4 (c ^ h)), and a 16-byte chunk stays whole (p a multiple of 4 maps to one).
#define WPITCH 272
__device__ __forceinline__ int wsidx(int x, int p) {
    return x * WPITCH + (p ^ (((p >> 5) & 3) << 2));
}
// wsidx of the passes' own points, written so that k and c (unrolled) stay constants: pass A's point u + 16 k
// (u < 16: its group is k) and pass B's chunk c of group g (point 16 g + 4 c).
__device__ __forceinline__ int wsidx_a(int x, int u, int k) {
    return x * WPITCH + 16 * k + (u ^ (((k >> 1) & 3) << 2));
}
__device__ __forceinline__ int wsidx_b(int x, int g, int c) {
    return x * WPITCH + 16 * g + 4 * (c ^ ((g >> 1) & 3));
}

// Pass A (S0 = 0) or B (S0 = 4) of the warp's 4 rows x = 0..3 (rows bt0 + x of the table's numbering,
// bt0 = 2^A_BITS + first row; see ntt_pass for the twiddle indices: stage s = S0 + d of row bt uses
// tw[(bt << s) + (g << d) + j], j = k >> (4 - d), g = 0 in pass A). Stages s >= SF (SF >= 4) take it as
// tw[bt << s] x tw[(g << d) + j] (two Shoup products; the row factor from wt, the second from tl); the
// earlier ones one table entry, from the warp's table wt for s < SFT (see transform.py's row kernel), else from tw.
// Rows 2 it + (lane >> 4) for it0 <= it < it1 (default: all 4).
template <int S0, bool INV, int SF, int SFT>
__device__ __forceinline__ void wpass(u32* sm, const uint2* __restrict__ tw, const uint2* tl, const uint2* wt,
                                      int bt0, int lane, u32 q, u32 two_q, u32 four_q, u32 eight_q, int it0 = 0,
                                      int it1 = 2) {
#pragma unroll
    for (int it = it0; it < it1; ++it) {
        const int x = (lane >> 4) + 2 * it, u = lane & 15;
        u32 v[16];
        if (S0 == 4) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const uint4 y = *(const uint4*)(sm + wsidx_b(x, u, c));
                v[4 * c] = y.x; v[4 * c + 1] = y.y; v[4 * c + 2] = y.z; v[4 * c + 3] = y.w;
            }
        } else {
#pragma unroll
            for (int k = 0; k < 16; ++k) v[k] = sm[wsidx_a(x, u, k)];
        }
#pragma unroll
        for (int dd = 0; dd < 4; ++dd) {
            const int d = INV ? 3 - dd : dd;
            const int half = 8 >> d;
            const int s = S0 + d;
            const bool split_s = s >= SF;  // constant once unrolled
            const int g = S0 == 4 ? u : 0;
            const uint2* __restrict__ tws = tw + (((bt0 + x) << s) + (g << d));  // stages SFT <= s < SF
            const uint2* wts = wt + 4 * ((1 << s) - 1) + (x << s) + (g << d);    // stages s < SFT
            const uint2 rf = split_s ? wt[4 * ((1 << SFT) - 1) + 4 * (s - SF) + x] : make_uint2(0u, 0u);
            const uint2* tls = tl + 16 * ((1 << d) - 1) + u;
#pragma unroll
            for (int k = 0; k < 16; ++k) {
                if (k & half) continue;
                const int j = k >> (4 - d);
                const uint2 w1 = split_s ? tls[16 * j] : s < SFT ? wts[j] : __ldg(tws + j);
                if (INV) {
                    u32 x = v[k], y = v[k + half];
                    gs_sum_diff(x, y, k, dd, two_q, four_q, eight_q);
                    u32 t = shoup_lazy(y, w1.x, w1.y, q);
                    if (split_s) t = shoup_lazy(t, rf.x, rf.y, q);
                    v[k] = x;
                    v[k + half] = t;
                } else {
                    u32 t = shoup_lazy(v[k + half], w1.x, w1.y, q);
                    if (split_s) t = shoup_lazy(t, rf.x, rf.y, q);
                    if (!LAZY) ct_bfly(v[k], v[k + half], t, two_q);
                    else if (d == 0) ct_bfly_lazy<true>(v[k], v[k + half], t, two_q, eight_q);
                    else ct_bfly_lazy<false>(v[k], v[k + half], t, two_q, eight_q);
                }
            }
        }
        if (INV) {
#pragma unroll
            for (int k = 0; k < 16; ++k) v[k] = gs_pass_end(v[k], k, 4, four_q, eight_q);
        }
        if (S0 == 4) {
#pragma unroll
            for (int c = 0; c < 4; ++c)
                *(uint4*)(sm + wsidx_b(x, u, c)) =
                    make_uint4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
        } else {
#pragma unroll
            for (int k = 0; k < 16; ++k) sm[wsidx_a(x, u, k)] = v[k];
        }
    }
}

// A warp tile's loads (the row kernels, the epilogues): wtile_load issues the 16-byte loads of its 4 rows at src into
// y, through L2 only (ld.global.cg: the limb is read once, so it takes no L1 lines from the twiddles), evict-first
// (ld.global.cs) when FIRST (the transform's first pass reads its input once: L2 keeps the intermediate); wtile_table the cp.async copies (not committed) of its table wt: the one-product
// twiddles of stages s < SFT of rows bt0 .. bt0 + 3 (tw[(bt0 << s) .. + 4 2^s) at wt[4 (2^s - 1)]) and their row
// factors of the split stages s >= SF (warp_table_index), from WARP_TABLE; wtile_store writes y to the warp's shared
// memory sm (wsidx); wtile_async (the epilogues) copies the tile straight to sm with cp.async (through L2 only; not
// committed), no registers held while the copies are in flight.
template <bool FIRST>
__device__ __forceinline__ void wtile_load(const uint4* __restrict__ src, uint4 (&y)[8], int lane) {
#pragma unroll
    for (int it = 0; it < 8; ++it) y[it] = FIRST ? __ldcs(src + it * 32 + lane) : __ldcg(src + it * 32 + lane);
}
// Prime pi's row of warp_tables (tl_all): its split-factor table tl (240 entries), then the table wt of every warp
// tile (WT entries; tile t: rows 2^A_BITS + 4 t ..), each a contiguous range that the kernels copy as it is.
#define TABLE_ROW(tl_all, pi, WT) ((tl_all) + (u64)(pi) * (240 + ((1 << A_BITS) / 4) * (WT)))
#define WARP_TABLE(tl_all, pi, tile, WT) (TABLE_ROW(tl_all, pi, WT) + 240 + (tile) * (WT))
template <int WT>
__device__ __forceinline__ void wtile_table(uint2* wt, const uint2* __restrict__ src, int lane) {
    for (int c = lane; c < WT / 2; c += 32) cp_async16(wt + 2 * c, src + 2 * c);
}
__device__ __forceinline__ void wtile_async(u32* sm, const uint4* __restrict__ src, int lane) {
#pragma unroll
    for (int it = 0; it < 8; ++it) cp_async16(sm + wsidx(it >> 1, ((it & 1) * 32 + lane) * 4), src + it * 32 + lane);
}
__device__ __forceinline__ void wtile_store(u32* sm, const uint4 (&y)[8], int lane) {
#pragma unroll
    for (int it = 0; it < 8; ++it) *(uint4*)(sm + wsidx(it >> 1, ((it & 1) * 32 + lane) * 4)) = y[it];
}

