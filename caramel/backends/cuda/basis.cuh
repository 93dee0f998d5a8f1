
// Tiled base conversion: block (b, tile, chunk), chunk fastest, computes outputs d0 .. d0 + W - 1
// (d0 = 16 chunk; W = 16, or 8 for the last chunk when D mod 16 is 1..8, so that fewer padded
// outputs are accumulated) of 256 coefficients (2 a thread, 8-byte accesses). Its W columns of the
// table (S x DP16, zero padded) sit in shared memory; the 2 W sums stay in 64-bit registers; each
// input limb is read once per chunk (the chunks of a tile run together, so the re-reads of the other
// chunks hit L2). t_k and the float sum f are recomputed per chunk.
// EXACT adds v [-Q_S]_p to the 64-bit sum (one more multiply-add; v <= S). Then acc mod p in 32-bit
// arithmetic: acc = hi 2^32 + lo, so the value is hi [2^32]_p + lo mod p, two Shoup products (lo =
// lo * 1) each in [0, 2p), summed with conditional subtractions (p < 2^30). c0 = (p, [-Q_S]_p, its
// Shoup quotient, [2^32]_p), c1 = (Shoup quotient of [2^32]_p, floor(2^32 / p), 0, 0).
__device__ __forceinline__ u32 reduce_sum(u64 acc, uint4 c0, uint4 c1) {
    const u32 p = c0.x, two_p = 2 * c0.x;
    u32 r = shoup_lazy((u32)(acc >> 32), c0.w, c1.x, p) + shoup_lazy((u32)acc, 1u, c1.y, p);
    r = r >= two_p ? r - two_p : r;
    return r >= p ? r - p : r;
}

template <int MODE, int W>
__device__ __forceinline__ void base_convert_tile(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D,
        const u32* __restrict__ in_consts, const u32* __restrict__ out8, const u32* __restrict__ table,
        const double* __restrict__ recip, int n, int tiles, int chunks) {
    __shared__ uint4 tab[64 * (W / 4)];
    const int chunk = blockIdx.x % chunks;
    const int rest = blockIdx.x / chunks;
    const int tile = rest % tiles, b = rest / tiles;
    const int DP = chunks * 16, d0 = chunk * 16;
    for (int e = threadIdx.x; e < S * (W / 4); e += blockDim.x)
        tab[e] = *(const uint4*)(table + (e / (W / 4)) * DP + d0 + (e % (W / 4)) * 4);
    __syncthreads();
    const int i = (tile * blockDim.x + threadIdx.x) * 2;
    if (i >= n) return;
    const int* __restrict__ ins = in_slots + b * S;
    u64 acc[2][W];
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int j = 0; j < W; ++j) acc[c][j] = 0;
    double f[2] = {0.0, 0.0};
    // Inputs in groups of 8 limbs: the 8 loads of a group are in flight together.
    for (int k0 = 0; k0 < S; k0 += 8) {
        uint2 xs[8];
#pragma unroll
        for (int j = 0; j < 8; ++j)
            xs[j] = k0 + j < S ? *(const uint2*)(arena + (u64)__ldg(ins + k0 + j) * n + i) : make_uint2(0u, 0u);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int k = k0 + j;
            if (k >= S) break;
            u32 x[2] = {xs[j].x, xs[j].y};
            if (MODE != 1) {
                const u32 qk = __ldg(in_consts + 4 * k), w = __ldg(in_consts + 4 * k + 1);
                const u32 wp = __ldg(in_consts + 4 * k + 2);
#pragma unroll
                for (int c = 0; c < 2; ++c) x[c] = shoup(x[c], w, wp, qk);
                if (MODE == 2) {
                    const double r = __ldg(recip + k);
#pragma unroll
                    for (int c = 0; c < 2; ++c) f[c] = __dadd_rn(f[c], __dmul_rn((double)x[c], r));
                }
            }
#pragma unroll
            for (int q4 = 0; q4 < W / 4; ++q4) {
                const uint4 m = tab[(W / 4) * k + q4];
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    acc[c][4 * q4 + 0] += (u64)x[c] * m.x;
                    acc[c][4 * q4 + 1] += (u64)x[c] * m.y;
                    acc[c][4 * q4 + 2] += (u64)x[c] * m.z;
                    acc[c][4 * q4 + 3] += (u64)x[c] * m.w;
                }
            }
        }
    }
    u32 v[2];
#pragma unroll
    for (int c = 0; c < 2; ++c) v[c] = MODE == 2 ? (u32)floor(__dadd_rn(f[c], 0.5)) : 0u;
#pragma unroll
    for (int j = 0; j < W; ++j) {
        const int d = d0 + j;
        if (d < D) {
            const uint4 c0 = __ldg((const uint4*)(out8 + 8 * d)), c1 = __ldg((const uint4*)(out8 + 8 * d + 4));
            u32* dst = arena + (u64)__ldg(out_slots + b * D + d) * n + i;
            u32 r[2];
#pragma unroll
            for (int c = 0; c < 2; ++c)
                r[c] = reduce_sum(MODE == 2 ? acc[c][j] + (u64)v[c] * c0.y : acc[c][j], c0, c1);
            *(uint2*)dst = make_uint2(r[0], r[1]);
        }
    }
}
// tail8: the last chunk holds 8 outputs (see base_convert_tile).
#define BC_TILED(NAME, MODE) \
extern "C" __global__ void __launch_bounds__(128) NAME( \
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D, \
        const u32* __restrict__ in_consts, const u32* __restrict__ out8, const u32* __restrict__ table, \
        const double* __restrict__ recip, int n, int tiles, int chunks, int tail8) { \
    if (tail8 && blockIdx.x % chunks == chunks - 1) \
        base_convert_tile<MODE, 8>(arena, in_slots, out_slots, S, D, in_consts, out8, table, recip, n, tiles, chunks); \
    else \
        base_convert_tile<MODE, 16>(arena, in_slots, out_slots, S, D, in_consts, out8, table, recip, n, tiles, chunks); \
}
BC_TILED(base_convert_tiled_textbook, 0)
BC_TILED(base_convert_tiled_emulator, 1)
BC_TILED(base_convert_tiled_exact, 2)

// 4 residues per thread (16-byte accesses); n4 = N / 4.
__device__ __forceinline__ u32 lift1(u32 x, u32 qt, u32 ql, u64 mu, u32 qt_mod_ql, int centred) {
    u32 y = reduce64(x, ql, mu);
    if (centred && x > (qt - 1u) / 2u) y = sub_mod(y, qt_mod_ql, ql);
    return y;
}
extern "C" __global__ void __launch_bounds__(256) sud_lift(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ src_prime, const int* __restrict__ dst_prime, const u32* __restrict__ pt,
        int centred, int n4, int tiles) {
    const int r = blockIdx.x / tiles;
    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    if (i >= n4) return;
    const int l = dst_prime[r];
    const u32 qt = prime_q(pt, src_prime[r]);
    const u32 ql = prime_q(pt, l);
    const u64 mu = prime_mu(pt, l);
    const u32 qm = reduce64(qt, ql, mu);
    const uint4 x = ((const uint4*)arena)[(u64)in_slots[r] * n4 + i];
    uint4 y;
    y.x = lift1(x.x, qt, ql, mu, qm, centred);
    y.y = lift1(x.y, qt, ql, mu, qm, centred);
    y.z = lift1(x.z, qt, ql, mu, qm, centred);
    y.w = lift1(x.w, qt, ql, mu, qm, centred);
    ((uint4*)arena)[(u64)out_slots[r] * n4 + i] = y;
}
