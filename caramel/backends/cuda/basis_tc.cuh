
// Base conversion on the tensor cores (see tc_layout, tc_table, tc_fragments, tc_words in basis.py).
// Block (b, tile): 128 coefficients, a warp 32 of them (two m16 tiles). Thread r computes t_k (and
// v) of coefficient tile 128 + r and writes its A row (KW = 8 KC words) to shared memory; the warp
// then holds the A fragments of its 32 rows in registers for all KC k-chunks and, for each 8
// outputs (TC_UNROLL tiles of 8 an iteration), runs 4 (byte planes b) x KC x 2 mma.m16n8k32
// (u8 x u8 -> s32) with the B fragments read from the pre-swizzled table (L1-resident), folds
// R_b 2^(8b) into two words and reduces (tc_reduce). The A rows are permuted within the warp
// (tc_row): MMA row 16 m + 8 hi + g holds coefficient 4 g + 2 m + hi, so that a lane's four results
// of one output are 4 consecutive coefficients, one 16-byte store. A warp reads all its inputs before
// it writes and only its own 32 coefficients, so outputs may overwrite inputs.
__device__ __forceinline__ void mma_u8(int* c, const u32* a, uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}
__device__ __forceinline__ u32 byte_plane(u32 t0, u32 t1, u32 t2, u32 t3, u32 sel) {
    return __byte_perm(__byte_perm(t0, t1, sel), __byte_perm(t2, t3, sel), 0x5410);
}
// sum_b R_b 2^(8b) mod p in 32-bit arithmetic (see tc_reduce in basis.py): z = R_0 + R_1 2^8 < 2^32,
// y = R_2 + R_3 2^8, value z + y 2^16; c = (p, [2^16]_p, its Shoup quotient, floor(2^32 / p)), np =
// -p mod 2^32. Two Shoup products (z 1 and y [2^16]_p, each in [0, 2p)) with one multiply-add of the
// summed quotients by -p: [0, 4p).
__device__ __forceinline__ u32 tc_reduce(int r0, int r1, int r2, int r3, uint4 c, u32 np) {
    const u32 z = (u32)r0 + ((u32)r1 << 8), y = (u32)r2 + ((u32)r3 << 8);
    const u32 r = z + y * c.y + (__umulhi(z, c.w) + __umulhi(y, c.z)) * np;
    const u32 s = min(r, r - 2u * c.x);
    return min(s, s - c.x);
}
template <int MODE, int KC>
__device__ __forceinline__ void base_convert_tc(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D,
        const u32* __restrict__ in_consts, const u32* __restrict__ out4, const uint2* __restrict__ frag,
        const double* __restrict__ recip, int n, int tiles) {
    constexpr int KW = 8 * KC, STRIDE = KW + 4;  // STRIDE: conflict-free fragment reads
    __shared__ u32 rows[128 * STRIDE];
    // The block's constants, read by every thread: (q_k, w_k, w'_k, input slot) and 1/q_k for k < SP,
    // (p_d, ..) of out4 and the output slot for d < 8 DT (slots past D repeat the last one).
    __shared__ uint4 cin[68];
    __shared__ double rin[68];
    __shared__ uint4 cout[64];
    __shared__ u32 sout[64];
    const int tile = blockIdx.x % tiles, b = blockIdx.x / tiles;
    const u32 base = tile * 128, row_bytes = 4u * n;  // a limb's bytes: addresses are one IMAD.WIDE.U32
    const int G = (S + 4) >> 2;  // SP / 4: inputs 0..S-1 and t_S = v
    const int DT = (D + 7) >> 3;
    for (int k = threadIdx.x; k < 4 * G; k += 128) {
        uint4 c = __ldg((const uint4*)in_consts + k);
        c.w = k < S ? __ldg(in_slots + b * S + k) : 0;
        cin[k] = c;
        if (MODE == 2) rin[k] = __ldg(recip + k);
    }
    for (int d = threadIdx.x; d < 8 * DT; d += 128) {
        cout[d] = __ldg((const uint4*)out4 + d);
        sout[d] = __ldg(out_slots + b * D + min(d, D - 1));
    }
    __syncthreads();
    {
        const char* src = (const char*)(arena + base + threadIdx.x);
        const int l = threadIdx.x & 31;  // coefficient l of the warp -> its MMA row (tc_row)
        u32* row = rows + ((threadIdx.x & 96) + 16 * ((l >> 1) & 1) + 8 * (l & 1) + (l >> 2)) * STRIDE;
        double f = 0.0;
        // TC_PF inputs a chunk: their loads are in flight together, then t of each 4 in turn.
        for (int j0 = 0; j0 < G; j0 += TC_PF / 4) {
            u32 xs[TC_PF];
#pragma unroll
            for (int q = 0; q < TC_PF; ++q) {
                const int k = 4 * j0 + q;
                const u32 x = *(const u32*)(src + (u64)cin[min(k, S - 1)].w * row_bytes);  // no predicate
                xs[q] = k < S ? x : 0u;
            }
#pragma unroll
            for (int jj = 0; jj < TC_PF / 4; ++jj) {
                const int j = j0 + jj;
                if (j >= G) break;
                u32 x[4];
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int k = 4 * j + q;
                    x[q] = xs[4 * jj + q];
                    if (MODE != 1) {  // constants zero padded to SP rows: k >= S gives t = 0 and f + 0.0 = f
                        const uint4 cq = cin[k];
                        x[q] = shoup(x[q], cq.y, cq.z, cq.x);
                        if (MODE == 2) f = __dadd_rn(f, __dmul_rn((double)x[q], rin[k]));
                    }
                    if (MODE == 2 && k == S) x[q] = (u32)floor(__dadd_rn(f, 0.5));  // f is complete: q increases
                }
#pragma unroll
                for (int a = 0; a < 4; ++a) row[a * G + j] = byte_plane(x[0], x[1], x[2], x[3], a | ((a + 4) << 4));
            }
        }
        for (int w = 4 * G; w < KW; ++w) row[w] = 0u;
    }
    __syncwarp();
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = (threadIdx.x & 96) + g;  // rows r0 (+8) of m-tile 0, r0 + 16 (+8) of m-tile 1
    u32 af[2][KC][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int c = 0; c < KC; ++c) {
            const u32* p = rows + (r0 + 16 * m) * STRIDE + 8 * c + t;
            af[m][c][0] = p[0];
            af[m][c][1] = p[8 * STRIDE];
            af[m][c][2] = p[4];
            af[m][c][3] = p[8 * STRIDE + 4];
        }
    const uint2* __restrict__ fr = frag + lane;
