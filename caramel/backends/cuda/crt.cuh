
// X += c * Qhat (c < q_l, so the product is < Q_B), then X -= Q_B if X >= Q_B.
// consts for basis position j: [q_l, inv, inv_shoup, Qhat words (M)]; QB words follow all positions.
template <int M>
__device__ __forceinline__ void rsv_body(u32* arena, const int* __restrict__ acc_slots,
        const int* __restrict__ src_slots, const int* __restrict__ src_pos, int K,
        const u32* __restrict__ consts, const u32* __restrict__ qb, int n, int tiles) {
    const int g = blockIdx.x / tiles;
    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u32 x[M];
#pragma unroll
    for (int w = 0; w < M; ++w) x[w] = arena[(u64)acc_slots[g * M + w] * n + i];
    for (int j = 0; j < K; ++j) {
        const u32* c = consts + src_pos[g * K + j] * (3 + M);
        const u32 rs = arena[(u64)src_slots[g * K + j] * n + i];
        const u32 a = shoup(rs, __ldg(c + 1), __ldg(c + 2), __ldg(c));
        u64 carry = 0;
#pragma unroll
        for (int w = 0; w < M; ++w) {
            const u64 s = (u64)a * __ldg(c + 3 + w) + x[w] + carry;
            x[w] = (u32)s;
            carry = s >> 32;
        }
        u32 d[M];
        u32 borrow = 0;
#pragma unroll
        for (int w = 0; w < M; ++w) {
            const u64 s = (u64)x[w] - __ldg(qb + w) - borrow;
            d[w] = (u32)s;
            borrow = (u32)(s >> 63);
        }
        if (!borrow) {
#pragma unroll
            for (int w = 0; w < M; ++w) x[w] = d[w];
        }
    }
#pragma unroll
    for (int w = 0; w < M; ++w) arena[(u64)acc_slots[g * M + w] * n + i] = x[w];
}

template <int M>
__device__ __forceinline__ void mod_body(u32* arena, const int* __restrict__ acc_slots,
        const int* __restrict__ out_slots, const int* __restrict__ prime_idx, const u32* __restrict__ pt,
        int n, int tiles) {
    const int r = blockIdx.x / tiles;
    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const int p = prime_idx[r];
    const u32 q = prime_q(pt, p);
    const u64 mu = prime_mu(pt, p);
    u32 y = 0;
#pragma unroll
    for (int w = M - 1; w >= 0; --w)
        y = reduce64(((u64)y << 32) | arena[(u64)acc_slots[r * M + w] * n + i], q, mu);
    arena[(u64)out_slots[r] * n + i] = y;
}

// Rows moved through a buffer (source and destination rows may overlap): buf[r] = arena[src[r]], then, in a
// second launch, arena[dst[r]] = buf[r]. rsv's accumulators go to their output rows this way, with no
// allocation (a graph capture allows none).
extern "C" __global__ void __launch_bounds__(256) gather_rows(const u32* __restrict__ arena,
        const int* __restrict__ src, u32* __restrict__ buf, int n, int tiles) {
    const int r = blockIdx.x / tiles;
    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    if (i < n) buf[(u64)r * n + i] = arena[(u64)src[r] * n + i];
}

extern "C" __global__ void __launch_bounds__(256) scatter_rows(u32* __restrict__ arena,
        const int* __restrict__ dst, const u32* __restrict__ buf, int n, int tiles) {
    const int r = blockIdx.x / tiles;
    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    if (i < n) arena[(u64)dst[r] * n + i] = buf[(u64)r * n + i];
}
