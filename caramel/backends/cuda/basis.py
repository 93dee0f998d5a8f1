"""Base conversion (the base conversion unit, ISA 4.4) and the register-form ``sud`` lift (ISA 4.3).

Both are bit-identical to :mod:`caramel.ring` (``BaseConverter.convert``, ``sud_lift``) in the three
modes of ISA decision 2. Base conversion, from input primes q_k (k < S) to output primes p_d (d < D):

* TEXTBOOK: t_k = [x_k Qhat_k^-1]_{q_k}; out_d = sum_k t_k [Qhat_k]_{p_d} mod p_d.
* EMULATOR: out_d = sum_k x_k F_{k,d} mod p_d, F_{k,d} = [Qhat_k]_{p_d} [Qhat_k^-1]_{q_k} mod p_d.
* EXACT: t_k as TEXTBOOK; f = sum over increasing k of double(t_k) * r_k (r_k = 1/q_k rounded once on
  the host; __dmul_rn and __dadd_rn, so no fused multiply-add), v = floor(f + 0.5);
  out_d = (sum_k t_k [Qhat_k]_{p_d} - v [Q_S]_{p_d}) mod p_d.

Three kernels compute the same residues. The default is the tensor-core one (``tensor``; see the comment
above :func:`tc_layout`): byte products on mma.m16n8k32 with int32 sums, folded into two 32-bit words
per output and reduced with two Shoup products (``tc_reduce``). The tiled one (the default before) is a
matrix product tiled over (16 outputs) x (128 TILED_CO coefficients) a block: the table's 16 columns in
shared memory, the 16 TILED_CO sums in 64-bit registers (the constructor checks that they cannot
overflow), each input limb read once per block (the blocks of one coefficient tile run together, so the
other output chunks' re-reads hit L2), and one 32-bit reduction per output: acc = hi 2^32 + lo, so (acc
+ v [-Q_S]_p) mod p = hi [2^32]_p + lo + v [-Q_S]_p mod p, three Shoup products. The first kernel
(``tiled=False``) gives one thread per coefficient, keeps t_k in shared memory and accumulates 8 outputs
at a time, then reduces with Barrett. One launch converts B independent inputs that share the primes
(e.g. both halves of a ciphertext): in_slots (B, S), out_slots (B, D).
"""

from __future__ import annotations

import numpy as np

from caramel.backends.cuda.context import CudaRing, cupy, index_array, shoup_constant

THREADS = 128
TILED_CO = 2  # coefficients per thread of the tiled kernel (1 or 2)
TAIL8 = True  # the tiled kernel's last chunk of outputs is 8 wide when D mod 16 is 1..8
BC_MIN_BLOCKS = 0  # resident blocks per multiprocessor asked for the tiled kernels (0: no bound)
MODES = {"textbook": 0, "emulator": 1, "exact": 2}
TENSOR = None  # convert's default kernel: None picks by shape (use_tensor), True the tensor-core one,
# False the tiled one
TC_MIN_D = 1  # use_tensor: the tensor-core kernel from this many outputs on (faster at every measured shape)
TC_ROWS = 128  # coefficients a block of the tensor-core kernel (32 a warp)
TC_STAGE = False  # its inputs through shared memory with 16-byte loads (None: when S > TC_STAGE_S)
TC_STAGE_S = 32
TC_PER = 0  # output tiles of 8 a block of the tensor-core kernel (0: all D outputs in one block)
TC_UNROLL = 1  # output tiles a loop iteration of the tensor-core kernel (1 or 2)
TC_SPLIT = 1  # warps a 32 coefficients of the tensor-core kernel (1 or 2; 2 needs direct loads)
TC_TSTORE = False  # its output tiles through shared memory, 16-byte row stores
TC_PF = 8  # its input loads in flight a thread (direct loads)
TC_MINB = 4  # blocks of 128 threads resident a multiprocessor asked of the tensor-core kernel (4: <= 128 registers)
TC_PIPE = False  # its next output tile's operands loaded during the current one (KC <= 3)


def mode_code(mode) -> int:
    """Kernel code of a :class:`caramel.ring.Mode` (or its value string)."""
    name = getattr(mode, "value", mode)
    if name not in MODES:
        raise ValueError(f"unknown arithmetic mode {mode!r}")
    return MODES[name]


def _source(min_blocks: int = 0) -> str:
    """The module's CUDA source; min_blocks > 0 asks the register allocator for that many resident
    blocks of the tiled kernels per multiprocessor (__launch_bounds__(128, min_blocks))."""
    bounds = f"128, {min_blocks}" if min_blocks else "128"
    return _SOURCE.replace("__launch_bounds__(TILED_BOUNDS)", f"__launch_bounds__({bounds})")


