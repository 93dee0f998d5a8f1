"""``caramel profile FAMILY --gpus 1,2,4,8``: one program family compiled for 1, 2, 4 and 8 chips,
each run on as many devices; a table, a PNG plot of the scaling curve and a Chrome trace, with the
timeline model's prediction (:mod:`caramel.timeline`) beside every measured replay.

For every G: the G-chip program runs on G devices (``gpu``: :class:`~caramel.execute.cuda_graph.MultiGpuRun`,
one CUDA graph per GPU, timed with CUDA events, the slowest GPU per replay; ``cpu-plan``: the
same device programs on NumPy in host threads over the fake fabric, wall clock, which checks the
machinery but shows no speedup). Then one instrumented eager run records every call per device,
for the trace. The busiest device's time splits into compute and communication: on the GPU,
compute is its program replayed as a graph without collectives (:func:`device_profiles`) and
communication the replay minus that; on the CPU, the instrumented run's collectives (including
waiting for peers). Speedup = t(1) / t(G), efficiency = speedup / G; both need a one-device run (``--gpus 2,4``
alone shows times and no speedup).

The prediction: on the GPU, each device's program alone on the current GPU (one after another, no
collectives): its kernels timed one by one (clock stamps in a one-stream graph) and its floor on the
run's streams (the compute sharing of :func:`caramel.timeline.simulate` fitted to it); the collectives
priced by :data:`caramel.timeline.FIRST_FIT`. So a G larger than the GPUs present (or every G with
``predict_only``) still gets its prediction and its devices' floors, and no replay: it is marked as a
prediction, never as a measurement. On ``cpu-plan`` the prediction is for an H200 from the kernel cost
estimates (:func:`caramel.plan.cost.estimate_us`), beside a wall clock it does not predict.

A family is a path prefix: ``programs/Mul_10L`` names ``programs/Mul_10L_<G>c``; an archive
``BootstrapLike_51L.tar.xz`` names its members ``BootstrapLike_51L_<G>c``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from caramel.errors import CaramelError
from caramel.logs import nvtx_range, progress
from caramel.ring import Context, Mode


@dataclass
class ScalingPoint:
    """One G: the G-chip program on G devices. The measured fields are None where the G-device run did not
    run (fewer devices present, or ``predict_only``); the ``predicted_*`` ones are the timeline model's."""

    program: str
    gpus: int
    replay_ms: float | None  # the median replay
    min_ms: float | None
    max_ms: float | None
    repeats: int
    collectives: int  # the most collective calls that one device issues
    bytes: int  # sent by all devices (N residues of 4 bytes per limb)
    compute_floor_ms: float | None  # busiest device (see the module docstring)
    comm_wait_ms: float | None  # the replay minus that: communication and waiting
    digest: str = ""
    setup_s: float = 0.0
    predicted_ms: float | None = None
    predicted_floor_ms: float | None = None
    predicted_comm_wait_ms: float | None = None
    prediction: str = ""  # what the prediction was made from

    @property
    def measured(self) -> bool:
        return self.replay_ms is not None

    # The names of the table's columns before the model (scripts and reports use them).
    median_ms = property(lambda self: self.replay_ms)
    compute_ms = property(lambda self: self.compute_floor_ms)
    comm_ms = property(lambda self: self.comm_wait_ms)
    comm_bytes = property(lambda self: self.bytes)


