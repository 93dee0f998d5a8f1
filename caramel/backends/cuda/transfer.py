"""Large host <-> device copies through small pinned (page-locked) staging buffers.

A copy from or to ordinary (pageable) host memory makes the driver stage every byte through its
own small pinned buffer, synchronously; measured on the H200 machine it ran near 1.3-1.7 GB/s for the
client's 4 GiB of evaluation keys (docs/PERFORMANCE.md, Session 5). Here the copy is cut into chunks
of :data:`STAGE_BYTES`: each chunk goes through one of two pinned buffers of the calling thread, so
that the host's ``memcpy`` into (or out of) one buffer overlaps the DMA of the other.

* :func:`download`: a device array as a new host array (the same bytes as ``a.get()``);
* :func:`upload_rows`: ``arena[rows] = data`` for a host (k, N) array or a list of k rows (the same
  result as CuPy's fancy assignment from ``cupy.asarray(data)``), chunk by chunk through a device
  staging buffer; rows of the list already on the GPU (the GPU client's keys) are copied there (one
  gather kernel reading each row at its address, when all are contiguous rows of the arena's type);
* :func:`row_maxima`: the largest value of each of some arena rows (a kernel of its own), for the
  range check of an uploaded input image (:func:`caramel.execute.memory.check_ranges`);
* :func:`pinned_scratch` and :func:`upload_pinned`: a thread's reused pinned buffer that a file is
  read into, and its bytes copied to a new device array at the pinned speed (the key store's
  files, :func:`caramel.ckks.keystore.load_keys`);
* :func:`settled`: device arrays just made, once their stream is done with them (before a cache that every
  thread reads publishes them).

Both run on the current CUDA stream and return when the host side is done (``download``: the data is
on the host; ``upload_rows``: every chunk is queued and the host buffers may be reused, the last
scatter may still run on the stream). Pinned buffers are per thread and device (GPU driver threads copy
at once).
CuPy is imported lazily.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from caramel import cores
from caramel.arrays import is_device_array
from caramel.backends.cuda.device import on_device

#: Bytes of one pinned staging buffer (two per thread).
STAGE_BYTES = 32 << 20
_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost

_local = threading.local()
#: Host threads that fill a pinned buffer (:func:`upload_rows`).
FILL_THREADS = max(1, min(4, cores.available() // 2))
_pool = None


def _forget_pool() -> None:  # a forked child has none of the parent's threads
    global _pool
    _pool = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _cp():
    import cupy

    return cupy


def _stages():
    """The calling thread's two pinned host buffers (uint8 views) and their events, for the current
    device (events belong to a device)."""
    cp = _cp()
    per_device = _local.__dict__.setdefault("stages", {})
    device = cp.cuda.runtime.getDevice()
    got = per_device.get(device)
    if got is None:
        mems = [cp.cuda.alloc_pinned_memory(STAGE_BYTES) for _ in range(2)]
        views = [np.frombuffer(m, dtype=np.uint8, count=STAGE_BYTES) for m in mems]
        events = [cp.cuda.Event(disable_timing=True) for _ in range(2)]
        got = per_device[device] = (mems, views, events, [False, False])
    return got


#: Copies of at most this many bytes go straight through CuPy (``a.get()``); larger ones through the
#: pinned buffers (a pageable copy of a key's 15 MB ran near 1.7 GB/s).
SMALL_BYTES = 1 << 20


def download(a) -> np.ndarray:
    """The device array ``a`` as a new C-contiguous host ndarray (pinned, chunked copy)."""
    cp = _cp()
    a = cp.ascontiguousarray(a)
    total = a.nbytes
    if total <= SMALL_BYTES:
        return a.get()
    out = np.empty(a.shape, dtype=a.dtype)
    _, views, events, _ = _stages()
    stream = cp.cuda.get_current_stream()
    dst = out.reshape(-1).view(np.uint8)
    src = a.data.ptr
    pending: list[tuple[int, int, int]] = []  # (buffer, start, stop) copies still on the device

    def drain() -> None:
        b, c0, c1 = pending.pop(0)
        events[b].synchronize()
        _copy(dst[c0:c1], views[b][: c1 - c0])

    for i, c0 in enumerate(range(0, total, STAGE_BYTES)):
        c1 = min(total, c0 + STAGE_BYTES)
        b = i % 2
        if len(pending) == 2:
            drain()
        cp.cuda.runtime.memcpyAsync(views[b].ctypes.data, src + c0, c1 - c0, _D2H, stream.ptr)
        events[b].record(stream)
        pending.append((b, c0, c1))
    while pending:
        drain()
    return out


#: Device rows are gathered into the arena this many at a time (:func:`upload_rows`).
DEVICE_ROWS_PER_COPY = 256


#: ``gather_rows``: row ``dst[r]`` of the (S, n) arena = the n words at device address ``src[r]``
#: (block (x, r): a stretch of columns of row r).
GATHER_SRC = r"""
extern "C" __global__ void gather_rows(const unsigned long long* __restrict__ src, const long long* __restrict__ dst,
                                       long long n, unsigned* __restrict__ arena) {
    const unsigned* s = (const unsigned*)src[blockIdx.y];
    unsigned* d = arena + dst[blockIdx.y] * n;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += (long long)gridDim.x * blockDim.x)
        d[j] = s[j];
}
"""


def _row_pointers(arena, data, idx: list[int]) -> np.ndarray | None:
    """The device addresses (uint64) of rows ``data[i]``, i in ``idx``, when each is a CuPy array of
    the arena's dtype, contiguous (stride one element) and on the arena's device; else None."""
    cp = _cp()
    if arena.dtype != np.uint32 or not arena.flags.c_contiguous:
        return None
    dtype, step, device = arena.dtype, (arena.itemsize,), arena.data.device_id
    ptrs = np.empty(len(idx), dtype=np.uint64)
    for j, i in enumerate(idx):
        a = data[i]
        if not isinstance(a, cp.ndarray) or a.dtype != dtype or a.strides != step:
            return None
        m = a.data
        if m.device_id != device:
            return None
        ptrs[j] = m.ptr
    return ptrs


def _gather_rows(arena, src: np.ndarray, dst: np.ndarray) -> None:
    """``arena[dst[r]] = the row at device address src[r]`` for every r, on the current stream (rows
    of :func:`_row_pointers`: uint32, contiguous, on the arena's device): one launch per 65535 rows."""
    from caramel.backends.cuda.compiler import function

    cp = _cp()
    with on_device(arena.data.device_id):
        fn = function(GATHER_SRC, "gather_rows", ())
    n = arena.shape[1]
    for r0 in range(0, len(src), 65535):
        s = cp.asarray(src[r0:r0 + 65535])
        d = cp.asarray(np.ascontiguousarray(dst[r0:r0 + 65535], dtype=np.int64))
        fn((min(-(-n // 256), 1024), len(s)), (256,), (s, d, np.int64(n), arena))


def _scatter(arena, rows: np.ndarray, block) -> None:
    """``arena[rows] = block`` for a device ``block``: rows of the arena's type, contiguous, one per row of ``rows``,
    gathered at their addresses (:func:`_gather_rows`: a kernel compiled ahead, where CuPy's assignment would compile
    one for the arena's size at its first use); CuPy's assignment (broadcasting, converting) for any other block."""
    if (block.dtype == arena.dtype == np.uint32 and block.shape == (len(rows), arena.shape[1])
            and block.flags.c_contiguous and arena.flags.c_contiguous):
        _gather_rows(arena, block.data.ptr + np.arange(len(rows), dtype=np.uint64) * np.uint64(block.strides[0]),
                     rows)
    else:
        arena[_cp().asarray(rows)] = block


def _device_rows(arena, rows: np.ndarray, data, idx: list[int]) -> None:
    """``arena[rows[i]] = data[i]`` for the device rows ``data[i]``, i in ``idx`` (device-to-device
    copies on the current stream, after everything queued on the device so far: the rows may come
    from other streams)."""
    cp = _cp()
    n = arena.shape[1]
    bad = next((i for i in idx if tuple(data[i].shape) != (n,)), None)
    if bad is not None:
        raise ValueError(f"data row {bad} of shape {tuple(data[bad].shape)}, expected ({n},)")
    cp.cuda.Device().synchronize()
    src = _row_pointers(arena, data, idx)
    if src is not None:  # every row a contiguous row of the arena's type on its device: one gather
        _gather_rows(arena, src, rows[idx])
        return
    for j in range(0, len(idx), DEVICE_ROWS_PER_COPY):
        part = idx[j:j + DEVICE_ROWS_PER_COPY]
        arena[cp.asarray(rows[part])] = cp.stack([data[i] for i in part]).astype(arena.dtype, copy=False)


def upload_rows(arena, rows, data) -> None:
    """``arena[rows] = data``: host ``data`` into rows ``rows`` (k,) of the device (S, N) arena, through
    pinned buffers and one device staging buffer per pinned buffer. ``data``: a (k, N) array, or a
    sequence of k arrays of shape (N,) (copied row by row into the pinned buffers: no (k, N) host
    image is built; rows already on the device are copied there, :func:`_device_rows`). Values are
    converted to the arena's type as ``astype`` does."""
    cp = _cp()
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    k = rows.shape[0]
    if isinstance(data, (list, tuple)):
        if len(data) != k:
            raise ValueError(f"{len(data)} rows of data for {k} arena rows")
        on_device = [i for i, r in enumerate(data) if is_device_array(r)]
        if on_device:
            _device_rows(arena, rows, data, on_device)
            rest = sorted(set(range(k)) - set(on_device))
            if not rest:
                return
            rows, data, k = rows[rest], [data[i] for i in rest], len(rest)
    row_bytes = arena.shape[1] * arena.itemsize
    per = max(1, STAGE_BYTES // row_bytes)
    if k <= per or row_bytes > STAGE_BYTES:  # small: one copy (CuPy's assignment, broadcasting as it does)
        _scatter(arena, rows, cp.asarray(np.asarray(data).astype(arena.dtype, copy=False)))
        return
    if isinstance(data, np.ndarray):
        if data.shape != (k, arena.shape[1]):
            raise ValueError(f"data of shape {data.shape} for {k} rows of {arena.shape[1]}")
    else:
        if len(data) != k:
            raise ValueError(f"{len(data)} rows of data for {k} arena rows")
        bad = next((i for i, r in enumerate(data) if np.shape(r) != (arena.shape[1],)), None)
        if bad is not None:
            raise ValueError(f"data row {bad} of shape {np.shape(data[bad])}, expected ({arena.shape[1]},)")
    _, views, events, used = _stages()
    stream = cp.cuda.get_current_stream()
    dev = [cp.empty((per, arena.shape[1]), dtype=arena.dtype) for _ in range(2)]
    for i, r0 in enumerate(range(0, k, per)):
        r1 = min(k, r0 + per)
        b = i % 2
        if used[b]:
            events[b].synchronize()  # the previous copy out of this buffer is done
        host = views[b][: (r1 - r0) * row_bytes].view(arena.dtype).reshape(r1 - r0, -1)
        _fill(host, data, r0)
        cp.cuda.runtime.memcpyAsync(dev[b].data.ptr, host.ctypes.data, (r1 - r0) * row_bytes, _H2D, stream.ptr)
        _scatter(arena, rows[r0:r1], dev[b][: r1 - r0])
        events[b].record(stream)
        used[b] = True
    for b in range(2):
        if used[b]:
            events[b].synchronize()  # the staging buffers are freed on return


def _fill(host: np.ndarray, data, r0: int) -> None:
    """``host[j] = data[r0 + j]`` for every row of ``host``, split over :data:`FILL_THREADS` threads
    (NumPy's copies release the GIL; one thread's ``memcpy`` does not reach the memory's bandwidth,
    and rows read from a memory-mapped file are first touched here)."""
    def part(a: int, b: int) -> None:
        if isinstance(data, np.ndarray):
            np.copyto(host[a:b], data[r0 + a:r0 + b], casting="unsafe")
        else:
            for j in range(a, b):
                np.copyto(host[j], data[r0 + j], casting="unsafe")

    k = host.shape[0]
    _in_parts(k, min(FILL_THREADS, k), part)


#: A host copy out of a pinned buffer is split over the fill threads from this many bytes on (the
#: copy writes fresh pages of the new array: page faults, which threads take in parallel).
PARALLEL_COPY_BYTES = 4 << 20


def _copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` for 1-D byte arrays, in :data:`FILL_THREADS` parts from
    :data:`PARALLEL_COPY_BYTES` on (NumPy's copies release the GIL)."""
    def part(a: int, b: int) -> None:
        dst[a:b] = src[a:b]

    n = dst.shape[0]
    _in_parts(n, FILL_THREADS if n >= PARALLEL_COPY_BYTES else 1, part)


def _in_parts(count: int, parts: int, part) -> None:
    """``part(a, b)`` over ``parts`` consecutive ranges [a, b) covering ``range(count)``, on the fill
    threads (inline for one part or fewer)."""
    if parts <= 1:
        part(0, count)
        return
    list(_fill_pool().map(lambda p: part(count * p // parts, count * (p + 1) // parts), range(parts)))


def _fill_pool():
    """The host threads of :func:`_fill` and :func:`_copy` (created on first use)."""
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(FILL_THREADS, thread_name_prefix="caramel-upload")
    return _pool


#: The largest value of each of some rows of a uint32 arena, into ``out`` set to 0 beforehand: blocks stride over a
#: row (grid x), one row per grid y; a kernel of its own, since CuPy's reductions compile CUB's headers (seconds).
ROW_MAXIMA_SRC = r"""
extern "C" __global__ void row_maxima(const unsigned* __restrict__ arena, const long long* __restrict__ rows,
                                      long long n, unsigned* __restrict__ out) {
    const unsigned* s = arena + rows[blockIdx.y] * n;
    unsigned m = 0;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n; j += step) m = max(m, s[j]);
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(out + blockIdx.y, m);
}
"""
_MAXIMA_THREADS = 256  # whole warps: the reduction shuffles every lane
_MAXIMA_ROWS = 65535  # rows per launch (the grid's y dimension)


def row_maxima(arena, rows) -> np.ndarray:
    """The largest value of each row ``rows`` (k,) of ``arena`` (a C-contiguous uint32 (R, N) device array), as a
    host array (k,): :data:`ROW_MAXIMA_SRC`, at most 65535 rows a launch."""
    from caramel.backends.cuda.compiler import function

    cp = _cp()
    if arena.dtype != np.uint32 or arena.ndim != 2 or not arena.flags.c_contiguous:
        raise ValueError(f"row_maxima needs a C-contiguous uint32 (rows, N) array, not {arena.dtype} {arena.shape}")
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    out = cp.zeros(rows.shape[0], dtype=np.uint32)
    if not rows.size:
        return out.get()
    rows_dev = cp.asarray(rows)
    n = arena.shape[1]
    kernel = function(ROW_MAXIMA_SRC, "row_maxima")
    blocks = max(1, min(64, -(-n // (_MAXIMA_THREADS * 4))))
    for r0 in range(0, rows.shape[0], _MAXIMA_ROWS):
        r1 = min(rows.shape[0], r0 + _MAXIMA_ROWS)
        kernel((blocks, r1 - r0), (_MAXIMA_THREADS,), (arena, rows_dev[r0:r1], np.int64(n), out[r0:r1]))
    return out.get()


def pinned_scratch(nbytes: int) -> np.ndarray:
    """The calling thread's pinned host buffer for the current device, as ``nbytes`` uint8 (kept for
    the thread's next call, grown when a call needs more): files read into it go to the device by
    :func:`upload_pinned` without the driver's pageable staging."""
    cp = _cp()
    per_device = _local.__dict__.setdefault("scratch", {})
    device = cp.cuda.runtime.getDevice()
    got = per_device.get(device)
    if got is None or got[1].shape[0] < nbytes:
        mem = cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        got = per_device[device] = (mem, np.frombuffer(mem, dtype=np.uint8, count=max(nbytes, 1)))
    return got[1][:nbytes]


def upload_pinned(host: np.ndarray):
    """A new device array equal to the C-contiguous ``host`` (a view of pinned memory, such as
    :func:`pinned_scratch`'s), copied on the current stream; returns when the copy is done (the
    host buffer may then be reused)."""
    cp = _cp()
    if not host.flags.c_contiguous:
        raise ValueError("upload_pinned needs a C-contiguous host array")
    out = cp.empty(host.shape, dtype=host.dtype)
    stream = cp.cuda.get_current_stream()
    if host.nbytes:
        cp.cuda.runtime.memcpyAsync(out.data.ptr, host.ctypes.data, host.nbytes, _H2D, stream.ptr)
    stream.synchronize()
    return out


def settled(value):
    """``value`` (device arrays made on the current stream: uploads, kernels) once that stream has finished them.
    A table cached for a whole device is read later on other threads' streams, which are non-blocking and never
    wait for this one, so the cache stores it only settled (a stream being captured into a graph is left as it is:
    tables are made before any capture)."""
    stream = _cp().cuda.get_current_stream()
    if not stream.is_capturing():
        stream.synchronize()
    return value


__all__ = ["SMALL_BYTES", "STAGE_BYTES", "download", "is_device_array", "pinned_scratch", "row_maxima",
           "settled", "upload_pinned", "upload_rows"]
