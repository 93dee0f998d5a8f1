"""Random polynomials for key generation and encryption (all draws from a ``numpy.random.Generator``).

* uniform residues: a_l[i] uniform in [0, q_l), independently per limb (the ``a`` of RLWE samples);
* dense ternary: s_i uniform in {-1, 0, 1};
* sparse ternary with Hamming weight h: exactly h positions (uniform without replacement) hold +-1
  (each sign with probability 1/2), the rest 0;
* centred binomial error CBD(k): e_i = sum_{j<k} (b_j - b'_j) with fair coins b, b', i.e.
  Bin(k, 1/2) - Bin(k, 1/2); variance k/2, so k = 21 gives sigma = sqrt(10.5) ~ 3.24 (the usual 3.2).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import numpy as np
from caramel.arrays import to_host
from caramel.errors import ArgumentError

#: Coin pairs of the centred binomial error: sigma = sqrt(CBD_K / 2) ~ 3.2.
CBD_K = 21


def rng_of(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A Generator from a Generator, a seed or None (fresh entropy)."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def uniform_residues(ctx, limbs, rng: np.random.Generator, xp=None, on_device: bool | None = None):
    """Uniform residues, shape (len(limbs), N) uint32, row r uniform in [0, q_{limbs[r]}).

    Exactly ``rng.integers(0, q[:, None], size=(k, N), dtype=int64)`` (same values, same generator
    state afterwards), as an array of module ``xp`` (NumPy by default). For NumPy's PCG64 the draw
    is replayed from raw 64-bit outputs of ``rng``: for a device (``on_device``, default when ``xp``
    is not NumPy: the GPU client) on the device (:func:`lemire_device`), else by the compiled host
    replay (:func:`lemire_host`, faster than NumPy's own loop); otherwise, or when a replay runs out
    of raw words, ``rng.integers`` draws it.
    """
    qs = [ctx.q(int(l)) for l in limbs]
    xp = np if xp is None else xp
    device = (xp is not np) if on_device is None else on_device
    out = lemire_device(qs, ctx.n, rng, xp) if device else lemire_host(qs, ctx.n, rng)
    if out is None:
        q_arr = np.array(qs, dtype=np.int64)
        out = rng.integers(0, q_arr[:, None], size=(len(qs), ctx.n), dtype=np.int64).astype(np.uint32)
        out = xp.asarray(out)
    return out


_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class PcgState:
    """Where a NumPy PCG64 generator stands: its 128-bit ``state`` and odd increment ``inc``, and the
    32-bit half it keeps between bounded draws (``has_uint32``, ``uinteger``). A generator made from
    it (:meth:`generator`) draws exactly what the captured one drew next (a key store keeps the
    state before each evaluation key's uniform ``a`` instead of ``a``'s limbs)."""

    state: int
    inc: int
    has_uint32: int = 0
    uinteger: int = 0

    #: Words of :meth:`words`: state (high, low), inc (high, low), has_uint32, uinteger.
    WORDS = 6

    @classmethod
    def of(cls, rng: np.random.Generator) -> "PcgState | None":
        """The state of ``rng``, or None when its bit generator is not PCG64."""
        st = rng.bit_generator.state
        if st.get("bit_generator") != "PCG64":
            return None
        return cls(int(st["state"]["state"]), int(st["state"]["inc"]), int(st["has_uint32"]), int(st["uinteger"]))

    def generator(self) -> np.random.Generator:
        """A fresh Generator on a PCG64 in this state."""
        return self.put(np.random.Generator(np.random.PCG64()))

    def put(self, rng: np.random.Generator) -> np.random.Generator:
        """``rng`` (on a PCG64) moved to this state: reusing a generator spares a new one's seeding, which reads the
        operating system's entropy while it holds the GIL."""
        rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": self.state, "inc": self.inc},
                                   "has_uint32": self.has_uint32, "uinteger": self.uinteger}
        return rng

    def words(self) -> np.ndarray:
        """The state as :data:`WORDS` uint64 words (:meth:`from_words` reads them back)."""
        return np.array([self.state >> 64, self.state & _MASK64, self.inc >> 64, self.inc & _MASK64,
                         self.has_uint32, self.uinteger], dtype=np.uint64)

    @classmethod
    def from_words(cls, w) -> "PcgState":
        """The state of :meth:`words`; ValueError unless ``inc`` is odd, ``has_uint32`` is 0 or 1 and
        ``uinteger`` below 2^32 (what NumPy's PCG64 can hold)."""
        w = [int(x) for x in w]
        if len(w) != cls.WORDS:
            raise ValueError(f"a PCG64 state is {cls.WORDS} words, got {len(w)}")
        got = cls((w[0] << 64) | w[1], (w[2] << 64) | w[3], w[4], w[5])
        if got.inc % 2 == 0 or got.has_uint32 not in (0, 1) or not 0 <= got.uinteger < 2**32:
            raise ValueError("not a PCG64 state (even increment, or a bad kept half)")
        return got


