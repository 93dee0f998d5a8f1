
__device__ __forceinline__ u64 pow_mod(u64 b, u32 e, u64 q) {
    u64 r = 1;
    for (; e; e >>= 1) {
        if (e & 1u) r = r * b % q;
        b = b * b % q;
    }
    return r;
}
// Thread t of prime blockIdx.y: the least of r^j over its odd j = 2 (t chunk + c) + 1, c < chunk, into psi.
extern "C" __global__ void twiddle_psi(u64* __restrict__ p, int primes, int n, int chunk) {
    const int i = blockIdx.y;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n / chunk) return;
    const u64 q = p[i], r = p[primes + i];
    const u64 r2 = r * r % q;
    u64 x = pow_mod(r, (u32)(2 * t * chunk + 1), q);
    u64 least = x;
    for (int c = 1; c < chunk; ++c) {
        x = x * r2 % q;
        least = x < least ? x : least;
    }
    atomicMin(p + 2 * primes + i, least);
}
// Entry m of prime blockIdx.y: (psi^br(m), shoup) and (psi^(2N - br(m)) = psi^-br(m), shoup).
extern "C" __global__ void twiddle_fill(const u64* __restrict__ p, int primes, int n, int logn,
                                        u32* __restrict__ fwd, u32* __restrict__ inv) {
    const int i = blockIdx.y;
    const int m = blockIdx.x * blockDim.x + threadIdx.x;
    if (m >= n) return;
    const u64 q = p[i], psi = p[2 * primes + i];
    const u32 br = __brev((u32)m) >> (32 - logn);
    const u64 w = pow_mod(psi, br, q), wi = pow_mod(psi, 2u * (u32)n - br, q);
    const long long at = 2 * ((long long)i * n + m);
    fwd[at] = (u32)w;
    fwd[at + 1] = (u32)((w << 32) / q);
    inv[at] = (u32)wi;
    inv[at + 1] = (u32)((wi << 32) / q);
}
