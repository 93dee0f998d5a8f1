"""``caramel profile``: time a program three ways and per kernel kind; write a Chrome trace.

Three variants are timed (warm-up, then ``repeats`` timed runs; median / min / max):

* ``eager``: the unfused plan, one launch per limb-level instruction (``GpuRun(per_row=True)``,
  no CUDA graph), the baseline;
* ``graph``: the unfused plan captured into one CUDA graph and replayed;
* ``graph+fusion``: the fused plan captured into one CUDA graph and replayed.

On the GPU (1-chip programs) runs are timed with CUDA events on the run's stream. With backend
``cpu-plan`` the same three plans run on the NumPy plan engine and are timed with the wall clock
(there is no graph on the CPU: ``graph`` is then simply the unfused plan kernel by kernel, so the
command works everywhere, e.g. in CI).

Then one *instrumented* run of the fused plan records every kernel (on the GPU, clock stamps
between the kernels of a one-stream graph, :func:`_instrument_gpu`; on the CPU, the wall clock
around each kernel): :func:`kind_table` aggregates it by :class:`~caramel.plan.plan.Kind` and
:func:`chrome_trace` turns it into a Perfetto-loadable Chrome trace (``{"traceEvents": [...]}``,
"X" complete events, microseconds). Communication kernels of multi-chip programs (``cpu-plan``
only) go through the in-process transport and are not timed.

:func:`profile_throughput` (``caramel profile PROGRAM --throughput``) measures instances per second
through an :class:`~caramel.executor.Executor`, served (shared inputs resident, the others encrypted
ahead) and end to end (every input drawn per instance), with the mean time of each phase of an
instance (encrypt, upload, replay, download, digest, check).

Everything here is a pure function of its inputs; ``caramel.cli`` only parses and prints.
"""

from __future__ import annotations

import json
import textwrap
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.plan.cost import family
from caramel.program import Mem, Program
from caramel.ring import Context

VARIANTS = ("eager", "graph", "graph+fusion")


@dataclass(frozen=True)
class Words:
    """What the tables call a device and one unit of work on a backend (a CPU has no GPUs and
    launches no kernels: it calls them)."""

    devices: str
    calls: str


#: :class:`Words` by backend (any backend not named here: the CPU's).
WORDS = {"gpu": Words("GPUs", "launches")}
CPU_WORDS = Words("devices", "calls")


def words(backend: str) -> Words:
    return WORDS.get(backend, CPU_WORDS)


#: Why the CPU's variants do not rank as the GPU's (printed under the CPU's table).
CPU_NOTE = ("on the CPU there is no graph: 'graph' calls the unfused plan's kernels one by one, 'eager' one row at a "
            "time. Fusion pays on a GPU (fewer launches, less memory traffic); NumPy evaluates a fused kernel as "
            "the same array operations with their temporaries, and a value fused into several consumers' loads "
            "is computed again in each, so graph+fusion can be slower than graph here.")
PROFILE_BACKENDS = ("auto", "gpu", "cpu-plan")
_TRACE_LINES = 16  # source lines kept per trace event (fused kernels can cover thousands)


@dataclass
class VariantTiming:
    """One timed variant: milliseconds per whole-program run."""

    name: str
    launches: int
    median_ms: float
    min_ms: float
    max_ms: float
    repeats: int
    digest: str = ""


@dataclass
class KernelRecord:
    """One kernel of the instrumented run; times in milliseconds from the run's start."""

    chip: int
    index: int
    kind: str
    rows: int
    lines: tuple[int, ...]
    start_ms: float
    dur_ms: float
    bytes: int = 0  # device-memory traffic of the plan model (inputs read, outputs written once)


@dataclass
class ProfileResult:
    """What :func:`profile_program` measured."""

    program: str
    n: int
    mode: str
    backend: str
    device: str
    clock: str  # "cuda events" or "wall clock"
    instructions: int
    variants: list[VariantTiming]
    kernels: list[KernelRecord]
    date: str = ""
    setup_s: dict[str, float] = field(default_factory=dict)
    copy_gbs: float = 0.0  # measured device-to-device copy bandwidth (read + write), 0 if not measured
    critical_ms: float = 0.0  # the longest chain of dependent kernels at their measured times (critical_path_ms)

    @property
    def digests_agree(self) -> bool:
        return len({v.digest for v in self.variants}) <= 1