@dataclass
class ScalingResult:
    family: str
    n: int
    mode: str
    backend: str
    device: str
    clock: str
    date: str
    points: list[ScalingPoint]
    #: (G, device, label, comm, start ms, dur ms, stream, collectives): ``stream`` the call's stream
    #: in the device's schedule, ``collectives`` the (level, id) keys of a group call (else ()).
    trace: list[tuple] = field(default_factory=list)
    throughput: list = field(default_factory=list)  # caramel.batch.ThroughputPoint per G (--throughput)

    def speedup(self, p: ScalingPoint) -> float | None:
        """Measured speedup t(1) / t(G) (None: ``p`` not measured, or no one-device run measured: a speedup over
        G0 > 1 devices would assume G0 of them scale perfectly)."""
        base = next((q for q in self.points if q.measured and q.gpus == 1 and q.replay_ms), None)
        if base is None or not p.measured or not p.replay_ms:
            return None
        return base.replay_ms / p.replay_ms

    def predicted_speedup(self, p: ScalingPoint) -> float | None:
        """The model's speedup over its own prediction for one device (a prediction; None without one)."""
        base = next((q for q in self.points if q.predicted_ms and q.gpus == 1), None)
        if base is None or not p.predicted_ms:
            return None
        return base.predicted_ms / p.predicted_ms


def family_member(family: str, chips: int) -> str:
    """The program of ``family`` compiled for ``chips`` chips (see the module docstring)."""
    path = Path(family.split("#")[0])
    if path.name.endswith((".tar.xz", ".tar.gz", ".tgz")):
        stem = path.name.split(".tar")[0].removesuffix(".tgz")
        return f"{path}#{stem}_{chips}c"
    return f"{family.rstrip('/')}_{chips}c"


def render_scaling(result: ScalingResult) -> str:
    from caramel.profile import _table, words

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    devices = words(result.backend).devices
    head = (devices, "program", "median ms", "min ms", "max ms", "speedup", "efficiency", "predicted ms",
            "MiB sent", "collectives", "compute ms", "comm ms")
    rows = []
    for p in result.points:
        s = result.speedup(p)
        rows.append((str(p.gpus), p.program + ("" if p.measured else " (not run)"), ms(p.replay_ms), ms(p.min_ms),
                     ms(p.max_ms), "-" if s is None else f"{s:.2f}x", "-" if s is None else f"{s / p.gpus:.0%}",
                     ms(p.predicted_ms), f"{p.bytes / 2**20:.1f}", str(p.collectives),
                     ms(p.compute_floor_ms if p.compute_floor_ms is not None else p.predicted_floor_ms),
                     ms(p.comm_wait_ms if p.comm_wait_ms is not None else p.predicted_comm_wait_ms)))
    title = (f"{result.family}: N = {result.n}, mode {result.mode}, backend {result.backend} ({result.device}), "
             f"{result.clock}, {result.date}")
    notes = ("compute ms: " + ("the busiest device's program replayed as a graph without its collectives; comm ms: "
                               "the replay minus that (communication and waiting)" if result.backend == "gpu" else
                               "the busiest device in one instrumented run; comm ms: its collectives, including "
                               "waiting for its peers") + "; collectives: the most calls that one device issues")
    lines = [title, "", _table(head, rows), "", notes]
    predicted = [p for p in result.points if p.predicted_ms is not None]
    if predicted:
        lines.append("predicted ms: a PREDICTION of the timeline model (caramel.timeline), not a measurement; "
                     f"{predicted[0].prediction}")
        if any(not p.measured for p in result.points):
            lines.append("rows marked (not run): no replay on that many devices here; their compute ms and comm ms "
                         "are the model's" + (" (the floors are measured, each device alone on this GPU)"
                                              if result.backend == "gpu" else ""))
    if result.throughput:  # program-level parallelism: the 1-chip program, one instance per device
        trows = [(str(t.gpus), t.program, str(t.instances), f"{t.wall_s:.3f}", f"{t.per_second:.2f}",
                  "-" if t.speedup is None else f"{t.speedup:.2f}x",
                  "-" if t.efficiency is None else f"{t.efficiency:.0%}") for t in result.throughput]
        lines += ["", "throughput (the 1-chip program, one instance per device at a time; runs only):",
                  _table((devices, "program", "instances", "wall s", "instances/s", "speedup", "efficiency"), trows)]
    return "\n".join(lines)


#: Formats :func:`plot_scaling` writes, by file extension.
PLOT_FORMATS = {".png": "png", ".pdf": "pdf", ".svg": "svg"}


