"""SEAL-style CKKS encoding of slot vectors into integer polynomial coefficients.

A message polynomial m(X) in Z[X]/(X^N + 1) has N/2 complex *slots*. With
zeta = exp(i*pi/N) (a primitive 2N-th root of unity) and the generator 5 (ISA.md section 3):

    slot_j(m) = m(zeta^(e_j)) / scale,      e_j = 5^j mod 2N,   j = 0 .. N/2-1

and the remaining N/2 evaluation points zeta^(-e_j) carry the conjugates (m is real). Every e_j is 1 mod 4
(5 generates those residues), so with M = N/2 the slots are the points zeta^(4s+1), s_j = (e_j - 1)/4, a
permutation of 0 .. M-1. Since zeta^(M(4s+1)) = i, the complex vector c_i = m_i + i m_(i+M) (i < M) gives

    m(zeta^(4s+1)) = sum_(i<M) c_i zeta^i exp(2 pi i s i / M),

a length-M DFT of c_i zeta^i. Encoding is its inverse: c = DFT(y) zeta^-i / M with y_(s_j) = value_j
(:func:`fft_rows`), then m = [Re c | Im c] rounded at the scale, ``round(scale * m_i)`` (round-half-even,
deterministic; SEAL's encoder also rounds to nearest). The transform is caramel's own radix-2 FFT written as
whole-array IEEE operations in one order, so the host (NumPy) and the GPU client (CuPy) compute the same
bits. :func:`decode` evaluates m at the N odd powers with one length-N inverse FFT:

    m(zeta^(2t+1)) = sum_i (m_i zeta^i) * exp(2 pi i t i / N) = N * ifft(m * zeta^i)[t],

slot j at t_j = (e_j - 1)/2 (its conjugate at N - 1 - t_j).

Rotation: the automorphism X -> X^g with g = 5^k moves slot j+k into slot j (a LEFT rotation by k,
``rot k`` in the ISA; negative k rotates right), and g = 2N-1 conjugates every slot.

Precision. The FFT runs in float64. For scale * max|value| below about 2^52 the rounded integer
coefficients are exactly the nearest integers of the float result (relative FFT error about
2^-52 * log2 N). Above that (e.g. scale 2^56) the float64 result has fewer fractional bits than the
integer needs: the coefficients are exact integers of the float64 value, i.e. they carry a relative
error of about 2^-52 * log2 N of the largest coefficient, which is far below any CKKS noise.
:func:`encode` returns ``int64`` when every coefficient has |c| < 2^62, else an ``object`` array of
Python ints. :func:`decode` accepts ints (int64 or Python ints of any size) or floats.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, NamedTuple

import numpy as np
from caramel.arrays import to_host
from caramel.errors import ArgumentError

#: Coefficients below this magnitude are returned as int64 by :func:`encode`.
INT64_LIMIT = 2**62
#: Rows of one host pass of :func:`encode_rows`'s transform: a few, so that a pass's arrays stay in a core's cache.
HOST_ROWS = 2


def _check_n(n: int) -> None:
    if n < 2 or n & (n - 1):
        raise ArgumentError(f"ring dimension N must be a power of two >= 2, got {n}")


@lru_cache(maxsize=32)
def slot_exponents(n: int) -> np.ndarray:
    """e_j = 5^j mod 2N for j = 0 .. N/2-1 (int64, read-only), built by doubling (no per-slot loop)."""
    _check_n(n)
    half, two_n = n // 2, 2 * n
    out = np.ones(max(half, 1), dtype=np.int64)
    k = 1
    while k < half:
        step = pow(5, k, two_n)
        m = min(k, half - k)
        out[k : k + m] = out[:m] * step % two_n
        k *= 2
    out = out[:half]
    out.setflags(write=False)
    return out


@lru_cache(maxsize=32)
def _tables(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(t_j slot positions in the length-N evaluation of :func:`decode`, zeta^i, zeta^-i) for ring dimension n."""
    t = (slot_exponents(n) - 1) // 2
    zeta = np.exp(1j * np.pi * np.arange(n) / n)
    for a in (t, zeta):
        a.setflags(write=False)
    izeta = np.conj(zeta)
    izeta.setflags(write=False)
    return t, zeta, izeta