# ----------------------------------------------------------------------------------------------
# tables and trace


def _by_kind(kernels: Sequence[KernelRecord]) -> dict[str, tuple[int, int, float, int]]:
    """``kind -> (kernels, rows, total ms, bytes)`` summed over ``kernels``."""
    agg: dict[str, list] = {}
    for k in kernels:
        a = agg.setdefault(k.kind, [0, 0, 0.0, 0])
        a[0] += 1
        a[1] += k.rows
        a[2] += k.dur_ms
        a[3] += k.bytes
    return {kind: tuple(a) for kind, a in agg.items()}


def kind_table(kernels: Sequence[KernelRecord]) -> list[tuple[str, int, int, float, float]]:
    """``(kind, kernels, rows, total ms, share)`` per kernel kind, the most expensive first."""
    agg = _by_kind(kernels)
    total = sum(a[2] for a in agg.values()) or 1.0
    out = [(kind, count, rows, ms, ms / total) for kind, (count, rows, ms, _) in agg.items()]
    return sorted(out, key=lambda r: (-r[3], r[0]))


@dataclass(frozen=True)
class RooflineRow:
    """One kernel kind of the roofline: measured time, the plan model's bytes, the achieved rate
    (bytes / time) and its share of the measured copy bandwidth (0 when none was measured)."""

    kind: str
    kernels: int
    ms: float
    bytes: int
    gbs: float
    share: float


def roofline_table(kernels: Sequence[KernelRecord], copy_gbs: float = 0.0) -> list[RooflineRow]:
    """Per kernel kind: gbs = bytes / (ms 1e6), share = gbs / copy_gbs; the most expensive first,
    then a ``total`` row."""
    rows = [(kind, count, ms, nbytes) for kind, (count, _, ms, nbytes) in _by_kind(kernels).items()]
    rows.sort(key=lambda r: (-r[2], r[0]))
    rows.append(("total", sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[3] for r in rows)))

    def row(kind, count, ms, nbytes):
        gbs = nbytes / (ms * 1e6) if ms > 0 else 0.0
        return RooflineRow(kind, count, ms, nbytes, gbs, gbs / copy_gbs if copy_gbs > 0 else 0.0)

    return [row(*r) for r in rows]


def critical_path_ms(kernels: Sequence[KernelRecord], plan) -> float:
    """The longest chain of dependent kernels of one chip at their measured times: finish(k) = dur(k) + max of
    finish(j) over the kernels j that k reads from (``ChipPlan.deps``; 0 without), the largest over kernels and
    chips (communication between chips is not followed). However well several streams overlap the kernels, a run
    takes at least this long; the kernels' sum less this is the most that overlap could save (when it is well
    below the sum, as on the bootstrapping programs, a multi-stream replay is bound by throughput, not by the
    chain)."""
    dur = {(r.chip, r.index): r.dur_ms for r in kernels}
    longest = 0.0
    for chip in plan.chips:
        finish: list[float] = []
        for k, deps in enumerate(chip.deps):
            finish.append(dur.get((chip.chip, k), 0.0) + max((finish[j] for j in deps), default=0.0))
        longest = max(longest, max(finish, default=0.0))
    return longest


def render_roofline(kernels: Sequence[KernelRecord], copy_gbs: float = 0.0) -> str:
    """:func:`roofline_table` as text."""
    head = ("kind", "kernels", "ms", "MiB moved", "GB/s", "of copy")
    rows = [(r.kind, str(r.kernels), f"{r.ms:.3f}", f"{r.bytes / 2**20:.1f}", f"{r.gbs:.0f}",
             f"{100 * r.share:.1f}%" if copy_gbs > 0 else "-") for r in roofline_table(kernels, copy_gbs)]
    return _table(head, rows)