def plot_format(path) -> str:
    """The matplotlib format of ``path`` from its extension (PNG, PDF, SVG); others are errors."""
    fmt = PLOT_FORMATS.get(Path(path).suffix.lower())
    if fmt is None:
        raise CaramelError(f"plot {path}: the file name must end in {', '.join(PLOT_FORMATS)}")
    return fmt


def bar_split(p: ScalingPoint) -> tuple[float, float]:
    """(compute, communication) of the busiest device, scaled so that they add up to the replay's
    median: the proportion compute : communication as measured (see the module docstring),
    applied to the replay time it explains (a point not measured: (0, 0))."""
    if not p.measured:
        return 0.0, 0.0
    total = (p.compute_floor_ms or 0.0) + (p.comm_wait_ms or 0.0)
    if total <= 0:
        return p.replay_ms, 0.0
    compute = p.replay_ms * p.compute_floor_ms / total
    return compute, p.replay_ms - compute


def plot_scaling(result: ScalingResult, path, targets: Sequence[tuple[int, float]] = ()) -> None:
    """Save the scaling curve to ``path`` (PNG, PDF or SVG by extension; :func:`plot_writer`)."""
    from caramel.outfiles import write_atomic

    write_atomic(path, plot_writer(result, path, targets), "plot")


def plot_writer(result: ScalingResult, path, targets: Sequence[tuple[int, float]] = ()):
    """A function that writes the scaling curve into an open binary file in the format of ``path``'s
    extension (PNG, PDF or SVG), for :func:`caramel.outfiles.write_output`. Drawn with matplotlib's
    object API (a :class:`~matplotlib.figure.Figure`, never the global backend): left, the replay time
    per device count as stacked compute + communication bars that add up to the replay (median, with
    its min-max range; none where not measured) and the timeline model's prediction as open markers;
    right, the speedup on log2 axes, where the ideal line (speedup = G) is straight, measured and
    predicted (dashed). ``targets``: optional (G, speedup) points drawn as a target line."""
    fmt = plot_format(path)
    from matplotlib.figure import Figure

    g = [p.gpus for p in result.points]
    fig = Figure(figsize=(10, 4), layout="constrained")
    a, b = fig.subplots(1, 2)
    x = np.arange(len(g))
    split = [bar_split(p) for p in result.points]
    a.bar(x, [c for c, _ in split], 0.6, label="compute (busiest device)")
    a.bar(x, [m for _, m in split], 0.6, bottom=[c for c, _ in split], label="communication and waiting")
    run = [(i, p) for i, p in enumerate(result.points) if p.measured]
    if run:
        a.errorbar([i for i, _ in run], [p.replay_ms for _, p in run],
                   yerr=[[p.replay_ms - p.min_ms for _, p in run], [p.max_ms - p.replay_ms for _, p in run]],
                   fmt="none", ecolor="black", capsize=4, label="replay min-max")
    pred = [(i, p) for i, p in enumerate(result.points) if p.predicted_ms is not None]
    if pred:
        a.plot([i for i, _ in pred], [p.predicted_ms for _, p in pred], "D", mfc="none", color="black",
               label="predicted (timeline model)")
    a.set(xlabel="devices", ylabel="ms per run", xticks=x, xticklabels=[str(v) for v in g], title="time per run")
    a.legend(fontsize=7)
    curves = (([(p.gpus, result.speedup(p)) for _, p in run], "o-", {}, "latency (G-chip program)"),
              ([(p.gpus, result.predicted_speedup(p)) for _, p in pred], "D--", {"mfc": "none"}, "latency, predicted"),
              ([(t.gpus, t.speedup) for t in result.throughput], "D-", {}, "throughput (1-chip program)"))
    for points, style, kw, label in curves:  # a curve only where a one-device point gives speedups
        points = [(gpus, s) for gpus, s in points if s is not None]
        if points:
            b.plot(*zip(*points), style, label=label, **kw)
    b.plot([min(g), max(g)], [min(g), max(g)], ":", color="gray", label="ideal (speedup = devices)")
    tg = [t for t in targets if t[0] <= max(g)]
    if tg:
        b.plot([1] + [t[0] for t in tg], [1.0] + [t[1] for t in tg], "x--", color="red", label="target")
    b.set_xscale("log", base=2)
    b.set_yscale("log", base=2)
    b.set(xlabel="devices", ylabel="speedup over 1 device", xticks=g, xticklabels=[str(v) for v in g],
          title="speedup")
    b.minorticks_off()
    b.legend(fontsize=7)
    fig.suptitle(f"{Path(result.family).name}, N = {result.n}, backend {result.backend} ({result.device}), "
                 f"{result.date}", fontsize=9)
    return lambda f: fig.savefig(f, format=fmt, dpi=120)


