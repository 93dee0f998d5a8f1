"""The one harness of the benchmarks: what every command of ``python -m bench`` shares.

* **A device call's steps**: :func:`find_program` and :func:`bench_inputs` (the inputs every figure of record
  uses), :func:`open_run` (a plan resident on ``gpu`` or on the NumPy plan engine, ``cpu-plan``, behind one
  :class:`Replay`), :func:`graph_time` / :func:`wall_time` (a launch timed from a replayed CUDA graph, or by the
  wall clock), :func:`kernel_config` (the only door of ``--config`` settings into caramel).
* **The check**: :func:`reference_digest` (the stored CPU reference digest of ``reference_digests.json``, or a CPU
  reference run) and :func:`same_stores` (limb for limb).
* **The record**: :class:`Record`, every figure with the date, commit, device and command, written as JSON
  (``--json``, default ``$OUT/<command>-<time>.json`` or ``bench-results/``).
* **A/B in one call**: ``--base DIR`` (:func:`add_common`, :func:`ab_runs`) runs the same command on the caramel of
  an earlier commit's tree (``python -m bench ab prepare REV``) and on this tree, alternating, in fresh processes.

Benchmarks use caramel's public names only and never write its modules' state: a kernel variant is a value
(``KernelConfig``) passed to the backend or executor, nothing else.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

#: The repository root (the tree whose caramel the benchmarks import, unless ``--base`` says otherwise).
ROOT = Path(__file__).resolve().parents[1]
#: Output digests of the CPU reference for the benchmark inputs (``python -m bench cpu digests`` writes them).
DIGESTS = Path(__file__).resolve().parent / "reference_digests.json"
#: The program of the figures of record.
BIG = "BootstrapLike_51L_1c"
BACKENDS = ("gpu", "cpu-plan")


def log(*parts: object) -> None:
    """One progress line on stderr, with the time of day."""
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# programs and inputs


def program_dirs() -> list[Path]:
    """Where programs are looked up by name: ``.data/`` (what a device call carries), ``.data/corpus/``,
    ``$CARAMEL_SHARED_PROGRAMS``, ``../shared/programs`` beside the checkout, ``programs/``."""
    dirs = [ROOT / ".data", ROOT / ".data" / "corpus"]
    if os.environ.get("CARAMEL_SHARED_PROGRAMS"):
        dirs.append(Path(os.environ["CARAMEL_SHARED_PROGRAMS"]))
    dirs += [ROOT.parent / "shared" / "programs", ROOT / "programs"]
    return [d for d in dirs if d.is_dir()]


def program_path(name: str) -> str:
    """Where the program ``name`` is: a path as given (a folder, or ``ARCHIVE#MEMBER``), or a name looked up in
    :func:`program_dirs` as a folder or as the member of its family's archive (``BootstrapLike_51L_1c`` in
    ``BootstrapLike_51L.tar.xz``). SystemExit naming the folders when it is nowhere."""
    if "#" in name or Path(name).exists():
        return name
    for d in program_dirs():
        if (d / name).is_dir():
            return str(d / name)
        archive = d / f"{name.rsplit('_', 1)[0]}.tar.xz"
        if archive.is_file():
            return f"{archive}#{name}"
    raise SystemExit(f"bench: program {name} not found in {', '.join(map(str, program_dirs())) or 'no folder'} "
                     "(give its path, or carry it in .data/)")


def family_archive(family: str = "BootstrapLike_51L") -> str:
    """The archive ``<family>.tar.xz`` of the first of :func:`program_dirs` that holds it; SystemExit when none
    does."""
    for d in program_dirs():
        if (d / f"{family}.tar.xz").is_file():
            return str(d / f"{family}.tar.xz")
    raise SystemExit(f"bench: {family}.tar.xz not found in {', '.join(map(str, program_dirs())) or 'no folder'} "
                     "(give its path, or carry it in .data/)")


def find_program(name: str):
    """The program ``name`` loaded (:func:`program_path`)."""
    from caramel.parse import load_program

    return load_program(program_path(name))


def bench_inputs(program, ctx, seed: int | None = None, client: str = "cpu") -> dict:
    """The input image of every figure of record: the default spec's random inputs drawn from
    ``numpy.random.default_rng(1)`` (``seed`` None), or those of ``caramel run --seed S`` (keys and inputs from
    S). ``client``: the device that encrypts ("gpu" gives the same bits, sooner)."""
    from caramel.api import default_spec, prepare_inputs
    from caramel.ckks.check import prepare_check
    from caramel.ckks.device import using
    from caramel.ckks.keyset import generate_keyset

    with using(client):
        if seed is None:
            return prepare_check(default_spec(program), program, ctx, rng=np.random.default_rng(1)).memory
        return prepare_inputs(program, ctx, generate_keyset(program, ctx, seed), seed).memory


def digest_key(name: str, n: int, seed: int | None = None) -> str:
    """The key of a stored digest: the benchmark inputs (``seed`` None) or those of ``caramel run --seed S``."""
    return f"{name} N={n} exact" + ("" if seed is None else f" run --seed {seed}")


def stored_digests() -> dict[str, str]:
    return json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}


def reference_digest(program, ctx, memory, *, seed: int | None = None, mode: str = "exact",
                     policy: str = "auto") -> tuple[str | None, str]:
    """(the CPU reference's output digest for these inputs, where it came from). ``policy``: ``stored`` (the
    digest of :data:`DIGESTS`, or None), ``run`` (a CPU reference run now), ``auto`` (stored when there is one,
    else a run), ``none``."""
    from caramel.api import output_digest
    from caramel.execute.reference import run_reference

    if policy == "none":
        return None, "not checked"
    stored = stored_digests().get(digest_key(program.name, ctx.n, seed)) if mode == "exact" else None
    if stored is not None and policy in ("auto", "stored"):
        return stored, f"stored CPU reference ({DIGESTS.name})"
    if policy == "stored":
        return None, "no stored digest"
    t0 = time.perf_counter()
    digest = output_digest(program, run_reference(program, ctx, memory, mode).memory)
    log(f"CPU reference of {program.name} at N = {ctx.n}: {time.perf_counter() - t0:.1f} s")
    return digest, "CPU reference run"


def same_stores(want, have) -> bool:
    """Whether two runs stored the same limbs, bit for bit (per chip: the same memory names, equal arrays)."""
    return len(want) == len(have) and all(
        w.keys() == h.keys() and all(np.array_equal(w[m], h[m]) for m in w) for w, h in zip(want, have))


# ----------------------------------------------------------------------------------------------
# kernel configurations and plan options


def kernel_config(settings: Sequence[str]):
    """The kernel configuration of ``--config`` settings (``["ntt.split_from=6/6", ...]``): None for none (or
    ``default``): the backend's own defaults, which every tree has; else
    ``caramel.backends.cuda.config.KernelConfig.with_settings(settings)``. A tree without that module (an earlier
    commit) refuses settings with SystemExit. This is the only place where a setting reaches caramel: as a frozen
    value passed to the backend or the executor, never written into a module."""
    settings = [s for s in settings if s and s != "default"]
    if not settings:
        return None
    try:
        from caramel.backends.cuda.config import KernelConfig
    except ImportError:
        raise SystemExit(f"bench: kernel settings {settings} need caramel.backends.cuda.config, which this tree "
                         "lacks") from None
    return KernelConfig().with_settings(settings)


def kernel_options(config) -> dict[str, Any]:
    """Keyword arguments that pass ``config`` to a GPU executor or backend (none for the default)."""
    return {} if config is None else {"kernels": config}


def config_sets(values: Sequence[str]) -> list[tuple[str, Any]]:
    """``--config`` values (each ``"NAME=V,NAME=V"`` or ``default``) -> [(label, configuration)], checked before
    any device work."""
    return [(v or "default", kernel_config([s.strip() for s in v.split(",")])) for v in (values or ["default"])]


def plan_options(text: str) -> dict[str, Any]:
    """``"max_outputs=1,fuse_ntt=all"`` -> ``build_plan`` keyword arguments, each cast like its default (a bool
    default takes true/false, or text such as ``fuse_ntt=all``; ``+`` stands for a comma inside a value)."""
    from caramel.plan import build_plan

    params = inspect.signature(build_plan).parameters
    out: dict[str, Any] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, value = item.partition("=")
        if key not in params or key == "program":
            known = ", ".join(p for p in params if p != "program")
            raise SystemExit(f"bench: unknown build_plan option {key!r} (known: {known})")
        default = params[key].default
        value = value.replace("+", ",")
        if isinstance(default, bool) and value.lower() in ("true", "false", "1", "0"):
            out[key] = value.lower() in ("true", "1")
        elif isinstance(default, int) and not isinstance(default, bool):
            out[key] = int(value)
        else:
            out[key] = value
    return out


# ----------------------------------------------------------------------------------------------
# device runs and timing


@dataclass
class Replay:
    """A plan resident on one backend: ``gpu`` (a :class:`~caramel.execute.cuda_graph.MultiGpuRun`, one CUDA
    graph per GPU) or ``cpu-plan`` (a :class:`~caramel.execute.drive.HostRun`, NumPy devices in host threads,
    timed by the wall clock)."""

    run: Any
    backend: str

    def time(self, repeats: int, warmup: int = 1, graph: bool = True):
        if self.backend == "gpu":
            return self.run.time(repeats, warmup, graph=graph)
        return self.run.time(repeats, warmup)

    def result(self):
        """The outputs of the last run (``cpu-plan``: of a run made now)."""
        return self.run.result()

    def once(self, graph: bool = True):
        """One run (``gpu``: a graph replay, or eager), its outputs read back."""
        if self.backend == "gpu":
            self.run.run(graph)
        return self.run.result()

    @property
    def launches(self) -> int:
        return sum(len(r.calls) for r in self.run.runs if r is not None)

    @property
    def arena_bytes(self) -> int:
        backends = [r.backend for r in self.run.runs if r is not None]
        return sum(int(getattr(b, "nbytes", 0) or getattr(getattr(b, "arena", None), "nbytes", 0)) for b in backends)

    def close(self) -> None:
        """Release the run and its arena (the next run's row layout depends on the memory free)."""
        run, self.run = self.run, None
        if run is not None:
            run.close()
            del run
            free_device_memory(self.backend)


def open_run(plan, ctx, memory, backend: str, *, streams: int = 1, per_row: bool = False, reuse: str | None = None,
             gpus: int | None = None, config=None, mode: str = "exact") -> Replay:
    """``plan`` resident on ``backend`` over the input image ``memory`` (see :class:`Replay`); a 1-chip plan on one
    GPU is a :class:`~caramel.execute.cuda_graph.GpuRun` (its kernels on every stream). ``per_row``, ``reuse``
    and ``config`` are the GPU's (the plan engine runs rows as the plan batches them)."""
    if backend == "gpu":
        from caramel.execute.cuda_graph import GpuRun, MultiGpuRun

        if len(plan.chips) == 1 and not gpus:
            return Replay(GpuRun(plan, ctx, memory, mode, per_row=per_row, streams=streams, reuse=reuse,
                                 **kernel_options(config)), backend)
        return Replay(MultiGpuRun(plan, ctx, memory, mode, gpus, streams=streams, per_row=per_row, reuse=reuse,
                                  **kernel_options(config)), backend)
    if backend != "cpu-plan":
        raise SystemExit(f"bench: backend {backend!r} is not one of {', '.join(BACKENDS)}")
    from caramel.execute.drive import HostRun

    return Replay(HostRun(plan, ctx, memory, mode, gpus, streams=streams, seed=0), backend)


def free_device_memory(backend: str) -> None:
    """Give CuPy's pooled blocks back (between variants, so that the next arena finds the memory free)."""
    if backend == "gpu":
        import gc

        import cupy as cp

        gc.collect()  # a released run's arrays may sit in reference cycles
        cp.get_default_memory_pool().free_all_blocks()


#: The data of all rotating input sets of one kernel timing together: well above a GPU's L2 (50-60 MB).
SET_BYTES = 512 << 20


def sets_for(bytes_per_set: int) -> int:
    """Input sets to rotate over so that one timing does not run from L2 (2 to 16)."""
    return max(2, min(16, SET_BYTES // max(bytes_per_set, 1)))


def graph_time(launch: Callable[[int], None], sets: int, per_replay: int = 0, repeats: int = 15) -> float:
    """Median seconds of one ``launch(s)`` on the current GPU: every set launched once (compiles, uploads), then a
    CUDA graph of ``per_replay`` launches over the sets in turn (default max(sets, 8)), replayed ``repeats``
    times with events around each replay: neither the host's launch overhead nor the L2 cache flatters it."""
    import cupy as cp

    per_replay = per_replay or max(sets, 8)
    for s in range(sets):
        launch(s)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            for k in range(per_replay):
                launch(k % sets)
        finally:
            graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    times = []
    for _ in range(repeats):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3 / per_replay)
    return statistics.median(times)


def wall_time(launch: Callable[[int], None], sets: int, per_replay: int = 0, repeats: int = 5) -> float:
    """:func:`graph_time` on the host: median seconds of one ``launch(s)`` by the wall clock."""
    per_replay = per_replay or max(sets, 2)
    for s in range(sets):
        launch(s)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for k in range(per_replay):
            launch(k % sets)
        times.append((time.perf_counter() - t0) / per_replay)
    return statistics.median(times)


def device_name(backend: str) -> str:
    """The GPU's name (``gpu``), else the host's CPU."""
    if backend == "gpu":
        import cupy as cp

        name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return f"CPU {platform.machine()} ({os.cpu_count()} cores), NumPy"


def need_gpu(backend: str) -> None:
    """SystemExit (status 2) when ``backend`` is ``gpu`` and no GPU is usable."""
    if backend == "gpu":
        from caramel.api import gpu_available

        if not gpu_available():
            raise SystemExit("bench: no usable GPU (CuPy or a CUDA device is missing); try --backend cpu-plan")


# ----------------------------------------------------------------------------------------------
# the record


def commit(tree: Path | None = None) -> str:
    """The commit of the caramel tree being measured: the ``.rev`` of a copy made by ``python -m bench ab prepare``,
    else ``$BENCH_COMMIT``, else git (``-dirty`` when tracked files changed) where the tree is a repository's root,
    else its ``.commit`` file (a device's copy of the working tree has no ``.git``)."""
    import caramel

    tree = tree or Path(caramel.__file__).resolve().parents[1]
    if (tree / ".rev").is_file():
        return (tree / ".rev").read_text().strip()
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        top = subprocess.run(["git", "-C", str(tree), "rev-parse", "--show-toplevel"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
        if top and Path(top).resolve() == tree:
            rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True, timeout=10).stdout.strip()
            dirty = subprocess.run(["git", "-C", str(tree), "diff", "--quiet", "HEAD"], timeout=30).returncode
            return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    if (tree / ".commit").is_file():
        return (tree / ".commit").read_text().strip()
    return "unknown"


@dataclass
class Figure:
    """One measured figure: ``what`` it is, its ``value`` (a number, or text such as a digest or a verdict),
    its ``unit``, and details (``config``, ``min``/``max``, ``repeats``, ...)."""

    what: str
    value: Any
    unit: str = ""
    detail: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        v = f"{self.value:.4g}" if isinstance(self.value, float) else str(self.value)
        extra = ""
        if "min" in self.detail and "max" in self.detail:
            extra = f" (min {self.detail['min']:.4g}, max {self.detail['max']:.4g})"
        return f"{v} {self.unit}".strip() + extra


class Record:
    """Every figure of one command, with the date, commit, device and command line; a check that fails makes
    :meth:`finish` return 1."""

    def __init__(self, command: str, argv: Sequence[str], backend: str = "cpu-plan"):
        from caramel.results import environment

        self.command = command
        self.header = {
            "command": "python -m bench " + shlex.join([command, *argv]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "commit": commit(),
            "device": device_name(backend),
            "backend": backend,
            "environment": environment(probe_gpu=backend == "gpu"),
        }
        self.figures: list[Figure] = []
        self.failures: list[str] = []
        self.extra: dict[str, Any] = {}  # further sections of the JSON record (e.g. every kernel's record)
        log(f"{self.header['command']}: commit {self.header['commit']}, {self.header['device']}")

    def add(self, what: str, value: Any, unit: str = "", **detail: Any) -> Figure:
        fig = Figure(what, value, unit, {k: v for k, v in detail.items() if v is not None})
        self.figures.append(fig)
        log(f"{what}: {fig.text()}")
        return fig

    def timing(self, what: str, t, **detail: Any) -> Figure:
        """A :class:`~caramel.execute.timing.Timing`: median milliseconds, with min, max and repeats."""
        return self.add(what, t.median_ms, "ms", min=t.min_ms, max=t.max_ms, repeats=t.repeats, **detail)

    def check(self, what: str, ok: bool, detail: str = "", **extra: Any) -> bool:
        self.add(what, "ok" if ok else "FAIL", "", note=detail or None, **extra)
        if not ok:
            self.failures.append(what + (f" ({detail})" if detail else ""))
        return ok

    def table(self) -> str:
        lines = ["| what | result |", "| --- | --- |"]
        for f in self.figures:
            tag = f" [{f.detail['config']}]" if f.detail.get("config") not in (None, "default") else ""
            more = "".join(f"; {f.detail[k]}" for k in ("rate", "traffic", "note") if f.detail.get(k))
            lines.append(f"| {f.what}{tag} | {f.text()}{more} |")
        return "\n".join(lines)

    def document(self) -> dict[str, Any]:
        return {**self.header, "figures": [{"what": f.what, "value": f.value, "unit": f.unit, **f.detail}
                                           for f in self.figures], "failures": self.failures, **self.extra}

    def write(self, path: str | Path) -> Path:
        from caramel.results import write_json

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_json(path, self.document())

    def finish(self, json_path: str | None) -> int:
        """Print the table and the verdict, write the JSON record; the exit status (1 when a check failed)."""
        print(self.table())
        print("checks: " + ("all passed" if not self.failures else "FAILED: " + "; ".join(self.failures)))
        path = self.write(json_path or default_json(self.command))
        log(f"record: {path}")
        return 1 if self.failures else 0


def default_json(command: str) -> Path:
    """``$OUT/<command>-<time>.json`` (what a device call brings back), else ``bench-results/`` of the tree."""
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench-results"
    return folder / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}.json"


# ----------------------------------------------------------------------------------------------
# command lines


def add_common(parser: argparse.ArgumentParser, *, backend: str | None = "gpu", n: int | None = 65536,
               repeats: int = 10, configs: bool = True, ab: bool = True) -> None:
    """The options every command shares: ``--json``, ``--backend`` (``gpu`` / ``cpu-plan``), ``--n``,
    ``--repeats``, ``--config`` (repeatable: one timing per kernel configuration, in this process), and the A/B
    options ``--base DIR`` (repeatable) and ``--rounds``."""
    parser.add_argument("--json", metavar="FILE", help="the record (default $OUT/<command>-<time>.json, "
                        "else bench-results/)")
    if backend is not None:
        parser.add_argument("--backend", default=backend, choices=BACKENDS, help=f"default {backend}")
    if n is not None:
        parser.add_argument("--n", type=int, default=n, help=f"ring degree (default {n})")
    parser.add_argument("--repeats", type=int, default=repeats, help=f"timed repeats (default {repeats})")
    if configs:
        parser.add_argument("--config", action="append", default=[], metavar="NAME=V[,NAME=V]",
                            help="kernel settings (KernelConfig.with_settings), one timing each in this process; "
                            "'default' for the backend's own (repeatable)")
    if ab:
        g = parser.add_argument_group("A/B in the same call")
        g.add_argument("--base", action="append", default=[], metavar="DIR",
                       help="also run this command on the caramel of DIR (made by `python -m bench ab prepare "
                       "REV`), alternating with this tree, each run a fresh process (repeatable)")
        g.add_argument("--rounds", type=int, default=2, help="with --base: runs of each tree (default 2)")


#: Options of the parent that its A/B children do not get (with the number of values each takes).
_AB_ONLY = {"--base": 1, "--rounds": 1, "--json": 1}


def strip_options(argv: Sequence[str], options: Mapping[str, int]) -> list[str]:
    """``argv`` without ``options`` (``--opt V`` and ``--opt=V`` forms)."""
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
            continue
        name = a.split("=", 1)[0]
        if name in options:
            skip = 0 if "=" in a else options[name]
            continue
        out.append(a)
    return out


def ab_runs(command: str, argv: Sequence[str], bases: Sequence[str], rounds: int, json_path: str | None) -> int:
    """Run ``python -m bench COMMAND ARGV`` on this tree and on each of ``bases``, ``rounds`` times in turn (this
    tree first), each in a fresh process whose JSON record is kept; print every figure side by side (one column
    per run) and write the records together. The base runs import the base's caramel and this tree's ``bench``
    (the same harness measures both trees). Exit status 1 when a run failed or a check failed in one."""
    from bench import ab

    trees = [("this tree", ROOT)] + [(f"base {Path(b).name}", ab.ready(Path(b))) for b in bases]
    plain = strip_options(argv, _AB_ONLY)
    runs: list[tuple[str, dict | None]] = []
    status = 0
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        shim = Path(tmp) / "shim"
        shim.mkdir()
        (shim / "bench").symlink_to(ROOT / "bench", target_is_directory=True)
        for r in range(rounds):
            for label, tree in trees:
                out = Path(tmp) / f"{len(runs)}.json"
                path = str(tree) if tree == ROOT else f"{shim}{os.pathsep}{tree}"
                env = {**os.environ, "PYTHONPATH": path + (os.pathsep + os.environ["PYTHONPATH"]
                                                          if os.environ.get("PYTHONPATH") else "")}
                cmd = [sys.executable, "-P", "-m", "bench", command, *plain, "--json", str(out)]
                log(f"A/B round {r + 1}, {label}: {shlex.join(cmd[3:])}")
                rc = subprocess.run(cmd, cwd=tree, env=env).returncode
                status |= rc != 0
                runs.append((f"{label} #{r + 1}", json.loads(out.read_text()) if out.exists() else None))
    print(ab_table(runs))
    doc = {"command": "python -m bench " + shlex.join([command, *argv]), "runs": [
        {"label": label, **(rec or {"failed": True})} for label, rec in runs]}
    from caramel.results import write_json

    path = Path(json_path) if json_path else default_json(f"{command}-ab")
    path.parent.mkdir(parents=True, exist_ok=True)
    log(f"record: {write_json(path, doc)}")
    return int(status)


def ab_table(runs: Sequence[tuple[str, dict | None]]) -> str:
    """A Markdown table: one row per figure (what and config), one column per run."""
    rows: dict[tuple[str, str], dict[int, str]] = {}
    for i, (_, rec) in enumerate(runs):
        for f in (rec or {}).get("figures", []):
            value = f["value"]
            cell = f"{value:.4g}" if isinstance(value, float) else str(value)
            rows.setdefault((f["what"], f.get("config", "default")), {})[i] = f"{cell} {f.get('unit', '')}".strip()
    head = "| what | " + " | ".join(f"{label} ({(rec or {}).get('commit', 'failed')})" for label, rec in runs) + " |"
    lines = [head, "|" + " --- |" * (len(runs) + 1)]
    for (what, config), cells in rows.items():
        tag = "" if config == "default" else f" [{config}]"
        lines.append(f"| {what}{tag} | " + " | ".join(cells.get(i, "") for i in range(len(runs))) + " |")
    return "\n".join(lines)


__all__ = ["BACKENDS", "BIG", "DIGESTS", "Figure", "ROOT", "Record", "Replay", "ab_runs", "ab_table", "add_common",
           "bench_inputs", "commit", "config_sets", "default_json", "device_name", "digest_key", "find_program",
           "free_device_memory", "graph_time", "kernel_config", "kernel_options", "log", "need_gpu", "open_run",
           "plan_options", "program_dirs", "program_path", "reference_digest", "same_stores", "sets_for",
           "stored_digests", "strip_options", "wall_time"]
