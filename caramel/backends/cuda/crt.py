"""CRT resolve and modular reduction of the rsv/mod accumulator (ISA 4.5), bit-identical to
:mod:`caramel.ring.crt`.

The accumulator of a basis B of m limbs is m arena rows (words, little-endian): per position i,
X[i] = sum_w arena[acc[w]][i] 2^(32 w). ``rsv`` adds c * (Q_B / q_l) with
c = [rs (Q_B / q_l)^-1]_{q_l}, then subtracts Q_B once if the sum reaches it, so X stays in
[0, Q_B) given that it starts there (``rsi`` zeroes it; unlike the CPU reference, the kernel does
not reduce an accumulator that already holds X >= Q_B). :func:`move_rows` moves accumulators to other rows
(the executor's rsv writes its result to rows other than its operand's). ``mod`` computes X mod q by Horner's rule
over the words with a 64-bit Barrett reduction. m <= 8; kernels are specialised per m.
"""

from __future__ import annotations

import math

from functools import lru_cache

import numpy as np

from caramel.backends.cuda.compiler import function, read_cuh
from caramel.backends.cuda.context import COMMON_SRC, CudaRing, cupy, index_array, shoup_constant

THREADS = 256
MAX_WORDS = 8


@lru_cache(maxsize=None)
def source() -> str:
    """The CUDA source of ``rsv_M`` and ``mod_M`` (M words)."""
    body = read_cuh(__package__, "crt.cuh")
    wrappers = []
    for m in range(1, MAX_WORDS + 1):
        wrappers.append(
            f'extern "C" __global__ void __launch_bounds__(256) rsv_{m}(u32* arena, const int* acc_slots, '
            f"const int* src_slots, const int* src_pos, int K, const u32* consts, const u32* qb, int n, int tiles) "
            f"{{ rsv_body<{m}>(arena, acc_slots, src_slots, src_pos, K, consts, qb, n, tiles); }}\n"
            f'extern "C" __global__ void __launch_bounds__(256) mod_{m}(u32* arena, const int* acc_slots, '
            f"const int* out_slots, const int* prime_idx, const u32* pt, int n, int tiles) "
            f"{{ mod_body<{m}>(arena, acc_slots, out_slots, prime_idx, pt, n, tiles); }}\n"
        )
    return COMMON_SRC + body + "".join(wrappers)


def _words(value: int, m: int) -> list[int]:
    return [(value >> (32 * w)) & 0xFFFFFFFF for w in range(m)]


def _launch_shape(ring: CudaRing, rows: int):
    threads = min(THREADS, ring.n)
    tiles = ring.n // threads
    return (rows * tiles,), (threads,), tiles


class CrtBasis:
    """Device constants of ``rsv`` for the basis ``limbs`` (limb indices, in the group's order).

    Q_B = prod q_l; for position j (limb l = limbs[j]): q_l, [(Q_B/q_l)^-1]_{q_l} with its Shoup
    quotient, and the m words of Q_B / q_l.
    """

    def __init__(self, ring: CudaRing, limbs):
        m = len(limbs)
        if not 1 <= m <= MAX_WORDS:
            raise ValueError(f"rsv basis of {m} limbs; the CUDA kernels support 1..{MAX_WORDS}")
        self.ring = ring
        self.limbs = tuple(int(l) for l in limbs)
        primes = [ring.primes[l] for l in self.limbs]
        qb = math.prod(primes)
        consts = np.zeros((m, 3 + m), dtype=np.uint32)
        for j, q in enumerate(primes):
            qhat = qb // q
            inv = pow(qhat % q, -1, q)
            consts[j, :3] = [q, inv, shoup_constant(inv, q)]
            consts[j, 3:] = _words(qhat, m)
        cp = cupy()
        self._consts = cp.asarray(consts)
        self._qb = cp.asarray(np.array(_words(qb, m), dtype=np.uint32))

    def rsv(self, arena, acc_slots, src_slots, src_pos) -> None:
        """Accumulate K sources into each of G accumulators, in order j = 0..K-1.

        acc_slots: int32 (G, m), the words of accumulator g; src_slots: int32 (G, K), coefficient-form
        rows; src_pos: int32 (G, K), the position in ``limbs`` of each source's limb. Equivalent to K
        successive ``rsv`` instructions per accumulator (``caramel.ring.crt.rsv_accumulate``).
        """
        ring = self.ring
        ring.check_arena(arena)
        m = len(self.limbs)
        groups = index_array(acc_slots, cols=m, name="acc_slots").shape[0]
        if src_slots.ndim != 2:
            raise ValueError("src_slots must have shape (G, K)")
        k = src_slots.shape[1]
        index_array(src_slots, groups, k, "src_slots")
        index_array(src_pos, groups, k, "src_pos")
        if groups == 0 or k == 0:
            return
        cp = cupy()
        grid, block, tiles = _launch_shape(ring, groups)
        kernel = function(source(), f"rsv_{m}")
        kernel(
            grid,
            block,
            (arena, acc_slots, src_slots, src_pos, cp.int32(k), self._consts, self._qb,
             cp.int32(ring.n), cp.int32(tiles)),
        )


def move_rows(ring: CudaRing, arena, src, dst, buf) -> None:
    """arena[dst[r]] = arena[src[r]] for every r at once (as if read before any is written), through ``buf``
    (uint32 (R, N), allocated by the caller): two launches and no allocation, so that it can be captured.
    ``src``, ``dst``: int32 device arrays of R rows."""
    ring.check_arena(arena)
    rows = index_array(src, name="src").shape[0]
    index_array(dst, rows, name="dst")
    if buf.shape != (rows, ring.n) or buf.dtype != np.uint32:
        raise ValueError(f"buf must be uint32 of shape ({rows}, {ring.n})")
    if rows == 0:
        return
    cp = cupy()
    grid, block, tiles = _launch_shape(ring, rows)
    function(source(), "gather_rows")(grid, block, (arena, src, buf, cp.int32(ring.n), cp.int32(tiles)))
    function(source(), "scatter_rows")(grid, block, (arena, dst, buf, cp.int32(ring.n), cp.int32(tiles)))


def mod(ring: CudaRing, arena, acc_slots, out_slots, prime_idx) -> None:
    """``mod``: arena[out_slots[r]] = X_r mod q_{prime_idx[r]}, X_r the accumulator of words
    acc_slots[r] (int32 (R, m), m <= 8, little-endian). Coefficient form."""
    ring.check_arena(arena)
    rows = index_array(prime_idx, name="prime_idx").shape[0]
    if acc_slots.ndim != 2 or not 1 <= acc_slots.shape[1] <= MAX_WORDS:
        raise ValueError(f"acc_slots must have shape (R, m) with 1 <= m <= {MAX_WORDS}")
    m = acc_slots.shape[1]
    index_array(acc_slots, rows, m, "acc_slots")
    index_array(out_slots, rows, name="out_slots")
    if rows == 0:
        return
    cp = cupy()
    grid, block, tiles = _launch_shape(ring, rows)
    kernel = function(source(), f"mod_{m}")
    kernel(grid, block, (arena, acc_slots, out_slots, prime_idx, ring.prime_table, cp.int32(ring.n), cp.int32(tiles)))
