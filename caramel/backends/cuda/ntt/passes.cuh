// Shared-memory passes of the NTT kernels (caramel.backends.cuda.ntt): twiddle products, the column and one-kernel
// transforms' passes (ntt_pass), cp.async copies and the passes' stores. Needs A_BITS (log2 of the column length of
// a limb seen as 2^A_BITS x 256), LAZY and butterflies.cuh.

// a * W mod q in [0, 2q) for the twiddle W = tw[(bt << s) + il] (a Shoup product); SMEM: tw is in shared memory.
template <bool SMEM>
__device__ __forceinline__ u32 tw_mul(u32 a, const uint2* __restrict__ tw, int bt, int s, int il, u32 q) {
    const uint2 w = SMEM ? tw[(bt << s) + il] : __ldg(tw + (bt << s) + il);
    return shoup_lazy(a, w.x, w.y, q);
}

// The column stages' twiddles tw[0 .. 2^A_BITS) of one prime (every index a column pass reads, see ntt_pass) copied
// to tws in shared memory, one entry a thread; the block barrier after the tile's data loads publishes them. A warp's
// lanes are columns of one sub-transform, so every twiddle read is a broadcast from shared memory, where a read
// through L1 took a 64-bit address and a longer wait.
__device__ __forceinline__ const uint2* col_twiddles(uint2* tws, const uint2* __restrict__ tw) {
    for (int i = threadIdx.x; i < (1 << A_BITS); i += blockDim.x) tws[i] = __ldg(tw + i);
    return tws;
}

// Shared-memory position of point p of sub-transform `sub`.
// MODE 0: one transform (p). MODE 1: 32 columns, column-minor (bank = column).
template <int MODE>
__device__ __forceinline__ int sidx(int sub, int p) {
    return MODE == 0 ? p : p * 32 + sub;
}

// Stages S0 .. S0+R-1 of G independent 2^LOGM-point sub-transforms held in shared memory (the
// small transform, N <= 4096: G = 1, MODE 0; the column kernels: G = 32 columns, MODE 1).
// Virtual thread u of a sub-transform owns points base + k*T (k < 2^R); stage S0+d pairs k and
// k + 2^(R-1-d) with group index i_local = g*2^d + (k >> (R-d)) and twiddle 2^s + i_local of the
// table tw (MODE 0: through L1, a warp reading one or a few contiguous twiddles; MODE 1: the copy in shared
// memory, col_twiddles) from one base pointer tw + (g << d) a stage and a constant offset each.
// CANON (forward, the transform's first pass): the inputs are canonical, so its first stage needs no reduction (after
// R <= 4 stages the values stay below q + 2q R <= 9q, as the next pass's reduction expects: below 16q).
template <int LOGM, int G, int MODE, int S0, int R, bool INV, bool CANON = false>
__device__ __forceinline__ void ntt_pass(u32* sm, const uint2* __restrict__ tw, u32 q, u32 two_q, u32 four_q,
                                         u32 eight_q) {
    constexpr int LOGT = LOGM - S0 - R;
    constexpr int T = 1 << LOGT;
    constexpr int NV = 1 << (LOGM - R);
    for (int item = threadIdx.x; item < NV * G; item += blockDim.x) {
        int sub, u;
        if (MODE == 1) {
            sub = item % G; u = item / G;
        } else {
            u = item % NV; sub = item / NV;
        }
        const int off = u & (T - 1);
        const int g = u >> LOGT;
        const int base = (g << (LOGT + R)) + off;
        u32 v[1 << R];
#pragma unroll
        for (int k = 0; k < (1 << R); ++k) v[k] = sm[sidx<MODE>(sub, base + k * T)];
#pragma unroll
        for (int dd = 0; dd < R; ++dd) {
            const int d = INV ? R - 1 - dd : dd;
            const int half = 1 << (R - 1 - d);
            const int s = S0 + d;
            const uint2* __restrict__ twg = tw + (g << d);
#pragma unroll
            for (int k = 0; k < (1 << R); ++k) {
                if (k & half) continue;
                const int il = k >> (R - d);
                if (INV) {
                    u32 x = v[k], y = v[k + half];
                    gs_sum_diff(x, y, k, dd, two_q, four_q, eight_q);
                    v[k + half] = tw_mul<MODE == 1>(y, twg, 1, s, il, q);
                    v[k] = x;
                } else {
                    const u32 t = tw_mul<MODE == 1>(v[k + half], twg, 1, s, il, q);
                    if (!LAZY) ct_bfly(v[k], v[k + half], t, two_q);
                    else if (d == 0 && !CANON) ct_bfly_lazy<true>(v[k], v[k + half], t, two_q, eight_q);
                    else ct_bfly_lazy<false>(v[k], v[k + half], t, two_q, eight_q);
                }
            }
        }
#pragma unroll
        for (int k = 0; k < (1 << R); ++k)
            sm[sidx<MODE>(sub, base + k * T)] = INV && S0 > 0 ? gs_pass_end(v[k], k, R, four_q, eight_q) : v[k];
    }
}

// 16-byte asynchronous copies global -> shared (cp.async, sm_80+), for the twiddle tables of the warp-tile row
// kernels and the epilogues' tiles.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory"); }

// A 16-byte store of a column or row pass: evict-first (st.global.cs) when CS: the last pass's output, read by no
// kernel soon, should not push out of L2 the intermediates a one-kernel transform still has to read (fused.py); else
// evict-last (st.global.L2::cache_hint under a createpolicy evict_last policy): the intermediate that the
// row pass or an epilogue reads next, or a transform's output, stays in L2 against the other streams' traffic.
template <bool CS>
__device__ __forceinline__ void store16(uint4* p, uint4 v) {
    if (CS) {
        __stcs(p, v);
    } else {
        u64 pol;
        asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
        asm volatile("st.global.L2::cache_hint.v4.u32 [%0], {%1, %2, %3, %4}, %5;" :: "l"(p), "r"(v.x), "r"(v.y),
                     "r"(v.z), "r"(v.w), "l"(pol) : "memory");
    }
}
