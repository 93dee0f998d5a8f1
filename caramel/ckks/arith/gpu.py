"""The client's arithmetic on a GPU: CuPy arrays, caramel's CUDA NTT, the draws replayed on the device.

The random words are NumPy's generator's own, computed on the device (:mod:`caramel.ckks.pcg`,
:func:`caramel.ckks.sampling.lemire_device`, :func:`~caramel.ckks.sampling.binomial_replay`), so
the draws, and everything after them, are the host client's bits. Rows are not chunked: the
device's kernels are parallel already. At N = 2^12 .. 2^16 the NTT runs on caramel's CUDA kernels
(the executor's), and the row formulas (:data:`CLIENT_ROWS_SRC`) and the encoding
(:data:`caramel.ckks.encoding.ENCODE_SRC`) on the client's own, each the host's integer or IEEE operations in its
order: the client compiles no CuPy kernel there. Other N run the formulas of
:class:`~caramel.ckks.arith.base.ClientArith` and the array kernels of :mod:`caramel.ring.ntt` on CuPy.

CuPy is imported on first use only, so this module imports without it. Checkable without a GPU:
``GpuArith(array_module=numpy, cuda_ntt=False)`` runs every formula, draw and transform of this
class on NumPy arrays (tests/ckks/arith/test_gpu.py).
"""

from __future__ import annotations

import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from caramel.ckks.arith.base import ClientArith, ClientDeviceError, DeviceKind
from caramel.ring.ntt import forward_rows, inverse_rows, row_tables

#: log2 of the ring degrees whose NTT runs on caramel's CUDA kernels (:mod:`caramel.backends.cuda.ntt`).
CUDA_NTT_SIZES = range(12, 17)
#: Host threads that copy a GPU client's arrays back in the background (:meth:`GpuArith.get_in_background`:
#: each its own stream and pinned buffers; the host side of a copy, writing fresh pages, is the slow part).
DOWNLOAD_THREADS = 3

_tables: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()
_encode_tables: dict[tuple, Any] = {}  # (N, array module, place) -> caramel.ckks.encoding.EncodeTables there

