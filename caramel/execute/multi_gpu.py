"""A K-chip plan on G CUDA devices: NCCL collectives, one host thread and one CUDA graph per GPU.

Each GPU runs its :class:`~caramel.execute.devices.DeviceProgram` (its chips merged by level,
:mod:`caramel.execute.devices`) over a :class:`~caramel.backends.cuda.backend.CupyBackend` arena.
Communication goes through :class:`NcclFabric`: every communication step of a device is ONE
``ncclGroupStart``/``ncclGroupEnd`` holding its broadcasts (``dis``/``rcv``) and uint32 SUM
reduces (``joi``, followed by a ``% q`` kernel) in the global order of
:mod:`caramel.execute.collectives`; communication among chips of one GPU is local copies and sums.

Life of a run (:class:`MultiGpuRun`):

1. the collectives are derived and checked, and the device programs built, before any GPU work;
2. ``NCCL_NVLS_ENABLE=0`` is set (NVLink multicast stays off) and one communicator per device
   group is created from the main thread (``ncclCommInitAll``; in process mode
   ``ncclCommInitRank`` with ids shared through a file, :mod:`caramel.execute.distributed`);
3. one host thread per GPU (a new one per phase, all concurrent) uploads the inputs (into rows no
   kernel overwrites, ``keep_inputs``, so replays need no restore), runs the program once without
   collectives (compiling and loading every kernel, uploading every index array: nothing may do
   that while an NCCL kernel waits for a peer), then eagerly with them (warming every
   communicator up), then captures it in thread-local capture mode into one CUDA graph;
4. replays launch every GPU's graph at once (a barrier lines the threads up) and wait;
5. :meth:`MultiGpuRun.close` drops the graphs, then destroys the communicators, each in its
   GPU's thread.

Streams (``streams`` = S, default :data:`~caramel.execute.devices.DEFAULT_STREAMS`): with S = 1 a
GPU runs its kernels and communication steps in one order on one stream; with S > 1 each
communication step (its local sums, copies, NCCL group and ``% q``) goes on stream S - 1 and the
kernels on the others (:meth:`DeviceRun.schedule <caramel.execute.devices.DeviceRun.schedule>`,
rows reused first-in first-out), joined by events on the arena rows they share
(:mod:`caramel.plan.streams`), so that kernels run while a collective waits for its peers.

Every phase runs under the watchdog of :func:`~caramel.execute.devices.run_threads`: a GPU that
does not finish in time makes the run abort its communicators (unblocking every GPU) and raise a
:class:`~caramel.errors.DeadlockError` naming the unfinished GPUs and their position.
"""

from __future__ import annotations

import os
import threading
from typing import Mapping, Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.execute.collectives import CollectiveKind
from caramel.execute.devices import (
    DEFAULT_STREAMS, DeviceProgram, DeviceRun, Fabric, RowOp, device_groups, device_programs, merge_results, run_threads,
)
from caramel.execute.gpu import StreamLauncher, Timing
from caramel.execute.plan_engine import check_plan_memory
from caramel.execute.reference import RunResult
from caramel.plan.plan import Plan
from caramel.program import Mem
from caramel.ring import Context, Mode