class EncodeTables(NamedTuple):
    """The constants of :func:`encode_rows` at ring dimension N (M = N/2), arrays of one array module (read-only
    host arrays from :func:`encode_tables`; :meth:`on` copies them to another module, e.g. a GPU's):

    ``gather``: (N,) int64, FFT input position s reads slot j(s) of the row [re | im]: ``gather[s] = j(s)``,
    ``gather[M + s] = M + j(s)``, where s_j = (5^j mod 2N - 1) / 4 and j(s) its inverse;
    ``stages``: per FFT stage t >= 1 (Ns = 2^t) the twiddles (re, im) W^(k M / 2Ns), k < Ns, W = exp(-2 pi i / M);
    ``twist``: (re, im) of zeta^-i / M, i < M (exact: M is a power of two)."""

    gather: Any
    stages: tuple
    twist: tuple

    def on(self, put: Callable) -> "EncodeTables":
        """These tables with every array passed through ``put`` (e.g. ``cupy.asarray``)."""
        return EncodeTables(put(self.gather), tuple((put(r), put(i)) for r, i in self.stages),
                            (put(self.twist[0]), put(self.twist[1])))


@lru_cache(maxsize=32)
def encode_tables(n: int) -> EncodeTables:
    """The host :class:`EncodeTables` of ring dimension n (float64 constants computed once, read-only)."""
    _check_n(n)
    m = n // 2
    s = (slot_exponents(n) - 1) // 4
    j_of = np.empty(m, dtype=np.int64)
    j_of[s] = np.arange(m, dtype=np.int64)
    w = np.exp(-2j * np.pi * np.arange(max(m // 2, 1)) / m)
    stages, ns = [], 2
    while ns < m:  # stage t = log2(ns) >= 1 of an M-point transform
        k = np.arange(ns) * (m // (2 * ns))
        stages.append((np.ascontiguousarray(w.real[k]), np.ascontiguousarray(w.imag[k])))
        ns *= 2
    twist = _tables(n)[2][:m] / m
    out = EncodeTables(np.concatenate([j_of, m + j_of]), tuple(stages),
                       (np.ascontiguousarray(twist.real), np.ascontiguousarray(twist.imag)))
    for a in (out.gather, *(x for pair in out.stages for x in pair), *out.twist):
        a.setflags(write=False)
    return out


def fft_rows(re, im, tables: EncodeTables, xp=np):
    """The forward DFT X_k = sum_j x_j W^(jk), W = exp(-2 pi i / M), of every row x = re + i im ((R, M) float64
    arrays of ``xp``, M a power of two): radix-2 Stockham, natural order in and out. Stage t (Ns = 2^t,
    t = 0 .. log2 M - 1) takes a = x_j and b = x_(j + M/2) for j < M/2, k = j mod Ns, forms b' = b W^(k M / 2Ns)
    (``tables.stages[t - 1]``; stage 0: b' = b) and writes a + b' to position 2(j - k) + k and a - b' to that + Ns.

    Every step is one IEEE operation of the array module over whole arrays (the complex product as
    br wr - bi wi and br wi + bi wr, each product rounded on its own), so NumPy and CuPy give the same bits:
    the GPU client encodes what the host client does. Returns (re, im) of X (new arrays)."""
    rows, m = re.shape
    if m == 1:
        return re.copy(), im.copy()
    half = m // 2
    src = (re, im)
    buffers = [(xp.empty((rows, m)), xp.empty((rows, m))) for _ in range(2)]
    p_re, p_im, t1, t2 = (xp.empty((rows, half)) for _ in range(4))
    ns, t = 1, 0
    while ns < m:
        groups = half // ns
        a_re, a_im = (v[:, :half].reshape(rows, groups, ns) for v in src)
        b_re, b_im = (v[:, half:].reshape(rows, groups, ns) for v in src)
        if t:
            wr, wi = tables.stages[t - 1]
            q1, q2, q_re, q_im = (v.reshape(rows, groups, ns) for v in (t1, t2, p_re, p_im))
            xp.multiply(b_re, wr, out=q1)
            xp.multiply(b_im, wi, out=q2)
            xp.subtract(q1, q2, out=q_re)
            xp.multiply(b_re, wi, out=q1)
            xp.multiply(b_im, wr, out=q2)
            xp.add(q1, q2, out=q_im)
            b_re, b_im = q_re, q_im
        dst = buffers[t % 2]
        o_re, o_im = (v.reshape(rows, groups, 2, ns) for v in dst)
        xp.add(a_re, b_re, out=o_re[:, :, 0])
        xp.add(a_im, b_im, out=o_im[:, :, 0])
        xp.subtract(a_re, b_re, out=o_re[:, :, 1])
        xp.subtract(a_im, b_im, out=o_im[:, :, 1])
        src, ns, t = dst, 2 * ns, t + 1
    return src


def _coefficients(parts, n: int, tables: EncodeTables, xp, out) -> None:
    """Write into ``out`` ((R, N) float64 of ``xp``) the real coefficients m (unit scale) of the rows ``parts``
    [re | im] of N/2 slot values each: with M = N/2 and c_i = m_i + i m_(i+M), every slot evaluation point
    zeta^(4s+1) gives m(zeta^(4s+1)) = sum_(i<M) c_i zeta^i exp(2 pi i s i / M) (zeta^(M(4s+1)) = i), so
    c = DFT_M(y) zeta^-i / M with y_s = z_(j(s)), s_j = (5^j mod 2N - 1) / 4 (:func:`fft_rows`; the twist as one
    complex product, re then im as in :func:`fft_rows`), and m = [Re c | Im c]."""
    rows, m = parts.shape[0], n // 2
    y = xp.take(parts, tables.gather, axis=1)
    x_re, x_im = fft_rows(y[:, :m], y[:, m:], tables, xp)
    zr, zi = tables.twist
    t1, t2 = xp.empty((rows, m)), xp.empty((rows, m))
    xp.multiply(x_re, zr, out=t1)
    xp.multiply(x_im, zi, out=t2)
    xp.subtract(t1, t2, out=out[:, :m])
    xp.multiply(x_re, zi, out=t1)
    xp.multiply(x_im, zr, out=t2)
    xp.add(t1, t2, out=out[:, m:])


def slot_parts(values, n: int) -> np.ndarray:
    """The row [re | im] (N float64) of N/2 slot values (complex or real, or one number broadcast to
    every slot), as :func:`encode_rows` reads it; the errors of :func:`encode_float` for a bad shape."""
    _check_n(n)
    z = np.asarray(values, dtype=np.complex128)
    if z.ndim == 0:
        z = np.full(n // 2, z)
    if z.shape != (n // 2,):
        raise ArgumentError(f"expected {n // 2} slot values for N = {n}, got shape {z.shape}")
    return np.concatenate([z.real, z.imag])


def checked_rows(parts, scales, n: int, xp=np):
    """(``parts`` as float64 rows of ``xp``, ``scales`` as a host (P, 1) float64 column) for :func:`encode_rows`:
    an :class:`ArgumentError` for rows that are not N long or a scale that is not positive."""
    _check_n(n)
    parts = xp.asarray(parts, dtype=np.float64)
    rows = parts.shape[0] if parts.ndim == 2 else 0
    if parts.shape != (rows, n):
        raise ArgumentError(f"expected rows of {n} slot parts for N = {n}, got shape {parts.shape}")
    host_scales = np.asarray(scales, dtype=np.float64).reshape(rows, 1)
    if not np.all(host_scales > 0):
        raise ArgumentError(f"scale must be positive, got {host_scales.ravel().tolist()}")
    return parts, host_scales


def rounded_rows(x, fits, out) -> list:
    """Per row of the rounded coefficients ``x`` ((P, N) float64, host or device): ``out[p]`` (already holding
    its int64 values) where ``fits[p]`` (a host bool per row: every |x| < 2^62), else the row as Python ints
    (:func:`float_to_int`, which raises for a non-finite value)."""
    return [out[p] if fits[p] else float_to_int(to_host(x[p])) for p in range(len(fits))]


def encode_rows(parts, scales, n: int, out=None, *, xp=np, tables: EncodeTables | None = None) -> list:
    """:func:`encode` of several vectors at once: row p of ``parts`` (P, N) float64 (an array of ``xp``) is
    [re | im] of vector p (:func:`slot_parts`; a real vector has im = 0), encoded at ``scales[p]`` (host
    numbers). Returns per row encode(re + 1j * im, scales[p], n), bit for bit: the same coefficients
    (:func:`_coefficients`), each multiplied by its scale and rounded (``rint``, ties to even). An int64 row is
    written into ``out[p]`` (default a new (P, N) int64 array of ``xp``) and returned as that view; a row with a
    coefficient of 2^62 or more is a host object array of Python ints (:func:`float_to_int`). ``tables``: those
    of :func:`encode_tables` on ``xp`` (default the host's). :data:`ENCODE_SRC` is the same on CUDA."""
    parts, host_scales = checked_rows(parts, scales, n, xp)
    rows = parts.shape[0]
    out = xp.empty((rows, n), dtype=np.int64) if out is None else out
    if rows == 0:
        return []
    tables = encode_tables(n) if tables is None else tables
    x = xp.empty((rows, n))
    step = HOST_ROWS if xp is np else rows
    for r0 in range(0, rows, step):
        _coefficients(parts[r0 : r0 + step], n, tables, xp, x[r0 : r0 + step])
    xp.multiply(x, xp.asarray(host_scales), out=x)
    xp.rint(x, out=x)
    fits = (x.max(axis=1) < INT64_LIMIT) & (x.min(axis=1) > -INT64_LIMIT)  # False for a row with nan
    fits = to_host(fits)
    for p in np.flatnonzero(fits):
        out[p] = x[p]  # exact: integers below 2^62
    return rounded_rows(x, fits, out)


#: :func:`encode_rows` in CUDA: the same IEEE operations in the same order, each rounded on its own
#: (``__dmul_rn``, ``__dadd_rn``, ``__dsub_rn``: never fused into a multiply-add), so that the GPU client's encodings
#: are the host's bit for bit. Rows are blockIdx.y; re and im of the transform are separate (P, M) arrays.
#: ``encode_gather``: the FFT input (:attr:`EncodeTables.gather`); ``encode_stage``: stage t of :func:`fft_rows`
#: (Ns = ``ns``; stage 0, Ns = 1, has no twiddle); ``encode_round``: the twist, the scale, ``rint``, the int64 rows and
#: a flag per row with a coefficient of 2^62 or more (or not finite), as :func:`_coefficients` and :func:`encode_rows`.
ENCODE_SRC = r"""
extern "C" __global__ void encode_gather(const double* __restrict__ parts, const long long* __restrict__ g,
                                         double* __restrict__ yr, double* __restrict__ yi, int m) {
    const long long r = blockIdx.y;
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= m) return;
    const double* row = parts + r * 2 * m;
    yr[r * m + s] = row[g[s]];
    yi[r * m + s] = row[g[m + s]];
}

extern "C" __global__ void encode_stage(const double* __restrict__ xr, const double* __restrict__ xi,
                                        double* __restrict__ yr, double* __restrict__ yi,
                                        const double* __restrict__ wr, const double* __restrict__ wi, int m, int ns) {
    const long long row = (long long)blockIdx.y * m;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    const int half = m >> 1;
    if (j >= half) return;
    const int k = j & (ns - 1);
    const double ar = xr[row + j], ai = xi[row + j];
    double br = xr[row + j + half], bi = xi[row + j + half];
    if (ns > 1) {
        const double c = wr[k], d = wi[k];
        const double pr = __dsub_rn(__dmul_rn(br, c), __dmul_rn(bi, d));
        const double pi = __dadd_rn(__dmul_rn(br, d), __dmul_rn(bi, c));
        br = pr;
        bi = pi;
    }
    const long long o = row + 2 * (j - k) + k;
    yr[o] = __dadd_rn(ar, br);
    yi[o] = __dadd_rn(ai, bi);
    yr[o + ns] = __dsub_rn(ar, br);
    yi[o + ns] = __dsub_rn(ai, bi);
}

extern "C" __global__ void encode_round(const double* __restrict__ xr, const double* __restrict__ xi,
                                        const double* __restrict__ zr, const double* __restrict__ zi,
                                        const double* __restrict__ scales, double* __restrict__ x,
                                        long long* __restrict__ out, int* __restrict__ over, int m) {
    const long long r = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) return;
    const double a = xr[r * m + i], b = xi[r * m + i], c = zr[i], d = zi[i], s = scales[r];
    const double u = rint(__dmul_rn(__dsub_rn(__dmul_rn(a, c), __dmul_rn(b, d)), s));
    const double v = rint(__dmul_rn(__dadd_rn(__dmul_rn(a, d), __dmul_rn(b, c)), s));
    const long long at = r * 2 * m + i;
    x[at] = u;
    x[at + m] = v;
    const double limit = 4611686018427387904.0;  /* 2^62: INT64_LIMIT */
    if (u < limit && u > -limit && v < limit && v > -limit) {
        out[at] = (long long)u;
        out[at + m] = (long long)v;
    } else {
        over[r] = 1;
    }
}
"""
#: The kernels of :data:`ENCODE_SRC`.
ENCODE_KERNELS = ("encode_gather", "encode_stage", "encode_round")


def encode_float(values, n: int) -> np.ndarray:
    """Real float64 coefficients m (unit scale, no rounding) with slot_j(m) = values[j].

    ``values``: N/2 complex or real numbers, or one number broadcast to every slot.
    """
    out = np.empty((1, n))
    _coefficients(slot_parts(values, n)[None], n, encode_tables(n), np, out)
    return out[0]


def float_to_int(x: np.ndarray) -> np.ndarray:
    """Round float64 values to integers: int64 if all |x| < 2^62, else exact Python ints (object).

    The object path decomposes x = mant * 2^exp (``frexp``); mant * 2^53 is an exact int64, so the
    conversion is exact for the (already rounded) float values.
    """
    r = np.rint(np.asarray(x, dtype=np.float64))
    if not np.all(np.isfinite(r)):
        raise ArgumentError("cannot encode non-finite values")
    if r.size == 0 or np.max(np.abs(r)) < INT64_LIMIT:
        return r.astype(np.int64)
    mant, exp = np.frexp(r)
    m53 = np.ldexp(mant, 53).astype(np.int64).astype(object)
    shift = exp.astype(np.int64) - 53
    pos = np.maximum(shift, 0).astype(object)
    neg = np.maximum(-shift, 0).astype(object)
    # r is an integer, so when shift < 0 the low bits of m53 are zero and >> is exact.
    return (m53 << pos) >> neg


def encode(values, scale: float, n: int) -> np.ndarray:
    """Integer coefficients of round(scale * m) where slot_j(m) = values[j] (see module docstring).

    Returns int64 (|c| < 2^62) or an object array of Python ints, shape (N,).
    """
    if not scale > 0:
        raise ArgumentError(f"scale must be positive, got {scale}")
    return float_to_int(encode_float(values, n) * float(scale))


def coeffs_to_float(coeffs) -> np.ndarray:
    """float64 view of integer (int64 or Python-int object) or float coefficients.

    Python ints too large for float64 (|c| >= 2^1000) are scaled down by a power of two first and
    scaled back up, giving +-inf where the value exceeds the float range (a garbage decryption).
    """
    a = np.asarray(coeffs)
    if a.dtype != object:
        return a.astype(np.float64)
    big = int(np.max(np.abs(a))) if a.size else 0
    excess = big.bit_length() - 1000
    if excess <= 0:
        return a.astype(np.float64)
    with np.errstate(over="ignore"):
        return np.ldexp((a >> excess).astype(np.float64), excess)


def decode(coeffs, scale: float, n: int | None = None) -> np.ndarray:
    """The N/2 complex slots slot_j = m(zeta^(5^j)) / scale of the coefficient vector ``coeffs``."""
    c = coeffs_to_float(coeffs)
    n = c.shape[-1] if n is None else n
    _check_n(n)
    if c.shape != (n,):
        raise ArgumentError(f"expected {n} coefficients, got shape {c.shape}")
    t, zeta, _ = _tables(n)
    with np.errstate(invalid="ignore", over="ignore"):
        evals = np.fft.ifft(c * zeta) * n
    return evals[t] / float(scale)


def rotate_slots(values, k: int) -> np.ndarray:
    """The slot vector rotated LEFT by k (slot i receives slot i+k), steps modulo the slot count."""
    v = np.asarray(values)
    return np.roll(v, -(k % v.shape[-1]), axis=-1)


def apply_galois(coeffs, g: int) -> np.ndarray:
    """Coefficients of m(X^g) in Z[X]/(X^N+1) for odd g: X^i -> (-1)^(floor(g i / N) mod 2) X^(g i mod N).

    Works on int64 or object coefficient vectors (a permutation with signs, no arithmetic growth).
    """
    a = np.asarray(coeffs)
    n = a.shape[-1]
    if g % 2 == 0:
        raise ArgumentError(f"Galois element must be odd, got {g}")
    e = np.arange(n, dtype=np.int64) * (g % (2 * n)) % (2 * n)
    out = np.zeros_like(a)
    sign_flip = e >= n
    dest = np.where(sign_flip, e - n, e)
    out[..., dest] = np.where(sign_flip, -a, a)
    return out