_SOURCE = r"""
// in_consts: S x 4 (q_k, [Qhat_k^-1]_{q_k}, its Shoup quotient, 0); out_consts: D x 4 (p_d, [-Q_S]_{p_d},
// mu_lo, mu_hi); table: S x DP (DP = D rounded up to a multiple of 8, zero padded), [Qhat_k]_{p_d}
// (textbook, exact) or F_{k,d} (emulator); recip: S, 1/q_k. mode: 0 textbook, 1 emulator, 2 exact.
// Each thread accumulates 8 outputs at a time in 64 bits: S <= 64 products below 2^56 plus
// v [-Q_S]_p < 2^35 stay below 2^64, so one Barrett reduction per output suffices.
extern "C" __global__ void __launch_bounds__(128) base_convert(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D, int mode,
        const u32* __restrict__ in_consts, const u32* __restrict__ out_consts, const u32* __restrict__ table,
        const double* __restrict__ recip, int n, int tiles) {
    extern __shared__ u32 smem[];
    const int DP = (D + 7) & ~7;
    u32* tab = smem;            // S * DP
    u32* t = smem + S * DP;     // S * blockDim.x
    const int b = blockIdx.x / tiles;
    const int i = (blockIdx.x % tiles) * blockDim.x + threadIdx.x;
    for (int e = threadIdx.x; e < S * DP; e += blockDim.x) tab[e] = table[e];
    // Raw inputs first (independent loads in flight together), then t_k and the float sum.
#pragma unroll 8
    for (int k = 0; k < S; ++k) t[k * blockDim.x + threadIdx.x] = i < n ? arena[(u64)in_slots[b * S + k] * n + i] : 0u;
    double f = 0.0;
    if (mode != 1) {
        for (int k = 0; k < S; ++k) {
            const u32 x = shoup(t[k * blockDim.x + threadIdx.x], __ldg(in_consts + 4 * k + 1),
                                __ldg(in_consts + 4 * k + 2), __ldg(in_consts + 4 * k));
            if (mode == 2) f = __dadd_rn(f, __dmul_rn((double)x, __ldg(recip + k)));
            t[k * blockDim.x + threadIdx.x] = x;
        }
    }
    __syncthreads();
    if (i >= n) return;
    const u64 v = mode == 2 ? (u64)floor(__dadd_rn(f, 0.5)) : 0ull;
    for (int d0 = 0; d0 < D; d0 += 8) {
        u64 acc[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] = 0;
        for (int k = 0; k < S; ++k) {
            const u32 tk = t[k * blockDim.x + threadIdx.x];
            const uint4 c0 = *(const uint4*)(tab + k * DP + d0);
            const uint4 c1 = *(const uint4*)(tab + k * DP + d0 + 4);
            acc[0] += (u64)tk * c0.x; acc[1] += (u64)tk * c0.y; acc[2] += (u64)tk * c0.z; acc[3] += (u64)tk * c0.w;
            acc[4] += (u64)tk * c1.x; acc[5] += (u64)tk * c1.y; acc[6] += (u64)tk * c1.z; acc[7] += (u64)tk * c1.w;
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int d = d0 + j;
            if (d < D) {
                const u32 p = __ldg(out_consts + 4 * d);
                const u64 mu = ((u64)__ldg(out_consts + 4 * d + 3) << 32) | __ldg(out_consts + 4 * d + 2);
                const u64 a = acc[j] + v * __ldg(out_consts + 4 * d + 1);
                arena[(u64)out_slots[b * D + d] * n + i] = reduce64(a, p, mu);
            }
        }
    }
}

// Tiled base conversion: block (b, tile, chunk), chunk fastest, computes outputs d0 .. d0 + W - 1
// (d0 = 16 chunk; W = 16, or 8 for the last chunk when D mod 16 is 1..8, so that fewer padded
// outputs are accumulated) of 128 CO coefficients (CO per thread, 8-byte accesses for CO = 2). Its W
// columns of the table (S x DP16, zero padded) sit in shared memory; the CO W sums stay in 64-bit
// registers; each input limb is read once per chunk (the chunks of a tile run together, so the
// re-reads of the other chunks hit L2). t_k and the float sum f are recomputed per chunk.
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

template <int MODE, int CO, int W>
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
    const int i = (tile * blockDim.x + threadIdx.x) * CO;
    if (i >= n) return;
    const int* __restrict__ ins = in_slots + b * S;
    u64 acc[CO][W];
#pragma unroll
    for (int c = 0; c < CO; ++c)
#pragma unroll
        for (int j = 0; j < W; ++j) acc[c][j] = 0;
    double f[CO];
#pragma unroll
    for (int c = 0; c < CO; ++c) f[c] = 0.0;
    // Inputs in groups of 8 limbs: the 8 loads of a group are in flight together.
    for (int k0 = 0; k0 < S; k0 += 8) {
        u32 xs[8][CO];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (CO == 2) {
                const uint2 w = k0 + j < S ? *(const uint2*)(arena + (u64)__ldg(ins + k0 + j) * n + i) : make_uint2(0u, 0u);
                xs[j][0] = w.x; xs[j][CO - 1] = w.y;
            } else {
                xs[j][0] = k0 + j < S ? arena[(u64)__ldg(ins + k0 + j) * n + i] : 0u;
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int k = k0 + j;
            if (k >= S) break;
            u32 x[CO];
#pragma unroll
            for (int c = 0; c < CO; ++c) x[c] = xs[j][c];
            if (MODE != 1) {
                const u32 qk = __ldg(in_consts + 4 * k), w = __ldg(in_consts + 4 * k + 1);
                const u32 wp = __ldg(in_consts + 4 * k + 2);
#pragma unroll
                for (int c = 0; c < CO; ++c) x[c] = shoup(x[c], w, wp, qk);
                if (MODE == 2) {
                    const double r = __ldg(recip + k);
#pragma unroll
                    for (int c = 0; c < CO; ++c) f[c] = __dadd_rn(f[c], __dmul_rn((double)x[c], r));
                }
            }
#pragma unroll
            for (int q4 = 0; q4 < W / 4; ++q4) {
                const uint4 m = tab[(W / 4) * k + q4];
#pragma unroll
                for (int c = 0; c < CO; ++c) {
                    acc[c][4 * q4 + 0] += (u64)x[c] * m.x;
                    acc[c][4 * q4 + 1] += (u64)x[c] * m.y;
                    acc[c][4 * q4 + 2] += (u64)x[c] * m.z;
                    acc[c][4 * q4 + 3] += (u64)x[c] * m.w;
                }
            }
        }
    }
    u32 v[CO];
#pragma unroll
    for (int c = 0; c < CO; ++c) v[c] = MODE == 2 ? (u32)floor(__dadd_rn(f[c], 0.5)) : 0u;
#pragma unroll
    for (int j = 0; j < W; ++j) {
        const int d = d0 + j;
        if (d < D) {
            const uint4 c0 = __ldg((const uint4*)(out8 + 8 * d)), c1 = __ldg((const uint4*)(out8 + 8 * d + 4));
            u32* dst = arena + (u64)__ldg(out_slots + b * D + d) * n + i;
            u32 r[CO];
#pragma unroll
            for (int c = 0; c < CO; ++c) r[c] = reduce_sum(MODE == 2 ? acc[c][j] + (u64)v[c] * c0.y : acc[c][j], c0, c1);
            if (CO == 2) {
                *(uint2*)dst = make_uint2(r[0], r[CO - 1]);
            } else {
                *dst = r[0];
            }
        }
    }
}
// tail8: the last chunk holds 8 outputs (see base_convert_tile).
#define BC_TILED(NAME, MODE, CO) \
extern "C" __global__ void __launch_bounds__(TILED_BOUNDS) NAME( \
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D, \
        const u32* __restrict__ in_consts, const u32* __restrict__ out8, const u32* __restrict__ table, \
        const double* __restrict__ recip, int n, int tiles, int chunks, int tail8) { \
    if (tail8 && blockIdx.x % chunks == chunks - 1) \
        base_convert_tile<MODE, CO, 8>(arena, in_slots, out_slots, S, D, in_consts, out8, table, recip, n, tiles, chunks); \
    else \
        base_convert_tile<MODE, CO, 16>(arena, in_slots, out_slots, S, D, in_consts, out8, table, recip, n, tiles, chunks); \
}
BC_TILED(base_convert_tiled2_textbook, 0, 2)
BC_TILED(base_convert_tiled2_emulator, 1, 2)
BC_TILED(base_convert_tiled2_exact, 2, 2)
BC_TILED(base_convert_tiled1_textbook, 0, 1)
BC_TILED(base_convert_tiled1_emulator, 1, 1)
BC_TILED(base_convert_tiled1_exact, 2, 1)

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
"""