def render(result: ProfileResult) -> str:
    """The two tables (variants; time per kernel kind) as text."""
    out = [f"{result.program}: {result.instructions} instructions, N = {result.n}, mode {result.mode}, "
           f"backend {result.backend} ({result.device}), timed with {result.clock}"
           + (f", {result.date}" if result.date else "")]
    eager = next((v for v in result.variants if v.name == "eager"), None)
    head = ("mode", words(result.backend).calls, "median ms", "min ms", "max ms", "speedup")
    rows = [(v.name, str(v.launches), f"{v.median_ms:.3f}", f"{v.min_ms:.3f}", f"{v.max_ms:.3f}",
             f"{eager.median_ms / v.median_ms:.2f}x" if eager and v.median_ms > 0 else "-")
            for v in result.variants]
    reps = sorted({v.repeats for v in result.variants})
    out.append("")
    out.append(f"whole program ({'/'.join(map(str, reps))} timed runs after warm-up; speedup over eager):")
    out.append(_table(head, rows))
    if result.variants and any(v.digest for v in result.variants):
        out.append(f"output digests of the variants agree: {'yes' if result.digests_agree else 'NO'}")
    if result.backend != "gpu":
        out.append(textwrap.fill(CPU_NOTE, 110))
    kinds = kind_table(result.kernels)
    total = sum(r[3] for r in kinds)
    out.append("")
    out.append(f"time per kernel kind (one instrumented run of the fused plan, {len(result.kernels)} kernels, "
               f"{total:.3f} ms in kernels):")
    krows = [(kind, str(c), str(r), f"{t:.3f}", f"{100 * s:.1f}%") for kind, c, r, t, s in kinds]
    krows.append(("total", str(sum(r[1] for r in kinds)), str(sum(r[2] for r in kinds)), f"{total:.3f}",
                  "100.0%" if kinds else "-"))
    out.append(_table(("kind", "kernels", "rows", "total ms", "share"), krows))
    if result.critical_ms > 0:
        out.append("critical path (the longest chain of dependent kernels at these times): "
                   f"{result.critical_ms:.3f} ms of the {total:.3f} ms sum")
    if result.backend != "gpu":
        out.append("")
        out.append("no roofline on the CPU: the plan's traffic model counts GPU memory traffic, which NumPy's\n"
                   "temporaries do not follow")
    elif any(k.bytes for k in result.kernels):
        out.append("")
        ceiling = f"measured copy bandwidth {result.copy_gbs:.0f} GB/s" if result.copy_gbs > 0 else "no copy ceiling"
        out.append(f"roofline per kernel kind (bytes of the plan's traffic model over the measured time; {ceiling}):")
        out.append(render_roofline(result.kernels, result.copy_gbs))
    return "\n".join(out)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def chrome_trace(result: ProfileResult) -> dict:
    """A Chrome / Perfetto trace of the instrumented run: one "X" event per kernel (name = kind and
    rows, ts/dur in microseconds, pid = chip (GPU), tid = stream 0, args = rows and source lines)."""
    events: list[dict] = []
    label = "GPU" if result.backend == "gpu" else "chip"
    for chip in sorted({k.chip for k in result.kernels}):
        events.append({"name": "process_name", "ph": "M", "pid": chip, "tid": 0,
                       "args": {"name": f"{label} {chip} ({result.device})"}})
        events.append({"name": "thread_name", "ph": "M", "pid": chip, "tid": 0, "args": {"name": "stream 0"}})
    for k in result.kernels:
        lines = list(k.lines)
        args = {"kernel": k.index, "rows": k.rows, "lines": lines[:_TRACE_LINES], "n_lines": len(lines)}
        if lines:
            args["first_line"], args["last_line"] = min(lines), max(lines)
        events.append({"name": f"{k.kind} x{k.rows}", "cat": k.kind, "ph": "X", "pid": k.chip, "tid": 0,
                       "ts": round(k.start_ms * 1e3, 3), "dur": round(k.dur_ms * 1e3, 3), "args": args})
    meta = {"program": result.program, "n": result.n, "mode": result.mode, "backend": result.backend,
            "device": result.device, "clock": result.clock, "date": result.date}
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}


def write_trace(result: ProfileResult, path) -> None:
    """Write :func:`chrome_trace` to ``path`` atomically."""
    from caramel.outfiles import write_atomic

    write_atomic(path, json.dumps(chrome_trace(result)), "trace")


# ----------------------------------------------------------------------------------------------
# measuring


