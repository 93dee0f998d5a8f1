
// A block of B = min(1024, N) consecutive outputs reads exactly one aligned block of B inputs (the
// varying low bits of j become the high bits of g (2 br(j) + 1) mod 2N, hence the low bits of the
// source index), so the block stages that input block in shared memory with 16-byte loads, then
// each thread gathers 4 consecutive outputs from it and stores them as one 16-byte word.
__device__ __forceinline__ u32 auto_src(u32 j, u32 g, int logn, u32 mask2n) {
    const u32 bj = __brev(j) >> (32 - logn);
    // (g (2 br(j) + 1)) mod 2N; 2N divides 2^32, so the wrapped 32-bit product is exact mod 2N.
    const u32 e = (g * (2u * bj + 1u)) & mask2n;
    return __brev((e - 1u) >> 1) >> (32 - logn);
}
extern "C" __global__ void __launch_bounds__(256) automorphism(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots,
        const int* __restrict__ galois, int logn, int tiles) {
    __shared__ uint4 sm4[256];
    const u32* sm = (const u32*)sm4;
    const int r = blockIdx.x / tiles;
    const u32 n = 1u << logn;
    const u32 block = n < 1024u ? n : 1024u;
    const u32 j0 = (blockIdx.x % tiles) * block;
    const u32 g = (u32)galois[r];
    const u32 mask2n = 2u * n - 1u;
    const u32 base = auto_src(j0, g, logn, mask2n) & ~(block - 1u);
    const uint4* src = (const uint4*)(arena + (u64)in_slots[r] * n + base);
    for (u32 t = threadIdx.x; t < block / 4; t += blockDim.x) sm4[t] = src[t];
    __syncthreads();
    uint4* dst = (uint4*)(arena + (u64)out_slots[r] * n + j0);
    for (u32 t = threadIdx.x; t < block / 4; t += blockDim.x) {
        const u32 j = j0 + 4 * t;
        uint4 v;
        v.x = sm[auto_src(j, g, logn, mask2n) - base];
        v.y = sm[auto_src(j + 1, g, logn, mask2n) - base];
        v.z = sm[auto_src(j + 2, g, logn, mask2n) - base];
        v.w = sm[auto_src(j + 3, g, logn, mask2n) - base];
        dst[t] = v;
    }
}
