"""SEAL-style CKKS encoding of slot vectors into integer polynomial coefficients.

A message polynomial m(X) in Z[X]/(X^N + 1) has N/2 complex *slots*. With
zeta = exp(i*pi/N) (a primitive 2N-th root of unity) and the generator 5 (ISA.md section 3):

    slot_j(m) = m(zeta^(e_j)) / scale,      e_j = 5^j mod 2N,   j = 0 .. N/2-1

and the remaining N/2 evaluation points zeta^(-e_j) carry the conjugates (m is real). The odd
exponents k = 2t+1 (t = 0..N-1) are exactly {e_j} U {2N - e_j}, so one length-N FFT evaluates m at
all of them:

    m(zeta^(2t+1)) = sum_i (m_i zeta^i) * exp(2 pi i t i / N) = N * ifft(m * zeta^i)[t],

slot j sits at t_j = (e_j - 1)/2 and its conjugate at N - 1 - t_j. Encoding is the exact inverse
(``fft``), followed by rounding ``round(scale * m_i)`` to integers (round-half-even, deterministic;
SEAL's encoder also rounds to nearest).

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

import threading
from functools import lru_cache

import numpy as np
from caramel.errors import ArgumentError

#: Coefficients below this magnitude are returned as int64 by :func:`encode`.
INT64_LIMIT = 2**62


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
    """(t_j slot positions in the FFT, zeta^i, zeta^-i) for ring dimension n."""
    t = (slot_exponents(n) - 1) // 2
    zeta = np.exp(1j * np.pi * np.arange(n) / n)
    for a in (t, zeta):
        a.setflags(write=False)
    izeta = np.conj(zeta)
    izeta.setflags(write=False)
    return t, zeta, izeta


@lru_cache(maxsize=32)
def _scaled_izeta(n: int) -> np.ndarray:
    """zeta^-i / n (read-only), exact: n is a power of two."""
    out = _tables(n)[2] / n
    out.setflags(write=False)
    return out


@lru_cache(maxsize=32)
def _fft_gather(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(g, sign), (2N,) each, read-only: the FFT input of :func:`encode_float` viewed as 2N float64
    (real and imaginary part of each position) is ``row[g] * sign`` for the row [re | im] of the N/2
    slots' real and imaginary parts: position t_j holds re_j + i im_j, position N-1-t_j its
    conjugate re_j - i im_j (the sign -1.0 negates exactly, as ``conj`` does, zeros included)."""
    t = _tables(n)[0]
    half = n // 2
    j = np.arange(half, dtype=np.int64)
    g = np.empty(2 * n, dtype=np.int64)
    sign = np.ones(2 * n, dtype=np.float64)
    g[2 * t], g[2 * t + 1] = j, half + j
    g[2 * (n - 1 - t)], g[2 * (n - 1 - t) + 1] = j, half + j
    sign[2 * (n - 1 - t) + 1] = -1.0
    for a in (g, sign):
        a.setflags(write=False)
    return g, sign


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


_scratch = threading.local()


def scratch(name: str, rows: int, n: int, dtype) -> np.ndarray:
    """This thread's (rows, n) array ``name`` of ``dtype`` (contents undefined): a view of one buffer per name, ring
    degree and type, kept for the thread's next call and grown to the most rows asked (threads that encode at once
    would otherwise spend their time in the kernel, faulting in fresh pages of megabyte-sized temporaries under one
    address-space lock)."""
    buffers = getattr(_scratch, "buffers", None)
    if buffers is None:
        buffers = _scratch.buffers = {}
    key = (name, n, np.dtype(dtype))
    a = buffers.get(key)
    if a is None or a.shape[0] < rows:
        a = buffers[key] = np.empty((rows, n), dtype=dtype)
    return a[:rows]


def encode_rows(parts, scales, n: int, out: np.ndarray | None = None) -> list[np.ndarray]:
    """:func:`encode` of several vectors in one pass of each step: row p of ``parts`` (P, N) float64
    is [re | im] of vector p (:func:`slot_parts`; a real vector has im = 0), encoded at ``scales[p]``.
    Returns per row encode(re + 1j * im, scales[p], n), bit for bit: the same FFT input (gathered,
    not scattered), NumPy's FFT of each row (its batched call transforms row by row), the same
    element-wise operations (each into this thread's :func:`scratch` arrays: the same loops, so the
    same bits) and the same rounding. An int64 row is written into ``out[p]`` (default a new (P, N)
    int64 array) and returned as that view; a row with a coefficient of 2^62 or more is an object
    array of Python ints (:func:`float_to_int`)."""
    _check_n(n)
    parts = np.asarray(parts, dtype=np.float64)
    rows = parts.shape[0] if parts.ndim == 2 else 0
    if parts.shape != (rows, n):
        raise ArgumentError(f"expected rows of {n} slot parts for N = {n}, got shape {parts.shape}")
    scales = np.asarray(scales, dtype=np.float64).reshape(rows, 1)
    if not np.all(scales > 0):
        raise ArgumentError(f"scale must be positive, got {scales.ravel().tolist()}")
    out = np.empty((rows, n), dtype=np.int64) if out is None else out
    if rows == 0:
        return []
    g, sign = _fft_gather(n)
    full, spectrum = (scratch(name, rows, n, np.complex128) for name in ("full", "spectrum"))
    x = scratch("x", rows, n, np.float64)
    view = full.view(np.float64)
    np.take(parts, g, axis=1, out=view, mode="clip")  # g is in range: 'clip' only spares 'raise''s buffered copy
    np.multiply(view, sign, out=view)
    # encode_float's expression step by step, then encode's scaling: (fft(full) / n * zeta^-i).real * scale, with
    # the division folded into the table (zeta^-i / n): n is a power of two, so both products are the one exact
    # product rounded once
    np.fft.fft(full, axis=-1, out=spectrum)
    np.multiply(spectrum, _scaled_izeta(n), out=spectrum)
    np.multiply(spectrum.real, scales, out=x)
    np.rint(x, out=x)
    fits = (x.max(axis=1) < INT64_LIMIT) & (x.min(axis=1) > -INT64_LIMIT)  # False for a row with nan
    if fits.all():
        np.copyto(out, x, casting="unsafe")  # exact: integers below 2^62
        return list(out)
    return [out[p] if fits[p] and np.copyto(out[p], x[p], casting="unsafe") is None else float_to_int(x[p])
            for p in range(rows)]  # float_to_int: Python ints, or the error of a non-finite value


def encode_float(values, n: int) -> np.ndarray:
    """Real float64 coefficients m (unit scale, no rounding) with slot_j(m) = values[j].

    ``values``: N/2 complex or real numbers, or one number broadcast to every slot.
    """
    _check_n(n)
    t, _, izeta = _tables(n)
    z = np.asarray(values, dtype=np.complex128)
    if z.ndim == 0:
        z = np.full(n // 2, z)
    if z.shape != (n // 2,):
        raise ArgumentError(f"expected {n // 2} slot values for N = {n}, got shape {z.shape}")
    full = np.zeros(n, dtype=np.complex128)
    full[t] = z
    full[n - 1 - t] = np.conj(z)
    return (np.fft.fft(full) / n * izeta).real


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
