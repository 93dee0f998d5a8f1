__device__ __forceinline__ u32 pro_lift1(u32 x, u32 qt, u32 ql, u64 mu, u32 qt_mod_ql) {
    u32 y = reduce64(x, ql, mu);
    if (PMODE == 2 && x > (qt - 1u) / 2u) y = sub_mod(y, qt_mod_ql, ql);
    return y;
}
__device__ __forceinline__ uint4 pro_load4(const u32* __restrict__ arena, const int* __restrict__ ins, int W,
        int r, int pi, int pos, const u32* __restrict__ pt, const int* __restrict__ args,
        const u32* __restrict__ cin, const u32* __restrict__ ctab, const double* __restrict__ recip) {
    const u32 q = prime_q(pt, pi);
    const u64 mu = prime_mu(pt, pi);
    if (PK == 0) {
        const u32 qt = prime_q(pt, args[r]);
        const u32 qm = reduce64(qt, q, mu);
        const uint4 x = *(const uint4*)(arena + (u64)__ldg(ins + r) * NN + pos);
        return make_uint4(pro_lift1(x.x, qt, q, mu, qm), pro_lift1(x.y, qt, q, mu, qm),
                          pro_lift1(x.z, qt, q, mu, qm), pro_lift1(x.w, qt, q, mu, qm));
    }
    if (PK == 1) {
        uint4 y = make_uint4(0u, 0u, 0u, 0u);
        for (int w = W - 1; w >= 0; --w) {
            const uint4 x = *(const uint4*)(arena + (u64)__ldg(ins + r * W + w) * NN + pos);
            y.x = reduce64(((u64)y.x << 32) | x.x, q, mu);
            y.y = reduce64(((u64)y.y << 32) | x.y, q, mu);
            y.z = reduce64(((u64)y.z << 32) | x.z, q, mu);
            y.w = reduce64(((u64)y.w << 32) | x.w, q, mu);
        }
        return y;
    }
    const u32* __restrict__ c = ctab + pi * (W + 1);
    u64 acc[4] = {0ull, 0ull, 0ull, 0ull};
    double f[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll 4
    for (int k = 0; k < W; ++k) {
        const uint4 x4 = *(const uint4*)(arena + (u64)__ldg(ins + r * W + k) * NN + pos);
        u32 x[4] = {x4.x, x4.y, x4.z, x4.w};
        if (PMODE != 1) {
            const u32 qk = __ldg(cin + 4 * k), w = __ldg(cin + 4 * k + 1), wp = __ldg(cin + 4 * k + 2);
#pragma unroll
            for (int j = 0; j < 4; ++j) x[j] = shoup(x[j], w, wp, qk);
            if (PMODE == 2) {
                const double rk = __ldg(recip + k);
#pragma unroll
                for (int j = 0; j < 4; ++j) f[j] = __dadd_rn(f[j], __dmul_rn((double)x[j], rk));
            }
        }
        const u32 ck = __ldg(c + k);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += (u64)x[j] * ck;
    }
    if (PMODE == 2) {
        const u32 negq = __ldg(c + W);
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[j] += (u64)floor(__dadd_rn(f[j], 0.5)) * negq;
    }
    return make_uint4(reduce64(acc[0], q, mu), reduce64(acc[1], q, mu), reduce64(acc[2], q, mu),
                      reduce64(acc[3], q, mu));
}