def call_streams(dev_run, streams: int) -> list[int]:
    """The stream of every call of ``dev_run`` in its schedule on ``streams`` streams (all 0 for one)."""
    out = [0] * len(dev_run.calls)
    if streams > 1:
        schedule = dev_run.schedule(streams)
        for t, calls in enumerate(dev_run.task_calls):
            for i in calls:
                out[i] = schedule.stream[t]
    return out


def call_collectives(dev_run) -> dict[int, tuple[tuple[int, int], ...]]:
    """Call index -> the (level, id) keys of the collectives that a fabric group call carries: the
    k-th group call of a device is its k-th communication step with collectives."""
    from caramel.execute.placement import CommStep

    steps = [s for s in dev_run.prog.steps if isinstance(s, CommStep) and s.ops]
    return {i: tuple((s.level, o.sync) for o in s.ops) for i, s in zip(sorted(dev_run.groups), steps)}


def comm_figures(progs, n: int) -> tuple[int, int]:
    """The most collective calls that one device program issues (the limbs that one root sends in a step go in one
    call, :func:`~caramel.execute.placement.pack`), and the bytes that all devices send (a BROADCAST from its root,
    a REDUCE contribution from every other member: N residues of 4 bytes per limb)."""
    from caramel.execute.placement import CommStep, pack
    from caramel.plan.collectives import CollectiveKind

    calls = [sum(len(pack(s.ops)) for s in p.steps if isinstance(s, CommStep)) for p in progs]
    ops = [[o for s in p.steps if isinstance(s, CommStep) for o in s.ops] for p in progs]
    sent = sum((o.kind is CollectiveKind.BROADCAST) == (o.root == p.device) for p, os in zip(progs, ops) for o in os)
    return max(calls, default=0), sent * 4 * n