#: The client's row kernels (one module): each the formula of :class:`~caramel.ckks.arith.base.ClientArith` that it
#: replaces, in the same integer operations (uint64, wrapping), so that its rows are the host's bit for bit. Rows
#: of N words, C-contiguous; thread (j, r) writes word j of row r.
#:
#: * ``residue_rows``: row r of plaintext p is its coefficients mod q_r (in [0, q_r), as NumPy's ``mod``), for
#:   rows[p] <= r < rows[p + 1] (``meta``: rows[0 .. P], then q_r for every row r); each coefficient read once;
#: * ``small_rows``: :func:`~caramel.ckks.arith.base.small_residues`: x = uint64(c) + q_r, then min(x, x - q_r);
#: * ``rlwe_c0_rows``: :meth:`~caramel.ckks.arith.base.ClientArith.rlwe_c0`'s row: (NTT(e) + q - a s mod q + m) mod q,
#:   or f m mod q in place of m (``f`` not null), m read at ``perm[j]`` (``perm`` not null);
#: * ``decrypt_rows``: :meth:`~caramel.ckks.arith.base.ClientArith.decrypt_rows` before its INTT: (c1 s mod q + c0)
#:   mod q;
#: * ``mulmod_rows``: :meth:`~caramel.ckks.arith.base.ClientArith.mulmod`: a b mod q, b a row (``b``) or a column
#:   (``bcol``, the other null);
#: * ``take_rows``: row r of ``out`` is row ``idx[r]`` of ``src`` (row r with ``idx`` null).
CLIENT_ROWS_SRC = r"""
typedef unsigned long long u64;

// The position of this thread in a launch over rows of n residues (grid: x covers n, y the rows): row r, residue j,
// word at = r n + j of the rows; threads past a row's end return.
#define ROW_POSITION(n) \
    const long long r = blockIdx.y; \
    const int j = blockIdx.x * blockDim.x + threadIdx.x; \
    if (j >= (n)) return; \
    const long long at = r * (n) + j

extern "C" __global__ void residue_rows(const long long* __restrict__ c, const long long* __restrict__ meta,
                                        int plaintexts, int n, unsigned* __restrict__ out) {
    ROW_POSITION(n);  // row r: plaintext r, whose residues are rows meta[r] .. meta[r + 1] of out
    const long long v = c[at];
    const long long* q = meta + plaintexts + 1;
    for (long long k = meta[r]; k < meta[r + 1]; ++k) {
        long long m = v % q[k];
        if (m < 0) m += q[k];
        out[k * n + j] = (unsigned)m;
    }
}

extern "C" __global__ void small_rows(const long long* __restrict__ c, const u64* __restrict__ q, int n,
                                      unsigned* __restrict__ out) {
    ROW_POSITION(n);
    const u64 x = (u64)c[j] + q[r], y = x - q[r];
    out[at] = (unsigned)(y < x ? y : x);
}

extern "C" __global__ void rlwe_c0_rows(const unsigned* __restrict__ ne, const unsigned* __restrict__ a,
                                        const unsigned* __restrict__ s, const unsigned* __restrict__ m,
                                        const long long* __restrict__ perm, const u64* __restrict__ f,
                                        const u64* __restrict__ q, int n, unsigned* __restrict__ out) {
    ROW_POSITION(n);
    const u64 qr = q[r];
    u64 c = (u64)ne[at] + qr;
    c -= ((u64)a[at] * s[at]) % qr;
    const u64 mv = m[r * n + (perm ? perm[j] : j)];
    c += f ? (mv * f[r]) % qr : mv;
    out[at] = (unsigned)(c % qr);
}

extern "C" __global__ void decrypt_rows(const unsigned* __restrict__ c0, const unsigned* __restrict__ c1,
                                        const unsigned* __restrict__ s, const u64* __restrict__ q, int n,
                                        unsigned* __restrict__ out) {
    ROW_POSITION(n);
    const u64 qr = q[r];
    out[at] = (unsigned)((((u64)c1[at] * s[at]) % qr + c0[at]) % qr);
}

extern "C" __global__ void mulmod_rows(const unsigned* __restrict__ a, const unsigned* __restrict__ b,
                                       const u64* __restrict__ bcol, const u64* __restrict__ q, int n,
                                       unsigned* __restrict__ out) {
    ROW_POSITION(n);
    out[at] = (unsigned)(((u64)a[at] * (b ? (u64)b[at] : bcol[r])) % q[r]);
}

extern "C" __global__ void take_rows(const unsigned* __restrict__ src, const long long* __restrict__ idx, int n,
                                     unsigned* __restrict__ out) {
    ROW_POSITION(n);
    out[at] = src[(idx ? idx[r] : r) * n + j];
}
"""
#: The kernels of :data:`CLIENT_ROWS_SRC`.
CLIENT_ROWS_KERNELS = ("residue_rows", "small_rows", "rlwe_c0_rows", "decrypt_rows", "mulmod_rows", "take_rows")
_ROW_THREADS = 256
_NULL = np.uint64(0)  # a null pointer argument (no ``perm``, no ``f``, no ``idx``)


def _rows_kernel(name: str):
    """Kernel ``name`` of :data:`CLIENT_ROWS_SRC` on the current device, through the source-keyed compile cache (so
    that the client's warm-up, :func:`caramel.ckks.gpu_kernels.client_modules`, compiles it ahead)."""
    from caramel.backends.cuda.compiler import function

    return function(CLIENT_ROWS_SRC, name)


#: Threads a block of the encoding's kernels (:data:`caramel.ckks.encoding.ENCODE_SRC`).
_ENCODE_THREADS = 256