def _record(kernel, chip: int, index: int, start_ms: float, dur_ms: float, limb_bytes: int = 0) -> KernelRecord:
    moved = kernel.traffic() * limb_bytes  # the plan model (a converting NTT load reads each input once)
    return KernelRecord(chip, index, family(kernel), len(kernel.rows), tuple(kernel.lines), start_ms, dur_ms,
                        moved)


def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 20) -> float:
    """Device-to-device copy rate in GB/s (bytes read plus written, median of ``repeats`` copies of
    an ``nbytes`` buffer timed with CUDA events): the ceiling of the roofline."""
    import cupy as cp

    src = cp.ones(nbytes // 4, dtype=cp.uint32)
    dst = cp.empty_like(src)
    dst[...] = src  # warm-up
    times = []
    for _ in range(repeats):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        dst[...] = src
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1))
    del src, dst
    return 2 * nbytes / (float(np.median(times)) * 1e6)


def _stats(times: Sequence[float]) -> tuple[float, float, float]:
    return float(np.median(times)), float(min(times)), float(max(times))


def _gpu_device() -> str:
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _profile_gpu(program, plans, ctx, memory, mode, repeats, warmup, log, kernels=None):
    import cupy as cp

    from caramel.api import output_digest
    from caramel.execute.cuda_graph import GpuRun
    from caramel.logs import nvtx_range

    if len(plans["graph+fusion"].chips) != 1:
        raise ExecutionError(f"profiling on the GPU takes a 1-chip program, not {program.chips} chips "
                             "(use --backend cpu-plan)")
    variants, kernels, setup = [], [], {}
    for name in VARIANTS:
        graph, per_row = name != "eager", name == "eager"
        t0 = time.perf_counter()
        extra = {} if kernels is None else {"kernels": kernels}  # the CUDA kernels' configuration
        run = GpuRun(plans[name], ctx, memory, mode, per_row=per_row, **extra)
        run.run(graph=False)  # warm-up: compiles kernels, uploads index arrays
        if graph:
            run.capture()
        setup[name] = time.perf_counter() - t0
        t = run.time(graph=graph, repeats=repeats, warmup=warmup)
        digest = output_digest(program, run.result().memory)
        variants.append(VariantTiming(name, run.kernels, t.median_ms, t.min_ms, t.max_ms, t.repeats, digest))
        log(f"{name}: {run.kernels} launches, setup {setup[name]:.1f} s, {t}")
        if name == "graph+fusion":
            with nvtx_range(f"caramel instrumented graph ({run.kernels} kernels)"):
                kernels = _instrument_gpu(run)
        del run
        cp.get_default_memory_pool().free_all_blocks()
    return variants, kernels, setup


#: A one-thread kernel that writes the GPU's global nanosecond clock to t[i]: the instrumented run's
#: marks (CUDA events recorded inside a graph cannot be timed).
_STAMP_SRC = r"""
extern "C" __global__ void stamp(unsigned long long* t, int i) {
    unsigned long long g;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));
    t[i] = g;
}
"""


def _graph_stamps(s, body, marks: int) -> list[float]:
    """Capture ``body(mark)`` on stream ``s`` into one CUDA graph, where ``mark()`` adds a clock
    stamp; replay it twice (the first uploads it) and return the stamps of the second in ms."""
    import cupy as cp

    stamp = cp.RawKernel(_STAMP_SRC, "stamp")
    t = cp.zeros(marks, dtype=cp.uint64)
    count = iter(range(marks))
    s.begin_capture()
    try:
        with s:
            body(lambda: stamp((1,), (1,), (t, np.int32(next(count)))))
    finally:
        graph = s.end_capture()
    for _ in range(2):
        graph.launch(s)
        s.synchronize()
    return [x / 1e6 for x in (t - t[0]).get().tolist()]