def scaling_trace(result: ScalingResult) -> dict:
    """A Chrome / Perfetto trace of the instrumented runs: one process per (G, device), one thread
    row per stream of its schedule; kernels and collectives are "X" events of categories
    ``kernel``/``comm``; flow arrows (``s``/``f`` events, category ``collective``) link the ends
    of each collective on different devices, from the first device that issued it to each other."""
    events: list[dict] = []
    pids: dict[tuple[int, int], int] = {}
    rows: set[tuple[int, int]] = set()
    ends: dict[tuple[int, tuple[int, int]], list[tuple[int, int, float]]] = {}
    for entry in result.trace:
        g, d, label, comm, start, dur = entry[:6]
        stream = entry[6] if len(entry) > 6 else 0
        keys = entry[7] if len(entry) > 7 else ()
        pid = pids.get((g, d))
        if pid is None:
            pid = pids[(g, d)] = len(pids)
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": f"{g} device run: device {d}"}})
        if (pid, stream) not in rows:
            rows.add((pid, stream))
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": stream,
                           "args": {"name": f"stream {stream}"}})
        ts = round(start * 1e3, 3)
        events.append({"name": label, "cat": "comm" if comm else "kernel", "ph": "X", "pid": pid, "tid": stream,
                       "ts": ts, "dur": round(dur * 1e3, 3)})
        for key in keys:
            ends.setdefault((g, key), []).append((pid, stream, ts))
    flow = 0
    for (_, (level, sync)), where in sorted(ends.items()):
        first, *others = sorted(where, key=lambda w: (w[2], w[0]))
        for pid, tid, ts in others:
            name = f"collective id {sync} (level {level})"
            events.append({"name": name, "cat": "collective", "ph": "s", "id": flow, "pid": first[0],
                           "tid": first[1], "ts": first[2]})
            events.append({"name": name, "cat": "collective", "ph": "f", "bp": "e", "id": flow, "pid": pid,
                           "tid": tid, "ts": ts})
            flow += 1
    meta = {"family": result.family, "n": result.n, "backend": result.backend, "device": result.device,
            "date": result.date}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def _device_floors(plan, ctx, memory, mode, gpus: int, repeats: int, streams: int, comm_stream: bool = True,
                   then: Callable | None = None) -> list[tuple[float, Any]]:
    """Each device program of a ``gpus``-device run in turn, alone on the current GPU and without its collectives:
    its floor in ms (the median replay of its graph on ``streams`` streams like the run) and what
    ``then(run, schedule, stream)`` returns (None without it), called with its
    :class:`~caramel.execute.runner.DeviceRun` before the next device's run is made (its arena freed first)."""
    import cupy as cp

    from caramel.backends.cuda.backend import CupyBackend
    from caramel.execute.cuda_graph import StreamLauncher, launch_device
    from caramel.execute.placement import gpu_device_programs
    from caramel.execute.runner import DeviceRun
    from caramel.execute.timing import time_runs

    out = []
    for prog in gpu_device_programs(plan, gpus, ctx, streams):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            run = DeviceRun(prog, plan, ctx, memory, Mode(mode), CupyBackend)
            run.run(collectives=False)  # compiles kernels, uploads index arrays
            schedule = run.schedule(streams, comm_stream=comm_stream)
            launcher = StreamLauncher(schedule, stream) if streams > 1 else None
            stream.synchronize()
            stream.begin_capture()
            try:
                launch_device(run, launcher, collectives=False)
            finally:
                captured = stream.end_capture()
        floor = time_runs(lambda: captured.launch(stream), stream, repeats).median_ms
        captured = None  # the graph's memory back before what ``then`` captures
        out.append((floor, then(run, schedule, stream) if then else None))
        run = None  # the arena back before the next device's
        cp.get_default_memory_pool().free_all_blocks()
    return out


def compute_only_ms(plan, ctx, memory, mode, gpus: int, repeats: int = 10, streams: int = 1) -> list[float]:
    """The replay time of each device's program WITHOUT its collectives (``collectives=False``),
    on ``streams`` streams like the run, one device after another on the current GPU: the compute
    floor of a G-device run. A G-GPU replay minus its busiest device's floor is what
    communication and waiting cost."""
    return [floor for floor, _ in _device_floors(plan, ctx, memory, mode, gpus, repeats, streams)]


def device_profiles(plan, ctx, memory, mode, gpus: int, repeats: int = 10, streams: int = 1, *,
                    comm_stream: bool = True):
    """Each device program of a ``gpus``-device run, alone on the current GPU, one after another, without its
    collectives: per device (its floor in ms, as :func:`compute_only_ms`; its
    :class:`~caramel.timeline.DeviceTimeline`: every call timed by clock stamps in a one-stream graph, on the run's
    stream schedule). The inputs of the timeline model's prediction. ``comm_stream``: whether the schedule keeps a
    stream for communication (False: as a 1-chip :class:`~caramel.execute.cuda_graph.GpuRun`)."""
    from caramel.profile import _graph_stamps
    from caramel.timeline import measured_timeline

    def stamped(run, schedule, stream):
        gap = float(np.median(np.diff(_graph_stamps(stream, lambda mark: [mark() for _ in range(65)], 65))))

        def body(mark):
            mark()
            run.run(lambda i: mark(), collectives=False)

        at = _graph_stamps(stream, body, len(run.calls) + 1)
        call_us = [1e3 * max(at[i + 1] - at[i] - gap, 0.0) for i in range(len(run.calls))]
        return measured_timeline(run, schedule, call_us, ctx.n)

    return _device_floors(plan, ctx, memory, mode, gpus, repeats, streams, comm_stream, then=stamped)


