#define FUSED_SPIN_LIMIT (1 << 25)
struct FusedItem { int first, limb, tile; };
__device__ __forceinline__ FusedItem fused_item(int t, int rows, int lag, int p, int q) {
    const int d = min(lag, rows);
    if (t < p * d) return {1, t / p, t % p};
    t -= p * d;
    const int mid = (rows - d) * (p + q);
    if (t < mid) {
        const int k = t / (p + q), w = t % (p + q);
        return w < p ? FusedItem{1, d + k, w} : FusedItem{0, k, w - p};
    }
    t -= mid;
    return {0, rows - d + t / q, t % q};
}
__device__ __forceinline__ void fused_wait(int* done, int p, int all) {
    int v = 0;
    for (int spins = 0;; ++spins) {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(done) : "memory");
        if (v >= p) break;
        if (spins == FUSED_SPIN_LIMIT) __trap();
        __nanosleep(100);
    }
    if (atomicAdd(done, 1) == all - 1) atomicExch(done, 0);
}