def _encode_kernels():
    """The kernels of :data:`caramel.ckks.encoding.ENCODE_SRC` on the current device, through the source-keyed
    compile cache (the warm-up's :func:`caramel.ckks.gpu_kernels.encoding_jobs` compiles them ahead)."""
    from caramel.backends.cuda.compiler import function
    from caramel.ckks.encoding import ENCODE_KERNELS, ENCODE_SRC

    return tuple(function(ENCODE_SRC, name) for name in ENCODE_KERNELS)


def _import_cupy():
    try:
        import cupy
    except ImportError:
        raise ClientDeviceError("the GPU client needs CuPy and a CUDA GPU (in the caramel clone: "
                                "pip install -e '.[cuda12]' or '.[cuda13]')") from None
    return cupy


@dataclass(frozen=True)
class GpuArith(ClientArith):
    """The GPU implementation of :class:`~caramel.ckks.arith.base.ClientArith`.

    ``array_module``: the array module (None: CuPy, imported on first use); ``cuda_ntt``: the N = 2^12
    .. 2^16 transform and the encoding's on caramel's CUDA kernels (needs CuPy); ``chunk_residues``: the array NTT
    (other N) transforms rows in chunks of about this many residues (eight bytes each, three buffers)."""

    array_module: Any = None
    cuda_ntt: bool = True
    chunk_residues: int = 1 << 24
    kind: ClassVar[DeviceKind] = DeviceKind.GPU

    @cached_property
    def xp(self):
        return _import_cupy() if self.array_module is None else self.array_module

    def place(self):
        """The current CUDA device (None for an array module without one)."""
        xp = self.xp
        return int(xp.cuda.Device().id) if hasattr(xp, "cuda") else None

    def rows(self, fn, total: int, n: int) -> None:
        fn(0, total)

    def host_rows(self, rows: int, n: int) -> np.ndarray:
        """:meth:`ClientArith.host_rows` in the thread's pinned buffer for the current device
        (:func:`~caramel.backends.cuda.transfer.pinned_scratch`) when the encoding runs on caramel's kernels, which copy
        it up without the driver's staging."""
        if not (self.cuda_ntt and hasattr(self.xp, "cuda")):
            return super().host_rows(rows, n)
        from caramel.backends.cuda.transfer import pinned_scratch

        return pinned_scratch(rows * n * 8).view(np.float64).reshape(rows, n)

    def transform(self, res, ctx, limbs, inverse: bool = False):
        """On caramel's CUDA kernels (N = 2^12 .. 2^16, :attr:`cuda_ntt`), the executor's own
        (:func:`caramel.backends.cuda.ntt.ntt`, which compute the reference's transform from the
        context's tables): one launch (the INTT) or two (the NTT) for all rows, the rows copied
        into the first half of a (2k, N) arena and transformed into its second half. Else the
        array kernels of :mod:`caramel.ring.ntt` on :attr:`xp`."""
        limbs = [int(l) for l in limbs]
        xp = self.xp
        if self._on_kernels(ctx.n) and limbs:
            from caramel.backends.cuda import ntt as cuda_ntt
            from caramel.backends.cuda.backend import cuda_ring

            k = len(limbs)
            arena = xp.empty((2 * k, ctx.n), dtype=np.uint32)
            if self._on_kernels(ctx.n, res):
                self._take(res, None, arena[:k])
            else:
                arena[:k] = res
            slots = xp.asarray(np.arange(2 * k, dtype=np.int32))
            primes = xp.asarray(np.asarray(limbs, dtype=np.int32))
            (cuda_ntt.intt if inverse else cuda_ntt.ntt)(cuda_ring(ctx), arena, slots[:k], slots[k:], primes)
            return arena[k:]
        tabs = [ctx.ntt_table(l) for l in limbs]
        out = xp.empty((len(limbs), ctx.n), dtype=np.uint32)
        kernel = inverse_rows if inverse else forward_rows
        chunk = max(1, self.chunk_residues // ctx.n)
        for r0 in range(0, len(limbs), chunk):
            r1 = min(r0 + chunk, len(limbs))
            kernel(res[r0:r1], out[r0:r1], row_tables(tabs[r0:r1], not inverse, xp, self._twiddles), xp)
        return out

    def _on_kernels(self, n: int, *rows, i64=()) -> bool:
        """Whether rows of N = ``n`` words run on caramel's CUDA kernels (:attr:`cuda_ntt`, N = 2^12 .. 2^16): the
        transform, and the row formulas (:data:`CLIENT_ROWS_SRC`) when ``rows`` are uint32 and ``i64`` int64 arrays
        of N-word rows, every one C-contiguous (else their array operations, the same bits)."""
        return (self.cuda_ntt and n.bit_length() - 1 in CUDA_NTT_SIZES
                and all(r.dtype == np.uint32 for r in rows) and all(r.dtype == np.int64 for r in i64)
                and all(r.shape[-1] == n and r.flags.c_contiguous for r in (*rows, *i64)))

    @staticmethod
    def _launch(name: str, rows: int, n: int, *args) -> None:
        """Kernel ``name`` of :data:`CLIENT_ROWS_SRC` over ``rows`` rows of N = ``n`` words."""
        if rows:
            _rows_kernel(name)((-(-n // _ROW_THREADS), rows), (_ROW_THREADS,), args)

    def _take(self, src, idx, out):
        """``out[r] = src[idx[r]]`` (``idx`` host int64, or None: row r) through ``take_rows``."""
        k, n = out.shape
        self._launch("take_rows", k, n, src, _NULL if idx is None else self.put(idx), np.int32(n), out)
        return out

    def take_rows(self, rows, limbs):
        """:meth:`ClientArith.take_rows` through ``take_rows`` (:data:`CLIENT_ROWS_SRC`)."""
        if not self._on_kernels(rows.shape[1], rows):
            return super().take_rows(rows, limbs)
        idx = np.asarray(list(limbs), dtype=np.int64)
        return self._take(rows, idx, self.xp.empty((len(idx), rows.shape[1]), dtype=np.uint32))

    def small_rows(self, coeffs, ctx, limbs):
        """:meth:`ClientArith.small_rows`: the residues by ``small_rows`` (:data:`CLIENT_ROWS_SRC`), then the NTT."""
        if isinstance(coeffs, np.ndarray):  # cast on the host: a cast on the device is another kernel to compile
            coeffs = np.asarray(coeffs, dtype=np.int64)
        coeffs = self.put(coeffs)
        if not self._on_kernels(ctx.n, i64=(coeffs,)):
            return super().small_rows(coeffs, ctx, limbs)
        limbs = [int(l) for l in limbs]
        return self.transform(self._small(coeffs, ctx.n, self.prime_column(ctx, limbs)), ctx, limbs)

    def _small(self, coeffs, n: int, q):
        """``small_rows``: coefficients ``coeffs`` mod the primes of column ``q``, one row a prime."""
        out = self.xp.empty((q.shape[0], n), dtype=np.uint32)
        self._launch("small_rows", q.shape[0], n, coeffs, q, np.int32(n), out)
        return out

    def rlwe_c0(self, ctx, limbs, a, s, e, m, factor=None, perm=None):
        """:meth:`ClientArith.rlwe_c0`: NTT(e mod q) by ``small_rows`` and the transform, then one ``rlwe_c0_rows``
        (:data:`CLIENT_ROWS_SRC`) for every row."""
        if not self._on_kernels(ctx.n, a, s, m, i64=(e,)):
            return super().rlwe_c0(ctx, limbs, a, s, e, m, factor, perm)
        limbs = [int(l) for l in limbs]
        q = self.prime_column(ctx, limbs)
        out = self.xp.empty(a.shape, dtype=np.uint32)
        ne = self.transform(self._small(e, ctx.n, q), ctx, limbs)
        perm = _NULL if perm is None else self.put(np.asarray(perm, dtype=np.int64))
        f = _NULL if factor is None else self.put(np.asarray(factor, dtype=np.uint64).reshape(-1))
        self._launch("rlwe_c0_rows", len(limbs), ctx.n, ne, a, s, m, perm, f, q, np.int32(ctx.n), out)
        return out

    def mulmod(self, a, b, q):
        """:meth:`ClientArith.mulmod` through ``mulmod_rows`` (:data:`CLIENT_ROWS_SRC`)."""
        column = b.ndim == 2 and b.shape[1] == 1 and b.dtype == np.uint64
        if not (self._on_kernels(a.shape[1], a, *(() if column else (b,))) and a.shape[0] == q.shape[0]):
            return super().mulmod(a, b, q)
        out = self.xp.empty(a.shape, dtype=np.uint32)
        rows = (_NULL, self.xp.ascontiguousarray(b)) if column else (b, _NULL)
        self._launch("mulmod_rows", a.shape[0], a.shape[1], a, *rows, q, np.int32(a.shape[1]), out)
        return out

    def decrypt_rows(self, ctx, limbs, c0, c1, s):
        """:meth:`ClientArith.decrypt_rows`: one ``decrypt_rows`` (:data:`CLIENT_ROWS_SRC`) for every row, then the
        INTT."""
        if not self._on_kernels(ctx.n, c0, c1, s):
            return super().decrypt_rows(ctx, limbs, c0, c1, s)
        out = self.xp.empty(c0.shape, dtype=np.uint32)
        self._launch("decrypt_rows", len(limbs), ctx.n, c0, c1, s, self.prime_column(ctx, limbs), np.int32(ctx.n),
                     out)
        return self.transform(out, ctx, limbs, inverse=True)

    def encode_rows(self, parts, scales, n: int, out) -> list:
        """:meth:`ClientArith.encode_rows` on caramel's CUDA kernels (:attr:`cuda_ntt`;
        :data:`~caramel.ckks.encoding.ENCODE_SRC`, the host's operations in its order): one copy of the rows to the
        device, one launch to gather the transform's input, one per stage of the transform, one for the twist,
        scale, rounding and int64 rows, one copy back of a flag per row (a row of Python ints is copied down and
        converted on the host). Else the array operations of :attr:`xp` (the same bits)."""
        from caramel.backends.cuda.transfer import upload_pinned
        from caramel.ckks.encoding import checked_rows, encode_rows, encode_tables, rounded_rows

        xp = self.xp
        key = (n, id(xp), self.place())
        tables = _encode_tables.get(key)
        if tables is None:
            tables = _encode_tables[key] = self._settled(encode_tables(n).on(xp.asarray))
        if not self.cuda_ntt:
            return encode_rows(xp.asarray(parts), scales, n, out, xp=xp, tables=tables)
        if (hasattr(xp, "cuda") and isinstance(parts, np.ndarray) and parts.dtype == np.float64
                and parts.flags.c_contiguous):
            parts = upload_pinned(parts)  # no staging copy when they are host_rows' pinned rows
        parts, host_scales = checked_rows(parts, scales, n, xp)
        rows, m = parts.shape[0], n // 2
        if rows == 0:
            return []
        gather, stage, finish = _encode_kernels()
        src, dst = (xp.empty((rows, m)), xp.empty((rows, m))), (xp.empty((rows, m)), xp.empty((rows, m)))
        grid = (-(-m // _ENCODE_THREADS), rows)
        gather(grid, (_ENCODE_THREADS,), (parts, tables.gather, *src, np.int32(m)))
        half = (-(-max(m // 2, 1) // _ENCODE_THREADS), rows)
        ns, t = 1, 0
        while ns < m:
            w = tables.stages[t - 1] if t else tables.twist  # stage 0 reads no twiddle
            stage(half, (_ENCODE_THREADS,), (*src, *dst, *w, np.int32(m), np.int32(ns)))
            src, dst, ns, t = dst, src, 2 * ns, t + 1
        x, over = xp.empty((rows, n)), xp.zeros(rows, dtype=np.int32)
        finish(grid, (_ENCODE_THREADS,), (*src, *tables.twist, xp.asarray(host_scales), x, out, over, np.int32(m)))
        return rounded_rows(x, over.get() == 0, out)

    def plaintext_rows(self, coeffs, ctx, groups):
        """:meth:`ClientArith.plaintext_rows` on caramel's CUDA kernels (:meth:`_on_kernels`, int64
        coefficients, on the host or the device): at most one copy of the coefficients to the device, one launch
        of ``residue_rows`` (:data:`CLIENT_ROWS_SRC`) for every row, one forward NTT of every row in place."""
        coeffs = coeffs if isinstance(coeffs, self.xp.ndarray) else np.asarray(coeffs)
        if not (self._on_kernels(ctx.n) and coeffs.dtype == np.int64 and coeffs.ndim == 2
                and coeffs.shape[1] == ctx.n):
            return super().plaintext_rows(coeffs, ctx, groups)
        from caramel.backends.cuda import ntt as cuda_ntt
        from caramel.backends.cuda.backend import cuda_ring

        cp, n = self.xp, ctx.n
        flat = [int(l) for g in groups for l in g]
        out = cp.empty((len(flat), n), dtype=np.uint32)
        if not flat:
            return out
        rows = np.zeros(len(groups) + 1, dtype=np.int64)
        rows[1:] = np.cumsum([len(g) for g in groups])
        meta = cp.asarray(np.concatenate([rows, ctx.moduli(flat).reshape(-1).astype(np.int64)]))
        c = cp.ascontiguousarray(cp.asarray(coeffs))
        self._launch("residue_rows", len(groups), n, c, meta, np.int32(len(groups)), np.int32(n), out)
        slots = cp.asarray(np.arange(len(flat), dtype=np.int32))
        cuda_ntt.ntt(cuda_ring(ctx), out, slots, slots, cp.asarray(np.array(flat, dtype=np.int32)))
        return out

    def _settled(self, tables):
        """``tables``, arrays of :attr:`xp` for a cache that every thread reads: on a CUDA module once the current
        stream has made them (:func:`caramel.backends.cuda.transfer.settled`)."""
        if not hasattr(self.xp, "cuda"):
            return tables
        from caramel.backends.cuda.transfer import settled

        return settled(tables)

    def _twiddles(self, table, forward: bool):
        """(w, w') of ``table`` (:meth:`caramel.ring.NttTable.kernel_tables`) as uint64 arrays of
        :attr:`xp`, copied once per table, direction and device."""
        xp = self.xp
        key = (forward, id(xp), self.place())
        per_table = _tables.setdefault(table, {})
        got = per_table.get(key)
        if got is None:
            got = per_table[key] = self._settled(tuple(xp.asarray(w.astype(np.uint64))
                                                        for w in table.kernel_tables(forward)))
        return got

    def get_in_background(self, arrays) -> list[Future]:
        """Futures of ``arrays`` (device arrays) copied to the host (read-only) by
        :data:`DOWNLOAD_THREADS` threads, each on a non-blocking stream that first waits for the
        work queued so far, so that the copies overlap what the caller queues next."""
        from caramel.backends.cuda.transfer import download

        cp = self.xp
        ready = cp.cuda.Event(disable_timing=True)
        ready.record()
        local = threading.local()

        def fetch(arr) -> np.ndarray:
            stream = getattr(local, "stream", None)
            if stream is None:  # the thread's stream, created in the thread, after the work queued so far
                stream = local.stream = cp.cuda.Stream(non_blocking=True)
                stream.wait_event(ready)
            with stream:
                host = download(arr)
            host.setflags(write=False)
            return host

        pool = ThreadPoolExecutor(max_workers=DOWNLOAD_THREADS, thread_name_prefix="caramel-key-download")
        futures = [pool.submit(fetch, arr) for arr in arrays]
        pool.shutdown(wait=False)
        return futures


#: The GPU client (CuPy, the current device).
GPU = GpuArith()