# --------------------------------------------------------------------------- tensor-core kernel
#
# out_d = sum_k t_k T[k][d] mod p_d as a product of bytes on the integer tensor cores. With t_k
# = sum_a t_{k,a} 2^(8a) (bytes, a < 4), out_d = sum_{a,k} t_{k,a} T_a[k][d] mod p_d where T_a[k][d]
# = [2^(8a) T[k][d]]_{p_d}: a K = 4S product of bytes of t with 32-bit table entries. Splitting those
# into bytes too, T_a[k][d] = sum_b T_{a,b}[k][d] 2^(8b), gives four byte GEMMs R_b = sum_{a,k}
# t_{k,a} T_{a,b}[k][d] (int32: (4S + 1) 255^2 < 2^24 for S <= 64) and out_d = sum_b R_b 2^(8b)
# mod p_d (< 2^49: two 32-bit words and two Shoup products, see tc_reduce). EXACT's v [-Q_S]_p
# (v <= S < 2^8) is one more input: t_S = v (bytes 1..3 zero) with table row [-Q_S]_p.


def use_tensor(s: int, d: int) -> bool:
    """Whether convert's default is the tensor-core kernel for S inputs and D outputs: from
    TC_MIN_D outputs on (docs/PERFORMANCE.md, session 7: it was the faster at every shape timed)."""
    return d >= TC_MIN_D


