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

import numpy as np

#: Coin pairs of the centred binomial error: sigma = sqrt(CBD_K / 2) ~ 3.2.
CBD_K = 21


def rng_of(rng: np.random.Generator | int | None) -> np.random.Generator:
    """A Generator from a Generator, a seed or None (fresh entropy)."""
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


def uniform_residues(ctx, limbs, rng: np.random.Generator, xp=None):
    """Uniform residues, shape (len(limbs), N) uint32, row r uniform in [0, q_{limbs[r]}).

    Exactly ``rng.integers(0, q[:, None], size=(k, N), dtype=int64)`` (same values, same generator
    state afterwards), as an array of module ``xp`` (NumPy by default). For CuPy (the GPU client) and
    NumPy's PCG64 the draw is replayed on the device from raw 64-bit outputs of ``rng``
    (:func:`lemire_rows`); otherwise, or when a replay runs out of raw words, ``rng.integers`` draws it.
    """
    qs = [ctx.q(int(l)) for l in limbs]
    xp = np if xp is None else xp
    # On the host NumPy's own loop is the faster of the two; the replay serves the GPU client.
    out = None if xp is np else lemire_rows(qs, ctx.n, rng, xp)
    if out is None:
        q_arr = np.array(qs, dtype=np.int64)
        out = rng.integers(0, q_arr[:, None], size=(len(qs), ctx.n), dtype=np.int64).astype(np.uint32)
        out = xp.asarray(out)
    return out


def lemire_rows(qs, n: int, rng: np.random.Generator, xp=np):
    """Replay of NumPy's bounded integers for rows of moduli ``qs`` from a PCG64 ``rng``, or None.

    NumPy draws each value in [0, q) (q < 2^32) with Lemire's method from 32-bit words w of the
    generator (the low then the high half of each 64-bit output, one half kept in the state between
    calls): m = w * q, accepted when (m mod 2^32) >= 2^32 mod q, value m >> 32; rejected words are
    skipped. Row r takes the next N accepted words. Here: take enough raw words, compute the
    acceptance of every word for every row's q over a window that must hold the row, find each row's
    start by prefix counts, keep the accepted words in order, then put the generator where NumPy
    would have left it (replay the consumed raw words, keep the unused half). Returns None (the
    generator untouched) when the generator is not PCG64 or the window was too short.
    """
    bg = rng.bit_generator
    state = bg.state
    if state.get("bit_generator") != "PCG64" or sys.byteorder != "little" or any(q >= 2**32 for q in qs):
        return None
    k = len(qs)
    if k == 0:
        return xp.empty((0, n), dtype=np.uint32)
    # Row r starts after r*N accepted words and the rejections before it: a window around the expected start.
    expected = np.array([(2**32 % q) / 2**32 * n for q in qs])
    before = np.concatenate([[0.0], np.cumsum(expected)[:-1]])
    margin = int(8 * math.sqrt(float(expected.sum()) + 1) + 64)
    lo = np.arange(k, dtype=np.int64) * n + np.maximum(0, np.floor(before - margin)).astype(np.int64)
    width = n + int(np.ceil(expected.max())) + 2 * margin + int(np.ceil(before[-1] - np.floor(before[-1])) + 1)
    width = max(width, n + int(np.ceil(before[-1] + expected[-1])) - int(lo[-1] - (k - 1) * n) + margin)
    h0 = int(state["has_uint32"])
    raw_count = (int(lo[-1]) + width - h0 + 1) // 2
    words = bg.random_raw(raw_count).view(np.uint32)  # low half, then high half of each output
    if h0:
        words = np.concatenate([np.array([state["uinteger"]], dtype=np.uint32), words])
    stream = xp.asarray(words)
    q_all = np.array(qs, dtype=np.uint64)[:, None]
    thr_all = np.array([2**32 % q for q in qs], dtype=np.uint64)[:, None]
    out = xp.empty((k, n), dtype=np.uint32)
    span = xp.arange(width, dtype=np.int64)[None, :]
    pos = 0  # stream position of the next word
    step = k if xp is not np else max(1, (1 << 18) // width)
    for r0 in range(0, k, step):
        r1 = min(k, r0 + step)
        m = stream[xp.asarray(lo[r0:r1])[:, None] + span].astype(np.uint64)
        m *= xp.asarray(q_all[r0:r1])
        accept = (m & np.uint64(0xFFFFFFFF)) >= xp.asarray(thr_all[r0:r1])
        counts = xp.cumsum(accept, axis=1, dtype=np.int32)
        host = counts.get() if xp is not np else counts
        starts = np.empty((r1 - r0, 1), dtype=np.int64)
        limits = np.empty((r1 - r0, 1), dtype=np.int64)
        for r in range(r0, r1):
            off = pos - int(lo[r])
            base = int(host[r - r0, off - 1]) if 0 < off <= width else 0
            if not 0 <= off < width or int(host[r - r0, -1]) < base + n:
                bg.state = state
                return None
            last = int(np.searchsorted(host[r - r0], base + n, side="left"))
            starts[r - r0], limits[r - r0] = off, base + n
            pos = int(lo[r]) + last + 1
        keep = accept & (span >= xp.asarray(starts)) & (counts <= xp.asarray(limits))
        m >>= np.uint64(32)
        out[r0:r1] = m[keep].astype(np.uint32).reshape(r1 - r0, n)
    # Leave the generator as NumPy would: pos words consumed (the first being the kept half, if any).
    used = pos - h0
    bg.state = state
    bg.random_raw((used + 1) // 2)
    after = bg.state
    if used % 2:
        after["has_uint32"], after["uinteger"] = 1, int(words[h0 + used])
    else:  # NumPy keeps the last half it handed out in the (now unused) buffer
        after["has_uint32"], after["uinteger"] = 0, int(words[h0 + used - 1]) if used else state["uinteger"]
    bg.state = after
    return out


def dense_ternary(n: int, rng: np.random.Generator) -> np.ndarray:
    """N coefficients uniform in {-1, 0, 1} (int64)."""
    return rng.integers(-1, 2, size=n, dtype=np.int64)


def sparse_ternary(n: int, h: int, rng: np.random.Generator) -> np.ndarray:
    """N coefficients with exactly h non-zeros, each +-1 (int64)."""
    if not 0 <= h <= n:
        raise ValueError(f"Hamming weight must be in [0, {n}], got {h}")
    out = np.zeros(n, dtype=np.int64)
    pos = rng.choice(n, size=h, replace=False)
    out[pos] = rng.integers(0, 2, size=h, dtype=np.int64) * 2 - 1
    return out


def cbd(n: int, rng: np.random.Generator, k: int = CBD_K) -> np.ndarray:
    """N centred-binomial coefficients Bin(k,1/2) - Bin(k,1/2) (int64), in [-k, k]."""
    return rng.binomial(k, 0.5, size=n).astype(np.int64) - rng.binomial(k, 0.5, size=n).astype(np.int64)
