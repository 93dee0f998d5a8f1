"""Forward NTTs whose load computes their input (fusion across NTT boundaries): the sud lift, ``mod`` or a base
conversion of the limb that their producer would have written, bit-identical to those kernels followed by the NTT.

N <= 4096: one kernel (the small transform with the computed load); else the column kernel with the computed load,
then the transform's row kernel (:mod:`.transform`), in place on the outputs (not for a half NTT: its readers run the
row pass in their loads, :mod:`.epilogue`).
"""

from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType

import numpy as np

from caramel.backends.cuda.compiler import function, read_cuh
from caramel.backends.cuda.config import KernelConfig
from caramel.backends.cuda.context import CudaRing, cupy, index_array
from caramel.backends.cuda.ntt.common import COLS, ROW_LOG, fill, header, pass_calls, ring_lazy
from caramel.backends.cuda.ntt.tables import col_smem_words
from caramel.backends.cuda.ntt.transform import launch

#: Prologue kinds of :func:`ntt_prologue` (the value of the producer's ``Kind``) -> kernel code PK.
PROLOGUE_CODES = MappingProxyType({"sud_lift": 0, "mod": 1, "baseconv": 2})

# The value a fused NTT's load computes at 4 consecutive positions pos.. of row r (instead of reading
# one limb), bit-identical to the kernels it replaces (basis.sud_lift, crt.mod, basis.BaseConversion):
# PK 0, the sud lift of ins[r] from prime args[r] to q (MODE 2, exact: centred); PK 1, X mod q of the W
# accumulator words ins[r, :] (Horner, 64-bit Barrett); PK 2, the base conversion of the W inputs
# ins[r, :] to prime index pi in MODE (0 textbook, 1 emulator, 2 exact): cin (W x 4: q_k,
# [Qhat_k^-1]_{q_k}, its Shoup quotient, 0), ctab (P x (W + 1): [Qhat_k]_p (or F_{k,p} in emulator
# mode) for k < W, then [-Q_S]_p), recip (W: 1/q_k); sum_k t_k c_k + v [-Q_S]_p < 2^64 (checked on the
# host), one Barrett reduction.
_PRO_HELPERS = "\n#define PK {pk}\n#define PMODE {pmode}\n" + read_cuh(__package__, "prologue.cuh")

# Column kernel with a prologue (N >= 8192): as the column kernel (transform.py), but block b is (column tile b / R, row b % R), so
# that the blocks of one tile (every output prime of a conversion) run together and re-read the inputs
# from L2; the load computes the input (pro_load4). The row kernel (ntt_fwd_row) follows.
_COL_PRO = r"""
extern "C" __global__ void __launch_bounds__(256) ntt_fwd_col_pro(
        u32* arena, const int* __restrict__ ins, int W, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const int* __restrict__ args, const u32* __restrict__ cin, const u32* __restrict__ ctab,
        const double* __restrict__ recip, int R) {
    __shared__ __align__(16) u32 sm[COL_SMEM];
    // LIMB_MAJOR: block (limb r, tile c), limb by limb, so that the last limbs are whole in L2 when the reversed
    // row kernel starts on them; else tile by tile (the blocks of one tile of every limb together: a converting
    // load's rows read the same inputs).
    constexpr int TILES = (1 << (LOGN - A_BITS)) / 32;
    const int r = {limb_major} ? blockIdx.x / TILES : blockIdx.x % R;
    const int c0 = ({limb_major} ? blockIdx.x % TILES : blockIdx.x / R) * 32;
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const uint2* tw = col_twiddles((uint2*)(sm + (32 << A_BITS)), tw_all + (u64)pi * NN);
    u32* dst = arena + (u64)out_slots[r] * NN + c0;
    for (int e = threadIdx.x; e < (8 << A_BITS); e += 256)
        *(uint4*)(sm + e * 4) = pro_load4(arena, ins, W, r, pi, c0 + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4,
                                          pt, args, cin, ctab, recip);
    __syncthreads();
{passes}
    __syncthreads();
#pragma unroll
    for (int it = 0; it < (8 << A_BITS) / 256; ++it) {
        const int e = it * 256 + threadIdx.x;
        store16<false>((uint4*)(dst + ((e >> 3) << (LOGN - A_BITS)) + (e & 7) * 4), *(const uint4*)(sm + e * 4));
    }
}
"""

