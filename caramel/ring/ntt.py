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

Array modules. The kernels (:func:`forward_rows`, :func:`inverse_rows`) take their array module
``xp`` and their constants (:class:`RowTables`) explicitly: :func:`ntt` and :func:`intt` run them
on NumPy, in chunks of rows that fit a core's L2 cache, spread over a small thread pool (see
:func:`client_threads`); the GPU client (:mod:`caramel.ckks.arith.gpu`) runs the same kernels on
CuPy with device copies of the tables. This module imports neither CuPy nor Numba.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from caramel import cores
from caramel.ring.modular import inv_mod
from caramel.errors import ArgumentError

_U64 = np.uint64
_SHIFT32 = np.uint64(32)
# Rows of a batched transform are processed in chunks of about this many residues, which keeps the
# working set (data and two scratch buffers) inside a core's L2 cache.
_CHUNK_RESIDUES = 1 << 16
#: Environment variable: worker threads of the host kernels (default: the machine's CPU count, at most 8).
THREADS_ENV = "CARAMEL_CLIENT_THREADS"

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def client_threads() -> int:
    """client_threads returns the number of host threads for batched transforms (``CARAMEL_CLIENT_THREADS``)."""
    raw = os.environ.get(THREADS_ENV, "")
    try:
        return max(1, int(raw)) if raw.strip() else max(1, min(8, cores.available()))
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
    powers of the root psi was found from (:func:`_root_and_powers`), and ``n_inv_shoup`` =
    floor(n_inv * 2^32 / q). The array kernels' tables (:meth:`kernel_tables`: kernel layout, Shoup
    quotients) are built on their first use, so a user of the powers alone (caramel's CUDA NTT)
    never builds them.
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
        self.n_inv_shoup = (self.n_inv << 32) // q
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

    def kernel_tables(self, forward: bool) -> tuple[np.ndarray, np.ndarray]:
        """kernel_tables returns (w, w') of the forward (or inverse) kernels: the twiddles in kernel
        layout and their Shoup quotients floor(w * 2^32 / q), uint32, read-only (see :func:`row_tables`)."""
        return (self._fw, self._fwp) if forward else (self._iw, self._iwp)

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
    a = np.asarray(a)
    if isinstance(tables, NttTable):
        n = tables.n
        if a.ndim == 0 or a.shape[-1] != n:
            raise ArgumentError(f"last axis has length {a.shape[-1] if a.ndim else 0}, want N = {n}")
        rows = a.reshape(-1, n)
        per_row: list[NttTable] | None = None
    else:
        per_row = list(tables)
        if not per_row:
            if a.ndim == 2 and a.shape[0] == 0:
                return np.empty(a.shape, dtype=np.uint32)
            raise ArgumentError(f"no NTT tables given for an array of shape {a.shape}")
        n = per_row[0].n
        if a.ndim != 2 or a.shape != (len(per_row), n):
            raise ArgumentError(f"array of shape {a.shape} does not match {len(per_row)} tables of N = {n}")
        if any(t.n != n for t in per_row):
            raise ArgumentError("NTT tables of different ring degrees")
        rows = a
    out = np.empty(rows.shape, dtype=np.uint32)
    kernel = forward_rows if forward else inverse_rows

    def run(c0: int, c1: int) -> None:
        kernel(rows[c0:c1], out[c0:c1], row_tables([tables] if per_row is None else per_row[c0:c1], forward))

    map_chunks(run, rows.shape[0], max(1, _CHUNK_RESIDUES // n))
    return out.reshape(a.shape)


class RowTables(NamedTuple):
    """RowTables holds the constants of the transforms of c rows, uint64 arrays of one array module:
    ``w``, ``wp`` (c, N) the twiddles in kernel layout and their Shoup quotients, ``q``, ``n_inv``,
    ``n_inv_shoup`` (c, 1) (see :class:`NttTable`). With c = 1 they serve every row."""

    w: Any
    wp: Any
    q: Any
    n_inv: Any
    n_inv_shoup: Any


def row_tables(tabs: Sequence[NttTable], forward: bool, xp=np,
               twiddles: Callable[[NttTable, bool], tuple[Any, Any]] | None = None) -> RowTables:
    """row_tables returns the :class:`RowTables` of rows modulo tabs[r].q as arrays of module ``xp``
    (one row when every table is the same); ``twiddles(tab, forward)`` gives (w, w') of one table
    as arrays of ``xp`` (default: :meth:`NttTable.kernel_tables`, host arrays)."""
    if all(t is tabs[0] for t in tabs):
        tabs = tabs[:1]
    ws, wps = zip(*((twiddles or NttTable.kernel_tables)(t, forward) for t in tabs))

    def stack(arrays):
        return (arrays[0][None] if len(arrays) == 1 else xp.stack(arrays)).astype(_U64, copy=False)

    def column(values):
        return xp.asarray(np.array(values, dtype=_U64)[:, None])

    return RowTables(stack(ws), stack(wps), column([t.q for t in tabs]), column([t.n_inv for t in tabs]),
                     column([t.n_inv_shoup for t in tabs]))


def forward_rows(src, dst, tables: RowTables, xp=np) -> None:
    """forward_rows writes NTT(src) into dst (c rows of N, arrays of ``xp``); lazy Cooley-Tukey with
    values in [0, 4q)."""
    c, n = src.shape
    r = _split(n.bit_length() - 1)
    s1, s2 = xp.empty(c * n // 2, dtype=_U64), xp.empty(c * n // 2, dtype=_U64)
    x = src.astype(_U64)  # a private copy, transformed in place
    m, t = 1, n // 2
    while t >= r:  # stages with butterfly distance t >= r: natural layout
        _stage(_ct_butterfly, x, tables, m, t, r, s1, s2, xp)
        m, t = m * 2, t // 2
    z = xp.ascontiguousarray(x.reshape(c, n // r, r).transpose(0, 2, 1))  # z[:, s, blk] = x[:, blk*r + s]
    while m < n:  # stages with 2t <= r: transposed layout
        _stage(_ct_butterfly, z, tables, m, t, r, s1, s2, xp)
        m, t = m * 2, t // 2
    q = tables.q.reshape(-1, 1, 1)
    s = xp.empty_like(z)
    xp.subtract(z, q * _U64(2), out=s)
    xp.minimum(z, s, out=z)  # [0, 2q)
    xp.subtract(z, q, out=s)
    xp.minimum(z, s, out=z)  # [0, q)
    dst.reshape(c, n // r, r)[...] = z.transpose(0, 2, 1)


def inverse_rows(src, dst, tables: RowTables, xp=np) -> None:
    """inverse_rows writes INTT(src) into dst (c rows of N, arrays of ``xp``); lazy Gentleman-Sande
    with values in [0, 2q)."""
    c, n = src.shape
    r = _split(n.bit_length() - 1)
    s1, s2 = xp.empty(c * n // 2, dtype=_U64), xp.empty(c * n // 2, dtype=_U64)
    z = xp.empty((c, r, n // r), dtype=_U64)
    z[...] = src.reshape(c, n // r, r).transpose(0, 2, 1)  # z[:, s, blk] = a[:, blk*r + s]
    h, t = n // 2, 1
    while t < r:  # stages with 2t <= r: transposed layout
        _stage(_gs_butterfly, z, tables, h, t, r, s1, s2, xp)
        h, t = h // 2, t * 2
    x = xp.ascontiguousarray(z.transpose(0, 2, 1)).reshape(c, n)
    while h >= 1:  # stages with t >= r: natural layout
        _stage(_gs_butterfly, x, tables, h, t, r, s1, s2, xp)
        h, t = h // 2, t * 2
    q = tables.q.reshape(-1, 1)
    s = xp.empty_like(x)
    _shoup(x, tables.n_inv, tables.n_inv_shoup, q, x, s, xp)  # x N^-1 in [0, 2q)
    xp.subtract(x, q, out=s)
    xp.minimum(x, s, out=x)  # [0, q)
    dst[...] = x


def _stage(butterfly, data, tables: RowTables, m: int, t: int, r: int, s1, s2, xp) -> None:
    """_stage runs ``butterfly`` on the m groups of one stage (distance t, twiddles w[m : 2m]) of c
    rows: ``data`` in natural layout (c, N) viewed as (c, m, 2, t) when t >= r, else in the
    transposed layout (c, r, N/r) viewed as (c, r/2t, 2, t, N/r); s1, s2 are c N/2 scratch words."""
    c, rows = data.shape[0], tables.w.shape[0]
    w, wp = tables.w[:, m : 2 * m], tables.wp[:, m : 2 * m]
    if t >= r:
        shape, w, wp, q = (c, m, t), w[:, :, None], wp[:, :, None], tables.q.reshape(-1, 1, 1)
    else:
        nblk, g = data.shape[-1], r // (2 * t)
        shape, q = (c, g, t, nblk), tables.q.reshape(-1, 1, 1, 1)
        w, wp = w.reshape(rows, g, 1, nblk), wp.reshape(rows, g, 1, nblk)
    blocks = data.reshape(shape[0], shape[1], 2, *shape[2:])
    butterfly(blocks[:, :, 0], blocks[:, :, 1], w, wp, q, q * _U64(2), s1.reshape(shape), s2.reshape(shape), xp)


def _shoup(y, w, wp, q, out, tmp, xp) -> None:
    """_shoup: out = y*w mod q in [0, 2q) by Shoup's product y*w - floor(y*w' / 2^32) * q (modulo 2^64),
    for y < 2^32, w < q < 2^30, w' = floor(w * 2^32 / q); ``tmp`` is scratch (``out`` may be ``y``)."""
    xp.multiply(y, wp, out=tmp)
    xp.right_shift(tmp, _SHIFT32, out=tmp)
    xp.multiply(tmp, q, out=tmp)
    xp.multiply(y, w, out=out)
    xp.subtract(out, tmp, out=out)


def _ct_butterfly(x, y, w, wp, q, tq, s1, s2, xp=np) -> None:
    """_ct_butterfly: (x, y) <- (x + y*w, x - y*w) mod q, lazily: inputs and outputs in [0, 4q)."""
    _shoup(y, w, wp, q, s2, s1, xp)  # v = y*w mod q in [0, 2q)
    xp.subtract(x, tq, out=s1)
    xp.minimum(x, s1, out=x)  # x in [0, 2q)
    xp.subtract(x, s2, out=y)
    xp.add(y, tq, out=y)  # x - v + 2q in (0, 4q)
    xp.add(x, s2, out=x)  # x + v in [0, 4q)


def _gs_butterfly(x, y, w, wp, q, tq, s1, s2, xp=np) -> None:
    """_gs_butterfly: (x, y) <- (x + y, (x - y)*w) mod q, lazily: inputs and outputs in [0, 2q)."""
    xp.subtract(x, y, out=s2)
    xp.add(s2, tq, out=s2)  # x - y + 2q in (0, 4q)
    xp.add(x, y, out=x)
    xp.subtract(x, tq, out=s1)
    xp.minimum(x, s1, out=x)  # x + y in [0, 2q)
    _shoup(s2, w, wp, q, y, s1, xp)  # (x - y)*w mod q in [0, 2q)
