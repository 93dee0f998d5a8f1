"""The host client's kernels compiled with Numba (optional: ``pip install -e '.[fast]'`` in the clone).

The same transforms as :func:`caramel.ring.ntt.ntt` / :func:`~caramel.ring.ntt.intt`, one row at a
time in compiled loops instead of whole-stage NumPy operations (which make about ten passes over
memory per stage); the c0 of an RLWE sample with its error's NTT (:func:`c0_row`); the residues of
an encoding's integer coefficients and their NTT (:func:`encode_row`); NumPy's bounded draws
replayed (:func:`lemire_fill`). All are exact integer arithmetic with fully reduced outputs, so the
results are the same bits as the NumPy code (tests/ckks/arith/test_jit.py compares them on random
data). :class:`caramel.ckks.arith.host.HostArith` uses them when :func:`ready`.

Forward (Cooley-Tukey, SEAL order): for stage m = 1, 2, 4, ..., N/2 with t = N/2m, group i < m,
twiddle W = psi^br(m+i), and j in [2it, 2it + t):

    u = a_j reduced to [0, 2q),  v = a_{j+t} W mod q in [0, 2q) (Shoup: v = a W - floor(a W' / 2^32) q),
    a_j = u + v,  a_{j+t} = u - v + 2q                       (values stay in [0, 4q) < 2^32)

then a_j is reduced to [0, q). Inverse (Gentleman-Sande): for h = N/2, ..., 1 with t = N/2h, group
i < h, W = psi^-br(h+i):

    a_j = (u + v) reduced to [0, 2q),  a_{j+t} = (u - v + 2q) W mod q in [0, 2q)

then a_j = a_j N^-1 mod q (Shoup) reduced to [0, q). W' = floor(W 2^32 / q).

Numba compiles the kernels once per process (a few seconds of CPU; the time is logged at debug
level): in a background thread started by the first transform of a ring of N >= 16384 (:func:`ready`),
the NumPy path serving until they are ready (so small rings never wait), or at once on
:func:`enabled`. Its on-disk cache is NOT used: loading a cached kernel unpickles a file, and caramel
executes nothing it reads from disk. ``CARAMEL_NUMBA=0`` turns the compiled path off (NumPy only).
The kernels release the GIL, so the client's thread pool runs rows in parallel.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

import numpy as np

from caramel.ring.modular import shoup

#: Environment variable: "0" (or "false", "no", "off") disables the compiled NTT.
ENV = "CARAMEL_NUMBA"

_log = logging.getLogger("caramel")
_lock = threading.Lock()
_state: dict = {}
_PENDING = object()
#: Smallest ring degree whose transforms start the background compilation (:func:`ready`).
MIN_N = 1 << 14
_NO_PERM = np.empty(0, dtype=np.int64)


def _after_fork() -> None:
    """A forked child has no compile thread: a fresh lock, and a compilation that was under way
    starts again on demand."""
    global _lock
    _lock = threading.Lock()
    if "kernels" not in _state:
        _state.pop("thread", None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def disabled() -> bool:
    """True when ``CARAMEL_NUMBA`` turns the compiled kernels off."""
    return os.environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off")


def enabled() -> bool:
    """True when the compiled kernels are used: Numba imports and ``CARAMEL_NUMBA`` does not say no
    (compiles them now, in the calling thread, if no one has)."""
    return not disabled() and _kernels() is not None


def ready(n: int) -> bool:
    """True when the compiled kernels are compiled and may be used now (for ring degree ``n``). The
    first ask with n >= :data:`MIN_N` starts their compilation in a background thread and answers
    False: the NumPy path (the same bits) serves until they are ready, so that small rings, where
    the compile would cost more than it saves, never wait for it."""
    if disabled():
        return False
    got = _state.get("kernels", _PENDING)
    if got is not _PENDING:
        return got is not None
    if n >= MIN_N:
        with _lock:
            if "thread" not in _state:
                _state["thread"] = threading.Thread(target=_kernels, name="caramel-numba", daemon=True)
                _state["thread"].start()
    return False


def _compile():
    import numba
    from numba import njit

    u32, u64 = numba.uint32, numba.uint64
    s32 = u64(32)
    ro32 = numba.types.Array(numba.uint32, 1, "C", readonly=True)
    ro64 = numba.types.Array(numba.int64, 1, "C", readonly=True)
    rows32 = numba.uint32[:, ::1]
    opts = dict(nogil=True, cache=False)

    @njit(inline="always", **opts)
    def shoup(y, w, wp, q):  # pragma: no cover - compiled; y w mod q in [0, 2q): y w - floor(y wp / 2^32) q
        return u32(u32(y * w) - u32(u32((u64(y) * wp) >> s32) * q))

    # Butterflies on two disjoint runs lo, hi (slices: no aliasing, no negative indices, so LLVM
    # vectorises); 32-bit arithmetic wraps modulo 2^32, which is exact since every result < 2^32.
    # Cooley-Tukey: (u, y) -> (u + y w, u - y w); Gentleman-Sande: (u, v) -> (u + v, (u - v) w).
    @njit(inline="always", **opts)
    def ct(lo, hi, k, w, wp, q, tq):  # pragma: no cover - compiled
        u = lo[k]
        u = u32(min(u, u32(u - tq)))
        v = shoup(hi[k], w, wp, q)
        lo[k] = u32(u + v)
        hi[k] = u32(u32(u + tq) - v)

    @njit(inline="always", **opts)
    def gs(lo, hi, k, w, wp, q, tq):  # pragma: no cover - compiled
        u = lo[k]
        v = hi[k]
        s = u32(u + v)
        lo[k] = u32(min(s, u32(s - tq)))
        hi[k] = shoup(u32(u32(u + tq) - v), w, wp, q)

    @njit(**opts)
    def ct_one(lo, hi, w, wp, q, tq):  # pragma: no cover - compiled; one twiddle for the run
        for k in range(lo.shape[0]):
            ct(lo, hi, k, w, wp, q, tq)

    @njit(**opts)
    def ct_many(lo, hi, w, wp, q, tq):  # pragma: no cover - compiled; twiddle k for element k
        for k in range(lo.shape[0]):
            ct(lo, hi, k, w[k], u64(wp[k]), q, tq)

    @njit(**opts)
    def gs_one(lo, hi, w, wp, q, tq):  # pragma: no cover - compiled
        for k in range(lo.shape[0]):
            gs(lo, hi, k, w, wp, q, tq)

    @njit(**opts)
    def gs_many(lo, hi, w, wp, q, tq):  # pragma: no cover - compiled
        for k in range(lo.shape[0]):
            gs(lo, hi, k, w[k], u64(wp[k]), q, tq)

    @njit(**opts)
    def forward_row(x, w, wp, q, tq):  # pragma: no cover - compiled; x (N,) in place
        n = x.shape[0]
        m = 1
        t = n >> 1
        while m < n:
            if t >= 8:  # long runs of one twiddle
                for i in range(m):
                    j1 = 2 * i * t
                    ct_one(x[j1 : j1 + t], x[j1 + t : j1 + 2 * t], w[m + i], u64(wp[m + i]), q, tq)
            else:  # short runs: strided over the groups, twiddle i for group i
                for k in range(t):
                    ct_many(x[k::2 * t], x[k + t :: 2 * t], w[m : 2 * m], wp[m : 2 * m], q, tq)
            m <<= 1
            t >>= 1
        for j in range(n):
            u = x[j]
            u = u32(min(u, u32(u - tq)))
            x[j] = u32(min(u, u32(u - q)))

    @njit(numba.void(rows32, ro32, ro32, u64), **opts)
    def forward(a, w, wp, q64):  # pragma: no cover - compiled
        q = u32(q64)
        for r in range(a.shape[0]):
            forward_row(a[r], w, wp, q, u32(q + q))

    i64 = numba.int64

    @njit(**opts)
    def mulmod(x, y, q, qinv):  # pragma: no cover - compiled; x y mod q for x, y < 2^31, q < 2^30 (int64)
        prod = i64(x) * i64(y)  # < 2^62
        r = prod - i64(numba.float64(prod) * qinv) * q  # quotient estimate one off at most
        if r < 0:
            r += q
        if r >= q:
            r -= q
        return r

    @njit(numba.void(ro64, ro32, ro32, ro32, u64, ro32, ro32, u64, numba.uint32[::1], ro64), **opts)
    def c0_row(e, a, s, extra, factor, w, wp, q64, out, perm):  # pragma: no cover - compiled
        n = out.shape[0]
        q = u32(q64)
        qq = i64(q64)
        f = i64(factor)
        qinv = 1.0 / numba.float64(qq)
        for j in range(n):
            out[j] = u32(e[j] + qq) if e[j] < 0 else u32(e[j])
        forward_row(out, w, wp, q, u32(q + q))
        for j in range(n):
            v = i64(out[j]) + qq - mulmod(a[j], s[j], qq, qinv)  # in (0, 2q)
            if f != 0:
                x = extra[perm[j]] if perm.shape[0] else extra[j]
                v += mulmod(x, f, qq, qinv)  # in (0, 3q)
            if v >= qq:
                v -= qq
            if v >= qq:
                v -= qq
            out[j] = u32(v)

    @njit(numba.void(rows32, ro32, ro32, u64, u64, u64), **opts)
    def inverse(a, w, wp, q64, ninv64, ninvp64):  # pragma: no cover - compiled
        n = a.shape[1]
        q = u32(q64)
        tq = u32(q + q)
        ninv = u32(ninv64)
        ninvp = u64(ninvp64)
        for r in range(a.shape[0]):
            x = a[r]
            t = 1
            h = n >> 1
            while h >= 1:
                if t >= 8:
                    for i in range(h):
                        j1 = 2 * i * t
                        gs_one(x[j1 : j1 + t], x[j1 + t : j1 + 2 * t], w[h + i], u64(wp[h + i]), q, tq)
                else:
                    for k in range(t):
                        gs_many(x[k::2 * t], x[k + t :: 2 * t], w[h : 2 * h], wp[h : 2 * h], q, tq)
                t <<= 1
                h >>= 1
            for j in range(n):
                u = x[j]
                u = u32(u32(u * ninv) - u32(u32((u64(u) * ninvp) >> s32) * q))
                x[j] = u32(min(u, u32(u - q)))

    @njit(numba.int64(ro32, numba.uint64[::1], numba.uint64[::1], rows32), **opts)
    def lemire(words, qs, thr, out):  # pragma: no cover - compiled
        pos = 0
        count = words.shape[0]
        low = u64(0xFFFFFFFF)
        for r in range(out.shape[0]):
            q = qs[r]
            th = thr[r]
            row = out[r]
            for i in range(row.shape[0]):
                while True:
                    if pos >= count:
                        return -1
                    m = u64(words[pos]) * q
                    pos += 1
                    if (m & low) >= th:
                        row[i] = u32(m >> s32)
                        break
        return pos

    @njit(numba.void(ro64, ro32, ro32, u64, numba.uint32[::1]), **opts)
    def encode_row(c, w, wp, q64, out):  # pragma: no cover - compiled
        qq = i64(q64)
        qinv = 1.0 / numba.float64(qq)
        for j in range(out.shape[0]):  # selects, no branches: the loop vectorises
            x = c[j]
            r = x - i64(numba.float64(x) * qinv) * qq  # in (-2q, 2q); wraps modulo 2^64: exact, as r is small
            r = r + qq if r < 0 else r
            r = r + qq if r < 0 else r
            r = r - qq if r >= qq else r
            out[j] = u32(r)
        forward_row(out, w, wp, u32(q64), u32(q64 + q64))

    return forward, inverse, lemire, c0_row, encode_row


def _kernels():
    """The compiled kernels (forward, inverse, lemire, c0_row, encode_row), or None without Numba (compiled once
    per process, under a lock: a caller waits for a compilation under way)."""
    if "kernels" not in _state:
        with _lock:
            if "kernels" not in _state:
                try:
                    t = time.perf_counter()
                    _state["kernels"] = _compile()
                    _log.debug("compiled the client's NTT with Numba in %.2f s", time.perf_counter() - t)
                except ImportError:
                    _state["kernels"] = None
    return _state["kernels"]


def _ro(x: np.ndarray, dtype) -> np.ndarray:
    """``x`` as a C-contiguous read-only array of ``dtype`` (a view when it already is one)."""
    x = np.ascontiguousarray(x, dtype=dtype)
    if x.flags.writeable:
        x = x.view()
        x.flags.writeable = False
    return x


def shoup_table(w: np.ndarray, q: int) -> np.ndarray:
    """floor(w * 2^32 / q) as uint32 (read-only), the Shoup companions of twiddles w < q."""
    out = shoup(w, q).astype(np.uint32)
    out.flags.writeable = False
    return out


_shoup: "weakref.WeakKeyDictionary[object, tuple[np.ndarray, np.ndarray]]" = weakref.WeakKeyDictionary()


def shoup_tables(table) -> tuple[np.ndarray, np.ndarray]:
    """The Shoup companions of ``table.psi_powers`` and ``table.psi_inv_powers`` (natural order) of an
    :class:`~caramel.ring.NttTable`, computed once per table (two threads may both compute them: the
    same values)."""
    got = _shoup.get(table)
    if got is None:
        got = _shoup[table] = (shoup_table(table.psi_powers, table.q), shoup_table(table.psi_inv_powers, table.q))
    return got


def forward_rows(src: np.ndarray, dst: np.ndarray, table) -> None:
    """dst = NTT(src) row by row modulo ``table.q`` (src, dst (c, N) uint32; dst C-contiguous)."""
    fwd = _kernels()[0]
    dst[...] = src
    fwd(dst, table.psi_powers, shoup_tables(table)[0], np.uint64(table.q))


def inverse_rows(src: np.ndarray, dst: np.ndarray, table) -> None:
    """dst = INTT(src) row by row modulo ``table.q``."""
    inv = _kernels()[1]
    dst[...] = src
    inv(dst, table.psi_inv_powers, shoup_tables(table)[1], np.uint64(table.q), np.uint64(table.n_inv),
        np.uint64(table.n_inv_shoup))


def c0_row(e: np.ndarray, a: np.ndarray, s: np.ndarray, extra: np.ndarray, factor: int, table, out: np.ndarray,
           perm: np.ndarray | None = None) -> None:
    """out = NTT(e mod q) - a s + factor * extra (mod q) for one limb of prime ``table.q``: the c0 of an
    evaluation key (extra = s_new, factor = P mod q) or of an encryption (extra = m, factor = 1);
    with ``perm`` (int64, non-empty), extra[perm] stands for extra (an automorphism's gather);
    e (N,) small int64, a, s, extra (N,) uint32 residues, out (N,) uint32 C-contiguous.
    (x y mod q: quotient estimated in float64, then corrected by one q: exact.)"""
    w, wp = table.psi_powers, shoup_tables(table)[0]
    e, perm = _ro(e, np.int64), _ro(_NO_PERM if perm is None else perm, np.int64)
    a, s, extra = (_ro(x, np.uint32) for x in (a, s, extra))
    _kernels()[3](e, a, s, extra, np.uint64(factor), w, wp, np.uint64(table.q), out, perm)


def encode_row(c: np.ndarray, table, out: np.ndarray) -> None:
    """out = NTT(c mod q) modulo ``table.q``: c (N,) int64 coefficients, out (N,) uint32 C-contiguous.
    (c mod q: the quotient c / q estimated in float64 and truncated, off by one at most besides the
    truncation, so the remainder r = c - quotient q lies in (-2q, 2q) and two additions and one
    subtraction of q put it in [0, q): exact for every int64 and q < 2^31.)"""
    _kernels()[4](_ro(c, np.int64), table.psi_powers, shoup_tables(table)[0], np.uint64(table.q), out)


def lemire_fill(words: np.ndarray, qs: np.ndarray, thresholds: np.ndarray, out: np.ndarray) -> int:
    """NumPy's bounded 32-bit draws replayed from ``words`` (32-bit halves of the generator's outputs,
    in order): row r of ``out`` takes the next N words w with (w q_r mod 2^32) >= thresholds[r]
    (= 2^32 mod q_r), as floor(w q_r / 2^32). Returns how many words were used, or -1 when ``words``
    ran out (:func:`caramel.ckks.sampling.lemire_host`)."""
    words = _ro(words, np.uint32)
    return int(_kernels()[2](words, qs, thresholds, out))


__all__ = ["ENV", "MIN_N", "c0_row", "enabled", "encode_row", "forward_rows", "inverse_rows", "lemire_fill", "ready",
           "shoup_table", "shoup_tables"]
