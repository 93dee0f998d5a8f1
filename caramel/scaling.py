"""``caramel profile FAMILY --gpus 1,2,4,8``: one program family compiled for 1, 2, 4 and 8 chips,
each run on as many devices; a table, a PNG plot of the scaling curve and a Chrome trace.

For every G: the G-chip program runs on G devices (``gpu``: :class:`~caramel.execute.cuda_graph.MultiGpuRun`,
one CUDA graph per GPU, timed with CUDA events, the slowest GPU per replay; ``cpu-plan``: the
same device programs on NumPy in host threads over the fake fabric, wall clock, which checks the
machinery but shows no speedup). Then one instrumented eager run records every call per device,
for the trace. The busiest device's time splits into compute and communication: on the GPU,
compute is its program replayed as a graph without collectives (:func:`compute_only_ms`) and
communication the replay minus that; on the CPU, the instrumented run's collectives (including
waiting for peers). Speedup = t(1) / t(G), efficiency = speedup / G.

A family is a path prefix: ``programs/Mul_10L`` names ``programs/Mul_10L_<G>c``; an archive
``BootstrapLike_51L.tar.xz`` names its members ``BootstrapLike_51L_<G>c``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from caramel.errors import CaramelError
from caramel.logs import nvtx_range, progress
from caramel.ring import Context, Mode


@dataclass
class ScalingPoint:
    """One G: the G-chip program on G devices."""

    program: str
    gpus: int
    median_ms: float
    min_ms: float
    max_ms: float
    repeats: int
    collectives: int  # the most device collectives that one device issues
    comm_bytes: int  # bytes sent by all devices (N residues of 4 bytes per limb)
    compute_ms: float  # busiest device (see the module docstring)
    comm_ms: float
    digest: str = ""
    setup_s: float = 0.0


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

    def speedup(self, p: ScalingPoint) -> float:
        base = next((q for q in self.points if q.gpus == 1), self.points[0])
        return base.median_ms * base.gpus / p.median_ms if p.median_ms else 0.0


def family_member(family: str, chips: int) -> str:
    """The program of ``family`` compiled for ``chips`` chips (see the module docstring)."""
    path = Path(family.split("#")[0])
    if path.name.endswith((".tar.xz", ".tar.gz", ".tgz")):
        stem = path.name.split(".tar")[0].removesuffix(".tgz")
        return f"{path}#{stem}_{chips}c"
    return f"{family.rstrip('/')}_{chips}c"


def render_scaling(result: ScalingResult) -> str:
    from caramel.profile import _table, words

    devices = words(result.backend).devices
    head = (devices, "program", "median ms", "min ms", "max ms", "speedup", "efficiency", "MiB sent",
            "collectives", "compute ms", "comm ms")
    rows = []
    for p in result.points:
        s = result.speedup(p)
        rows.append((str(p.gpus), p.program, f"{p.median_ms:.2f}", f"{p.min_ms:.2f}", f"{p.max_ms:.2f}",
                     f"{s:.2f}x", f"{s / p.gpus:.0%}", f"{p.comm_bytes / 2**20:.1f}", str(p.collectives),
                     f"{p.compute_ms:.2f}", f"{p.comm_ms:.2f}"))
    title = (f"{result.family}: N = {result.n}, mode {result.mode}, backend {result.backend} ({result.device}), "
             f"{result.clock}, {result.date}")
    notes = ("compute ms: " + ("the busiest device's program replayed as a graph without its collectives; comm ms: "
                               "the replay minus that (communication and waiting)" if result.backend == "gpu" else
                               "the busiest device in one instrumented run; comm ms: its collectives, including "
                               "waiting for its peers") + "; collectives: the most that one device issues")
    lines = [title, "", _table(head, rows), "", notes]
    if result.throughput:  # program-level parallelism: the 1-chip program, one instance per device
        trows = [(str(t.gpus), t.program, str(t.instances), f"{t.wall_s:.3f}", f"{t.per_second:.2f}",
                  f"{t.speedup:.2f}x", f"{t.efficiency:.0%}") for t in result.throughput]
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
    applied to the replay time it explains."""
    total = p.compute_ms + p.comm_ms
    if total <= 0:
        return p.median_ms, 0.0
    compute = p.median_ms * p.compute_ms / total
    return compute, p.median_ms - compute


def plot_scaling(result: ScalingResult, path, targets: Sequence[tuple[int, float]] = ()) -> None:
    """Save the scaling curve to ``path`` (PNG, PDF or SVG by extension; :func:`plot_writer`)."""
    from caramel.outfiles import write_atomic

    write_atomic(path, plot_writer(result, path, targets), "plot")


