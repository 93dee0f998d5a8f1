"""The GPU lane: instances through one CUDA device, overlapped (:mod:`caramel.execute.pipeline`).

The device holds the program resident (a captured :class:`~caramel.execute.cuda_graph.GpuRun`, or a
K-chip :class:`~caramel.execute.cuda_graph.MultiGpuRun` with every chip on this GPU) with the shared
limbs written once. Each instance takes one of ``depth`` *slots*: its own pinned host buffers and
device buffers for the instance rows, their source addresses, the scalar table, the output rows and
the rows' maxima. Three streams:

* ``up``: the host-to-device copies of instance i + 1 (pinned rows, their addresses, its scalar table),
* ``compute`` (the graph's stream): for instance i, wait for its upload; one kernel copies its rows
  into the arena (from the slot, or straight from the GPU client's arrays) and reduces each row's
  maximum on the way; the scalar table is copied in place; the graph replays; one kernel gathers the
  output rows into the slot,
* ``down``: the device-to-host copy of instance i - 1's outputs (and row maxima) into pinned memory,

so that uploads and downloads run under other instances' replays. The host fills a slot only while
it is free (released after its download and the copy of its outputs), so no buffer is written while
the device may read it; the arrays a slot reads from are kept alive until then. Nothing per
instance goes through a NumPy ``astype`` or ``stack``: host rows are copied once into the pinned
slot (from the user's arrays), device rows not at all. The range check of the instance rows (every
residue below its prime) is the maxima read back with the outputs, compared on the host.
CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import queue
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from caramel.errors import BindingError
from caramel.arrays import is_device_array
from caramel.execute.pipeline import Feed, Key, LaneOutput, RowLayout, check_host_rows
from caramel.program import Mem
from caramel.ring import Context, Mode

#: ``copy_rows``: row ``dst[r]`` = row ``src[r]`` (device addresses; rows of n4 uint4 words, 16-byte
#: aligned), and ``maxima[r]`` = max(maxima[r], the row's largest word). Block (x, r): a stretch of row r.
COPY_ROWS_SRC = r"""
extern "C" __global__ void copy_rows(const unsigned long long* __restrict__ src,
                                     const unsigned long long* __restrict__ dst, long long n4,
                                     unsigned* __restrict__ maxima) {
    const uint4* s = (const uint4*)src[blockIdx.y];
    uint4* d = (uint4*)dst[blockIdx.y];
    unsigned m = 0;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x; j < n4; j += step) {
        const uint4 v = s[j];
        d[j] = v;
        m = max(m, max(max(v.x, v.y), max(v.z, v.w)));
    }
    for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_down_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) atomicMax(maxima + blockIdx.y, m);
}
"""


def lane_jobs() -> list:
    """The compile jobs of a lane whatever its plan: the module of ``copy_rows`` (for
    :func:`caramel.backends.cuda.compiler.schedule`; the lane then finds it compiled)."""
    from caramel.backends.cuda.compiler import NVRTC_OPTIONS
    from caramel.backends.cuda.kernel_set import Module

    return [Module(("copy_rows",), ((COPY_ROWS_SRC, ("copy_rows",), NVRTC_OPTIONS),))]


#: Threads per block of ``copy_rows`` (whole warps: the reduction shuffles every lane).
COPY_THREADS = 256
#: Rows per launch of ``copy_rows`` (the grid's y dimension).
COPY_ROWS_PER_LAUNCH = 65535
#: Instances in flight per GPU by default: one uploading, one replaying, one downloading.
DEFAULT_DEPTH = 3
_H2D, _D2H, _D2D = 1, 2, 3


def _pinned(shape, dtype):
    """A NumPy array of ``shape`` over new pinned (page-locked) host memory."""
    import cupy as cp

    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    mem = cp.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
    return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)


def _addresses(base: int, rows: np.ndarray, row_bytes: int) -> np.ndarray:
    """Device addresses ``base + rows * row_bytes`` (uint64)."""
    return np.uint64(base) + np.asarray(rows, dtype=np.uint64) * np.uint64(row_bytes)


class _Slot:
    """One instance's buffers and events (see the module docstring)."""

    def __init__(self, lane: "GpuRowLane"):
        import cupy as cp

        k, ko, n = max(1, len(lane.layout)), max(1, len(lane.layout.out_rows)), lane.n
        self.ptr_host = _pinned((k,), np.uint64)
        self.ptr_dev = cp.empty(k, dtype=cp.uint64)
        self.max_dev = cp.zeros(k, dtype=cp.uint32)
        self.max_host = _pinned((k,), np.uint32)
        self.out_dev = cp.empty((ko, n), dtype=cp.uint32)
        self.out_host = _pinned((ko, n), np.uint32)
        self.out_max = cp.zeros(ko, dtype=cp.uint32)  # the gather's maxima (not read)
        self.out_dst = cp.asarray(_addresses(self.out_dev.data.ptr, np.arange(ko), lane.row_bytes))
        table = len(lane.base_scalars) if lane.layout.scalar_groups else 0
        self.table_host = _pinned((table,), np.uint32) if table else None
        self.table_dev = cp.empty(table, dtype=cp.uint32) if table else None
        self.in_host = self.in_dev = None  # for host rows, made on first use: (k, N) pinned and device
        self.events = {name: cp.cuda.Event() for name in ("up0", "up1", "run0", "run1", "out", "down0", "down1")}
        self.keep: list = []  # what the device reads until this instance is done
        self.stage_s = 0.0

    def host_rows(self, lane: "GpuRowLane"):
        """The slot's pinned and device buffers for host rows (made on first use)."""
        if self.in_host is None:
            import cupy as cp

            k = len(lane.layout)
            self.in_host = _pinned((k, lane.n), np.uint32)
            self.in_dev = cp.empty((k, lane.n), dtype=cp.uint32)
        return self.in_host, self.in_dev