def _instrument_gpu(run) -> list[KernelRecord]:
    """Time ``run``'s (fused) plan kernel by kernel on the GPU alone: the plan is captured on one
    stream into one CUDA graph with a one-thread kernel between every two kernels that stamps the
    GPU's clock (``%globaltimer``), and kernel i's time is stamp(i+1) - stamp(i) less one stamp's own
    time (the median gap of a graph of stamps alone). No host time: issuing the kernels one by one
    from Python, with events around each, would be slower than the GPU runs them."""
    chip, s, calls = run.plan.chips[0], run.stream, len(run.device.calls)
    with s:  # one untimed pass: nothing left to load or compile during the capture
        run.device.run()
    s.synchronize()

    def alone(mark):
        for _ in range(65):
            mark()

    gap = float(np.median(np.diff(_graph_stamps(s, alone, 65))))

    def plan(mark):
        mark()
        run.device.run(mark=lambda i: mark())

    at = _graph_stamps(s, plan, calls + 1)
    limb = 4 * run.ctx.n
    return [_record(k, chip.chip, i, at[j], max(at[j + 1] - at[j] - gap, 0.0), limb)
            for j, (_, i, k) in enumerate(run.device.kernel_of)]


def _cpu_run(plan, ctx, memory, mode, per_row: bool):
    """A fresh :class:`~caramel.execute.runner.DeviceRun` of ``plan`` on NumPy, one device hosting
    every chip; ``per_row`` lowers every row as its own call. Returns it and its kernel launches."""
    from caramel.backends.numpy_backend import NumpyBackend
    from caramel.execute.placement import device_programs
    from caramel.execute.runner import DeviceRun

    run = DeviceRun(device_programs(plan, 1, ctx.primes)[0], plan, ctx, memory, mode, NumpyBackend,
                    per_row=per_row)
    return run, sum(k is not None for k in run.kernel_of)


def _profile_cpu(program, plans, ctx, memory, mode, repeats, warmup, log):
    from caramel.api import output_digest

    variants, setup = [], {}
    for name in VARIANTS:
        times, launches, digest = [], 0, ""
        t_setup = 0.0
        for rep in range(warmup + repeats):
            t0 = time.perf_counter()
            run, launches = _cpu_run(plans[name], ctx, memory, mode, per_row=name == "eager")
            t1 = time.perf_counter()
            run.run()
            t2 = time.perf_counter()
            t_setup += t1 - t0
            if rep >= warmup:
                times.append((t2 - t1) * 1e3)
            if rep == warmup + repeats - 1:
                merged = dict(memory)
                for store in run.stores():
                    merged.update(store)
                digest = output_digest(program, merged)
        setup[name] = t_setup
        med, lo, hi = _stats(times)
        variants.append(VariantTiming(name, launches, med, lo, hi, len(times), digest))
        log(f"{name}: {launches} kernel calls, median {med:.3f} ms")
    run, _ = _cpu_run(plans["graph+fusion"], ctx, memory, mode, per_row=False)
    marks: list[float] = []
    origin = time.perf_counter()
    run.run(lambda i: marks.append(time.perf_counter()))
    starts = [origin] + marks[:-1]
    records = [_record(k[2], k[0], k[1], (t0 - origin) * 1e3, (t1 - t0) * 1e3, 4 * ctx.n)
               for k, t0, t1 in zip(run.kernel_of, starts, marks) if k is not None]
    records.sort(key=lambda r: (r.chip, r.index))
    return variants, records, setup


def resolve_profile_backend(backend: str) -> str:
    from caramel.api import gpu_available

    if backend == "auto":
        return "gpu" if gpu_available() else "cpu-plan"
    if backend == "gpu" and not gpu_available():
        raise ExecutionError("backend gpu: no usable GPU (CuPy or a CUDA device is missing); "
                             "use --backend cpu-plan")
    if backend not in PROFILE_BACKENDS:
        raise ExecutionError(f"unknown profile backend {backend!r} (expected one of {', '.join(PROFILE_BACKENDS)})")
    return backend