def tc_layout(s: int) -> tuple[int, int]:
    """(SP, KC) of the tensor-core kernel for S inputs: K row kk = a SP + k holds byte a of t_k
    (t_S = v, EXACT's rounding, else 0; SP = S + 1 rounded up to a multiple of 4, rows k > S zero),
    and K = 32 KC = 4 SP rounded up to a multiple of 32 (the k of one mma.m16n8k32)."""
    sp = -(-(s + 1) // 4) * 4
    return sp, -(-(4 * sp) // 32)


def tc_table(table: np.ndarray, neg_q: np.ndarray, out_primes) -> np.ndarray:
    """The K x (8 DT) table of the tensor-core kernel, uint64 (DT = ceil(D / 8)): row a SP + k,
    column d = [2^(8a) table[k, d]]_{p_d} (k < S); row S = neg_q = [-Q_S]_{p_d}; zero elsewhere.

    table: (S, D) [Qhat_k]_{p_d} (textbook, exact) or F_{k,d} (emulator)."""
    s, d = table.shape
    sp, kc = tc_layout(s)
    p = np.array(out_primes, dtype=np.uint64)
    out = np.zeros((32 * kc, 8 * max(1, -(-d // 8))), dtype=np.uint64)
    for a in range(4):
        out[a * sp : a * sp + s, :d] = (table.astype(np.uint64) << np.uint64(8 * a)) % p
    out[s, :d] = neg_q
    return out


def tc_fragments(big: np.ndarray) -> np.ndarray:
    """The B fragments of mma.m16n8k32 (u8, col) for the byte planes of a :func:`tc_table` ``big``:
    uint32 (DT, 4, KC, 32, 2), entry [dt, b, kc, lane] = the lane's (b0, b1) of the 32 x 8 block of
    byte plane b (bytes (big >> 8b) & 255) at rows 32 kc.., columns 8 dt..: lane = 4 g + t holds
    column g, rows 4t + i (b0) and 16 + 4t + i (b1) in byte i."""
    kp, cols = big.shape
    kc, dt = kp // 32, cols // 8
    planes = np.stack([(big >> np.uint64(8 * b)) & np.uint64(255) for b in range(4)]).astype(np.uint8)
    # (b, kc, half, t, i, dt, g) -> (dt, b, kc, g, t, half, i)
    frag = planes.reshape(4, kc, 2, 4, 4, dt, 8).transpose(5, 0, 1, 6, 3, 2, 4)
    return np.ascontiguousarray(frag).reshape(dt, 4, kc, 32, 8).view("<u4").reshape(dt, 4, kc, 32, 2)


def tc_out_constants(out_primes) -> np.ndarray:
    """The epilogue's constants of the tensor-core kernel: uint32 (8 DT, 4), row d = (p_d, [2^16]_p,
    its Shoup quotient floor([2^16]_p 2^32 / p), floor(2^32 / p)); rows d >= D zero (see tc_reduce)."""
    d = len(out_primes)
    out = np.zeros((8 * max(1, -(-d // 8)), 4), dtype=np.uint32)
    for j, p in enumerate(out_primes):
        c16 = (1 << 16) % p
        out[j] = [p, c16, shoup_constant(c16, p), (1 << 32) // p]
    return out


def tc_reduce(r: np.ndarray, consts: np.ndarray) -> np.ndarray:
    """The epilogue of the tensor-core kernel in the kernel's 32-bit arithmetic: sum_b R_b 2^(8b) mod p.

    r: (4, ..., D) the byte-plane sums R_b (each < 2^24); consts: (D, 4) rows of :func:`tc_out_constants`.
    z = R_0 + R_1 2^8 (< 2^32: R_b <= (4 S + 1) 255^2 with S <= 64), y = R_2 + R_3 2^8, and the value
    z + y 2^16 is reduced as z 1 + y [2^16]_p with two Shoup products sharing one multiply by p:
    r = z + y c16 - (floor(z floor(2^32/p) / 2^32) + floor(y c16' / 2^32)) p mod 2^32, in [0, 4p) (each
    product in [0, 2p), p < 2^30), then two conditional subtractions (2p, p). Returns uint32 (..., D)."""
    m32 = np.uint64(0xFFFFFFFF)
    r = np.asarray(r).astype(np.uint64)
    z = r[0] + (r[1] << np.uint64(8))
    y = r[2] + (r[3] << np.uint64(8))
    if z.max(initial=0) > m32 or y.max(initial=0) > m32:
        raise OverflowError("tc_reduce: a folded byte-plane sum does not fit 32 bits")
    c = np.asarray(consts).astype(np.uint64)
    p, c16, c16q, inv = c[:, 0], c[:, 1], c[:, 2], c[:, 3]
    quot = ((z * inv) >> np.uint64(32)) + ((y * c16q) >> np.uint64(32))
    val = (z + ((y * c16) & m32) - ((quot * p) & m32)) & m32
    if (val >= 4 * p).any():
        raise OverflowError("tc_reduce: the lazy residue is not below 4p")
    val = np.where(val >= 2 * p, val - 2 * p, val)
    return np.where(val >= p, val - p, val).astype(np.uint32)


def tc_words(t: np.ndarray, v: np.ndarray | None) -> np.ndarray:
    """The A rows of the tensor-core kernel (what each thread writes to shared memory): uint32
    (N, 8 KC), word a SP/4 + j = bytes a of t_{4j}, .., t_{4j+3} (low byte first), t_S = v (or 0).

    t: (S, N) uint32; v: (N,) or None."""
    s, n = t.shape
    sp, kc = tc_layout(s)
    tp = np.zeros((sp, n), dtype=np.uint32)
    tp[:s] = t
    if v is not None:
        tp[s] = v
    words = np.zeros((n, 8 * kc), dtype=np.uint32)
    for a in range(4):
        byte = (tp >> np.uint32(8 * a)) & np.uint32(255)  # (SP, N)
        quads = byte.reshape(sp // 4, 4, n)
        words[:, a * (sp // 4) : (a + 1) * (sp // 4)] = (
            quads[:, 0] | quads[:, 1] << np.uint32(8) | quads[:, 2] << np.uint32(16) | quads[:, 3] << np.uint32(24)
        ).T
    return words


_TC_SOURCE = r"""
// Base conversion on the tensor cores (see tc_layout, tc_table, tc_fragments, tc_words in basis.py).
// Block (b, tile): 128 coefficients, a warp 32 of them (two m16 tiles). Thread r of the block computes
// t_k (and v) of coefficient tile 128 + r and writes its A row (KW = 8 KC words) to shared memory;
// the warp then holds the A fragments of its 32 rows in registers for all KC k-chunks and, for each
// 8 outputs, runs 4 (byte planes b) x KC x 2 mma.m16n8k32 (u8 x u8 -> s32) with the B fragments read
// from the pre-swizzled table (L1-resident), folds R_b 2^(8b) into two words and reduces (tc_reduce).
// A warp reads and writes only its own 32 coefficients, so outputs may overwrite inputs.
__device__ __forceinline__ void mma_u8(int* c, const u32* a, uint2 b) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.u8.u8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b.x), "r"(b.y));
}
__device__ __forceinline__ u32 byte_plane(u32 t0, u32 t1, u32 t2, u32 t3, u32 sel) {
    return __byte_perm(__byte_perm(t0, t1, sel), __byte_perm(t2, t3, sel), 0x5410);
}
// sum_b R_b 2^(8b) mod p in 32-bit arithmetic (see tc_reduce in basis.py): z = R_0 + R_1 2^8 < 2^32,
// y = R_2 + R_3 2^8, value z + y 2^16; c = (p, [2^16]_p, its Shoup quotient, floor(2^32 / p)). Two
// Shoup products (z 1 and y [2^16]_p, each in [0, 2p)) with one subtraction of the quotients: [0, 4p).
__device__ __forceinline__ u32 tc_reduce(int r0, int r1, int r2, int r3, uint4 c) {
    const u32 z = (u32)r0 + ((u32)r1 << 8), y = (u32)r2 + ((u32)r3 << 8);
    const u32 r = z + y * c.y - (__umulhi(z, c.w) + __umulhi(y, c.z)) * c.x;
    const u32 s = min(r, r - 2u * c.x);
    return min(s, s - c.x);
}
template <int MODE, int KC>
__device__ __forceinline__ void base_convert_tc(
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D,
        const u32* __restrict__ in_consts, const u32* __restrict__ out4, const uint2* __restrict__ frag,
        const double* __restrict__ recip, int n, int tiles, int chunks, int per) {
    constexpr int KW = 8 * KC, STRIDE = KW + 4;  // STRIDE: conflict-free fragment reads
    __shared__ u32 rows[128 * STRIDE];
#if TC_STAGE
    __shared__ uint4 stage[16 * 32];  // 16 input rows x 128 coefficients
#endif
#if TC_TSTORE
    __shared__ __align__(16) u32 otile[4 * TC_SPLIT * 8 * 36];  // a warp's 8 x 32 outputs (rows of 36 words)
    u32* ot = otile + (threadIdx.x >> 5) * (8 * 36);
#endif
    const int chunk = blockIdx.x % chunks, rest = blockIdx.x / chunks;
    const int tile = rest % tiles, b = rest / tiles;
    const int base = tile * 128, i = base + threadIdx.x;
    const int* __restrict__ ins = in_slots + b * S;
    const int G = (S + 4) >> 2;  // SP / 4: inputs 0..S-1 and t_S = v
    // TC_SPLIT warps share each 32 rows: threads 0..127 write the rows, all then split the outputs.
    static_assert(TC_SPLIT == 1 || !TC_STAGE, "split blocks read their inputs directly");
    const bool loader = TC_SPLIT == 1 || threadIdx.x < 128;
    u32* row = rows + (threadIdx.x & 127) * STRIDE;
    double f = 0.0;
#if TC_STAGE
    // 16 input rows at a time: 4 independent 16-byte loads a thread, then t from shared memory.
    for (int j0 = 0; j0 < G; j0 += 4) {
        __syncthreads();
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int e = q * 128 + threadIdx.x, k = 4 * j0 + (e >> 5), c = base + 4 * (e & 31);
            stage[e] = k < S ? __ldg((const uint4*)(arena + (u64)__ldg(ins + k) * n + c)) : make_uint4(0u, 0u, 0u, 0u);
        }
        __syncthreads();
        const u32* xs = (const u32*)stage;
#pragma unroll 2
    for (int j = j0; j < min(G, j0 + 4); ++j) {
        u32 x[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) x[q] = xs[(4 * (j - j0) + q) * 128 + threadIdx.x];
#else
    // TC_PF inputs a chunk: their loads are in flight together, then t of each 4 in turn.
    for (int j0 = 0; j0 < (loader ? G : 0); j0 += TC_PF / 4) {
        u32 xs[TC_PF];
#pragma unroll
        for (int q = 0; q < TC_PF; ++q) {
            const int k = 4 * j0 + q;
            xs[q] = k < S ? arena[(u64)__ldg(ins + k) * n + i] : 0u;
        }
#pragma unroll
    for (int jj = 0; jj < TC_PF / 4; ++jj) {
        const int j = j0 + jj;
        if (j >= G) break;
        u32 x[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) x[q] = xs[4 * jj + q];
#endif
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int k = 4 * j + q;
            if (MODE != 1) {  // constants zero padded to SP rows: k >= S gives t = 0 and f + 0.0 = f
                const uint4 cq = __ldg((const uint4*)in_consts + k);
                x[q] = shoup(x[q], cq.y, cq.z, cq.x);
                if (MODE == 2) f = __dadd_rn(f, __dmul_rn((double)x[q], __ldg(recip + k)));
            }
            if (MODE == 2 && k == S) x[q] = (u32)floor(__dadd_rn(f, 0.5));  // f is complete: q increases
        }
#pragma unroll
        for (int a = 0; a < 4; ++a) row[a * G + j] = byte_plane(x[0], x[1], x[2], x[3], a | ((a + 4) << 4));
    }
    }
    if (loader)
        for (int w = 4 * G; w < KW; ++w) row[w] = 0u;
    if (TC_SPLIT > 1) __syncthreads(); else __syncwarp();
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
    const int DP = (D + 7) & ~7, DT = min(DP >> 3, (chunk + 1) * per);  // this block's outputs: 8 per dt
    // A lane's two output rows of tile dt: d = 8 dt + 2 t + h (its accumulator columns), or with
    // TC_TSTORE the rows it stores, 8 dt + lane / 8 + 4 h (coefficients 4 (lane % 8) .. + 3).
    const int dlane = TC_TSTORE ? (lane >> 3) : 2 * t, dstep = TC_TSTORE ? 4 : 1;
    const int coef = base + (TC_TSTORE ? (threadIdx.x & 96) + 4 * (lane & 7) : r0);
    const int* __restrict__ outs = out_slots + b * D;
    // Tile dt's operands: B fragments, epilogue constants (out4: rows padded to 8 DT) and output rows.
    // TC_PIPE (KC <= 3): loaded one tile ahead, so their latency hides behind the previous tile.
    constexpr bool PIPE = TC_PIPE && KC <= 3;
    uint2 bf[4][KC];
    uint4 c4[2];
    int slot[2];
    auto load_tile = [&](int dt) {
        const uint2* fr = frag + (u64)dt * 4 * KC * 32 + lane;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            c4[h] = __ldg((const uint4*)out4 + 8 * dt + 2 * t + h);
            const int o = 8 * dt + dlane + dstep * h;
            slot[h] = o < D ? __ldg(outs + o) : 0;
        }
#pragma unroll
        for (int bp = 0; bp < 4; ++bp)
#pragma unroll
            for (int c = 0; c < KC; ++c) bf[bp][c] = __ldg(fr + (bp * KC + c) * 32);
    };
    const int dt0 = chunk * per + (threadIdx.x >> 7);
    if (PIPE && dt0 < DT) load_tile(dt0);
#pragma unroll TC_UNROLL
    for (int dt = dt0; dt < DT; dt += TC_SPLIT) {
        if (!PIPE) load_tile(dt);
        int acc[4][2][4];
#pragma unroll
        for (int bp = 0; bp < 4; ++bp)
#pragma unroll
            for (int m = 0; m < 2; ++m) {
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[bp][m][e] = 0;
#pragma unroll
                for (int c = 0; c < KC; ++c) mma_u8(acc[bp][m], af[m][c], bf[bp][c]);
            }
        const uint4 cc[2] = {c4[0], c4[1]};
        u32* dst[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) dst[h] = arena + (u64)slot[h] * n + coef;
        if (PIPE && dt + TC_SPLIT < DT) load_tile(dt + TC_SPLIT);
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // output d = 8 dt + 2 t + h
            if (!TC_TSTORE && 8 * dt + 2 * t + h >= D) continue;
#pragma unroll
            for (int m = 0; m < 2; ++m)
#pragma unroll
                for (int hi = 0; hi < 2; ++hi) {  // element 2 hi + h: row r0 + 16 m + 8 hi
                    const int e = 2 * hi + h;
                    const u32 y = tc_reduce(acc[0][m][e], acc[1][m][e], acc[2][m][e], acc[3][m][e], cc[h]);
#if TC_TSTORE
                    ot[(2 * t + h) * 36 + g + 16 * m + 8 * hi] = y;
#else
                    dst[h][16 * m + 8 * hi] = y;
#endif
                }
        }
#if TC_TSTORE
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; ++h)  // output row 8 dt + lane / 8 + 4 h: 16 bytes a lane, 128 a row
            if (8 * dt + (lane >> 3) + 4 * h < D)
                *(uint4*)dst[h] = *(const uint4*)(ot + ((lane >> 3) + 4 * h) * 36 + 4 * (lane & 7));
        __syncwarp();
#endif
    }
}
#define BC_TC(MODE, NAME) \
extern "C" __global__ void __launch_bounds__(128 * TC_SPLIT, (TC_MINB + TC_SPLIT - 1) / TC_SPLIT) base_convert_tc_##NAME( \
        u32* arena, const int* __restrict__ in_slots, const int* __restrict__ out_slots, int S, int D, \
        const u32* __restrict__ in_consts, const u32* __restrict__ out4, const uint2* __restrict__ frag, \
        const double* __restrict__ recip, int n, int tiles, int chunks, int per) { \
    base_convert_tc<MODE, TC_KC>(arena, in_slots, out_slots, S, D, in_consts, out4, frag, recip, n, tiles, chunks, \
                                 per); \
}
BC_TC(0, textbook)
BC_TC(1, emulator)
BC_TC(2, exact)
"""


def _tc_source(kc: int, stage: bool, unroll: int = 1, split: int = 1, tstore: bool = False, pf: int = 8,
               minb: int = 1, pipe: bool = False) -> str:
    """The tensor-core kernels for KC k-chunks (see tc_layout);
    ``stage``: inputs through shared memory, 16-byte loads (else ``pf`` 4-byte loads in flight a
    thread, pf a multiple of 4); ``unroll``: output tiles a loop iteration; ``split``: warps a 32
    coefficients (128 split threads a block; the warps of a row group take every split-th output tile;
    direct loads only); ``tstore``: each warp's 8 x 32 output tile through shared memory, stored as
    16-byte rows (else 4-byte stores from the accumulator layout); ``minb``: __launch_bounds__'s
    minimum resident blocks of 128 threads (minb / split blocks of 128 split); ``pipe``: each output
    tile's B fragments, constants and rows loaded during the previous tile (KC <= 3, else ignored).
    The epilogue is tc_reduce's."""
    head = _SOURCE[_SOURCE.index("__device__ __forceinline__ u32 reduce_sum") :]
    head = head[: head.index("template <int MODE, int CO, int W>")]
    body = _TC_SOURCE.replace("#pragma unroll TC_UNROLL", f"#pragma unroll {int(unroll)}")
    defines = dict(TC_KC=kc, TC_STAGE=int(stage), TC_SPLIT=int(split), TC_TSTORE=int(tstore), TC_PF=int(pf),
                   TC_MINB=int(minb), TC_PIPE=int(pipe))
    return "".join(f"#define {k} {v}\n" for k, v in defines.items()) + head + body


class BaseConversion:
    """Device tables of the conversion from limbs ``in_limbs`` to limbs ``out_limbs`` (limb indices).

    The constants come from ``ring.ctx.base_converter(in_limbs, out_limbs)`` (the CPU reference).
    Call :meth:`convert` any number of times; tables are uploaded once, at construction.
    """

    def __init__(self, ring: CudaRing, in_limbs, out_limbs):
        if not 1 <= len(in_limbs) <= 64:
            raise ValueError(f"base conversion supports 1..64 inputs, got {len(in_limbs)}")
        self.ring = ring
        self.in_limbs = tuple(int(l) for l in in_limbs)
        self.out_limbs = tuple(int(l) for l in out_limbs)
        conv = ring.ctx.base_converter(self.in_limbs, self.out_limbs)
        s, d = len(self.in_limbs), len(self.out_limbs)
        if s * max(conv.in_primes) * max(conv.out_primes, default=1) + (1 << 40) >= 1 << 64:
            raise ValueError("the 64-bit accumulator of base conversion would overflow with these primes")
        in_consts = np.zeros((s, 4), dtype=np.uint32)
        for k, q in enumerate(conv.in_primes):
            w = int(conv.qhat_inv[k])
            in_consts[k, :3] = [q, w, shoup_constant(w, q)]
        out_consts = np.zeros((d, 4), dtype=np.uint32)
        for j, p in enumerate(conv.out_primes):
            mu = (1 << 64) // p
            out_consts[j] = [p, (p - int(conv.product_mod_out[j])) % p, mu & 0xFFFFFFFF, mu >> 32]
        cp = cupy()
        self._in_consts = cp.asarray(in_consts)
        self._out_consts = cp.asarray(out_consts)
        # Tables transposed to (S, DP): row k holds the factors of input k for every output, zero
        # padded to a multiple of 8 outputs (the kernel reads 8 at a time).
        self._dp = -(-d // 8) * 8
        qhat = np.zeros((s, self._dp), dtype=np.uint32)
        qhat[:, :d] = conv.qhat_mod_out.T
        factors = np.zeros_like(qhat)
        factors[:, :d] = conv.factors.T
        self._qhat = cp.asarray(qhat)
        self._factors = cp.asarray(factors)
        self._recip = cp.asarray(conv.reciprocals.astype(np.float64))
        # The tiled kernel's tables: (S, DP16), zero padded to a multiple of 16 outputs.
        self._chunks = max(1, -(-d // 16))
        wide = np.zeros((2, s, 16 * self._chunks), dtype=np.uint32)
        wide[0, :, :d] = conv.qhat_mod_out.T
        wide[1, :, :d] = conv.factors.T
        self._qhat16 = cp.asarray(wide[0])
        # Its output constants, 8 words an output prime (see reduce_sum in the source).
        out8 = np.zeros((max(d, 1), 8), dtype=np.uint32)
        for j, p in enumerate(conv.out_primes):
            negq, c32 = (p - int(conv.product_mod_out[j])) % p, (1 << 32) % p
            out8[j, :6] = [p, negq, shoup_constant(negq, p), c32, shoup_constant(c32, p), (1 << 32) // p]
        self._out8 = cp.asarray(out8)
        self._factors16 = cp.asarray(wide[1])
        # The tensor-core kernel's B fragments (tc_table, tc_fragments), one table a mode family.
        neg_q = [(p - int(m)) % p for p, m in zip(conv.out_primes, conv.product_mod_out)]
        sp, self._tc_kc = tc_layout(s)
        # Its input constants and reciprocals zero padded to SP rows, output constants to 8 DT.
        self._tc_in = cp.asarray(np.concatenate([in_consts, np.zeros((sp - s, 4), np.uint32)]))
        self._tc_recip = cp.asarray(np.concatenate([conv.reciprocals.astype(np.float64), np.zeros(sp - s)]))
        self._tc_out4 = cp.asarray(tc_out_constants(conv.out_primes))
        self._tc_qhat = cp.asarray(tc_fragments(tc_table(conv.qhat_mod_out.T, neg_q, conv.out_primes)))
        self._tc_factors = cp.asarray(tc_fragments(tc_table(conv.factors.T, neg_q, conv.out_primes)))

    def convert(self, arena, in_slots, out_slots, mode, tiled: bool = True, tail8: bool = TAIL8,
                min_blocks: int = BC_MIN_BLOCKS, tensor: bool | None = TENSOR, stage: bool | None = TC_STAGE,
                per: int = TC_PER, unroll: int = TC_UNROLL, split: int = TC_SPLIT, tstore: bool = TC_TSTORE,
                pf: int = TC_PF, minb: int = TC_MINB, pipe: bool | None = None) -> None:
        """Convert B inputs: arena[out_slots[b, d]] = conversion of rows arena[in_slots[b, :]].

        in_slots: int32 (B, S) in the order of ``in_limbs``; out_slots: int32 (B, D) in the order of
        ``out_limbs``; inputs in coefficient form, canonical. ``mode``: a ``caramel.ring.Mode``.
        ``tiled``: the tiled kernel (16 outputs x 128 TILED_CO coefficients a block; 1 or 2 picks
        the coefficients per thread); False: one thread per coefficient, t_k in shared memory (the
        first kernel, kept for comparison). ``tensor``: the tensor-core kernel (byte products on
        mma.m16n8k32, see tc_table; 128 coefficients and ``per`` x 8 outputs a block, 0: all); it
        ignores ``tiled``, ``tail8`` and ``min_blocks``; None: :func:`use_tensor` when ``tiled`` is True
        (the default), else the kernel ``tiled`` names. ``stage`` (None:
        S > TC_STAGE_S), ``unroll``, ``split``, ``tstore``, ``pf``, ``minb`` and ``pipe`` (None:
        TC_PIPE): see _tc_source.
        All compute the same residues.
        """
        ring = self.ring
        ring.check_arena(arena)
        s, d = len(self.in_limbs), len(self.out_limbs)
        batch = index_array(in_slots, cols=s, name="in_slots").shape[0]
        index_array(out_slots, batch, d, "out_slots")
        if batch == 0 or d == 0:
            return
        code = mode_code(mode)
        cp = cupy()
        if tensor is None:  # the default kernel: by shape unless the caller named a tiled or first kernel
            tensor = tiled is True and use_tensor(s, d)
        if tensor and ring.n % TC_ROWS == 0:
            tiles = -(-ring.n // TC_ROWS)
            dts = -(-d // 8)
            per = min(int(per), dts) if per else dts
            chunks = -(-dts // per)
            name = "base_convert_tc_" + ("textbook", "emulator", "exact")[code]
            kc, staged, unroll = self._tc_kc, bool(s > TC_STAGE_S if stage is None else stage), int(unroll)
            split = int(split)
            if split not in (1, 2) or (staged and split > 1) or int(pf) not in (4, 8, 12, 16, 20, 24) or not (
                    1 <= int(minb) <= 16):
                raise ValueError(f"tensor-core base conversion: split {split} with stage {staged}, pf {pf}, "
                                 f"minb {minb}")
            opts = (kc, staged, unroll, split, bool(tstore), int(pf), int(minb),
                    bool(TC_PIPE if pipe is None else pipe))
            ring.kernel("basis-tc-" + "-".join(str(int(o)) for o in opts), lambda: _tc_source(*opts), name)(
                (batch * tiles * chunks,),
                (TC_ROWS * split,),
                (arena, in_slots, out_slots, cp.int32(s), cp.int32(d), self._tc_in,
                 self._tc_out4,
                 self._tc_factors if code == 1 else self._tc_qhat, self._tc_recip, cp.int32(ring.n), cp.int32(tiles),
                 cp.int32(chunks), cp.int32(per)),
            )
            return
        if tiled:
            per_thread = TILED_CO if tiled is True else int(tiled)
            tiles = -(-ring.n // (128 * per_thread))
            name = f"base_convert_tiled{per_thread}_" + ("textbook", "emulator", "exact")[code]
            key = f"basis-mb{min_blocks}" if min_blocks else "basis"
            ring.kernel(key, lambda: _source(min_blocks), name)(
                (batch * tiles * self._chunks,),
                (128,),
                (arena, in_slots, out_slots, cp.int32(s), cp.int32(d), self._in_consts, self._out8,
                 self._factors16 if code == 1 else self._qhat16, self._recip, cp.int32(ring.n), cp.int32(tiles),
                 cp.int32(self._chunks), cp.int32(tail8 and 1 <= d % 16 <= 8)),
            )
            return
        tiles = -(-ring.n // THREADS)
        smem = 4 * (s * self._dp + s * THREADS)
        kernel = ring.kernel("basis", _source, "base_convert")
        kernel(
            (batch * tiles,),
            (THREADS,),
            (
                arena,
                in_slots,
                out_slots,
                cp.int32(s),
                cp.int32(d),
                cp.int32(code),
                self._in_consts,
                self._out_consts,
                self._factors if code == 1 else self._qhat,
                self._recip,
                cp.int32(ring.n),
                cp.int32(tiles),
            ),
            shared_mem=smem,
        )


def sud_lift(ring: CudaRing, arena, in_slots, out_slots, src_prime_idx, dst_prime_idx, mode) -> None:
    """Register-form ``sud`` lift: arena[out_slots[r]] = lift of arena[in_slots[r]] from q_t to q_l.

    t = src_prime_idx[r], l = dst_prime_idx[r] (int32 (R,) each). EXACT: centred (rb - q_t when
    rb > (q_t - 1)/2), then mod q_l; TEXTBOOK and EMULATOR: rb mod q_l. Coefficient form.
    """
    ring.check_arena(arena)
    rows = index_array(dst_prime_idx, name="dst_prime_idx").shape[0]
    index_array(src_prime_idx, rows, name="src_prime_idx")
    index_array(in_slots, rows, name="in_slots")
    index_array(out_slots, rows, name="out_slots")
    if rows == 0:
        return
    cp = cupy()
    n4 = ring.n // 4
    threads = min(256, n4)
    tiles = n4 // threads
    kernel = ring.kernel("basis", _source, "sud_lift")
    kernel(
        (rows * tiles,),
        (threads,),
        (
            arena,
            in_slots,
            out_slots,
            src_prime_idx,
            dst_prime_idx,
            ring.prime_table,
            cp.int32(mode_code(mode) == 2),
            cp.int32(n4),
            cp.int32(tiles),
        ),
    )
