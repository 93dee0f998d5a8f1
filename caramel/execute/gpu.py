"""Single-GPU execution of plans: eager launches or one CUDA graph per chip plan.

:func:`run_gpu` runs a program (or a built :class:`~caramel.plan.Plan`) on one CUDA device through
:class:`caramel.backends.cuda.backend.CupyBackend`. For a 1-chip plan the inputs are uploaded into
the arena once into rows that no kernel writes (``assign_rows(keep_inputs=True)``: 23% more rows
for BootstrapLike_51L), so replays are repeatable as they are, with nothing to restore (copying
its 4.9 GiB of inputs back by a scatter cost 7.5 ms of every 33.6 ms replay), an eager warm-up run through the plan
engine's lowered kernels compiles the kernels and uploads every index array, and then (``graph``)
the whole kernel sequence is captured into ONE CUDA graph on a non-default stream and replayed.
Multi-chip programs go to :mod:`caramel.execute.multi_gpu` (on one GPU here).

``streams`` > 1 runs the kernel DAG on that many CUDA streams (:mod:`caramel.plan.streams`): the
arena rows are assigned first-in first-out (``assign_rows(reuse="fifo")``, the same row count,
fewer reuse hazards between independent branches), :func:`~caramel.plan.streams.assign_streams`
puts every kernel on a stream, and :func:`~caramel.plan.streams.check_schedule` verifies it. A run
starts on the origin stream (``GpuRun.stream``, which is also stream 0) and
records a *fork* event that every other stream waits for before its first kernel; each kernel
waits for the events of its cross-stream ``waits``, launches on its stream, and records its
event when someone waits for it; at the end the origin stream waits for the last kernel of
every other stream (the *join*). Captured, these become the edges of one graph with parallel
branches; eager runs (``graph=False``) issue the same sequence, so both are bit-identical to
the single-stream run. Events are created once, before any capture.

``eager`` mode (``graph=False``) runs the unfused plan (``build_plan(program, fuse=False)``): one
launch per instruction, the baseline (single-stream unless ``streams`` says otherwise).
:class:`GpuRun` exposes the pieces and :meth:`GpuRun.time` times replays with CUDA events. CuPy is
imported lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from caramel.errors import ExecutionError
from caramel.execute.reference import RunResult
from caramel.program import Mem, Program
from caramel.ring import Context, Mode


def gpu_available() -> bool:
    """True when CuPy imports and sees a CUDA device."""
    from caramel.backends.cuda import available

    return available()


@dataclass
class Timing:
    """Milliseconds per run over ``repeats`` timed runs (after warm-up)."""

    median_ms: float
    min_ms: float
    max_ms: float
    repeats: int

    def __str__(self) -> str:
        return f"median {self.median_ms:.3f} ms, min {self.min_ms:.3f}, max {self.max_ms:.3f} ({self.repeats} runs)"


def time_runs(fn: Callable[[], None], stream, repeats: int = 10, warmup: int = 1) -> Timing:
    """Time ``fn`` (which launches work on ``stream``) with CUDA events, each run separately."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    stream.synchronize()
    times = []
    for _ in range(max(1, repeats)):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        fn()
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return Timing(float(np.median(times)), float(min(times)), float(max(times)), len(times))


class StreamLauncher:
    """Issues the tasks of a :class:`~caramel.plan.streams.StreamSchedule` on CUDA streams: the
    ``origin`` stream (stream 0, where the run's earlier work is) and ``n_streams - 1`` new ones,
    with one event per waited-for task, all created now (on the current device, before any
    capture)."""

    def __init__(self, schedule, origin):
        import cupy as cp

        self.schedule = schedule
        self.streams = [origin] + [cp.cuda.Stream(non_blocking=True) for _ in range(schedule.n_streams - 1)]
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


