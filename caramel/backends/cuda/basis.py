"""Base conversion (the base conversion unit, ISA 4.4) and the register-form ``sud`` lift (ISA 4.3).

Both are bit-identical to :mod:`caramel.ring` (``BaseConverter.convert``, ``sud_lift``) in the three
modes of ISA decision 2. Base conversion, from input primes q_k (k < S) to output primes p_d (d < D):

* TEXTBOOK: t_k = [x_k Qhat_k^-1]_{q_k}; out_d = sum_k t_k [Qhat_k]_{p_d} mod p_d.
* EMULATOR: out_d = sum_k x_k F_{k,d} mod p_d, F_{k,d} = [Qhat_k]_{p_d} [Qhat_k^-1]_{q_k} mod p_d.
* EXACT: t_k as TEXTBOOK; f = sum over increasing k of double(t_k) * r_k (r_k = 1/q_k rounded once on
  the host; __dmul_rn and __dadd_rn, so no fused multiply-add), v = floor(f + 0.5);
  out_d = (sum_k t_k [Qhat_k]_{p_d} - v [Q_S]_{p_d}) mod p_d.

Two kernels compute the same residues; a :class:`BaseConversion` picks one at construction and uploads
only its tables. The tensor-core one (the default wherever N is a multiple of TC_ROWS and D <= 64; see
the comment above :func:`tc_layout`): byte products on mma.m16n8k32 with int32 sums, folded into two
32-bit words per output and reduced with two Shoup products (``tc_reduce``). The tiled one (else): a matrix
product tiled over (16 outputs) x (256 coefficients, 2 a thread) a block, the last chunk 8 outputs wide
when D mod 16 is 1..8: the table's columns in shared memory, the sums in 64-bit registers (the
constructor checks that they cannot overflow), each input limb read once per block, and one 32-bit
reduction per output: acc = hi 2^32 + lo, so (acc + v [-Q_S]_p) mod p = hi [2^32]_p + lo + v [-Q_S]_p
mod p. One launch converts B independent inputs that share the primes (e.g. both halves of a
ciphertext): in_slots (B, S), out_slots (B, D).
"""

from __future__ import annotations

from functools import lru_cache
from types import MappingProxyType

import numpy as np

from caramel.backends.cuda.compiler import function, read_cuh
from caramel.backends.cuda.context import COMMON_SRC, CudaRing, cupy, index_array, shoup_constant

MODES = MappingProxyType({"textbook": 0, "emulator": 1, "exact": 2})
TC_ROWS = 128  # coefficients a block of the tensor-core kernel; N must be a multiple of it
TC_PF_MAX = 24  # input loads in flight a thread of the tensor-core kernel: min(8 KC, TC_PF_MAX)
TC_SMALL_KC = 3  # tc_build: k-chunks up to which the 2-tile and 80-register builds (nearly) fit (ptxas)


def tc_build(kc: int, blocks: int, multiprocessors: int) -> tuple[int, int]:
    """(unroll, minb) of the tensor-core kernel for KC k-chunks and a grid of ``blocks``: output tiles
    a loop iteration and the resident blocks of 128 threads asked of __launch_bounds__.

    KC <= TC_SMALL_KC: (2, 4) where the grid fits in two waves of 4 blocks a multiprocessor (two
    tiles give each warp independent work; <= 128 registers, 8 bytes of spills at KC = 3), else
    (1, 6) (<= 80 registers: more warps resident). Larger KC: (1, 4) (<= 128 registers; the other
    builds spill hundreds of bytes)."""
    if kc > TC_SMALL_KC:
        return 1, 4
    return (2, 4) if blocks <= 8 * multiprocessors else (1, 6)


def tensor_fits(n: int, outputs: int) -> bool:
    """Whether the tensor-core kernel converts to ``outputs`` primes at N = ``n`` (its shared tables hold 64
    outputs); where it does, it is the default."""
    return n % TC_ROWS == 0 and outputs <= 64


