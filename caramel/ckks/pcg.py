"""NumPy's PCG64 raw words drawn on a GPU: the same 64-bit words as ``bit_generator.random_raw``.

NumPy's ``PCG64`` (PCG XSL-RR 128/64) keeps a 128-bit state s and an odd increment c; each raw word
first steps the state, then outputs from it:

    s <- s M + c  (mod 2^128),   M = 0x2360ED051FC65DA4_4385DF649FCCF645
    word = rotr64(hi(s) xor lo(s), hi(s) >> 58)

so word i (0-based) of a draw is the output of the state after i + 1 steps. The state after d steps
is s_d = M^d s + (M^(d-1) + ... + M + 1) c, computed in O(log d) products by the jump-ahead of PCG's
``pcg_advance_lcg_128`` (:func:`advance`). On the GPU every thread jumps to its first word and steps
through :data:`WORDS_PER_THREAD` words; :func:`host_words` is the same arithmetic in Python integers
(tests compare both with ``random_raw``). The generator itself is not touched here: the caller
advances it past the words it used (``bit_generator.advance``).
"""

from __future__ import annotations

import numpy as np

#: PCG's default 128-bit multiplier (NumPy's PCG64).
MULTIPLIER = (0x2360ED051FC65DA4 << 64) | 0x4385DF649FCCF645
_MASK128 = (1 << 128) - 1
_MASK64 = (1 << 64) - 1
#: Consecutive words each GPU thread computes after its jump-ahead.
WORDS_PER_THREAD = 64
_THREADS = 256

_SOURCE = r"""
typedef unsigned long long u64;
struct u128 { u64 hi, lo; };
__device__ __forceinline__ u128 mul128(u128 a, u128 b) {
    u128 r;
    r.lo = a.lo * b.lo;
    r.hi = __umul64hi(a.lo, b.lo) + a.lo * b.hi + a.hi * b.lo;
    return r;
}
__device__ __forceinline__ u128 add128(u128 a, u128 b) {
    u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo ? 1ull : 0ull);
    return r;
}
extern "C" __global__ void pcg64_words(u64 s_hi, u64 s_lo, u64 c_hi, u64 c_lo, u64 m_hi, u64 m_lo,
                                       long long count, u64* __restrict__ out) {
    const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * WORDS;
    if (first >= count) return;
    const u128 one = {0ull, 1ull};
    const u128 m = {m_hi, m_lo};
    const u128 c = {c_hi, c_lo};
    u128 acc_mult = one, acc_plus = {0ull, 0ull}, cur_mult = m, cur_plus = c;
    for (unsigned long long d = (unsigned long long)first; d; d >>= 1) {
        if (d & 1ull) {
            acc_mult = mul128(acc_mult, cur_mult);
            acc_plus = add128(mul128(acc_plus, cur_mult), cur_plus);
        }
        cur_plus = mul128(add128(cur_mult, one), cur_plus);
        cur_mult = mul128(cur_mult, cur_mult);
    }
    const u128 s0 = {s_hi, s_lo};
    u128 s = add128(mul128(acc_mult, s0), acc_plus);
    const long long last = first + WORDS < count ? first + WORDS : count;
    for (long long i = first; i < last; ++i) {
        s = add128(mul128(s, m), c);
        const u64 x = s.hi ^ s.lo;
        const unsigned rot = (unsigned)(s.hi >> 58);
        out[i] = (x >> rot) | (x << ((64u - rot) & 63u));
    }
}
"""

#: The module of ``pcg64_words`` (:data:`WORDS_PER_THREAD` words a thread) and its NVRTC options, compiled through the
#: source-keyed compile cache (:mod:`caramel.backends.cuda.compiler`).
SOURCE = f"#define WORDS {WORDS_PER_THREAD}\n" + _SOURCE
OPTIONS = ("--std=c++17",)
KERNEL = "pcg64_words"


def advance(state: int, inc: int, delta: int) -> int:
    """The state after ``delta`` steps s <- s M + inc (mod 2^128), by PCG's jump-ahead."""
    acc_mult, acc_plus, cur_mult, cur_plus = 1, 0, MULTIPLIER, inc
    while delta:
        if delta & 1:
            acc_mult = acc_mult * cur_mult & _MASK128
            acc_plus = (acc_plus * cur_mult + cur_plus) & _MASK128
        cur_plus = (cur_mult + 1) * cur_plus & _MASK128
        cur_mult = cur_mult * cur_mult & _MASK128
        delta >>= 1
    return (acc_mult * state + acc_plus) & _MASK128


def output(state: int) -> int:
    """XSL-RR: rotr64(hi xor lo, hi >> 58) of a 128-bit state."""
    hi, lo = state >> 64, state & _MASK64
    x, rot = hi ^ lo, hi >> 58
    return ((x >> rot) | (x << ((64 - rot) & 63))) & _MASK64


def host_words(state: int, inc: int, start: int, count: int) -> np.ndarray:
    """Words ``start`` .. ``start + count - 1`` of a draw from (``state``, ``inc``), uint64, in Python
    integers (the reference of the GPU kernel's arithmetic)."""
    s = advance(state, inc, start)
    out = np.empty(count, dtype=np.uint64)
    for i in range(count):
        s = (s * MULTIPLIER + inc) & _MASK128
        out[i] = output(s)
    return out


def pcg64_state(bit_generator) -> tuple[int, int] | None:
    """(state, inc) of a NumPy PCG64 bit generator, or None for any other kind."""
    st = bit_generator.state
    if st.get("bit_generator") != "PCG64":
        return None
    return int(st["state"]["state"]), int(st["state"]["inc"])


def device_words(state: int, inc: int, count: int, cp=None, dtype=np.uint64):
    """The first ``count`` raw words of a draw from (``state``, ``inc``) as a CuPy array, computed on
    the current GPU (the same words as ``random_raw(count)``; the generator is not advanced): uint64,
    or with ``dtype`` uint32 the 2 ``count`` little-endian halves (low, then high, of each word: what
    ``random_raw(count).view(np.uint32)`` gives)."""
    if cp is None:
        import cupy as cp
    from caramel.backends.cuda.compiler import function

    kernel = function(SOURCE, KERNEL, OPTIONS)
    dtype = np.dtype(dtype)
    if dtype not in (np.dtype(np.uint64), np.dtype(np.uint32)):
        raise ValueError(f"raw words as uint64 or uint32, not {dtype}")
    out = cp.empty(count * 8 // dtype.itemsize, dtype=dtype)  # the kernel writes 64-bit words
    if count:
        threads = -(-count // WORDS_PER_THREAD)
        u64 = np.uint64
        kernel((-(-threads // _THREADS),), (_THREADS,),
               (u64(state >> 64), u64(state & _MASK64), u64(inc >> 64), u64(inc & _MASK64),
                u64(MULTIPLIER >> 64), u64(MULTIPLIER & _MASK64), np.int64(count), out))
    return out


__all__ = ["KERNEL", "MULTIPLIER", "OPTIONS", "SOURCE", "WORDS_PER_THREAD", "advance", "device_words", "host_words", "output", "pcg64_state"]