def nccl_environment() -> None:
    """Keep NVLink multicast (NVLS) off in NCCL unless the caller chose otherwise, and load CUDA
    modules eagerly (lazy loading during an NCCL kernel can deadlock; effective only before the
    process's first CUDA context)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")


class NcclFabric(Fabric):
    """One GPU's collectives over NCCL communicators: ``comms[group]`` is this GPU's
    communicator of that device group (its rank is its position in the group).

    ``payload_limit`` (class attribute, default None) caps every call at that many uint32: only
    for timing experiments that separate synchronisation from bandwidth
    (``scripts/gpu_multi_bench.py --sync-only``); the results are then wrong."""

    payload_limit: int | None = None

    def __init__(self, device: int, comms: Mapping[tuple[int, ...], object]):
        self.device, self.comms = device, dict(comms)

    def group(self, backend, ops: Sequence[RowOp]) -> None:
        import cupy as cp
        from cupy.cuda import nccl

        stream = cp.cuda.get_current_stream().ptr
        arena = backend.arena
        n = arena.shape[1]
        base, width = arena.data.ptr, n * 4
        nccl.groupStart()
        try:
            for op in ops:
                comm = self.comms[op.group]
                root = op.group.index(op.root)
                count = n * op.rows if self.payload_limit is None else min(n * op.rows, self.payload_limit)
                if op.kind is CollectiveKind.BROADCAST:
                    ptr = base + (op.send if op.send >= 0 else op.recv) * width
                    comm.broadcast(ptr, ptr, count, nccl.NCCL_UINT32, root, stream)
                else:
                    send = base + op.send * width
                    recv = base + op.recv * width if op.recv >= 0 else send
                    comm.reduce(send, recv, count, nccl.NCCL_UINT32, nccl.NCCL_SUM, root, stream)
        finally:
            nccl.groupEnd()

    def close(self) -> None:
        for comm in self.comms.values():
            comm.destroy()
        self.comms.clear()


def gpu_device_programs(plan: Plan, gpus: int, ctx: Context, streams: int) -> list[DeviceProgram]:
    """The device programs as the GPUs run them (collectives checked first): inputs in rows that
    no kernel overwrites, so replays need no restore; with several streams, rows reused first-in
    first-out (fewer hazards between streams)."""
    return device_programs(plan, gpus, ctx.primes, ctx.n, reuse="fifo" if streams > 1 else "lifo", keep_inputs=True)


def launch_device(run: DeviceRun, launcher: StreamLauncher | None, *, collectives: bool = True) -> None:
    """Issue one device's whole program: in order on the current stream (no ``launcher``), or over
    the launcher's streams; ``collectives`` as in :meth:`DeviceRun.run`."""
    if launcher is None:
        run.run(collectives=collectives)
    else:
        launcher.launch(lambda t: run.run_task(t, collectives=collectives))


def nccl_communicators(groups: Sequence[tuple[int, ...]], devices: Sequence[int]) -> dict[int, dict]:
    """``{device: {group: communicator}}`` for one process driving ``devices`` (device index ->
    CUDA device id), one ``ncclCommInitAll`` per group."""
    out: dict[int, dict] = {d: {} for d in range(len(devices))}
    if not groups:
        return out
    from cupy.cuda import nccl

    nccl_environment()
    for g in groups:
        comms = nccl.NcclCommunicator.initAll([devices[d] for d in g])
        for d, comm in zip(g, comms):
            out[d][g] = comm
    return out