# The small transform (N <= 4096) with a prologue: one block a row, the whole limb computed by the
# load into shared memory (rows of one conversion are adjacent blocks).
_SMALL_PRO = r"""
extern "C" __global__ void __launch_bounds__(256) ntt_fwd_pro(
        u32* arena, const int* __restrict__ ins, int W, const int* __restrict__ out_slots,
        const int* __restrict__ prime_idx, const u32* __restrict__ pt, const uint2* __restrict__ tw_all,
        const int* __restrict__ args, const u32* __restrict__ cin, const u32* __restrict__ ctab,
        const double* __restrict__ recip, int R) {
    __shared__ __align__(16) u32 sm[NN];
    const int r = blockIdx.x;
    const int pi = prime_idx[r];
    PRIME_CONSTANTS(pt, pi);
    const uint2* tw = tw_all + (u64)pi * NN;
    u32* dst = arena + (u64)out_slots[r] * NN;
    for (int i = threadIdx.x; i < NN / 4; i += blockDim.x)
        *(uint4*)(sm + 4 * i) = pro_load4(arena, ins, W, r, pi, 4 * i, pt, args, cin, ctab, recip);
    __syncthreads();
{passes}
    __syncthreads();
    const u32 m32 = prime_m32(pt, pi);
    for (int i = threadIdx.x; i < NN; i += blockDim.x) dst[i] = fwd_final(sm[i], q, two_q, m32);
}
"""


@lru_cache(maxsize=None)
def prologue_source(logn: int, pk: int, pmode: int, lazy: bool, limb_major: bool) -> str:
    """CUDA source of the forward NTT's first kernel with prologue ``pk`` in arithmetic mode ``pmode`` (see
    _PRO_HELPERS): ``ntt_fwd_pro`` (N <= 4096, the whole transform) or ``ntt_fwd_col_pro`` (the column pass; the
    transform's ``ntt_fwd_row`` does the rest). Same stages and twiddles as the transform's kernels. ``limb_major``:
    the column kernel's blocks limb by limb (LIMB_MAJOR in _COL_PRO)."""
    helpers = fill(_PRO_HELPERS, pk=pk, pmode=pmode)
    if logn <= 12:
        return header(logn, logn, lazy) + helpers + fill(_SMALL_PRO, passes=pass_calls(logn, 1, 0, False))
    a = logn - ROW_LOG
    kernel = fill(_COL_PRO, passes=pass_calls(a, COLS, 1, False), limb_major=str(limb_major).lower())
    return header(logn, a, lazy) + f"#define COL_SMEM {col_smem_words(a)}\n" + helpers + kernel


def prologue_kernel(logn: int, kind: str, mode_code: int, lazy: bool) -> tuple[str, str]:
    """(source, kernel name) of the first kernel of a forward NTT whose load is ``kind`` (a key of
    :data:`PROLOGUE_CODES`) in arithmetic mode ``mode_code`` (:func:`caramel.backends.cuda.basis.mode_code`). A lift
    or ``mod`` load's column kernel runs limb by limb (the last limbs are whole in L2 when the reversed row kernel
    starts on them); a converting load's tile by tile (its rows share their inputs)."""
    pk = PROLOGUE_CODES[kind]
    source = prologue_source(logn, pk, mode_code if pk != 1 else 0, lazy, pk != 2)
    return source, "ntt_fwd_pro" if logn <= 12 else "ntt_fwd_col_pro"


