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
    trace: list[tuple[int, int, str, bool, float, float]] = field(default_factory=list)  # (G, dev, label, comm, start, dur)
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
    from caramel.profile import _table

    head = ("GPUs", "program", "median ms", "min ms", "max ms", "speedup", "efficiency", "MiB sent",
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
                  _table(("GPUs", "program", "instances", "wall s", "instances/s", "speedup", "efficiency"), trows)]
    return "\n".join(lines)


def plot_scaling(result: ScalingResult, path, targets: Sequence[tuple[int, float]] = ((2, 1.7), (4, 2.8), (8, 4.0))) -> None:
    """A PNG: replay time and speedup against the number of devices, with ideal and target lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = [p.gpus for p in result.points]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.errorbar(g, [p.median_ms for p in result.points],
               yerr=[[p.median_ms - p.min_ms for p in result.points], [p.max_ms - p.median_ms for p in result.points]],
               marker="o", capsize=3, label="replay (median, min-max)")
    a.plot(g, [p.compute_ms for p in result.points], "s--", label="compute (busiest device)")
    a.plot(g, [p.comm_ms for p in result.points], "^--", label="communication and waiting (busiest device)")
    a.set(xlabel="devices", ylabel="ms", xscale="log", xticks=g, xticklabels=[str(x) for x in g],
          title="time per run")
    a.minorticks_off()
    a.legend(fontsize=7)
    b.plot(g, [result.speedup(p) for p in result.points], "o-", label="latency (G-chip program)")
    if result.throughput:
        b.plot([t.gpus for t in result.throughput], [t.speedup for t in result.throughput], "D-",
               label="throughput (1-chip program)")
    b.plot(g, g, ":", color="gray", label="ideal")
    tg = [t for t in targets if t[0] <= max(g)]
    if tg:
        b.plot([1] + [t[0] for t in tg], [1.0] + [t[1] for t in tg], "x--", color="red", label="target")
    b.set(xlabel="devices", ylabel="speedup over 1", xscale="log", xticks=g, xticklabels=[str(x) for x in g],
          title="speedup")
    b.minorticks_off()
    b.legend(fontsize=7)
    fig.suptitle(f"{Path(result.family).name}, N = {result.n}, {result.device}, {result.date}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scaling_trace(result: ScalingResult) -> dict:
    """A Chrome / Perfetto trace of the instrumented runs: one process per (G, device), one row
    (its stream); kernels and collectives are "X" events of categories ``kernel``/``comm``."""
    events: list[dict] = []
    pids: dict[tuple[int, int], int] = {}
    for g, d, label, comm, start, dur in result.trace:
        pid = pids.get((g, d))
        if pid is None:
            pid = pids[(g, d)] = len(pids)
            events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                           "args": {"name": f"{g} device run: device {d}"}})
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "stream 0"}})
        events.append({"name": label, "cat": "comm" if comm else "kernel", "ph": "X", "pid": pid, "tid": 0,
                       "ts": round(start * 1e3, 3), "dur": round(dur * 1e3, 3)})
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
    from caramel.api import default_spec, output_digest
    from caramel.ckks.check import prepare_check
    from caramel.execute.drive import HostRun
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.validate import validate

    from caramel.execute.cuda_graph import DEFAULT_STREAMS, gpu_available

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
    for g in gpus:
        path = family_member(family, g)
        log(f"{g} device(s): loading {path}")
        program = load_program(path)
        validate(program)
        if program.chips != g:
            raise CaramelError(f"{path} is compiled for {program.chips} chips, expected {g}")
        memory = prepare_check(default_spec(program), program, ctx, rng=np.random.default_rng(seed)).memory
        plan = build_plan(program)
        t0 = time.perf_counter()
        if backend == "gpu":
            from caramel.execute.cuda_graph import MultiGpuRun

            run = MultiGpuRun(plan, ctx, memory, mode, g, streams=streams)
            run.capture()
        else:
            run = HostRun(plan, ctx, memory, mode, g, timeout=600.0, streams=streams, seed=seed)
        setup = time.perf_counter() - t0
        try:
            t = run.time(repeats, warmup)
            digest = output_digest(program, run.result().memory)
            marks = run.instrument()
        finally:
            run.close()
        progs = run.progs
        split = (0.0, 0.0)  # (compute, communication) of the busiest device
        for d, (dev_run, m) in enumerate(zip(run.runs, marks)):
            comm = sum(dur for i, _, dur in m if dev_run.is_comm(i))
            total = sum(dur for _, _, dur in m)
            split = max(split, (total - comm, comm), key=sum)
            trace += [(g, d, dev_run.labels[i], dev_run.is_comm(i), start, dur) for i, start, dur in m]
        if backend == "gpu":  # graph replays without collectives, not the eager instrumented run
            del run
            floor = max(compute_only_ms(plan, ctx, memory, mode, g, repeats, streams))
            split = (floor, max(0.0, t.median_ms - floor))
        points.append(ScalingPoint(program.name, g, t.median_ms, t.min_ms, t.max_ms, t.repeats,
                                   max(p.collectives for p in progs), sum(p.comm_bytes for p in progs),
                                   split[0], split[1], digest, setup))
        log(f"{g} device(s): {t}; setup {setup:.1f} s; digest {digest[:16]}")
    return ScalingResult(family, n, mode.value, backend, device, clock,
                         time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), points, trace)


__all__ = ["ScalingPoint", "ScalingResult", "compute_only_ms", "family_member", "plot_scaling", "profile_scaling", "render_scaling",
           "scaling_trace"]