def predict(progs, n: int, streams: int, measured: Sequence | None = None):
    """The timeline model's replay of ``progs`` (the device programs of one run) on ``streams`` streams a device:
    from ``measured`` (:func:`device_profiles`' (floor ms, timeline) per device: the compute sharing fitted to the
    floors) or, without, from the kernel cost estimates of :mod:`caramel.plan.cost`. Returns the
    :class:`~caramel.timeline.Replay` and a line saying what it was made from."""
    from caramel.timeline import FIRST_FIT, OVERLAP, device_timelines, fit_overlap, simulate

    if measured is None:
        from caramel.backends.cuda.target import CUDA_TARGET  # no CuPy: the H200's kernel costs

        timelines = device_timelines(progs, n, streams, target=CUDA_TARGET)
        how = "kernel times: the cost estimates of caramel.plan.cost (H200 kernels)"
        overlap = OVERLAP
    else:
        timelines = [tl for _, tl in measured]
        fits = [f for f in (fit_overlap(tl, 1e3 * floor) for floor, tl in measured) if f is not None]
        overlap = float(np.median(fits)) if fits else OVERLAP
        how = ("kernel times: each device's program alone on this GPU, stamped call by call; compute sharing "
               "fitted to its floors")
    replay = simulate(timelines, FIRST_FIT, overlap=overlap)
    return replay, f"{how}; overlap {overlap:.2f}; collectives: {FIRST_FIT.name}"