class GpuRun:
    """One 1-chip plan resident on the GPU: arena, lowered kernels, optional CUDA graph."""

    def __init__(self, plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                 *, per_row: bool = False, streams: int = 1):
        """``per_row``: lower every kernel row as its own launch (with an unfused plan, one launch
        per limb-level instruction: the eager baseline; the rows of one kernel stay on its stream).
        ``streams``: how many CUDA streams the kernel DAG is spread over (module docstring)."""
        import cupy as cp

        from caramel.backends.cuda.backend import CupyBackend
        from caramel.execute.plan_engine import ChipRun, check_plan_memory
        from caramel.plan.plan import Kind

        streams = int(streams)
        if streams < 1:
            raise ValueError(f"streams must be at least 1, got {streams}")
        if len(plan.chips) != 1:
            raise ExecutionError(f"GpuRun takes a 1-chip plan, not {len(plan.chips)} chips")
        chip = plan.chips[0]
        if any(k.kind is Kind.COMM for k in chip.kernels):
            raise ExecutionError("a 1-chip plan with communication kernels cannot run as a graph")
        self.plan, self.ctx, self.mode = plan, ctx, Mode(mode)
        check_plan_memory(plan, ctx, memory)
        self.memory = memory
        self.stream = cp.cuda.Stream(non_blocking=True)
        with self.stream:
            # (several streams: rows reused first-in first-out, fewer hazards between branches)
            # inputs keep their rows (no kernel overwrites them), so replays need no restore
            self.chip = ChipRun(chip, ctx, memory, self.mode, CupyBackend, reuse="fifo" if streams > 1 else "lifo",
                                keep_inputs=True)
            if per_row:
                import dataclasses

                from caramel.execute.plan_engine import lower_kernel

                self.chip.calls = [lower_kernel(dataclasses.replace(k, rows=(r,)), self.chip.rows_of, ctx, self.mode)
                                   for k in chip.kernels for r in k.rows]
        self.stream.synchronize()
        self.graph = None
        self.kernels = sum(1 for c in self.chip.calls if c is not None)
        self.schedule = None
        if streams > 1:
            from caramel.plan.streams import assign_streams, check_schedule, chip_tasks

            tasks = chip_tasks(chip, self.chip.rows_of)
            self.schedule = assign_streams(tasks, streams)
            check_schedule(tasks, self.schedule, what=f"stream schedule of chip {chip.chip}")
            # the calls of each kernel (several with per_row), in plan order
            self._calls_of = [[] for _ in chip.kernels]
            owners = ([k for k, kernel in enumerate(chip.kernels) for _ in kernel.rows] if per_row
                      else range(len(chip.kernels)))
            for k, call in zip(owners, self.chip.calls):
                self._calls_of[k].append(call)
            self._launcher = StreamLauncher(self.schedule, self.stream)

    @property
    def backend(self):
        return self.chip.backend

    def _launch(self) -> None:
        """Launch every kernel: all on the run's stream, or (with a schedule) fork, every kernel
        on its stream after its waits, join (module docstring)."""
        b = self.backend
        if self.schedule is None:
            with self.stream:
                for call in self.chip.calls:
                    call(b)
            return
        calls_of = self._calls_of

        def issue(k: int) -> None:
            for call in calls_of[k]:
                call(b)
        self._launcher.launch(issue)

    def eager(self) -> None:
        """Launch every kernel once (no synchronisation; the work ends on the run's stream)."""
        self._launch()

    def capture(self):
        """Capture the whole kernel sequence into one CUDA graph (after an eager warm-up, which
        uses the same streams, so that every cache and memory pool is filled before capture)."""
        if self.graph is None:
            self.eager()  # compiles kernels, uploads index arrays, fills the caches
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                self._launch()
            finally:
                graph = self.stream.end_capture()
            self.graph = graph
        return self.graph

    def replay(self) -> None:
        """Launch the captured graph (no synchronisation)."""
        self.capture().launch(self.stream)

    def run(self, graph: bool = True) -> None:
        (self.replay if graph else self.eager)()
        self.stream.synchronize()

    def time(self, graph: bool = True, repeats: int = 10, warmup: int = 1) -> Timing:
        if graph:
            self.capture()
        return time_runs(self.replay if graph else self.eager, self.stream, repeats, warmup)

    def result(self) -> RunResult:
        """The outputs of the last run, read back, as a :class:`RunResult`."""
        self.stream.synchronize()
        return RunResult.from_stores([self.chip.stores()], self.memory, self.plan.instructions)


def _plan_of(plan_or_program, fuse: bool):
    from caramel.plan import build_plan

    if isinstance(plan_or_program, Program):
        return build_plan(plan_or_program, fuse=fuse)
    return plan_or_program


def run_gpu(
    plan_or_program,
    ctx: Context,
    memory: Mapping[Mem, np.ndarray],
    mode: Mode | str = Mode.EXACT,
    *,
    graph: bool = True,
    repeats: int = 0,
    per_row: bool | None = None,
    streams: int = 1,
) -> RunResult:
    """Run on one GPU. ``graph=True``: the (fused) plan as one CUDA graph; ``graph=False``: eager,
    one launch per instruction (unfused plan, ``per_row``, default: when not ``graph``) when given
    a program. ``streams``: CUDA streams for a 1-chip plan (:class:`GpuRun`). A multi-chip plan
    runs all its chips on this one GPU (:func:`~caramel.execute.multi_gpu.run_multi_gpu` with
    one device: chips merged by level, communication as local copies and sums). ``repeats`` > 0 replays that many extra
    times (and attaches ``timing`` to the result)."""
    plan = _plan_of(plan_or_program, fuse=graph)
    if len(plan.chips) != 1:
        from caramel.execute.multi_gpu import run_multi_gpu

        return run_multi_gpu(plan, ctx, memory, mode, 1, graph=graph, repeats=repeats)
    if per_row is None:
        per_row = not graph and isinstance(plan_or_program, Program)
    run = GpuRun(plan, ctx, memory, mode, per_row=per_row, streams=streams)
    run.run(graph)
    timing = run.time(graph, repeats) if repeats > 0 else None
    result = run.result()
    if timing is not None:
        result.timing = timing  # type: ignore[attr-defined]
    return result


#: CUDA streams of a 1-chip graph by default (1.05x at N = 65536, 1.4x at N = 4096 on BootstrapLike_51L_1c).
DEFAULT_STREAMS = 4


def gpu_executor(program: Program, ctx: Context, mode: Mode | str, *, graph: bool = True,
                 streams: int = DEFAULT_STREAMS) -> Callable[[Mapping], RunResult]:
    """``memory -> RunResult`` running ``program`` on the GPU (the plan is built once) on
    ``streams`` CUDA streams."""
    plan = _plan_of(program, fuse=graph)
    return lambda memory: run_gpu(plan, ctx, memory, mode, graph=graph, streams=streams)


__all__ = ["GpuRun", "StreamLauncher", "Timing", "gpu_available", "gpu_executor", "run_gpu", "time_runs"]
