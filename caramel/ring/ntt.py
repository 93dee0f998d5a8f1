"""The negacyclic number-theoretic transform of one limb (ISA section 3), batched over limbs.

For a prime q = 1 mod 2N, psi is the smallest integer in [2, q) with psi^N = -1 mod q (a primitive 2N-th
root of unity). The forward transform maps coefficients a_0..a_{N-1} to

    A[j] = sum_i a_i * psi^((2*br(j) + 1) * i) mod q,        br = bit reversal on log2(N) bits,

that is the evaluations of a(X) at the odd powers of psi, in bit-reversed order; the inverse transform
is its exact inverse (it includes N^-1). Both outputs are fully reduced.

The kernels are the iterative Cooley-Tukey (forward) and Gentleman-Sande (inverse) butterflies of SEAL
and Longa-Naehrig, vectorised over whole stages, with Shoup products and Harvey's lazy reduction:
forward values stay in [0, 4q), inverse values in [0, 2q), and the last step reduces to [0, q).
Stages whose butterflies span fewer than R points run on a transposed (R, N/R) view so that every
NumPy operation has a long contiguous inner loop; twiddles for those stages are stored in that layout.

Array modules. The kernels are written against an array module ``xp``: NumPy arrays run them on the
host (chunks of rows that fit a core's L2 cache, spread over a small thread pool, see
:func:`client_threads`), CuPy arrays run the same operations on the GPU (large chunks of rows, the
tables copied to the device once). Results are bit-identical: every step is exact integer arithmetic.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from caramel.ring import ntt_jit
from caramel.ring.modular import inv_mod
from caramel.errors import ArgumentError

_U64 = np.uint64
_SHIFT32 = np.uint64(32)
# Rows of a batched transform are processed in chunks of about this many residues, which keeps the
# working set (data and two scratch buffers) inside a core's L2 cache.
_CHUNK_RESIDUES = 1 << 16
# On a GPU, rows are processed in chunks of about this many residues (eight bytes each, three buffers).
_GPU_CHUNK_RESIDUES = 1 << 24
#: Environment variable: worker threads of the host kernels (default: the machine's CPU count, at most 8).
THREADS_ENV = "CARAMEL_CLIENT_THREADS"

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def client_threads() -> int:
    """client_threads returns the number of host threads for batched transforms (``CARAMEL_CLIENT_THREADS``)."""
    raw = os.environ.get(THREADS_ENV, "")
    try:
        return max(1, int(raw)) if raw.strip() else max(1, min(8, os.cpu_count() or 1))
    except ValueError:
        return 1


def _thread_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers != client_threads():
            _pool = ThreadPoolExecutor(max_workers=client_threads(), thread_name_prefix="caramel-ntt")
        return _pool


def _forget_pool() -> None:  # a forked child has no pool threads: start a fresh pool there
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def map_chunks(fn, total: int, chunk: int) -> None:
    """map_chunks calls fn(c0, c1) for consecutive slices [c0, c1) of range(total) of length ``chunk``,
    on the host thread pool when there are several slices and threads (fn must write disjoint outputs)."""
    spans = [(c0, min(c0 + chunk, total)) for c0 in range(0, total, max(1, chunk))]
    if len(spans) > 1 and client_threads() > 1 and not threading.current_thread().name.startswith("caramel-ntt"):
        for f in [_thread_pool().submit(fn, c0, c1) for c0, c1 in spans]:
            f.result()
    else:
        for c0, c1 in spans:
            fn(c0, c1)


def array_module(a):
    """array_module returns the array module of ``a``: CuPy for CuPy arrays, else NumPy (no CuPy import)."""
    if type(a).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


@functools.lru_cache(maxsize=8)
def bit_reverse(n: int) -> np.ndarray:
    """bit_reverse returns br as an index array: br[i] = i with its log2(n) bits reversed (n a power of 2).
    Cached per n (every prime's table of a ring uses it) and read-only."""
    log_n = n.bit_length() - 1
    idx = np.arange(n, dtype=np.int64)
    rev = np.zeros(n, dtype=np.int64)
    for b in range(log_n):
        rev |= ((idx >> b) & 1) << (log_n - 1 - b)
    rev.flags.writeable = False
    return rev


def primitive_root_2n(q: int, n: int) -> int:
    """primitive_root_2n returns psi, the smallest integer in [2, q) with psi^n = -1 mod q.

    Such psi has order exactly 2n (n a power of two), i.e. it is a primitive 2n-th root of unity. The
    primitive 2n-th roots are r^j for odd j, r any one of them (r = x^((q-1)/2n) for a non-residue x);
    psi is the least of these n values. Raises ValueError when q != 1 mod 2n or q is not prime.
    """
    return _root_and_powers(q, n)[0]


def _root_and_powers(q: int, n: int) -> tuple[int, int, np.ndarray]:
    """(psi, k, r_pow): psi of :func:`primitive_root_2n`, r_pow = [r^0, ..., r^(2n-1)] mod q (uint64)
    for the primitive 2n-th root r it was found from, and k odd with psi = r^k, so that
    psi^i = r_pow[k i mod 2n] and psi^-i = r_pow[-k i mod 2n]."""
    if n < 1 or (q - 1) % (2 * n):
        raise ArgumentError(f"{q} is not 1 mod 2N = {2 * n}: no primitive 2N-th root of unity")
    for x in range(2, min(q, 1000)):
        r = pow(x, (q - 1) // (2 * n), q)
        if pow(r, n, q) == q - 1:
            break
    else:
        raise ArgumentError(f"no primitive {2 * n}-th root of unity modulo {q} (is it prime?)")
    r_pow = _powers(r, 2 * n, q)
    odd_powers = r_pow[1::2]
    if np.any(odd_powers == 0):
        raise ArgumentError(f"{q} is not prime")
    j = int(odd_powers.argmin())
    return int(odd_powers[j]), 2 * j + 1, r_pow


def _powers(base: int, n: int, q: int) -> np.ndarray:
    """_powers returns [base^0, base^1, ..., base^(n-1)] mod q (uint64), by doubling."""
    out = np.ones(n, dtype=_U64)
    if n > 1:
        out[1] = base % q
    size = 2
    while size < n:
        step = np.uint64(pow(base, size, q))
        out[size : 2 * size] = out[:size] * step % np.uint64(q)
        size *= 2
    return out


def _split(log_n: int) -> int:
    """_split returns R: stages whose butterfly blocks span at most R points use the transposed layout."""
    return 1 << ((log_n + 1) // 2)


def _kernel_layout(w: np.ndarray, n: int, r: int) -> np.ndarray:
    """_kernel_layout reorders twiddles w (index m + i for stage m, group i) for the kernels.

    Entries [0, n/r) stay put (stages with butterfly distance t >= r). For each later stage m (t = n/2m)
    the slice w[m:2m], indexed by group i = blk * (r/2t) + s, is stored transposed as [s, blk].
    """
    out = w.copy()
    nblk = n // r
    m = nblk
    while m < n:
        t = n // (2 * m)
        out[m : 2 * m] = w[m : 2 * m].reshape(nblk, r // (2 * t)).T.reshape(-1)
        m *= 2
    return out


class NttTable:
    """NttTable holds the constants of the negacyclic NTT for one prime q and ring degree n.

    Attributes: ``q``, ``n``, ``psi`` (see primitive_root_2n), ``psi_inv`` = psi^-1 mod q,
    ``n_inv`` = n^-1 mod q, ``psi_powers[k]`` = psi^br(k) and ``psi_inv_powers[k]`` = psi^-br(k) mod q
    (bit-reversed powers, the twiddles of stage m, group i being entry m + i), both gathered from the
    powers of the root psi was found from (:func:`_root_and_powers`). The host kernels' tables
    (kernel layout, Shoup quotients) are built on their first use, so a GPU client, which reads only
    the powers, never builds them.
    """

    def __init__(self, q: int, n: int):
        q, n = int(q), int(n)
        if n < 2 or n & (n - 1):
            raise ArgumentError(f"N = {n} is not a power of two >= 2")
        if not 2 < q < 1 << 30:
            raise ArgumentError(f"modulus {q} is outside (2, 2^30)")
        self.q = q
        self.n = n
        self.log_n = n.bit_length() - 1
        self.psi, k, r_pow = _root_and_powers(q, n)
        self.psi_inv = inv_mod(self.psi, q)
        self.n_inv = inv_mod(n, q)
        kbr = bit_reverse(n) * k  # psi^br(j) = r^(k br(j) mod 2n); psi^-br(j) = r^(-k br(j) mod 2n)
        self.psi_powers = r_pow[kbr & (2 * n - 1)].astype(np.uint32)
        self.psi_inv_powers = r_pow[-kbr & (2 * n - 1)].astype(np.uint32)
        self._r = _split(self.log_n)
        self._n_inv_shoup = (self.n_inv << 32) // q
        for arr in (self.psi_powers, self.psi_inv_powers):
            arr.flags.writeable = False  # tables are shared through the Context cache

    def _kernel_table(self, name: str) -> np.ndarray:
        """A host kernel table, built once: ``_fw``/``_iw`` the forward/inverse twiddles in kernel
        layout, ``_fwp``/``_iwp`` their Shoup quotients floor(w * 2^32 / q), all uint32, read-only."""
        got = self.__dict__.get(name)
        if got is None:
            w = _kernel_layout((self.psi_powers if name[1] == "f" else self.psi_inv_powers).astype(_U64), self.n, self._r)
            if name.endswith("p"):
                w = (w << _SHIFT32) // np.uint64(self.q)
            got = w.astype(np.uint32)
            got.flags.writeable = False  # tables are shared through the Context cache
            self.__dict__[name] = got
        return got

    _fw = property(lambda self: self._kernel_table("_fw"))
    _fwp = property(lambda self: self._kernel_table("_fwp"))
    _iw = property(lambda self: self._kernel_table("_iw"))
    _iwp = property(lambda self: self._kernel_table("_iwp"))

    def __repr__(self) -> str:
        return f"NttTable(q={self.q}, n={self.n}, psi={self.psi})"

    def jit_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Shoup companions of ``psi_powers`` and ``psi_inv_powers`` (natural order), for the compiled
        host kernels (:mod:`caramel.ring.ntt_jit`); computed once."""
        got = self.__dict__.get("_jit")
        if got is None:
            from caramel.ring.ntt_jit import shoup_table

            got = self.__dict__["_jit"] = (shoup_table(self.psi_powers, self.q), shoup_table(self.psi_inv_powers, self.q))
        return got

    def device_array(self, name: str, xp):
        """device_array returns the kernel table ``name`` (e.g. ``"_fw"``) as uint64 on the device of
        array module ``xp`` (CuPy), copied once per table, name and device."""
        cache = self.__dict__.setdefault("_device", {})
        key = (name, int(xp.cuda.Device().id))
        arr = cache.get(key)
        if arr is None:
            arr = cache[key] = xp.asarray(getattr(self, name).astype(_U64))
        return arr

    def forward(self, a) -> np.ndarray:
        """forward returns NTT_q(a) along the last axis (any leading shape), uint32."""
        return ntt(a, self)

    def inverse(self, a) -> np.ndarray:
        """inverse returns INTT_q(a) along the last axis (any leading shape), uint32."""
        return intt(a, self)


def ntt(a, tables: NttTable | Sequence[NttTable]) -> np.ndarray:
    """ntt returns A[j] = sum_i a_i psi^((2 br(j)+1) i) mod q along the last axis, as uint32.

    ``tables`` is one NttTable (applied to every row of a, any leading shape) or a sequence of k tables
    for a of shape (k, N) (row r modulo tables[r].q). Input residues must be canonical.
    """
    return _transform(a, tables, forward=True)


def intt(a, tables: NttTable | Sequence[NttTable]) -> np.ndarray:
    """intt returns a with ntt(a) = A, i.e. a_i = N^-1 sum_j A[j] psi^(-(2 br(j)+1) i) mod q, as uint32.

    Same calling convention as ntt.
    """
    return _transform(a, tables, forward=False)


def _transform(a, tables, forward: bool) -> np.ndarray:
    xp = array_module(a)
    a = xp.asarray(a)
    if isinstance(tables, NttTable):
        n = tables.n
        if a.ndim == 0 or a.shape[-1] != n:
            raise ArgumentError(f"last axis has length {a.shape[-1] if a.ndim else 0}, want N = {n}")
        rows = a.reshape(-1, n)
        row_tables: list[NttTable] | None = None
    else:
        row_tables = list(tables)
        if not row_tables:
            if a.ndim == 2 and a.shape[0] == 0:
                return xp.empty(a.shape, dtype=np.uint32)
            raise ArgumentError(f"no NTT tables given for an array of shape {a.shape}")
        n = row_tables[0].n
        if a.ndim != 2 or a.shape != (len(row_tables), n):
            raise ArgumentError(f"array of shape {a.shape} does not match {len(row_tables)} tables of N = {n}")
        if any(t.n != n for t in row_tables):
            raise ArgumentError("NTT tables of different ring degrees")
        rows = a
    out = xp.empty(rows.shape, dtype=np.uint32)
    chunk = max(1, (_CHUNK_RESIDUES if xp is np else _GPU_CHUNK_RESIDUES) // n)
    if xp is np and ntt_jit.ready(n):  # compiled host kernels (Numba), row by row: the same bits
        jit_kernel = ntt_jit.forward_rows if forward else ntt_jit.inverse_rows

        def run(c0: int, c1: int) -> None:
            if row_tables is None:
                jit_kernel(rows[c0:c1], out[c0:c1], tables)
            else:
                for r in range(c0, c1):
                    jit_kernel(rows[r : r + 1], out[r : r + 1], row_tables[r])
    else:
        kernel = _forward_rows if forward else _inverse_rows

        def run(c0: int, c1: int) -> None:
            if row_tables is None:
                tabs = [tables]
            else:
                tabs = row_tables[c0:c1]
                if all(t is tabs[0] for t in tabs):
                    tabs = tabs[:1]
            kernel(rows[c0:c1], out[c0:c1], tabs, xp)

    if xp is np:
        map_chunks(run, rows.shape[0], chunk)
    else:
        for c0 in range(0, rows.shape[0], chunk):
            run(c0, min(c0 + chunk, rows.shape[0]))
    return out.reshape(a.shape)


def _stack(tabs: list[NttTable], names: tuple[str, str], xp=np) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_stack returns (w, w', q) for the rows: twiddles (c, N) uint64, Shoup quotients, moduli (c, 1)."""
    if xp is not np:
        w = xp.stack([tab.device_array(names[0], xp) for tab in tabs])
        wp = xp.stack([tab.device_array(names[1], xp) for tab in tabs])
        return w, wp, xp.asarray(np.array([[t.q] for t in tabs], dtype=_U64))
    if len(tabs) == 1:
        w = getattr(tabs[0], names[0]).astype(_U64)[None]
        wp = getattr(tabs[0], names[1]).astype(_U64)[None]
    else:
        w = np.stack([getattr(t, names[0]) for t in tabs]).astype(_U64)
        wp = np.stack([getattr(t, names[1]) for t in tabs]).astype(_U64)
    q = np.array([[t.q] for t in tabs], dtype=_U64)
    return w, wp, q


def _forward_rows(src, dst, tabs: list[NttTable], xp=np) -> None:
    """_forward_rows writes NTT(src) into dst (c rows); lazy Cooley-Tukey with values in [0, 4q)."""
    c, n = src.shape
    r = tabs[0]._r
    nblk = n // r
    w, wp, q = _stack(tabs, ("_fw", "_fwp"), xp)
    q3, q4 = q.reshape(-1, 1, 1), q.reshape(-1, 1, 1, 1)
    tq3, tq4 = q3 * _U64(2), q4 * _U64(2)
    rows = w.shape[0]
    s1 = xp.empty(c * n // 2, dtype=_U64)
    s2 = xp.empty(c * n // 2, dtype=_U64)
    x = src.astype(_U64)  # a private copy, transformed in place
    m, t = 1, n // 2
    while t >= r:  # stages with butterfly distance t >= r: natural layout (c, m, 2, t)
        blocks = x.reshape(c, m, 2, t)
        _ct_butterfly(blocks[:, :, 0], blocks[:, :, 1], w[:, m : 2 * m, None], wp[:, m : 2 * m, None],
                      q3, tq3, s1.reshape(c, m, t), s2.reshape(c, m, t), xp)
        m, t = m * 2, t // 2
    z = xp.ascontiguousarray(x.reshape(c, nblk, r).transpose(0, 2, 1))  # z[:, s, blk] = x[:, blk*r + s]
    while m < n:  # stages with 2t <= r: transposed layout (c, r/2t, 2, t, nblk)
        g = r // (2 * t)
        blocks = z.reshape(c, g, 2, t, nblk)
        tw = w[:, m : 2 * m].reshape(rows, g, 1, nblk)
        twp = wp[:, m : 2 * m].reshape(rows, g, 1, nblk)
        _ct_butterfly(blocks[:, :, 0], blocks[:, :, 1], tw, twp, q4, tq4,
                      s1.reshape(c, g, t, nblk), s2.reshape(c, g, t, nblk), xp)
        m, t = m * 2, t // 2
    zz = z.reshape(c, r, nblk)
    s = xp.empty_like(zz)
    xp.subtract(zz, tq3, out=s)
    xp.minimum(zz, s, out=zz)  # [0, 2q)
    xp.subtract(zz, q3, out=s)
    xp.minimum(zz, s, out=zz)  # [0, q)
    dst.reshape(c, nblk, r)[...] = zz.transpose(0, 2, 1)


def _ct_butterfly(x, y, w, wp, q, tq, s1, s2, xp=np) -> None:
    """_ct_butterfly: (x, y) <- (x + y*w, x - y*w) mod q, lazily: inputs and outputs in [0, 4q)."""
    xp.multiply(y, wp, out=s1)
    xp.right_shift(s1, _SHIFT32, out=s1)
    xp.multiply(s1, q, out=s1)
    xp.multiply(y, w, out=s2)
    xp.subtract(s2, s1, out=s2)  # v = y*w mod q in [0, 2q) (Shoup)
    xp.subtract(x, tq, out=s1)
    xp.minimum(x, s1, out=x)  # x in [0, 2q)
    xp.subtract(x, s2, out=y)
    xp.add(y, tq, out=y)  # x - v + 2q in (0, 4q)
    xp.add(x, s2, out=x)  # x + v in [0, 4q)


def _inverse_rows(src, dst, tabs: list[NttTable], xp=np) -> None:
    """_inverse_rows writes INTT(src) into dst (c rows); lazy Gentleman-Sande with values in [0, 2q)."""
    c, n = src.shape
    r = tabs[0]._r
    nblk = n // r
    w, wp, q = _stack(tabs, ("_iw", "_iwp"), xp)
    q3, q4 = q.reshape(-1, 1, 1), q.reshape(-1, 1, 1, 1)
    tq3, tq4 = q3 * _U64(2), q4 * _U64(2)
    rows = w.shape[0]
    s1 = xp.empty(c * n // 2, dtype=_U64)
    s2 = xp.empty(c * n // 2, dtype=_U64)
    z = xp.empty((c, r, nblk), dtype=_U64)
    z[...] = src.reshape(c, nblk, r).transpose(0, 2, 1)  # z[:, s, blk] = a[:, blk*r + s]
    h, t = n // 2, 1
    while t < r:  # stages with 2t <= r: transposed layout
        g = r // (2 * t)
        blocks = z.reshape(c, g, 2, t, nblk)
        tw = w[:, h : 2 * h].reshape(rows, g, 1, nblk)
        twp = wp[:, h : 2 * h].reshape(rows, g, 1, nblk)
        _gs_butterfly(blocks[:, :, 0], blocks[:, :, 1], tw, twp, q4, tq4,
                      s1.reshape(c, g, t, nblk), s2.reshape(c, g, t, nblk), xp)
        h, t = h // 2, t * 2
    x = xp.ascontiguousarray(z.transpose(0, 2, 1)).reshape(c, n)
    while h >= 1:  # stages with t >= r: natural layout (c, h, 2, t)
        blocks = x.reshape(c, h, 2, t)
        _gs_butterfly(blocks[:, :, 0], blocks[:, :, 1], w[:, h : 2 * h, None], wp[:, h : 2 * h, None],
                      q3, tq3, s1.reshape(c, h, t), s2.reshape(c, h, t), xp)
        h, t = h // 2, t * 2
    # Multiply by N^-1 (Shoup) and reduce to [0, q).
    q2 = q.reshape(-1, 1)
    ninv = xp.asarray(np.array([[tab.n_inv] for tab in tabs], dtype=_U64))
    ninvp = xp.asarray(np.array([[tab._n_inv_shoup] for tab in tabs], dtype=_U64))
    s = xp.empty_like(x)
    xp.multiply(x, ninvp, out=s)
    xp.right_shift(s, _SHIFT32, out=s)
    xp.multiply(s, q2, out=s)
    xp.multiply(x, ninv, out=x)
    xp.subtract(x, s, out=x)  # [0, 2q)
    xp.subtract(x, q2, out=s)
    xp.minimum(x, s, out=x)
    dst[...] = x


def _gs_butterfly(x, y, w, wp, q, tq, s1, s2, xp=np) -> None:
    """_gs_butterfly: (x, y) <- (x + y, (x - y)*w) mod q, lazily: inputs and outputs in [0, 2q)."""
    xp.subtract(x, y, out=s2)
    xp.add(s2, tq, out=s2)  # x - y + 2q in (0, 4q)
    xp.add(x, y, out=x)
    xp.subtract(x, tq, out=s1)
    xp.minimum(x, s1, out=x)  # x + y in [0, 2q)
    xp.multiply(s2, wp, out=s1)
    xp.right_shift(s1, _SHIFT32, out=s1)
    xp.multiply(s1, q, out=s1)
    xp.multiply(s2, w, out=y)
    xp.subtract(y, s1, out=y)  # (x - y)*w mod q in [0, 2q) (Shoup)