def _replayable(state: dict, qs) -> bool:
    """True when NumPy's bounded draws modulo ``qs`` from a generator in ``state`` can be replayed
    word by word: PCG64, a little-endian host, every q < 2^32."""
    return state.get("bit_generator") == "PCG64" and sys.byteorder == "little" and all(q < 2**32 for q in qs)


def _next_words(bg, state: dict, need: int, xp=np):
    """At least ``need`` 32-bit words in the order NumPy's bounded draws take them from ``bg`` (in
    ``state``): the kept half ``state["uinteger"]`` first when ``state["has_uint32"]``, then the low
    and the high half of each next raw output (:func:`raw_words`)."""
    h0 = int(state["has_uint32"])
    words = raw_words(bg, (need - h0 + 1) // 2, xp, np.uint32)
    if h0:
        words = xp.concatenate([xp.asarray(np.array([state["uinteger"]], dtype=np.uint32)), words])
    return words


def lemire_rows(qs, n: int, rng: np.random.Generator, xp=np):
    """Replay of NumPy's bounded integers for rows of moduli ``qs`` from a PCG64 ``rng``, or None.

    NumPy draws each value in [0, q) (q < 2^32) with Lemire's method from 32-bit words w of the
    generator (the low then the high half of each 64-bit output, one half kept in the state between
    calls): m = w * q, accepted when (m mod 2^32) >= 2^32 mod q, value m >> 32; rejected words are
    skipped. Row r takes the next N accepted words. Here: take enough raw words, compute the
    acceptance of every word for every row's q over a window that must hold the row, find each row's
    start by prefix counts, keep the accepted words in order, then put the generator where NumPy
    would have left it (advance it past the consumed raw words, keep the unused half). Returns None (the
    generator untouched) when the generator is not PCG64 or the window was too short.
    """
    bg = rng.bit_generator
    state = bg.state
    if not _replayable(state, qs):
        return None
    k = len(qs)
    if k == 0:
        return xp.empty((0, n), dtype=np.uint32)
    lo, width = _lemire_windows(qs, n)
    words = _next_words(bg, state, int(lo[-1]) + width, xp)
    q_all = np.array(qs, dtype=np.uint64)[:, None]
    thr_all = np.array([2**32 % q for q in qs], dtype=np.uint64)[:, None]
    out = xp.empty((k, n), dtype=np.uint32)
    span = xp.arange(width, dtype=np.int64)[None, :]
    pos = 0  # position in words of the next word
    step = k if xp is not np else max(1, (1 << 18) // width)
    for r0 in range(0, k, step):
        r1 = min(k, r0 + step)
        m = words[xp.asarray(lo[r0:r1])[:, None] + span].astype(np.uint64)
        m *= xp.asarray(q_all[r0:r1])
        accept = xp.bitwise_and(m, np.uint64(0xFFFFFFFF)) >= xp.asarray(thr_all[r0:r1])
        counts = xp.cumsum(accept, axis=1, dtype=np.int32)
        # A row starts at window index off <= width - N and ends at an index >= N - 1: only the
        # prefix counts of those two ranges go to the host.
        head, tail = counts[:, : width - n], counts[:, n - 1 :]
        head, tail = (head.get(), tail.get()) if xp is not np else (head, tail)
        starts = np.empty((r1 - r0, 1), dtype=np.int64)
        limits = np.empty((r1 - r0, 1), dtype=np.int64)
        for r in range(r0, r1):
            off = pos - int(lo[r])
            if not 0 <= off <= width - n:
                bg.state = state
                return None
            base = int(head[r - r0, off - 1]) if off else 0
            if int(tail[r - r0, -1]) < base + n:
                bg.state = state
                return None
            last = n - 1 + int(np.searchsorted(tail[r - r0], base + n, side="left"))
            starts[r - r0], limits[r - r0] = off, base + n
            pos = int(lo[r]) + last + 1
        keep = accept & (span >= xp.asarray(starts)) & (counts <= xp.asarray(limits))
        xp.right_shift(m, np.uint64(32), out=m)
        out[r0:r1] = m[keep].astype(np.uint32).reshape(r1 - r0, n)
    _leave_generator(bg, state, words, pos)
    return out


def _lemire_windows(qs, n: int) -> tuple[np.ndarray, int]:
    """(lo, width): row r of a bounded draw (:func:`lemire_rows`) is looked for in words
    lo[r] .. lo[r] + width - 1. Row r starts after r N accepted words and the rejections before
    it: the window covers the expected start and end with a margin of 10 standard deviations."""
    k = len(qs)
    reject = np.array([(2**32 % q) / 2**32 for q in qs])  # probability that one word is rejected
    expected = n * reject / (1 - reject)  # rejections before the N-th acceptance
    before = np.concatenate([[0.0], np.cumsum(expected)[:-1]])
    margin = int(10 * math.sqrt(float(expected.sum()) + 1) + 256)
    lo = np.arange(k, dtype=np.int64) * n + np.maximum(0, np.floor(before - margin)).astype(np.int64)
    width = n + int(np.ceil(expected.max())) + 2 * margin + int(np.ceil(before[-1] - np.floor(before[-1])) + 1)
    width = max(width, n + int(np.ceil(before[-1] + expected[-1])) - int(lo[-1] - (k - 1) * n) + margin)
    return lo, width


_LEMIRE_SOURCE = r"""
typedef unsigned long long u64;
__device__ __forceinline__ unsigned word_at(const unsigned* raw, unsigned first, int has_first, long long i) {
    return has_first ? (i == 0 ? first : raw[i - 1]) : raw[i];
}
// p: lo[0..k), q[0..k), thr[0..k) as int64. Block r: inclusive counts of accepted words over row r's window.
extern "C" __global__ void lemire_counts(const unsigned* __restrict__ raw, unsigned first, int has_first,
                                         const long long* __restrict__ p, int k, long long width,
                                         int* __restrict__ counts) {
    __shared__ int sums[1024];
    const int r = blockIdx.x, t = threadIdx.x;
    const long long lo = p[r];
    const u64 q = (u64)p[k + r], thr = (u64)p[2 * k + r];
    const long long chunk = (width + blockDim.x - 1) / blockDim.x;
    const long long j0 = (long long)t * chunk;
    const long long j1 = j0 + chunk < width ? j0 + chunk : width;
    int c = 0;
    for (long long j = j0; j < j1; ++j)
        c += ((u64)word_at(raw, first, has_first, lo + j) * q & 0xFFFFFFFFull) >= thr;
    sums[t] = c;
    __syncthreads();
    for (int off = 1; off < blockDim.x; off <<= 1) {
        const int v = t >= off ? sums[t - off] : 0;
        __syncthreads();
        sums[t] += v;
        __syncthreads();
    }
    int run = sums[t] - c;
    int* out = counts + (long long)r * width;
    for (long long j = j0; j < j1; ++j) {
        run += ((u64)word_at(raw, first, has_first, lo + j) * q & 0xFFFFFFFFull) >= thr;
        out[j] = run;
    }
}
// One thread: each row starts at the word after the previous row's N-th acceptance.
extern "C" __global__ void lemire_chain(const int* __restrict__ counts, const long long* __restrict__ p, int k,
                                        long long width, int n, long long* __restrict__ starts,
                                        long long* __restrict__ limits, long long* __restrict__ status) {
    long long pos = 0;
    for (int r = 0; r < k; ++r) {
        const long long off = pos - p[r];
        const int* c = counts + (long long)r * width;
        if (off < 0 || off > width - n) { status[0] = 1; return; }
        const long long need = (off ? c[off - 1] : 0) + (long long)n;
        if (c[width - 1] < need) { status[0] = 1; return; }
        long long a = off, b = width - 1;  // the first index whose count reaches need
        while (a < b) {
            const long long m = (a + b) >> 1;
            if (c[m] >= need) b = m; else a = m + 1;
        }
        starts[r] = off;
        limits[r] = need;
        pos = p[r] + a + 1;
    }
    status[0] = 0;
    status[1] = pos;
}
// Thread (j, r): the accepted word j of row r's window, if it is one of the row's N, to its place.
extern "C" __global__ void lemire_scatter(const unsigned* __restrict__ raw, unsigned first, int has_first,
                                          const long long* __restrict__ p, int k, long long width, int n,
                                          const int* __restrict__ counts, const long long* __restrict__ starts,
                                          const long long* __restrict__ limits, const long long* __restrict__ status,
                                          unsigned* __restrict__ out) {
    const int r = blockIdx.y;
    const long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (status[0] || j >= width || j < starts[r]) return;
    const long long c = counts[(long long)r * width + j], base = limits[r] - n;
    if (c > limits[r] || c <= base) return;
    const u64 m = (u64)word_at(raw, first, has_first, p[r] + j) * (u64)p[k + r];
    if ((m & 0xFFFFFFFFull) < (u64)p[2 * k + r]) return;
    out[(long long)r * n + (c - base - 1)] = (unsigned)(m >> 32);
}
"""
#: The module of the Lemire replay's three kernels and its NVRTC options (compiled through the source-keyed compile
#: cache, :mod:`caramel.backends.cuda.compiler`).
LEMIRE_SOURCE = _LEMIRE_SOURCE
LEMIRE_OPTIONS = ("--std=c++17",)
LEMIRE_KERNELS = ("lemire_counts", "lemire_chain", "lemire_scatter")


def _lemire_kernel(name: str):
    from caramel.backends.cuda.compiler import function

    return function(LEMIRE_SOURCE, name, LEMIRE_OPTIONS)


#: NumPy's inversion for Bin(k, 1/2) on both halves of 2 m raw words at once (:func:`binomial_replay`), and their
#: difference: per word u = (w >> 11) 2^-53, then while u > px[s]: x += 1, u -= px[s] (the host's px table: the same
#: doubles as NumPy's recurrence). A value still above px[bound] after ``bound`` steps sets ``flag`` (NumPy draws
#: again: no replay). One subtraction and one comparison a step, as NumPy's doubles (no product to contract).
BINOMIAL_SOURCE = r"""
__device__ long long binomial_inverse(unsigned long long w, const double* __restrict__ px, int bound, int* flag) {
    double u = (double)(w >> 11) * (1.0 / 9007199254740992.0);
    long long x = 0;
    int s = 0;
    for (; s < bound && u > px[s]; ++s) { x += 1; u = u - px[s]; }
    if (s == bound && u > px[bound]) *flag = 1;
    return x;
}

extern "C" __global__ void binomial_difference(const unsigned long long* __restrict__ words,
                                               const double* __restrict__ px, int bound, long long m,
                                               long long* __restrict__ out, int* __restrict__ flag) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < m; i += step)
        out[i] = binomial_inverse(words[i], px, bound, flag) - binomial_inverse(words[m + i], px, bound, flag);
}
"""
BINOMIAL_KERNEL = "binomial_difference"
_BINOMIAL_THREADS = 256


def _binomial_kernel():
    from caramel.backends.cuda.compiler import function

    return function(BINOMIAL_SOURCE, BINOMIAL_KERNEL)


def lemire_state_rows(qs, n: int, st: "PcgState", xp=np):
    """(out, status): the draw of :func:`uniform_residues` (rows of moduli ``qs``, N each) from a
    generator in state ``st``, computed without the generator and, on the GPU (``xp`` CuPy), without
    waiting for the device. ``status`` is a (2,) int64 array of ``xp``: [1, -] when a row did not
    fall in its window (:func:`_lemire_windows`; then ``out`` is garbage and the caller draws
    another way), else [0, the 32-bit words used, the kept half counted as in :func:`lemire_rows`]. Three steps, the same on both devices: per row, the counts of accepted
    words over its window (Lemire's test as in :func:`lemire_rows`); one pass over the rows chaining
    each row's start to the previous row's N-th acceptance; the kept words scattered to their places.
    On the host (NumPy) it is the reference of the CUDA kernels. ``st`` must be a PCG64 state."""
    k = len(qs)
    if k == 0:
        return xp.empty((0, n), dtype=np.uint32), xp.asarray(np.array([0, int(st.has_uint32)], dtype=np.int64))
    lo, width = _lemire_windows(qs, n)
    h0 = int(st.has_uint32)
    need = int(lo[-1]) + width
    count = (need - h0 + 1) // 2  # raw 64-bit outputs
    q = np.array(qs, dtype=np.int64)
    thr = np.array([2**32 % int(x) for x in qs], dtype=np.int64)
    if xp is np:
        bg = st.generator().bit_generator
        raw = bg.random_raw(count).view(np.uint32)
        words = np.concatenate([np.array([st.uinteger], dtype=np.uint32), raw]) if h0 else raw
        idx = lo[:, None] + np.arange(width, dtype=np.int64)[None, :]
        m = words[idx].astype(np.uint64) * q.astype(np.uint64)[:, None]
        accept = (m & np.uint64(0xFFFFFFFF)) >= thr.astype(np.uint64)[:, None]
        counts = np.cumsum(accept, axis=1, dtype=np.int64)
        out = np.zeros((k, n), dtype=np.uint32)
        pos = 0
        for r in range(k):
            off = pos - int(lo[r])
            if not 0 <= off <= width - n:
                return out, np.array([1, 0], dtype=np.int64)
            need_r = (int(counts[r, off - 1]) if off else 0) + n
            if counts[r, -1] < need_r:
                return out, np.array([1, 0], dtype=np.int64)
            a = int(np.searchsorted(counts[r], need_r, side="left"))
            keep = accept[r] & (np.arange(width) >= off) & (counts[r] <= need_r)
            out[r] = (m[r][keep] >> np.uint64(32)).astype(np.uint32)
            pos = int(lo[r]) + a + 1
        return out, np.array([0, pos], dtype=np.int64)
    from caramel.ckks import pcg

    cp = xp
    raw = pcg.device_words(st.state, st.inc, count, cp, np.uint32)
    p = cp.asarray(np.concatenate([lo, q, thr]))
    counts = cp.empty((k, width), dtype=np.int32)
    starts = cp.empty(k, dtype=np.int64)
    limits = cp.empty(k, dtype=np.int64)
    status = cp.asarray(np.ones(2, dtype=np.int64))  # a copy: CuPy's ones is a kernel to compile
    out = cp.empty((k, n), dtype=np.uint32)
    first, hf = np.uint32(st.uinteger if h0 else 0), np.int32(h0)
    _lemire_kernel("lemire_counts")((k,), (1024,), (raw, first, hf, p, np.int32(k), np.int64(width), counts))
    _lemire_kernel("lemire_chain")((1,), (1,), (counts, p, np.int32(k), np.int64(width), np.int32(n), starts,
                                                limits, status))
    _lemire_kernel("lemire_scatter")((-(-width // 256), k), (256,),
                                     (raw, first, hf, p, np.int32(k), np.int64(width), np.int32(n), counts, starts,
                                      limits, status, out))
    return out, status


def raw_words(bg, count: int, xp=np, dtype=np.uint64):
    """``bg.random_raw(count)`` (viewed as ``dtype``: uint64, or uint32 halves) as an array of module
    ``xp``, leaving ``bg`` where ``random_raw`` leaves it. For CuPy and a PCG64 generator the words are
    computed on the GPU (:mod:`caramel.ckks.pcg`, the same words) and the generator is advanced past
    them: nothing is drawn on the host or copied."""
    if xp is not np:
        from caramel.ckks import pcg

        got = pcg.pcg64_state(bg)
        if got is not None:
            words = pcg.device_words(got[0], got[1], int(count), xp, dtype)
            advance_raw(bg, int(count))
            return words
    return xp.asarray(bg.random_raw(count).view(dtype))


def advance_raw(bg, count: int) -> None:
    """Put ``bg`` where ``bg.random_raw(count)`` leaves it: ``advance`` steps the state the same way but
    also drops the buffered 32-bit half (``has_uint32``, ``uinteger``), which ``random_raw`` keeps."""
    before = bg.state
    bg.advance(count)
    after = bg.state
    after["has_uint32"], after["uinteger"] = before["has_uint32"], before["uinteger"]
    bg.state = after


def lemire_host(qs, n: int, rng: np.random.Generator):
    """The draw of :func:`uniform_residues` on the host by the compiled replay
    (:func:`caramel.ckks.arith.jit.lemire_fill`: the same acceptance test as :func:`lemire_rows`, word
    by word in order), or None (the generator untouched) when the compiled kernels are not ready
    (:func:`caramel.ckks.arith.jit.ready`), for a generator other than PCG64, or when the words drawn
    ahead run out."""
    from caramel.ckks.arith import jit

    bg = rng.bit_generator
    state = bg.state
    if not _replayable(state, qs):
        return None
    if not jit.ready(n):
        return None
    k = len(qs)
    if k == 0:
        return np.empty((0, n), dtype=np.uint32)
    reject = np.array([(2**32 % q) / 2**32 for q in qs])
    expected = float((n * reject / (1 - reject)).sum())  # rejected words among all rows
    need = k * n + int(math.ceil(expected + 10 * math.sqrt(expected + 1))) + 256
    words = _next_words(bg, state, need)
    out = np.empty((k, n), dtype=np.uint32)
    pos = jit.lemire_fill(words, np.array(qs, dtype=np.uint64), np.array([2**32 % q for q in qs], dtype=np.uint64), out)
    if pos < 0:
        bg.state = state
        return None
    _leave_generator(bg, state, words, pos)
    return out


def _leave_generator(bg, state: dict, words, pos: int) -> None:
    """Leave PCG64 ``bg`` (whose state before the draw was ``state``) as NumPy would after handing
    out ``pos`` words of ``words`` (:func:`_next_words`: the kept half ``state["uinteger"]`` first
    when ``state["has_uint32"]``)."""
    _leave_generator_at(bg, state, pos, lambda i: int(words[i]))


def _leave_generator_at(bg, state: dict, pos: int, word) -> None:
    """:func:`_leave_generator` with ``word(i)`` giving word i of the draw."""
    h0 = int(state["has_uint32"])
    used = pos - h0
    bg.state = state
    bg.advance((used + 1) // 2)  # as many outputs as the words used need (PCG64: one step per output)
    after = bg.state
    if used % 2:
        after["has_uint32"], after["uinteger"] = 1, word(h0 + used)
    else:  # NumPy keeps the last half it handed out in the (now unused) buffer
        after["has_uint32"], after["uinteger"] = 0, word(h0 + used - 1) if used else state["uinteger"]
    bg.state = after


def _word_of(st: "PcgState", i: int) -> int:
    """Word i of the 32-bit words a generator in state ``st`` hands out (:func:`_next_words`: the kept
    half first when there is one, then the low and high half of each raw output), from PCG64's
    jump-ahead on the host (:func:`caramel.ckks.pcg.host_words`)."""
    from caramel.ckks.pcg import host_words

    if st.has_uint32 and i == 0:
        return int(st.uinteger)
    j = i - int(st.has_uint32)
    return (int(host_words(st.state, st.inc, j // 2, 1)[0]) >> (32 * (j % 2))) & 0xFFFFFFFF


def lemire_device(qs, n: int, rng: np.random.Generator, xp):
    """The draw of :func:`uniform_residues` on the GPU (``xp`` CuPy) by :func:`lemire_state_rows`
    (one wait, for the number of words used), the generator then left where NumPy leaves it; when
    the rows leave their windows, :func:`lemire_rows`; None (the generator untouched) where neither
    applies."""
    bg = rng.bit_generator
    state = bg.state
    if not _replayable(state, qs):
        return None
    st = PcgState.of(rng)
    out, status = lemire_state_rows(qs, n, st, xp)
    failed, pos = (int(x) for x in to_host(status))
    if failed:
        return lemire_rows(qs, n, rng, xp)
    _leave_generator_at(bg, state, pos, lambda i: _word_of(st, i))
    return out


def dense_ternary(n: int, rng: np.random.Generator) -> np.ndarray:
    """N coefficients uniform in {-1, 0, 1} (int64)."""
    return rng.integers(-1, 2, size=n, dtype=np.int64)


def sparse_ternary(n: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """N coefficients with exactly h non-zeros, each +-1 (int64)."""
    if not 0 <= h <= n:
        raise ArgumentError(f"Hamming weight must be in [0, {n}], got {h}")
    out = np.zeros(n, dtype=np.int64)
    pos = rng.choice(n, size=h, replace=False)
    out[pos] = rng.integers(0, 2, size=h, dtype=np.int64) * 2 - 1
    return out


def cbd(n: int, rng: np.random.Generator, k: int = CBD_K, xp=None, on_device: bool | None = None):
    """N centred-binomial coefficients Bin(k,1/2) - Bin(k,1/2) (int64), in [-k, k], an array of
    module ``xp`` (NumPy by default).

    Exactly ``rng.binomial(k, 0.5, n) - rng.binomial(k, 0.5, n)``; for a device (``on_device``,
    default when ``xp`` is not NumPy: the GPU client) and a PCG64 generator it is replayed there
    (:func:`binomial_replay`), else drawn by NumPy."""
    xp = np if xp is None else xp
    if (xp is not np) if on_device is None else on_device:
        out = binomial_replay(n, k, rng, xp)
        if out is not None:
            return out
    return xp.asarray(rng.binomial(k, 0.5, size=n).astype(np.int64) - rng.binomial(k, 0.5, size=n).astype(np.int64))


def binomial_replay(n: int, k: int, rng: np.random.Generator, xp=np):
    """Replay of two NumPy ``binomial(k, 1/2, n)`` draws (first minus second), or None.

    NumPy draws Bin(k, p) for k p <= 30 by inversion from one double U = (w >> 11) 2^-53 per value
    (w a raw 64-bit word): px = q^k, X = 0; while U > px: X += 1, U -= px, px = (k-X+1) p px / (X q);
    a value that would pass X > bound = min(k, k p + 10 sqrt(k p q + 1)) draws a new U (then this
    returns None, the generator untouched). The px of every step come from that recurrence on the host
    (:func:`binomial_steps`); the loop runs on all values at once (NumPy) or one value a thread
    (:data:`BINOMIAL_SOURCE`), with the same floating-point operations in the same order.
    """
    state = rng.bit_generator.state
    if state.get("bit_generator") != "PCG64" or 0.5 * k > 30.0:
        return None
    words = raw_words(rng.bit_generator, 2 * n, xp)
    px, bound = binomial_steps(k)
    if xp is not np:
        out = xp.empty(n, dtype=np.int64)
        flag = xp.zeros(1, dtype=np.int32)
        blocks = max(1, min(4096, -(-n // _BINOMIAL_THREADS)))
        _binomial_kernel()((blocks,), (_BINOMIAL_THREADS,),
                           (words, xp.asarray(np.array(px, dtype=np.float64)), np.int32(bound), np.int64(n), out, flag))
        if int(flag.get()[0]):
            rng.bit_generator.state = state
            return None
        return out
    u = (words >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
    x = np.zeros(2 * n, dtype=np.int64)
    alive = np.ones(2 * n, dtype=bool)
    for step in range(bound + 1):
        alive &= u > px[step]
        if step == bound:
            if alive.any():
                rng.bit_generator.state = state
                return None
            break
        x += alive
        u = np.where(alive, u - px[step], u)
    return x[:n] - x[n:]


def binomial_steps(k: int, p: float = 0.5) -> tuple[list[float], int]:
    """(px, bound) of NumPy's inversion for Bin(k, p): px[s] the probability that step s + 1 compares with, from
    NumPy's recurrence px = q^k, then px = (k - s + 1) p px / (s q) after step s, in its order of operations;
    ``bound`` = min(k, k p + 10 sqrt(k p q + 1)) steps (a value above px[bound] after them is drawn again)."""
    q = 1.0 - p
    bound = int(min(k, k * p + 10.0 * math.sqrt(k * p * q + 1)))
    px = [math.exp(k * math.log(q))]
    for step in range(1, bound + 1):
        px.append(((k - step + 1) * p * px[-1]) / (step * q))
    return px, bound