def conversion_kernel(n: int, s: int, batch: int, code: int, tensor: bool, multiprocessors: int = 0,
                      build: tuple[int, int] | None = None) -> tuple[str, str]:
    """(source, kernel name) of a conversion of ``batch`` inputs of ``s`` limbs at N = ``n`` in mode ``code``
    (:func:`mode_code`): the tensor-core kernel (``tensor``; ``build`` its (unroll, minb), None: :func:`tc_build`'s
    for a device of ``multiprocessors``) or the tiled one."""
    mode_name = ("textbook", "emulator", "exact")[code]
    if not tensor:
        return source(), "base_convert_tiled_" + mode_name
    kc = tc_layout(s)[1]
    unroll, minb = (int(v) for v in (build or tc_build(kc, batch * (n // TC_ROWS), multiprocessors)))
    if unroll not in (1, 2) or not 1 <= minb <= 16:
        raise ValueError(f"tensor-core base conversion: unroll {unroll}, minb {minb}")
    return tc_source(kc, unroll, minb), "base_convert_tc_" + mode_name


def mode_code(mode) -> int:
    """Kernel code of a :class:`caramel.ring.Mode` (or its value string)."""
    name = getattr(mode, "value", mode)
    if name not in MODES:
        raise ValueError(f"unknown arithmetic mode {mode!r}")
    return MODES[name]


@lru_cache(maxsize=None)
def source() -> str:
    """The CUDA source of the tiled base conversion and the ``sud`` lift."""
    return COMMON_SRC + _SOURCE


_SOURCE = read_cuh(__package__, "basis.cuh")


# --------------------------------------------------------------------------- tensor-core kernel
#
# out_d = sum_k t_k T[k][d] mod p_d as a product of bytes on the integer tensor cores. With t_k
# = sum_a t_{k,a} 2^(8a) (bytes, a < 4), out_d = sum_{a,k} t_{k,a} T_a[k][d] mod p_d where T_a[k][d]
# = [2^(8a) T[k][d]]_{p_d}: a K = 4S product of bytes of t with 32-bit table entries. Splitting those
# into bytes too, T_a[k][d] = sum_b T_{a,b}[k][d] 2^(8b), gives four byte GEMMs R_b = sum_{a,k}
# t_{k,a} T_{a,b}[k][d] (int32: (4S + 1) 255^2 < 2^24 for S <= 64) and out_d = sum_b R_b 2^(8b)
# mod p_d (< 2^49: two 32-bit words and two Shoup products, see tc_reduce). EXACT's v [-Q_S]_p
# (v <= S < 2^8) is one more input: t_S = v (bytes 1..3 zero) with table row [-Q_S]_p.


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


def tc_row(lane: int) -> int:
    """The MMA row (of its warp's 32) that holds coefficient ``lane`` of the warp: lane = 4 g + 2 m + hi
    -> row 16 m + 8 hi + g. The C elements of one output that lane (g, t) holds, rows g, g + 8 of
    m-tiles 0 and 1, are then coefficients 4 g .. 4 g + 3: one 16-byte store."""
    return 16 * ((lane >> 1) & 1) + 8 * (lane & 1) + (lane >> 2)


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


_TC_SOURCE = read_cuh(__package__, "basis_tc.cuh")


@lru_cache(maxsize=None)
def tc_source(kc: int, unroll: int, minb: int) -> str:
    """The tensor-core kernels for KC k-chunks (see tc_layout) with ``unroll`` output tiles a loop
    iteration and __launch_bounds__'s ``minb`` resident blocks. Input loads in flight a thread:
    min(8 KC, TC_PF_MAX), a multiple of 4 that covers SP <= 8 KC, so that up to 23 inputs load in one
    round. The epilogue is tc_reduce's."""
    defines = dict(TC_KC=kc, TC_PF=min(8 * kc, TC_PF_MAX), TC_MINB=int(minb))
    body = _TC_SOURCE.replace("#pragma unroll TC_UNROLL", f"#pragma unroll {int(unroll)}")
    return COMMON_SRC + "".join(f"#define {k} {v}\n" for k, v in defines.items()) + body


def conversion_constants(conv, what: str) -> tuple[np.ndarray, list[int]]:
    """The host constants of every GPU conversion kernel (this module's and the NTT's converting
    load) for the host converter ``conv``, after checking that their 64-bit sums cannot overflow
    (``what`` names the sum in the error): per input prime q_k the row (q_k, w_k, shoup(w_k), 0),
    w_k = [Qhat_k^-1]_{q_k} (t_k = x_k w_k mod q_k), uint32 (S, 4); per output prime p, [-Q]_p (the
    term of EXACT's v)."""
    s = len(conv.in_primes)
    if s * max(conv.in_primes) * max(conv.out_primes, default=1) + (1 << 40) >= 1 << 64:
        raise ValueError(f"the 64-bit {what} would overflow with these primes")
    in_consts = np.zeros((s, 4), dtype=np.uint32)
    for k, q in enumerate(conv.in_primes):
        w = int(conv.qhat_inv[k])
        in_consts[k, :3] = [q, w, shoup_constant(w, q)]
    return in_consts, [(p - int(m)) % p for p, m in zip(conv.out_primes, conv.product_mod_out)]


class BaseConversion:
    """Device tables of the conversion from limbs ``in_limbs`` to limbs ``out_limbs`` (limb indices).

    The constants come from ``ring.ctx.base_converter(in_limbs, out_limbs)`` (the CPU reference).
    ``tensor``: the kernel, picked once (None: the tensor-core one when N is a multiple of TC_ROWS
    and D <= 64, else the tiled one; True needs both). Only that kernel's tables are uploaded, here,
    so that :meth:`convert` copies nothing and can be captured in a CUDA graph.
    """

    def __init__(self, ring: CudaRing, in_limbs, out_limbs, tensor: bool | None = None):
        if not 1 <= len(in_limbs) <= 64:
            raise ValueError(f"base conversion supports 1..64 inputs, got {len(in_limbs)}")
        self.ring = ring
        self.in_limbs = tuple(int(l) for l in in_limbs)
        self.out_limbs = tuple(int(l) for l in out_limbs)
        fits = tensor_fits(ring.n, len(self.out_limbs))
        self.tensor = fits if tensor is None else bool(tensor)
        if self.tensor and not fits:
            raise ValueError(f"the tensor-core base conversion needs N a multiple of {TC_ROWS} and at most 64 "
                             f"outputs, got N = {ring.n}, {len(self.out_limbs)} outputs")
        conv = ring.ctx.base_converter(self.in_limbs, self.out_limbs)
        s, d = len(self.in_limbs), len(self.out_limbs)
        in_consts, neg_q = conversion_constants(conv, "accumulator of base conversion")
        recip = conv.reciprocals.astype(np.float64)
        cp = cupy()
        self._sms = cp.cuda.Device().attributes["MultiProcessorCount"] if self.tensor else 0
        if self.tensor:
            # B fragments (tc_table, tc_fragments), one table a mode family; input constants and
            # reciprocals zero padded to SP rows, output constants to 8 DT (tc_out_constants).
            sp = tc_layout(s)[0]
            self._in = cp.asarray(np.concatenate([in_consts, np.zeros((sp - s, 4), np.uint32)]))
            self._recip = cp.asarray(np.concatenate([recip, np.zeros(sp - s)]))
            self._out = cp.asarray(tc_out_constants(conv.out_primes))
            self._qhat = cp.asarray(tc_fragments(tc_table(conv.qhat_mod_out.T, neg_q, conv.out_primes)))
            self._factors = cp.asarray(tc_fragments(tc_table(conv.factors.T, neg_q, conv.out_primes)))
            return
        # The tiled kernel: tables (S, DP16) zero padded to a multiple of 16 outputs, and 8 words of
        # output constants an output prime (see reduce_sum in the source).
        self._chunks = max(1, -(-d // 16))
        wide = np.zeros((2, s, 16 * self._chunks), dtype=np.uint32)
        wide[0, :, :d] = conv.qhat_mod_out.T
        wide[1, :, :d] = conv.factors.T
        out8 = np.zeros((max(d, 1), 8), dtype=np.uint32)
        for j, p in enumerate(conv.out_primes):
            c32 = (1 << 32) % p
            out8[j, :6] = [p, neg_q[j], shoup_constant(neg_q[j], p), c32, shoup_constant(c32, p), (1 << 32) // p]
        self._in = cp.asarray(in_consts)
        self._recip = cp.asarray(recip)
        self._out = cp.asarray(out8)
        self._qhat = cp.asarray(wide[0])
        self._factors = cp.asarray(wide[1])

    def convert(self, arena, in_slots, out_slots, mode, build: tuple[int, int] | None = None) -> None:
        """Convert B inputs: arena[out_slots[b, d]] = conversion of rows arena[in_slots[b, :]].

        in_slots: int32 (B, S) in the order of ``in_limbs``; out_slots: int32 (B, D) in the order of
        ``out_limbs``; inputs in coefficient form, canonical. ``mode``: a ``caramel.ring.Mode``.
        ``build``: the tensor-core kernel's (unroll, minb) (see tc_source; None: :func:`tc_build`'s).
        Outputs may overwrite inputs with the tensor-core kernel.
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
        table = self._factors if code == 1 else self._qhat
        kernel = function(*conversion_kernel(ring.n, s, batch, code, self.tensor, self._sms, build))
        if self.tensor:
            tiles = ring.n // TC_ROWS
            kernel(
                (batch * tiles,),
                (TC_ROWS,),
                (arena, in_slots, out_slots, cp.int32(s), cp.int32(d), self._in, self._out, table, self._recip,
                 cp.int32(ring.n), cp.int32(tiles)),
            )
            return
        tiles = -(-ring.n // 256)
        kernel(
            (batch * tiles * self._chunks,),
            (128,),
            (arena, in_slots, out_slots, cp.int32(s), cp.int32(d), self._in, self._out, table, self._recip,
             cp.int32(ring.n), cp.int32(tiles), cp.int32(self._chunks), cp.int32(1 <= d % 16 <= 8)),
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
    kernel = function(source(), "sud_lift")
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