def plot_writer(result: ScalingResult, path, targets: Sequence[tuple[int, float]] = ()):
    """A function that writes the scaling curve into an open binary file in the format of ``path``'s
    extension (PNG, PDF or SVG), for :func:`caramel.outfiles.write_output`. Drawn with matplotlib's
    object API (a :class:`~matplotlib.figure.Figure`, never the global backend): left, the replay time
    per device count as stacked compute + communication bars that add up to the replay (median, with
    its min-max range); right, the speedup on log2 axes, where the ideal line (speedup = G) is
    straight. ``targets``: optional (G, speedup) points drawn as a target line."""
    fmt = plot_format(path)
    from matplotlib.figure import Figure

    g = [p.gpus for p in result.points]
    fig = Figure(figsize=(10, 4), layout="constrained")
    a, b = fig.subplots(1, 2)
    x = np.arange(len(g))
    split = [bar_split(p) for p in result.points]
    a.bar(x, [c for c, _ in split], 0.6, label="compute (busiest device)")
    a.bar(x, [m for _, m in split], 0.6, bottom=[c for c, _ in split], label="communication and waiting")
    a.errorbar(x, [p.median_ms for p in result.points],
               yerr=[[p.median_ms - p.min_ms for p in result.points], [p.max_ms - p.median_ms for p in result.points]],
               fmt="none", ecolor="black", capsize=4, label="replay min-max")
    a.set(xlabel="devices", ylabel="ms per run", xticks=x, xticklabels=[str(v) for v in g], title="time per run")
    a.legend(fontsize=7)
    b.plot(g, [result.speedup(p) for p in result.points], "o-", label="latency (G-chip program)")
    if result.throughput:
        b.plot([t.gpus for t in result.throughput], [t.speedup for t in result.throughput], "D-",
               label="throughput (1-chip program)")
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
    """The most device collectives that one device program issues, and the bytes that all of them
    send (a BROADCAST from its root, a REDUCE contribution from every other member: N residues of
    4 bytes per limb)."""
    from caramel.execute.placement import CommStep
    from caramel.plan.collectives import CollectiveKind

    ops = [[o for s in p.steps if isinstance(s, CommStep) for o in s.ops] for p in progs]
    sent = sum((o.kind is CollectiveKind.BROADCAST) == (o.root == p.device) for p, os in zip(progs, ops) for o in os)
    return max(map(len, ops), default=0), sent * 4 * n


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


def compute_only_ms(plan, ctx, memory, mode, devices: int, repeats: int = 10, streams: int = 1) -> list[float]:
    """The replay time of each device's program WITHOUT its collectives (``collectives=False``),
    on ``streams`` streams like the run, one device after another on the current GPU: the compute
    floor of a G-device run. A G-GPU replay minus its busiest device's floor is what
    communication and waiting cost."""
    import cupy as cp

    from caramel.backends.cuda.backend import CupyBackend
    from caramel.execute.cuda_graph import StreamLauncher, launch_device
    from caramel.execute.placement import gpu_device_programs
    from caramel.execute.runner import DeviceRun
    from caramel.execute.timing import time_runs

    out = []
    for prog in gpu_device_programs(plan, devices, ctx, streams):
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            run = DeviceRun(prog, plan, ctx, memory, Mode(mode), CupyBackend)
            run.run(collectives=False)  # compiles kernels, uploads index arrays
            launcher = StreamLauncher(run.schedule(streams), stream) if streams > 1 else None
            stream.synchronize()
            stream.begin_capture()
            try:
                launch_device(run, launcher, collectives=False)
            finally:
                graph = stream.end_capture()
        out.append(time_runs(lambda: graph.launch(stream), stream, repeats).median_ms)
        del run, graph
        cp.get_default_memory_pool().free_all_blocks()
    return out


def profile_scaling(family: str, gpus: Sequence[int], *, n: int = 65536, mode: Mode | str = Mode.EXACT,
                    seed: int = 1, repeats: int = 10, warmup: int = 1, backend: str = "auto",
                    streams: int | None = None, log: Callable[[str], None] = lambda s: None) -> ScalingResult:
    """Run and time ``family`` on each device count of ``gpus`` (see the module docstring) with
    ``streams`` streams per device (default: the multi-GPU executor's)."""
    from caramel.api import output_digest, prepare_inputs
    from caramel.ckks.keyset import generate_keyset
    from caramel.execute.drive import HostRun
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
    if backend == "gpu":
        import cupy as cp

        from caramel.profile import _gpu_device

        present = cp.cuda.runtime.getDeviceCount()
        if max(gpus) > present:
            raise CaramelError(f"--gpus {','.join(map(str, gpus))} asks for {max(gpus)} GPUs; this machine has {present}")
        device, clock = f"{_gpu_device()}", "cuda events"
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
        memory = prepare_inputs(program, ctx, generate_keyset(program, ctx, seed), seed).memory
        plan = build_plan(program)
        t0 = time.perf_counter()
        with nvtx_range(f"caramel {g} devices: setup and capture"):
            if backend == "gpu":
                from caramel.execute.cuda_graph import MultiGpuRun

                run = MultiGpuRun(plan, ctx, memory, mode, g, streams=streams)
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
        progs = run.progs
        split = (0.0, 0.0)  # (compute, communication) of the busiest device
        for d, (dev_run, m) in enumerate(zip(run.runs, marks)):
            comm = sum(dur for i, _, dur in m if dev_run.is_comm(i))
            total = sum(dur for _, _, dur in m)
            split = max(split, (total - comm, comm), key=sum)
            stream_of, keys_of = call_streams(dev_run, streams), call_collectives(dev_run)
            trace += [(g, d, dev_run.labels[i], dev_run.is_comm(i), start, dur, stream_of[i], keys_of.get(i, ()))
                      for i, start, dur in m]
        if backend == "gpu":  # graph replays without collectives, not the eager instrumented run
            del run
            floor = max(compute_only_ms(plan, ctx, memory, mode, g, repeats, streams))
            split = (floor, max(0.0, t.median_ms - floor))
        points.append(ScalingPoint(program.name, g, t.median_ms, t.min_ms, t.max_ms, t.repeats,
                                   *comm_figures(progs, n),
                                   split[0], split[1], digest, setup))
        log(f"{g} device(s): {t}; setup {setup:.1f} s; digest {digest[:16]}")
    return ScalingResult(family, n, mode.value, backend, device, clock,
                         time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), points, trace)


__all__ = ["ScalingPoint", "ScalingResult", "compute_only_ms", "family_member", "plot_scaling", "profile_scaling", "render_scaling",
           "scaling_trace"]
