// The helpers at the top of every caramel CUDA module (caramel.backends.cuda.context.COMMON_SRC). Residues are
// canonical in [0, q) with q < 2^30 unless a name says otherwise ("lazy" values lie in [0, 2q) or [0, 4q)); the
// prime table pt has a row of 8 words per prime (caramel.backends.cuda.context: q, 2q, N^-1, its Shoup quotient,
// mu = floor(2^64 / q) low and high, 8q and 4q mod 2^32).
typedef unsigned int u32;
typedef unsigned long long u64;

// x mod q for any 64-bit x (Barrett with mu = floor(2^64 / q); the quotient estimate is at most
// one short, so one conditional subtraction suffices).
__device__ __forceinline__ u32 reduce64(u64 x, u32 q, u64 mu) {
    const u64 qh = __umul64hi(x, mu);
    const u32 r = (u32)x - (u32)qh * q;
    return r >= q ? r - q : r;
}
__device__ __forceinline__ u32 mul_mod(u32 a, u32 b, u32 q, u64 mu) {
    return reduce64((u64)a * b, q, mu);
}
__device__ __forceinline__ u32 add_mod(u32 a, u32 b, u32 q) {
    const u32 s = a + b;
    return s >= q ? s - q : s;
}
__device__ __forceinline__ u32 sub_mod(u32 a, u32 b, u32 q) {
    return a >= b ? a - b : a + q - b;
}
__device__ __forceinline__ u32 neg_mod(u32 a, u32 q) {
    return a ? q - a : 0u;
}
// a * w mod q in [0, 2q) for any a < 2^32, with w < q and wp = floor(w * 2^32 / q) (Shoup).
__device__ __forceinline__ u32 shoup_lazy(u32 a, u32 w, u32 wp, u32 q) {
    return a * w - __umulhi(a, wp) * q;
}
__device__ __forceinline__ u32 shoup(u32 a, u32 w, u32 wp, u32 q) {
    const u32 r = shoup_lazy(a, w, wp, q);
    return r >= q ? r - q : r;
}
__device__ __forceinline__ u32 prime_q(const u32* __restrict__ pt, int p) { return __ldg(pt + 8 * p); }
__device__ __forceinline__ u64 prime_mu(const u32* __restrict__ pt, int p) {
    return ((u64)__ldg(pt + 8 * p + 5) << 32) | (u64)__ldg(pt + 8 * p + 4);
}
// floor(2^32 / q): mu's high word (mu = floor(2^64 / q) for q < 2^32), for a 32-bit Barrett step.
__device__ __forceinline__ u32 prime_m32(const u32* __restrict__ pt, int p) { return __ldg(pt + 8 * p + 5); }