#pragma unroll TC_UNROLL
    for (int dt = 0; dt < DT; ++dt) {
        int acc[4][2][4];
#pragma unroll
        for (int bp = 0; bp < 4; ++bp) {
            uint2 bf[KC];
#pragma unroll
            for (int c = 0; c < KC; ++c) bf[c] = __ldg(fr + ((dt * 4 + bp) * KC + c) * 32);
#pragma unroll
            for (int m = 0; m < 2; ++m) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[bp][m][e] = 0;
#pragma unroll
                for (int c = 0; c < KC; ++c) mma_u8(acc[bp][m], af[m][c], bf[c]);
            }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // output d = 8 dt + 2 t + h; element 2 hi + h of m-tile m is
            const int d = 8 * dt + 2 * t + h;  // coefficient 4 g + 2 m + hi of the warp
            const uint4 cc = cout[d];
            const u32 np = 0u - cc.x;
            uint4 y;
            y.x = tc_reduce(acc[0][0][h], acc[1][0][h], acc[2][0][h], acc[3][0][h], cc, np);
            y.y = tc_reduce(acc[0][0][2 + h], acc[1][0][2 + h], acc[2][0][2 + h], acc[3][0][2 + h], cc, np);
            y.z = tc_reduce(acc[0][1][h], acc[1][1][h], acc[2][1][h], acc[3][1][h], cc, np);
            y.w = tc_reduce(acc[0][1][2 + h], acc[1][1][2 + h], acc[2][1][2 + h], acc[3][1][2 + h], cc, np);
            if (d < D) *(uint4*)((char*)(arena + base + (threadIdx.x & 96) + 4 * g) + (u64)sout[d] * row_bytes) = y;
        }
    }
}
#define BC_TC(MODE, NAME) \
extern "C" __global__ void __launch_bounds__(128, TC_MINB) base_convert_tc_##NAME( \
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D, \
        const u32* __restrict__ in_consts, const u32* __restrict__ out4, const uint2* __restrict__ frag, \
        const double* __restrict__ recip, int n, int tiles) { \
    base_convert_tc<MODE, TC_KC>(arena, in_slots, out_slots, S, D, in_consts, out4, frag, recip, n, tiles); \
}
BC_TC(0, textbook)
BC_TC(1, emulator)
BC_TC(2, exact)