class GpuRowLane:
    """One CUDA device (``device_id``) running instances of ``plan`` (see the module docstring):
    built from the ``template`` image (keys and shared inputs; zeros where instances write),
    captured once; ``source`` and ``outputs`` as :class:`~caramel.execute.pipeline.RowLayout`;
    ``streams``: CUDA streams of the graph; ``depth``: instances in flight; ``kernels``: the CUDA
    kernels' configuration, passed to the GPU executor."""

    def __init__(self, plan, ctx: Context, mode: Mode, template: Mapping[Mem, object],
                 source: Callable[[Mem], tuple[Key, int] | None], outputs: Sequence[Mem], *, device_id: int = 0,
                 streams: int | None = None, depth: int | None = None, kernels=None):
        import cupy as cp

        from caramel.backends.cuda.device import on_device
        from caramel.execute.cuda_graph import GRAPH_STREAMS, GpuRun, MultiGpuRun
        from caramel.plan.kernel import Kind

        self.device_id, self.device_ids, self.n = int(device_id), (int(device_id),), ctx.n
        self.depth = depth or DEFAULT_DEPTH
        self.row_bytes = 4 * ctx.n
        extra = {} if kernels is None else {"kernels": kernels}
        with on_device(self.device_id):
            one_chip = len(plan.chips) == 1 and not any(k.kind is Kind.COMM for k in plan.chips[0].kernels)
            if one_chip:
                self.run = GpuRun(plan, ctx, template, mode, streams=streams or GRAPH_STREAMS, **extra)
            else:  # every chip on this GPU: the communication is local sums and copies
                self.run = MultiGpuRun(plan, ctx, template, mode, 1, device_ids=[self.device_id], streams=streams,
                                       **extra)
            self.run.capture()
            device = self.run.runs[0]
            self.layout = RowLayout(self.run.progs[0], plan, ctx, source, outputs)
            self.base_scalars = device._scalar_values(template)
            self.arena, self.table = device.backend.arena, device.backend.scalars
            self.graph, self.compute = self.run.graphs[0], self.run.streams[0]
            self.up, self.down = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
            from caramel.backends.cuda.compiler import function

            self.kernel = function(COPY_ROWS_SRC, "copy_rows")
            base = self.arena.data.ptr
            self.dst = cp.asarray(_addresses(base, self.layout.rows, self.row_bytes))
            self.out_src = cp.asarray(_addresses(base, self.layout.out_rows, self.row_bytes))
            self.slots = [_Slot(self) for _ in range(self.depth)]
            # The address tables and slot buffers above were made on the current stream (CuPy's uploads are
            # asynchronous there); the lane's streams are non-blocking and would not wait for it.
            ready = cp.cuda.Event(disable_timing=True)
            ready.record()
            for stream in (self.compute, self.up, self.down):
                stream.wait_event(ready)
            if len(self.layout.out_rows):  # compiles and loads copy_rows now, not in the first instance
                slot = self.slots[0]
                self._copy(self.out_src[:1], slot.out_dst[:1], slot.out_max[:1], 1)
            self.compute.synchronize()
        self.free: queue.Queue[_Slot] = queue.Queue()
        for s in self.slots:
            self.free.put(s)
        self._closed = False

    # ------------------------------------------------------------------ one instance

    def _usable(self, a) -> bool:
        """Whether device array ``a`` can be read in place by ``copy_rows``: uint32 rows of N on this
        device, contiguous within a row and 16-byte aligned."""
        return (is_device_array(a) and getattr(a, "dtype", None) == np.uint32 and a.ndim == 2
                and a.shape[1] == self.n and a.strides[1] == 4 and a.strides[0] % 16 == 0
                and a.data.ptr % 16 == 0 and a.data.device_id == self.device_id)

    def _stage(self, slot: _Slot, feed: Feed) -> bool:
        """The host side of an instance on a free slot: its rows' source addresses (GPU arrays read in
        place; host rows copied into the slot's pinned buffer) and its scalar table. Returns whether
        host rows are to be uploaded. Raises :class:`BindingError` for a missing limb or a bad row."""
        layout = self.layout
        layout.check_feed(feed)
        host = False
        for key, g in layout.groups.items():
            a, limbs = feed.rows[key]
            src = layout.source_rows(key, limbs, g.limbs)
            if self._usable(a):
                slot.ptr_host[g.start:g.stop] = _addresses(a.data.ptr, src, a.strides[0])
                slot.keep.append(a)
                continue
            if is_device_array(a):  # another device or layout: through the host (slow, correct)
                a = a.get()
            a = check_host_rows(f"{key[0]} ({key[1]})", a, self.n)
            in_host, in_dev = slot.host_rows(self)
            out = in_host[g.start:g.stop]
            if a.dtype == np.uint32:
                np.take(a, src, axis=0, out=out)
            else:
                np.copyto(out, a[src], casting="unsafe")
            slot.ptr_host[g.start:g.stop] = _addresses(in_dev.data.ptr, np.arange(g.start, g.stop), self.row_bytes)
            host = True
        if slot.table_host is not None:
            slot.table_host[:] = layout.scalar_table(self.base_scalars, feed)
        return host

    def start(self, feed: Feed) -> _Slot:
        """Issue one instance on a free slot (waits for one); returns the slot as the ticket."""
        import cupy as cp

        from caramel.backends.cuda.device import on_device

        slot = self.free.get()
        t0 = time.perf_counter()
        try:
            host = self._stage(slot, feed)
        except BaseException:
            slot.keep = []
            self.free.put(slot)
            raise
        slot.stage_s = time.perf_counter() - t0
        k, ko, ev = len(self.layout), len(self.layout.out_rows), slot.events
        rt = cp.cuda.runtime
        with on_device(self.device_id):
            ev["up0"].record(self.up)
            if host:
                rt.memcpyAsync(slot.in_dev.data.ptr, slot.in_host.ctypes.data, slot.in_host.nbytes, _H2D, self.up.ptr)
            if k:
                rt.memcpyAsync(slot.ptr_dev.data.ptr, slot.ptr_host.ctypes.data, 8 * k, _H2D, self.up.ptr)
            if slot.table_host is not None:
                rt.memcpyAsync(slot.table_dev.data.ptr, slot.table_host.ctypes.data, slot.table_host.nbytes, _H2D,
                               self.up.ptr)
            ev["up1"].record(self.up)
            self.compute.wait_event(ev["up1"])
            if k:
                rt.memsetAsync(slot.max_dev.data.ptr, 0, 4 * k, self.compute.ptr)
                self._copy(slot.ptr_dev, self.dst, slot.max_dev, k)
            if slot.table_dev is not None:
                rt.memcpyAsync(self.table.data.ptr, slot.table_dev.data.ptr, slot.table_dev.nbytes, _D2D,
                               self.compute.ptr)
            ev["run0"].record(self.compute)
            self.graph.launch(self.compute)
            ev["run1"].record(self.compute)
            if ko:
                self._copy(self.out_src, slot.out_dst, slot.out_max, ko)
            ev["out"].record(self.compute)
            self.down.wait_event(ev["out"])
            ev["down0"].record(self.down)
            if ko:
                rt.memcpyAsync(slot.out_host.ctypes.data, slot.out_dev.data.ptr, ko * self.row_bytes, _D2H,
                               self.down.ptr)
            if k:
                rt.memcpyAsync(slot.max_host.ctypes.data, slot.max_dev.data.ptr, 4 * k, _D2H, self.down.ptr)
            ev["down1"].record(self.down)
        return slot

    def _copy(self, src, dst, maxima, rows: int) -> None:
        """``copy_rows`` over ``rows`` rows on the compute stream (in launches of at most
        :data:`COPY_ROWS_PER_LAUNCH` rows)."""
        n4 = self.n // 4
        grid_x = max(1, min(64, -(-n4 // COPY_THREADS)))
        with self.compute:
            for r0 in range(0, rows, COPY_ROWS_PER_LAUNCH):
                r1 = min(rows, r0 + COPY_ROWS_PER_LAUNCH)
                self.kernel((grid_x, r1 - r0), (COPY_THREADS,), (src[r0:r1], dst[r0:r1], np.int64(n4), maxima[r0:r1]))

    def finish(self, slot: _Slot) -> LaneOutput:
        """Wait for the instance of ``slot``; its outputs (host arrays it owns) and phase seconds."""
        import cupy as cp

        ev = slot.events
        ev["down1"].synchronize()
        ms = cp.cuda.get_elapsed_time
        timings = {"upload": slot.stage_s + ms(ev["up0"], ev["up1"]) / 1e3, "replay": ms(ev["run0"], ev["run1"]) / 1e3,
                   "download": ms(ev["down0"], ev["down1"]) / 1e3}
        k, ko = len(self.layout), len(self.layout.out_rows)
        problems = self.layout.range_problems(slot.max_host[:k]) if k else []
        out = np.array(slot.out_host[:ko])
        slot.keep = []
        self.free.put(slot)
        if problems:
            raise BindingError("bad input rows (found on the device):\n  " + "\n  ".join(problems))
        return LaneOutput(dict(zip(self.layout.out_mems, out)), timings)

    def close(self, failed: bool = False) -> None:
        """Drop the slots and the resident run (its graph first; :meth:`MultiGpuRun.close`)."""
        if self._closed:
            return
        self._closed = True
        from caramel.backends.cuda.device import on_device

        with on_device(self.device_id):
            if not failed:
                self.compute.synchronize()
                self.down.synchronize()
            self.slots = []
            self.run.close(failed)


__all__ = ["COPY_ROWS_SRC", "DEFAULT_DEPTH", "GpuRowLane", "lane_jobs"]