def profile_program(program: Program, options=None, *, repeats: int = 10, warmup: int = 1,
                    memory: Mapping[Mem, np.ndarray] | None = None, log: Callable[[str], None] | None = None,
                    **fields) -> ProfileResult:
    """Time ``program`` (eager / graph / graph+fusion) and one instrumented run of its fused plan.

    ``options``: a :class:`~caramel.options.RunOptions` or its fields (``n``, ``mode``, ``seed``,
    ``backend``: ``gpu``, ``cpu-plan`` or ``auto``, the GPU when usable). Inputs are random unless
    ``memory`` (an input image at ring dimension ``n``) is given: those of ``caramel run --seed S
    --no-check`` (``caramel.api.default_spec``, keys from key seed ``seed``, inputs from
    :func:`~caramel.ckks.keyset.input_rng`), so the digests agree with that run's."""
    from caramel.api import prepare_inputs
    from caramel.ckks.keyset import generate_keyset
    from caramel.options import RunOptions
    from caramel.plan import build_plan

    opts = RunOptions.of(options, **fields)
    log = log or (lambda s: None)
    mode, seed, n = opts.mode, opts.seed, opts.n
    backend = resolve_profile_backend(opts.backend)
    ctx = Context(n=n)
    if memory is None:
        t0 = time.perf_counter()
        memory = prepare_inputs(program, ctx, generate_keyset(program, ctx, opts.keys_seed), seed).memory
        log(f"keys and inputs at N = {n} in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    unfused = build_plan(program, fuse=False)
    plans = {"eager": unfused, "graph": unfused, "graph+fusion": build_plan(program, fuse=True)}
    log(f"plans in {time.perf_counter() - t0:.1f} s")
    repeats, warmup = max(1, int(repeats)), max(0, int(warmup))
    if backend == "gpu":
        variants, kernels, setup = _profile_gpu(program, plans, ctx, memory, mode, repeats, warmup, log, opts.kernels)
        device, clock = _gpu_device(), "cuda events"
        copy_gbs = copy_bandwidth()
    else:
        variants, kernels, setup = _profile_cpu(program, plans, ctx, memory, mode, repeats, warmup, log)
        device, clock = "NumPy plan engine", "wall clock"
        copy_gbs = 0.0
    return ProfileResult(program.name, n, mode.value, backend, device, clock, program.instruction_count,
                         variants, kernels, time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), setup, copy_gbs,
                         critical_path_ms(kernels, plans["graph+fusion"]))


# ----------------------------------------------------------------------------------------------
# throughput: many instances through one executor

#: The phases of an instance, in the order they happen (:class:`caramel.executor.InstanceResult`).
INSTANCE_PHASES = ("encrypt", "upload", "replay", "download", "digest", "check")
#: The inputs shared when serving, unless ``options.shared`` names others.
SERVING_SHARED = ("plaintexts", "scalars")


@dataclass
class RatePoint:
    """One rate of :func:`profile_throughput`: ``instances`` timed from the first submission to the
    last result (setup and one untimed instance before), their ``per_second``, the inputs ``shared``
    (resident), the mean seconds of each phase of an instance (``phases_s``; instances overlap, so
    the rate is not one over their sum), and the digests of the instances (in order)."""

    name: str
    instances: int
    wall_s: float
    per_second: float
    shared: tuple[str, ...]
    phases_s: dict[str, float]
    setup_s: dict[str, float]
    digests: list[str]


@dataclass
class ThroughputProfile:
    """What :func:`profile_throughput` measured: the ``serving`` and ``end to end`` rates."""

    program: str
    n: int
    mode: str
    backend: str
    device: str
    date: str
    rates: list[RatePoint]

    def body(self) -> dict:
        """The JSON body (``caramel profile --throughput --json``; :func:`caramel.results.document`
        adds the environment)."""
        from dataclasses import asdict

        return {"program": self.program, "n": self.n, "mode": self.mode, "backend": self.backend,
                "device": self.device, "date": self.date, "rates": [asdict(r) for r in self.rates],
                "per_second": {r.name: r.per_second for r in self.rates}}


def _rate(name: str, executor, jobs, *, shared) -> RatePoint:
    """Time ``jobs`` (each ``(inputs, seed)``) through ``executor`` after one untimed instance."""
    first = jobs[0]
    executor.submit(first[0], seed=first[1]).result()  # untimed: the lanes' first instance
    start = time.perf_counter()
    futures = [executor.submit(inputs, seed=seed) for inputs, seed in jobs]
    results = [f.result() for f in futures]
    wall = time.perf_counter() - start
    phases = {p: float(np.mean([r.timings.get(p, 0.0) for r in results])) for p in INSTANCE_PHASES}
    return RatePoint(name, len(results), wall, len(results) / wall if wall > 0 else 0.0, tuple(shared), phases,
                     dict(executor.timings), [r.digest for r in results])