class PrologueTables:
    """Device tables of a converting load (a ``baseconv`` prologue) from limbs ``in_limbs`` to ANY
    prime of the ring (the kernel picks the row of its output prime): the constants of
    ``ring.ctx.base_converter(in_limbs, all limbs)``, the CPU reference's, laid out as in
    _PRO_HELPERS. Raises ValueError when the 64-bit sum could overflow."""

    def __init__(self, ring: CudaRing, in_limbs):
        from caramel.backends.cuda.basis import conversion_constants

        self.in_limbs = tuple(int(l) for l in in_limbs)
        primes = len(ring.primes)
        conv = ring.ctx.base_converter(self.in_limbs, tuple(range(primes)))
        s = len(self.in_limbs)
        cin, negq = conversion_constants(conv, "sum of a converting NTT load")
        tables = np.zeros((2, primes, s + 1), dtype=np.uint32)
        tables[0, :, :s], tables[1, :, :s] = conv.qhat_mod_out, conv.factors
        tables[:, :, s] = negq
        cp = cupy()
        self.cin, self.recip = cp.asarray(cin), cp.asarray(conv.reciprocals.astype(np.float64))
        self.qhat, self.factors = cp.asarray(tables[0]), cp.asarray(tables[1])


def ntt_prologue(ring: CudaRing, arena, kind: str, ins, out_slots, prime_idx, args, mode,
                 tables: PrologueTables | None = None, half: bool = False, kernels: KernelConfig | None = None) -> None:
    """Forward NTT whose load computes its input (fusion across NTT boundaries):
    arena[out_slots[r]] = NTT_{q_p}(y_r), p = prime_idx[r], y_r computed from rows ins (int32 (R, W))
    as ``kind`` says: "sud_lift" (W = 1; from prime args[r], as :func:`basis.sud_lift`), "mod" (W
    words, as :func:`crt.mod`) or "baseconv" (W inputs in the order of ``tables.in_limbs``, to prime
    p, as :class:`basis.BaseConversion`); ``mode`` a :class:`caramel.ring.Mode`. Same bits as those
    kernels followed by the NTT, without writing y. ``out_slots`` must not be an input row of the
    launch. N <= 4096: one kernel; else the column kernel with the prologue, then the row kernel (not with
    ``half``: epilogue kernels read the outputs)."""
    from caramel.backends.cuda.basis import mode_code

    ring.check_arena(arena)
    rows = index_array(prime_idx, name="prime_idx").shape[0]
    if ins.ndim != 2:
        raise ValueError("ins must have shape (R, W)")
    w = ins.shape[1]
    index_array(ins, rows, w, "ins")
    index_array(out_slots, rows, name="out_slots")
    index_array(args, rows, name="args")
    if kind not in PROLOGUE_CODES:
        raise ValueError(f"no NTT prologue {kind!r}")
    pk = PROLOGUE_CODES[kind]
    if pk == 2 and (tables is None or len(tables.in_limbs) != w):
        raise ValueError("a converting load needs the PrologueTables of its input limbs")
    if pk == 0 and w != 1:
        raise ValueError("a lifting load reads one limb a row")
    if rows == 0:
        return
    cp = cupy()
    code = mode_code(mode)
    small = ring.logn <= 12
    fn = function(*prologue_kernel(ring.logn, kind, code, ring_lazy(ring)))
    pt = ring.prime_table
    if pk == 2:
        cin, ctab, recip = tables.cin, tables.factors if code == 1 else tables.qhat, tables.recip
    else:
        cin, ctab, recip = pt, pt, ring.twiddles[0]  # unused
    blocks = rows if small else rows * ((1 << ROW_LOG) // COLS)
    fn((blocks,), (256,), (arena, ins, cp.int32(w), out_slots, prime_idx, pt, ring.twiddles[0], args, cin, ctab,
                           recip, cp.int32(rows)))
    if not small and not half:
        launch(ring, arena, out_slots, out_slots, prime_idx, False, kernels, only_row=True)