class MultiGpuRun:
    """A plan resident on G GPUs (see the module docstring). ``gpus``: how many (default: one
    per chip); ``local``: the devices (indices 0..G-1) that this process drives (default all; one
    in process mode, :mod:`caramel.execute.distributed`); ``device_ids``: the CUDA device of each
    local device (default 0, 1, ...); ``timeout``: the watchdog's limit in seconds for every
    phase; ``comms``: communicators to use (``{device: {group: communicator}}``,
    :func:`nccl_communicators`), which then stay open at :meth:`close` (destroy them after it);
    ``streams``: CUDA streams per GPU (module docstring)."""

    def __init__(self, plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                 gpus: int | None = None, *, local: Sequence[int] | None = None,
                 device_ids: Sequence[int] | None = None, timeout: float = 300.0,
                 comms: Mapping[int, Mapping] | None = None, streams: int | None = None):
        import cupy as cp

        from caramel.backends.cuda.backend import CupyBackend

        self.plan, self.ctx, self.mode, self.memory = plan, ctx, Mode(mode), memory
        self.timeout = timeout
        present = cp.cuda.runtime.getDeviceCount()
        g = min(gpus or len(plan.chips), len(plan.chips))
        self.local = list(local) if local is not None else list(range(g))
        ids = list(device_ids) if device_ids is not None else list(range(len(self.local)))
        if len(ids) < len(self.local) or any(not 0 <= i < present for i in ids):
            raise ExecutionError(f"{len(self.local)} GPU(s) asked for (CUDA devices {ids}); "
                                 f"this machine has {present}")
        check_plan_memory(plan, ctx, memory)
        streams = DEFAULT_STREAMS if streams is None else int(streams)
        if streams < 1:
            raise ValueError(f"streams must be at least 1, got {streams}")
        self.progs = gpu_device_programs(plan, g, ctx, streams)  # checks the collectives first
        self.device_ids = dict(zip(self.local, ids))
        self.groups = device_groups(self.progs)
        self._own_comms = comms is None  # communicators passed in stay open at close()
        if comms is None:
            if len(self.local) != len(self.progs):
                raise ExecutionError("a run driving some of the devices needs their communicators (comms=)")
            comms = nccl_communicators(self.groups, [self.device_ids[d] for d in self.local])
        self.comms = comms
        self.runs: list[DeviceRun | None] = [None] * len(self.progs)
        self.streams: list = [None] * len(self.progs)
        self.graphs: list = [None] * len(self.progs)
        self.launchers: list = [None] * len(self.progs)
        self._closed = False

        def setup(d: int):
            def go():
                with cp.cuda.Device(self.device_ids[d]):
                    stream = self.streams[d] = cp.cuda.Stream(non_blocking=True)
                    with stream:
                        run = DeviceRun(self.progs[d], plan, ctx, memory, self.mode, CupyBackend,
                                        NcclFabric(d, self.comms.get(d, {})))
                        self.runs[d] = run
                        run.init_data = None  # the inputs stay in their rows: no host copy to restore from
                        # A dry run without collectives compiles and loads every kernel and uploads
                        # every index array now: loading a module or a synchronous copy while an
                        # NCCL kernel waits for a peer can deadlock the GPUs (as seen on H200s).
                        run.run(collectives=False)
                        if streams > 1:
                            self.launchers[d] = StreamLauncher(run.schedule(streams), stream)
                    stream.synchronize()
            return go

        self._each(setup, "setup")

    # ------------------------------------------------------------------ phases

    @property
    def gpus(self) -> int:
        return len(self.progs)

    def _each(self, make, phase: str) -> list:
        """Run ``make(d)()`` on one new thread per local GPU under the watchdog; results in
        ``self.local`` order."""
        def describe(i: int) -> str:
            run = self.runs[self.local[i]]
            return f"GPU {self.local[i]}, {phase}: " + (run.position if run is not None else "setting up")

        return run_threads([make(d) for d in self.local], self.timeout, lambda e: self.abort(), describe)

    def _launch(self, d: int) -> None:
        launch_device(self.runs[d], self.launchers[d])

    def _on(self, d: int, body):
        import cupy as cp

        def go():
            with cp.cuda.Device(self.device_ids[d]), self.streams[d]:
                return body(d)
        return go

    def eager(self) -> None:
        """Every GPU runs its program once, kernel by kernel, and waits."""
        def body(d):
            self._launch(d)
            self.streams[d].synchronize()
        self._each(lambda d: self._on(d, body), "eager run")

    def capture(self) -> None:
        """Capture every GPU's program into one CUDA graph each (after an eager warm-up that
        compiles the kernels and warms the communicators up)."""
        if self.graphs[self.local[0]] is not None:
            return
        self.eager()
        import cupy as cp

        mode = getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", 1)

        def body(d):
            s = self.streams[d]
            s.begin_capture(mode)
            try:
                self._launch(d)
            finally:
                self.graphs[d] = s.end_capture()
        self._each(lambda d: self._on(d, body), "capture")

    def replay(self, repeats: int = 1) -> list[list[float]]:
        """Launch every GPU's graph ``repeats`` times, all GPUs together; returns per repeat the
        milliseconds of each GPU (CUDA events around its launch)."""
        import cupy as cp

        self.capture()
        barrier = threading.Barrier(len(self.local))
        times = [[0.0] * self.gpus for _ in range(repeats)]

        def body(d):
            s = self.streams[d]
            for r in range(repeats):
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                s.synchronize()
                barrier.wait(self.timeout)
                start.record(s)
                self.graphs[d].launch(s)
                stop.record(s)
                stop.synchronize()
                times[r][d] = cp.cuda.get_elapsed_time(start, stop)
        self._each(lambda d: self._on(d, body), "replay")
        return times

    def time(self, repeats: int = 10, warmup: int = 1) -> Timing:
        """Replay timing: per repeat the slowest local GPU's time (they finish together, being
        coupled by the collectives); median, min and max over ``repeats``."""
        if warmup:
            self.replay(warmup)
        per = [max(t) for t in self.replay(repeats)]
        return Timing(float(np.median(per)), float(min(per)), float(max(per)), len(per))

    def instrument(self) -> list[list[tuple[int, float, float]]]:
        """One eager run with a CUDA event after every call: per GPU, (call index, start ms,
        duration ms) from the GPU's first event (the GPUs start together at a barrier)."""
        import cupy as cp

        barrier = threading.Barrier(len(self.local))

        def body(d):
            s = self.streams[d]
            events = []

            def mark(i):
                e = cp.cuda.Event()
                e.record(s)
                events.append(e)
            s.synchronize()
            barrier.wait(self.timeout)
            origin = cp.cuda.Event()
            origin.record(s)
            self.runs[d].run(mark)
            s.synchronize()
            ends = [cp.cuda.get_elapsed_time(origin, e) for e in events]
            starts = [0.0] + ends[:-1]
            return [(i, a, b - a) for i, (a, b) in enumerate(zip(starts, ends))]
        return self._each(lambda d: self._on(d, body), "instrumented run")

    def result(self) -> RunResult:
        """The outputs of the last run, read back."""
        out = self._each(lambda d: self._on(d, lambda d: (self.progs[d].chips, self.runs[d].stores())), "read back")
        return merge_results(self.plan, self.memory, out)  # (chips of other processes: empty stores)

    def abort(self) -> None:
        """Abort every communicator: GPUs blocked in a collective return (with an error)."""
        for d in self.local:
            for comm in self.comms.get(d, {}).values():
                try:
                    comm.abort()
                except Exception:  # noqa: BLE001
                    pass

    def close(self) -> None:
        """Drop the graphs, then destroy the communicators (each in its GPU's thread). The order
        matters: ``ncclCommDestroy`` waits while a CUDA graph holding the communicator's work
        exists (seen on H200s with NCCL 2.28.9: a process that destroyed its communicator before
        its graph never exited)."""
        if self._closed:
            return
        self._closed = True
        self.graphs = [None] * self.gpus

        def body(d):
            self.streams[d].synchronize()
            run = self.runs[d]
            if run is not None and self._own_comms:
                run.fabric.close()
        try:
            self._each(lambda d: self._on(d, body), "shutdown")
        finally:
            self.comms = {}

    def __enter__(self) -> "MultiGpuRun":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is not None:
            self.abort()
            self._closed = True
            return
        self.close()


def run_multi_gpu(plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                  gpus: int | None = None, *, graph: bool = True, repeats: int = 0,
                  streams: int | None = None) -> RunResult:
    """Run ``plan`` on ``gpus`` GPUs (default one per chip, at most those present), as one CUDA
    graph per GPU (``graph``) or eagerly, on ``streams`` streams per GPU (default
    :data:`DEFAULT_STREAMS`); ``repeats`` > 0 also times that many replays."""
    if gpus is None:
        import cupy as cp

        gpus = min(len(plan.chips), cp.cuda.runtime.getDeviceCount())
    with MultiGpuRun(plan, ctx, memory, mode, gpus, streams=streams) as run:
        if graph:
            run.replay(1)
        else:
            run.eager()
        timing = run.time(repeats) if repeats > 0 else None
        result = run.result()
    if timing is not None:
        result.timing = timing  # type: ignore[attr-defined]
    return result


__all__ = ["MultiGpuRun", "NcclFabric", "gpu_device_programs", "launch_device", "nccl_communicators", "nccl_environment", "run_multi_gpu"]