def profile_throughput(program: Program, options=None, *, instances: int = 16, keys=None,
                       log: Callable[[str], None] | None = None, **fields) -> ThroughputProfile:
    """Instances per second of ``program``, two ways, on one executor setup each:

    * ``serving``: the inputs ``options.shared`` names (default :data:`SERVING_SHARED`, a model's
      constants) shared and resident, every other input encrypted ahead on the host (ready
      ciphertexts), ``instances`` of them submitted at once; no check: upload, replay, outputs back
      and their digests;
    * ``end to end``: every input drawn per instance (seeds ``seed .. seed + instances - 1``),
      encoded and encrypted on the client device, run, digested and checked (``options.check``), as
      ``caramel run --batch``.

    ``options``: :class:`~caramel.options.RunOptions` or its fields (``backend``: ``gpu``, ``cpu-plan``
    or ``auto``); ``keys``: the key set (default: generated from the key seed, once for both)."""
    from caramel.ckks.device import resolve as client_device, using as using_client
    from caramel.ckks.keyset import generate_keyset
    from caramel.executor import Executor
    from caramel.options import RunOptions

    opts = RunOptions.of(options, **fields)
    log = log or (lambda s: None)
    backend = resolve_profile_backend(opts.backend)
    opts = opts.with_(backend=backend)
    instances = max(1, int(instances))
    ctx = Context(n=opts.n)
    if keys is None:
        t0 = time.perf_counter()
        with using_client(client_device(opts.client, backend)):
            keys = generate_keyset(program, ctx, opts.keys_seed)
        log(f"keys at N = {opts.n} in {time.perf_counter() - t0:.1f} s")
    rates = []
    shared = opts.shared or SERVING_SHARED
    with Executor(program, opts.with_(shared=shared, check=None), keys=keys, ctx=ctx, log=log) as ex:
        ready = [(ex.encrypt(seed=opts.seed + i), opts.seed + i) for i in range(instances)]
        rates.append(_rate("serving", ex, ready, shared=ex.shared))
    log(f"serving: {rates[-1].per_second:.2f} instances/s")
    with Executor(program, opts.with_(shared=()), keys=keys, ctx=ctx, log=log) as ex:
        rates.append(_rate("end to end", ex, [(None, opts.seed + i) for i in range(instances)], shared=()))
    log(f"end to end: {rates[-1].per_second:.2f} instances/s")
    device = _gpu_device() if backend == "gpu" else "NumPy plan engine"
    return ThroughputProfile(program.name, opts.n, opts.mode.value, backend, device,
                             time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), rates)


def render_throughput(result: ThroughputProfile) -> str:
    """The rates and the mean time of each phase of an instance, as a table."""
    head = ("rate", "instances", "wall s", "instances/s", *(f"{p} ms" for p in INSTANCE_PHASES))
    rows = [(r.name, str(r.instances), f"{r.wall_s:.3f}", f"{r.per_second:.2f}",
             *(f"{1e3 * r.phases_s.get(p, 0.0):.2f}" for p in INSTANCE_PHASES)) for r in result.rates]
    lines = [f"{result.program}: N = {result.n}, mode {result.mode}, backend {result.backend} ({result.device}), "
             f"{result.date}", "", _table(head, rows), ""]
    for r in result.rates:
        if r.name == "serving":
            what = (f"shared and resident: {', '.join(r.shared)}; " if r.shared else "no input shared; ") + \
                "the other inputs encrypted ahead on the host"
        else:
            what = "every input drawn, encoded and encrypted per instance"
        setup = ", ".join(f"{k} {v:.2f} s" for k, v in r.setup_s.items())
        lines.append(f"{r.name}: {what}; setup {setup}")
    lines.append("phases: the mean per instance; the instances of an executor overlap (one uploads while another "
                 "replays), so a rate is not one over their sum")
    return "\n".join(lines)


__all__ = ["KernelRecord", "ProfileResult", "RatePoint", "RooflineRow", "ThroughputProfile", "VariantTiming",
           "chrome_trace", "copy_bandwidth", "critical_path_ms", "kind_table", "profile_program", "profile_throughput",
           "render", "render_roofline", "render_throughput", "roofline_table", "write_trace"]