def profile_scaling(family: str, gpus: Sequence[int], options=None, *, repeats: int = 10, warmup: int = 1,
                    log: Callable[[str], None] = lambda s: None, predict_only: bool = False,
                    **fields) -> ScalingResult:
    """Run and time ``family`` on each device count of ``gpus`` (see the module docstring), with the
    timeline model's prediction of each; a G of more GPUs than present, or every G with
    ``predict_only``, gets the prediction alone. ``options``: a :class:`~caramel.options.RunOptions`
    or its fields (``n``, ``mode``, ``seed``, ``backend``: ``gpu``, ``cpu-plan`` or ``auto``;
    ``streams`` per device, default the multi-GPU executor's; ``kernels``)."""
    from caramel.options import RunOptions

    opts = RunOptions.of(options, **fields)
    n, mode, seed, backend, streams = opts.n, opts.mode, opts.seed, opts.backend, opts.streams
    extra = {} if opts.kernels is None else {"kernels": opts.kernels}
    from caramel.api import output_digest, prepare_inputs
    from caramel.ckks.keyset import generate_keyset
    from caramel.execute.drive import HostRun
    from caramel.execute.placement import device_programs
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.validate import validate

    from caramel.api import gpu_available
    from caramel.execute.cuda_graph import DEFAULT_STREAMS

    streams = DEFAULT_STREAMS if streams is None else streams
    if backend == "auto":
        backend = "gpu" if gpu_available() else "cpu-plan"
    if backend not in ("gpu", "cpu-plan"):
        raise CaramelError(f"scaling profiles run on gpu or cpu-plan, not {backend!r}")
    device, clock = "host threads (NumPy)", "wall clock"
    present = max(gpus)  # simulated devices: as many as asked
    if backend == "gpu":
        import cupy as cp

        from caramel.profile import _gpu_device

        present = cp.cuda.runtime.getDeviceCount()
        device, clock = f"{_gpu_device()}", "cuda events"
        if max(gpus) > present and not predict_only:
            log(f"--gpus {','.join(map(str, gpus))}: this machine has {present} GPU(s); larger counts are predicted, "
                "not run")
    ctx = Context(n=n)
    mode = Mode(mode)
    points, trace = [], []
    programs = {}
    for g in gpus:  # every member read and checked before any runs: a missing one fails at once
        path = family_member(family, g)
        log(f"{g} device(s): loading {path}")
        programs[g] = program = load_program(path)
        validate(program)
        if program.chips != g:
            raise CaramelError(f"{path} is compiled for {program.chips} chips, expected {g}")
    for g in progress(gpus, desc=f"scaling {Path(family).name}", unit="G"):
        program = programs.pop(g)
        plan = build_plan(program)
        measure = not predict_only and g <= present
        memory = (prepare_inputs(program, ctx, generate_keyset(program, ctx, opts.keys_seed), seed).memory
                  if measure or backend == "gpu" else None)
        progs = device_programs(plan, g, ctx.primes, reuse="none", keep_inputs=True)  # as a GPU run lays them out
        t = digest = None
        setup = 0.0
        split = (None, None)  # (compute, communication) of the busiest device
        if measure:
            t0 = time.perf_counter()
            with nvtx_range(f"caramel {g} devices: setup and capture"):
                if backend == "gpu":
                    from caramel.execute.cuda_graph import MultiGpuRun

                    run = MultiGpuRun(plan, ctx, memory, mode, g, streams=streams, **extra)
                    run.capture()
                else:
                    run = HostRun(plan, ctx, memory, mode, g, timeout=600.0, streams=streams, seed=seed)
            setup = time.perf_counter() - t0
            try:
                with nvtx_range(f"caramel {g} devices: {repeats} timed replays"):
                    t = run.time(repeats, warmup)
                digest = output_digest(program, run.result().memory)
                with nvtx_range(f"caramel {g} devices: instrumented run"):
                    marks = run.instrument()
            finally:
                run.close()
            busiest = (0.0, 0.0)
            for d, (dev_run, m) in enumerate(zip(run.runs, marks)):
                comm = sum(dur for i, _, dur in m if dev_run.is_comm(i))
                total = sum(dur for _, _, dur in m)
                busiest = max(busiest, (total - comm, comm), key=sum)
                stream_of, keys_of = call_streams(dev_run, streams), call_collectives(dev_run)
                trace += [(g, d, dev_run.labels[i], dev_run.is_comm(i), start, dur, stream_of[i], keys_of.get(i, ()))
                          for i, start, dur in m]
            split = busiest
            del run
        profiles = None
        if backend == "gpu":  # graph replays without collectives, not the eager instrumented run
            with nvtx_range(f"caramel {g} devices: each device alone, for the floors and the model"):
                profiles = device_profiles(plan, ctx, memory, mode, g, repeats, streams)
            floor = max(f for f, _ in profiles)
            split = (floor, max(0.0, t.median_ms - floor) if t is not None else None)
        replay, how = predict(progs, n, streams, profiles)
        points.append(ScalingPoint(
            program.name, g, t.median_ms if t else None, t.min_ms if t else None, t.max_ms if t else None,
            t.repeats if t else 0, *comm_figures(progs, n), split[0], split[1], digest or "", setup,
            replay.predicted_ms, replay.compute_floor_ms, replay.comm_wait_ms, how))
        log(f"{g} device(s): " + (f"{t}; setup {setup:.1f} s; digest {digest[:16]}; " if t else "not run; ")
            + f"predicted {replay.predicted_ms:.2f} ms (a prediction)")
    return ScalingResult(family, n, mode.value, backend, device, clock,
                         time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), points, trace)


__all__ = ["ScalingPoint", "ScalingResult", "compute_only_ms", "device_profiles", "family_member", "plot_scaling",
           "predict", "profile_scaling", "render_scaling", "scaling_trace"]
