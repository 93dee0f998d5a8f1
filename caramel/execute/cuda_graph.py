"""Plans on CUDA GPUs: the stream launcher, CUDA graph capture and replay, one GPU or G GPUs.

:class:`MultiGpuRun` holds a K-chip plan on G GPUs: per GPU the chip runner
(:class:`~caramel.execute.runner.DeviceRun`) over a :class:`~caramel.backends.cuda.backend.CupyBackend`
arena, driven by one host thread under the watchdog of :func:`~caramel.execute.drive.run_threads`,
collectives over NCCL (:mod:`caramel.execute.fabric.nccl`). Life of a run: the collectives are
derived and checked and the device programs built before any GPU work; every kernel the run loads is
compiled at once, in parallel (:mod:`caramel.execute.precompile`); one communicator per device
group (``ncclCommInitAll``; in process mode ``ncclCommInitRank`` with ids shared through a file,
:mod:`caramel.execute.distributed`); per GPU: the inputs uploaded once into rows that no kernel
writes (``keep_inputs``: a replay needs no restore), with several GPUs a dry run without
collectives (compiling and loading every kernel: nothing may do that while an NCCL kernel waits
for a peer), an eager run, a capture into ONE CUDA graph (thread-local mode); replays launch every
GPU's graph at once (a barrier lines the threads up); :meth:`MultiGpuRun.close` drops the graphs,
then destroys the communicators. A GPU that does not finish a phase in time makes the run abort
its communicators and raise a :class:`~caramel.errors.DeadlockError`. :class:`GpuRun` is the same
run of a 1-chip plan on the current GPU, eager (``per_row``: one launch per instruction with an
unfused plan, the baseline) or as a graph. :func:`run_gpu`, :func:`run_multi_gpu`,
:func:`gpu_executor` run them; a resident run serving many instances is
:class:`caramel.execute.gpu_pipeline.GpuRowLane`.

Streams. ``streams`` > 1 spreads a device's tasks over that many CUDA streams
(:meth:`DeviceRun.schedule <caramel.execute.runner.DeviceRun.schedule>`, :mod:`caramel.plan.streams`;
a row for every buffer where the memory allows, else rows reused first-in first-out: few or no hazards
between branches besides the data, :func:`~caramel.execute.placement.gpu_device_programs`): on a GPU
with communication each communication step (local sums, copies, NCCL group, ``% q``) goes on the last stream and the
kernels on the others, so that kernels run while a collective waits for its peers.
:class:`StreamLauncher` starts on the origin stream, records a *fork* event that every other
stream waits for, makes each task wait for the events of its cross-stream ``waits``, and at the
end joins every other stream back; captured, these become the edges of one graph with parallel
branches, and eager runs issue the same sequence, so both are bit-identical to one stream.
CuPy is imported lazily.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.execute.drive import run_threads
from caramel.execute.fabric.nccl import NcclFabric, nccl_communicators
from caramel.execute.memory import check_plan_memory, check_ranges
from caramel.execute.placement import device_groups, gpu_device_programs
from caramel.execute.precompile import precompile
from caramel.execute.result import RunResult, merge_results
from caramel.execute.runner import DeviceRun
from caramel.execute.timing import Timing
from caramel.plan.kernel import Kind, Plan
from caramel.plan.order import for_target
from caramel.program import Mem, Program
from caramel.ring import Context, Mode

if TYPE_CHECKING:
    from caramel.backends.cuda.config import KernelConfig

#: CUDA streams of a 1-chip graph by default (its kernel DAG spread over all of them).
GRAPH_STREAMS = 4
#: CUDA streams per GPU of a multi-GPU run by default: the kernels on two, the communication on the
#: third, so that kernels run while a collective waits for its peers (the choice and its figures:
#: docs/PERFORMANCE.md).
DEFAULT_STREAMS = 3


class StreamLauncher:
    """Issues the tasks of a :class:`~caramel.plan.streams.StreamSchedule` on CUDA streams: the
    ``origin`` stream (stream 0, where the run's earlier work is) and ``n_streams - 1`` new ones,
    with one event per waited-for task, all created now (on the current device, before any
    capture). ``comm_first``: the last stream (a device's communication) gets the device's greatest
    priority, so that its copies and NCCL kernels go before waiting kernels (eager runs; a graph keeps
    the nodes' priorities only when instantiated with ``cudaGraphInstantiateFlagUseNodePriority``)."""

    def __init__(self, schedule, origin, comm_first: bool = False):
        import cupy as cp

        self.schedule = schedule
        # cudaStreamCreateWithPriority clamps a priority beyond the device's range to its greatest (lowest number).
        last, top = schedule.n_streams - 1, -(1 << 20) if comm_first else None
        self.streams = [origin] + [cp.cuda.Stream(non_blocking=True, priority=top if s == last else None)
                                   for s in range(1, schedule.n_streams)]
        self.events = [cp.cuda.Event(disable_timing=True) for _ in range(schedule.n_events)]
        self.fork = cp.cuda.Event(disable_timing=True)

    def launch(self, issue: Callable[[int], None]) -> None:
        """Fork every used stream from the origin, then per task in order: its stream waits for
        the events of its ``waits``, ``issue(k)`` launches it with that stream current, and its
        event is recorded if anyone waits for it; finally the origin joins every other stream."""
        sch, streams, events = self.schedule, self.streams, self.events
        self.fork.record(streams[0])
        forked = [True] + [False] * (len(streams) - 1)
        for k, t in enumerate(sch.stream):
            s = streams[t]
            if not forked[t]:
                s.wait_event(self.fork)
                forked[t] = True
            for j in sch.waits[k]:
                s.wait_event(events[sch.event[j]])
            with s:
                issue(k)
            if sch.event[k] >= 0:
                events[sch.event[k]].record(s)
        for j in sch.joins:
            streams[0].wait_event(events[sch.event[j]])


def launch_device(run: DeviceRun, launcher: StreamLauncher | None, *, collectives: bool = True) -> None:
    """Issue one device's whole program: in order on the current stream (no ``launcher``), or over
    the launcher's streams; ``collectives`` as in :meth:`DeviceRun.run`."""
    if launcher is None:
        run.run(collectives=collectives)
    else:
        launcher.launch(lambda t: run.run_task(t, collectives=collectives))


class MultiGpuRun:
    """A plan resident on G GPUs (see the module docstring). ``gpus``: how many (default: one
    per chip, at most those present); ``hosted``: the devices (indices 0..G-1) that this process
    drives (default all; one in process mode, :mod:`caramel.execute.distributed`); ``device_ids``:
    the CUDA device of each hosted device (default 0, 1, ...); ``timeout``: the watchdog's limit in
    seconds for every phase; ``comms``: communicators to use (``{device: {group: communicator}}``,
    :func:`nccl_communicators`), which then stay open at :meth:`close` (destroy them after it);
    ``streams``: CUDA streams per GPU (module docstring); ``per_row``: every kernel row is its own
    launch (:class:`~caramel.execute.runner.DeviceRun`); ``reuse``: the arena rows' reuse
    (:func:`~caramel.execute.placement.gpu_device_programs`; None: by the streams and the memory free); ``kernels``:
    the CUDA kernels' settings (:class:`~caramel.backends.cuda.config.KernelConfig`; None: the defaults). A plan
    ordered for another target (``plan.target``) is re-ordered for the CUDA backend's
    (:func:`caramel.plan.order.for_target`)."""

    #: Whether the last stream of a device is kept for its communication steps (module docstring),
    #: and whether a capture may allocate (CuPy's relaxed mode) or is thread-local.
    comm_stream, relaxed_capture = True, False

    def __init__(self, plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                 gpus: int | None = None, *, hosted: Sequence[int] | None = None,
                 device_ids: Sequence[int] | None = None, timeout: float = 300.0,
                 comms: Mapping[int, Mapping] | None = None, streams: int | None = None, per_row: bool = False,
                 reuse: str | None = None, kernels: KernelConfig | None = None):
        import cupy as cp

        from caramel.backends.cuda.device import on_device
        from caramel.backends.cuda.backend import CupyBackend, available_bytes
        from caramel.backends.cuda.transfer import row_maxima

        plan = for_target(plan, CupyBackend.target)
        self.plan, self.ctx, self.mode, self.memory = plan, ctx, Mode(mode), memory
        self.timeout = timeout
        present = cp.cuda.runtime.getDeviceCount()
        g = min(gpus or present, len(plan.chips))
        self.hosted = list(hosted) if hosted is not None else list(range(g))
        ids = list(device_ids) if device_ids is not None else list(range(len(self.hosted)))
        if len(ids) < len(self.hosted) or any(not 0 <= i < present for i in ids):
            raise ExecutionError(f"{len(self.hosted)} GPU(s) asked for (CUDA devices {ids}); "
                                 f"this machine has {present}")
        # On one GPU (no communicator to leave waiting) the residues are scanned there, after the upload.
        deferred = check_plan_memory(plan, ctx, memory, defer_ranges=g == 1)
        streams = DEFAULT_STREAMS if streams is None else streams
        free = []  # what the arena of each hosted device may take (the rows' reuse depends on it)
        for i in ids[: len(self.hosted)]:
            with on_device(i):
                free.append(available_bytes()[0])
        # (checks the collectives)
        self.progs = gpu_device_programs(plan, g, ctx, streams, reuse=reuse, free_bytes=min(free))
        streams = int(streams)
        self.device_ids = dict(zip(self.hosted, ids))
        self._own_comms = comms is None  # communicators passed in stay open at close()
        if comms is None:
            if len(self.hosted) != len(self.progs):
                raise ExecutionError("a run driving some of the devices needs their communicators (comms=)")
            comms = nccl_communicators(device_groups(self.progs), [self.device_ids[d] for d in self.hosted])
        self.comms = comms
        n = len(self.progs)
        self.runs: list[DeviceRun | None] = [None] * n
        self.streams, self.graphs, self.launchers = [None] * n, [None] * n, [None] * n
        self._closed = False

        def setup(d: int):
            def go():
                with on_device(self.device_ids[d]):
                    stream = self.streams[d] = cp.cuda.Stream(non_blocking=True)
                    with stream:
                        run = DeviceRun(self.progs[d], plan, ctx, memory, self.mode,
                                        functools.partial(CupyBackend, kernels=kernels),
                                        NcclFabric(d, self.comms.get(d, {})), per_row=per_row)
                        self.runs[d] = run
                        run.init_data = None  # the inputs stay in their rows: no host copy to restore from
                        if deferred:  # the residues not scanned on the host: the uploaded rows' maxima
                            row_of = dict(zip(run.input_mems, run.init_rows))
                            maxima = row_maxima(run.backend.arena, [row_of[m] for m in deferred])
                            check_ranges(ctx, memory, deferred, maxima)
                        if self.gpus > 1:
                            # A dry run without collectives compiles and loads every kernel and uploads
                            # every index array now: loading a module or a synchronous copy while an
                            # NCCL kernel waits for a peer can deadlock the GPUs (as seen on H200s).
                            run.run(collectives=False)
                        if streams > 1:
                            sch = run.schedule(streams, comm_stream=self.comm_stream)
                            self.launchers[d] = StreamLauncher(sch, stream, comm_first=self.comm_stream)
                    stream.synchronize()
            return go

        with on_device(self.device_ids[self.hosted[0]]):  # every kernel compiled now, in parallel
            precompile([self.progs[d] for d in self.hosted], plan, ctx, [self.mode], kernels)
        self._each(setup, "setup")

    # ------------------------------------------------------------------ phases

    @property
    def gpus(self) -> int:
        return len(self.progs)

    def _each(self, make, phase: str) -> list:
        """Run ``make(d)()`` on one new thread per hosted GPU under the watchdog; results in
        ``self.hosted`` order."""
        def describe(i: int) -> str:
            run = self.runs[self.hosted[i]]
            return f"GPU {self.hosted[i]}, {phase}: " + (run.position if run is not None else "setting up")

        return run_threads([make(d) for d in self.hosted], self.timeout, lambda e: self.abort(), describe)

    def _on(self, d: int, body):
        from caramel.backends.cuda.device import on_device

        def go():
            with on_device(self.device_ids[d]), self.streams[d]:
                return body(d)
        return go

    def eager(self) -> None:
        """Every GPU runs its program once, kernel by kernel, and waits."""
        self.replay(1, graph=False)

    def capture(self) -> None:
        """Capture every GPU's program into one CUDA graph each (after an eager warm-up that
        compiles the kernels and warms the communicators up)."""
        if self.graphs[self.hosted[0]] is not None:
            return
        self.eager()
        import cupy as cp

        mode = None if self.relaxed_capture else getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", 1)

        def body(d):
            s = self.streams[d]
            s.begin_capture(mode)
            try:
                launch_device(self.runs[d], self.launchers[d])
            except BaseException:
                with contextlib.suppress(Exception):  # the capture's own error says only that it was invalidated
                    s.end_capture()
                raise
            self.graphs[d] = s.end_capture()
        self._each(lambda d: self._on(d, body), "capture")

    def replay(self, repeats: int = 1, *, graph: bool = True) -> list[list[float]]:
        """Launch every GPU's graph (``graph=False``: its program, eagerly) ``repeats`` times, all
        GPUs together; returns per repeat the milliseconds of each GPU (CUDA events around its launch)."""
        import cupy as cp

        if graph:
            self.capture()
        barrier = threading.Barrier(len(self.hosted))
        times = [[0.0] * self.gpus for _ in range(repeats)]

        def body(d):
            s = self.streams[d]
            for r in range(repeats):
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                s.synchronize()
                barrier.wait(self.timeout)
                start.record(s)
                if graph:
                    self.graphs[d].launch(s)
                else:
                    launch_device(self.runs[d], self.launchers[d])
                stop.record(s)
                stop.synchronize()
                times[r][d] = cp.cuda.get_elapsed_time(start, stop)
        self._each(lambda d: self._on(d, body), "replay" if graph else "eager run")
        return times

    def run(self, graph: bool = True) -> None:
        """One run on every GPU: a replay of the graphs (``graph``), or eagerly."""
        self.replay(1, graph=graph)

    def time(self, repeats: int = 10, warmup: int = 1, *, graph: bool = True) -> Timing:
        """Replay timing (``graph=False``: eager runs): per repeat the slowest hosted GPU's time
        (they finish together, being coupled by the collectives); median, min and max over ``repeats``."""
        if warmup:
            self.replay(warmup, graph=graph)
        return Timing.of([max(t) for t in self.replay(repeats, graph=graph)])

    def instrument(self) -> list[list[tuple[int, float, float]]]:
        """One eager run with a CUDA event after every call: per GPU, (call index, start ms,
        duration ms) from the GPU's first event (the GPUs start together at a barrier)."""
        import cupy as cp

        barrier = threading.Barrier(len(self.hosted))

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

    def rebind(self, memory: Mapping[Mem, np.ndarray], keep: frozenset[Mem] = frozenset()) -> None:
        """The inputs of another instance, written in place on every hosted GPU (:meth:`DeviceRun.rebind
        <caramel.execute.runner.DeviceRun.rebind>`; ``keep``: limbs already in place, checked with
        the first image), so that the graphs replay on them. The graphs and communicators stay."""
        check_plan_memory(self.plan, self.ctx, memory, kept=keep)

        def body(d):
            self.runs[d].rebind(memory, keep)
            self.streams[d].synchronize()
        self._each(lambda d: self._on(d, body), "rebind")
        self.memory = memory

    def result(self) -> RunResult:
        """The outputs of the last run, read back."""
        out = self._each(lambda d: self._on(d, lambda d: (self.progs[d].chips, self.runs[d].stores())), "read back")
        return merge_results(self.plan, self.memory, out)  # (chips of other processes: empty stores)

    def abort(self) -> None:
        """Abort every communicator: GPUs blocked in a collective return (with an error)."""
        for d in self.hosted:
            for comm in self.comms.get(d, {}).values():
                with contextlib.suppress(Exception):  # best effort: the run is failing already
                    comm.abort()

    def close(self, failed: bool = False) -> None:
        """Drop the graphs, then destroy the communicators (each in its GPU's thread): in this
        order, as ``ncclCommDestroy`` waits while a CUDA graph holding the communicator's work
        exists. ``failed`` (after an error): abort the communicators instead."""
        if self._closed:
            return
        self._closed = True
        if failed:
            self.abort()
            return
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
        self.close(failed=exc[0] is not None)


class GpuRun(MultiGpuRun):
    """A 1-chip plan resident on the current GPU: a :class:`MultiGpuRun` of one device whose
    kernels use every stream (``streams``, default one), launched eagerly or as one captured
    graph; ``per_row`` and ``reuse`` as there (``per_row`` with an unfused plan: one launch per limb-level
    instruction, the eager baseline). ``device`` is its :class:`~caramel.execute.runner.DeviceRun`."""

    comm_stream, relaxed_capture = False, True

    def __init__(self, plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                 *, per_row: bool = False, streams: int = 1, reuse: str | None = None,
                 kernels: KernelConfig | None = None):
        import cupy as cp

        if len(plan.chips) != 1:
            raise ExecutionError(f"GpuRun takes a 1-chip plan, not {len(plan.chips)} chips")
        if any(k.kind is Kind.COMM for k in plan.chips[0].kernels):
            raise ExecutionError("a 1-chip plan with communication kernels cannot run as a graph")
        super().__init__(plan, ctx, memory, mode, 1, device_ids=[cp.cuda.Device().id], streams=streams,
                         per_row=per_row, reuse=reuse, kernels=kernels)
        self.device, self.stream, self.backend = self.runs[0], self.streams[0], self.runs[0].backend
        self.kernels = len(self.device.calls)
        self.schedule = self.launchers[0].schedule if self.launchers[0] is not None else None


def _run_once(run: MultiGpuRun, graph: bool, repeats: int) -> RunResult:
    """One run (a graph replay or eager), ``repeats`` > 0 more timed, the result read back."""
    run.run(graph)
    timing = run.time(repeats, graph=graph) if repeats > 0 else None
    return replace(run.result(), timing=timing)


def run_multi_gpu(plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                  gpus: int | None = None, *, graph: bool = True, repeats: int = 0,
                  streams: int | None = None, kernels: KernelConfig | None = None) -> RunResult:
    """Run ``plan`` on ``gpus`` GPUs (:class:`MultiGpuRun`), as one CUDA graph per GPU (``graph``)
    or eagerly, on ``streams`` streams per GPU (default :data:`DEFAULT_STREAMS`); ``repeats`` > 0
    also times that many runs."""
    with MultiGpuRun(plan, ctx, memory, mode, gpus, streams=streams, kernels=kernels) as run:
        return _run_once(run, graph, repeats)


def _plan_of(plan_or_program, fuse: bool):
    """The plan of a program, built for the CUDA backend's target; a plan as it is."""
    from caramel.backends.cuda.target import CUDA_TARGET
    from caramel.plan import build_plan

    if isinstance(plan_or_program, Program):
        return build_plan(plan_or_program, fuse=fuse, target=CUDA_TARGET)
    return plan_or_program


def run_gpu(plan_or_program, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT, *,
            graph: bool = True, repeats: int = 0, per_row: bool | None = None, streams: int = 1,
            kernels: KernelConfig | None = None) -> RunResult:
    """Run on one GPU. ``graph=True``: the (fused) plan as one CUDA graph; ``graph=False``: eager,
    one launch per instruction (unfused plan, ``per_row``, default: when not ``graph``) when given
    a program. ``streams``: CUDA streams for a 1-chip plan (:class:`GpuRun`); a multi-chip plan runs
    all its chips on this GPU (:func:`run_multi_gpu`). ``repeats`` > 0: that many more runs timed."""
    plan = _plan_of(plan_or_program, fuse=graph)
    if len(plan.chips) != 1:
        return run_multi_gpu(plan, ctx, memory, mode, 1, graph=graph, repeats=repeats, kernels=kernels)
    if per_row is None:
        per_row = not graph and isinstance(plan_or_program, Program)
    return _run_once(GpuRun(plan, ctx, memory, mode, per_row=per_row, streams=streams, kernels=kernels), graph,
                     repeats)


def gpu_executor(program: Program, ctx: Context, mode: Mode | str, *, graph: bool = True,
                 streams: int = GRAPH_STREAMS, kernels: KernelConfig | None = None) -> Callable[[Mapping], RunResult]:
    """``memory -> RunResult`` running ``program`` on the GPU (the plan is built once) on
    ``streams`` CUDA streams."""
    plan = _plan_of(program, fuse=graph)
    return lambda memory: run_gpu(plan, ctx, memory, mode, graph=graph, streams=streams, kernels=kernels)


__all__ = ["DEFAULT_STREAMS", "GRAPH_STREAMS", "GpuRun", "MultiGpuRun", "StreamLauncher", "gpu_executor",
           "launch_device", "run_gpu", "run_multi_gpu"]
