#!/usr/bin/env python3
"""Where the seconds of one `caramel run --backend gpu --keys DIR` go: the command run in this process
with a cProfile per thread (the main thread, the GPU warm-up, the key loading threads).

Usage: python3 scripts/gpu_client_runprofile.py PROGRAM --keys DIR [--n 65536] [--out DIR] [--top 45]
           [--no-profile] [--eager] [--timeline]

Writes to --out (default ./gpu_profile): ``run.json`` (the run's --json), ``prof-<thread>.txt`` (per
thread group, the top functions by cumulative time) and prints a summary: per thread group the calls
and seconds of CuPy's compile-cache lookups (each one a module loaded: an ElementwiseKernel or ufunc
of a new signature, a RawModule) and of caramel's phases. ``--no-profile``: only the timings (and
``-v``'s DEBUG lines on stderr). ``--eager``: a one-shot run launched eagerly instead of captured
as a graph and replayed (the same kernels in the same order: the digest must not change).
cProfile slows the Python parts of every profiled thread; read shares, not absolute seconds.
Python 3.12 runs cProfile on ``sys.monitoring``, one profiler per process that sees every thread:
there the whole process is one profile (thread groups are only made before 3.12, where a second
profiler in another thread was allowed; on 3.12 it raised in the pool's worker threads, which then
never ran their jobs, and the run hung: session 7). ``--timeline`` (with ``--no-profile``): wall-clock spans from the script's start, written to ``timeline.txt``:
every CuPy module loaded (``_compile_with_cache_cuda``: a kernel cache lookup and a module load, or a
compilation) with its thread, and the main thread's steps (key store, encryption, plan, executor, eager
run, capture, replay, read back; the executor's setup: image check, device programs, arena, input rows,
range check, lowering, schedule). ``--timeout S`` (default 120): after S seconds
the threads' stacks are printed and the process exits (faulthandler), so a hang costs no more.
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import io
import json
import pstats
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

T0 = time.perf_counter()
PROFILES: dict[str, list[cProfile.Profile]] = defaultdict(list)
WATCH = ("_compile_module_with_cache", "compile_with_cache", "load_client_kernels", "work", "transform_rows",
         "prepare_inputs", "encrypt", "plaintext_from_coeffs", "encode", "to_ntt_rows", "cached_plan", "executor",
         "cuda_graph.py:__init__", "runner.py:__init__", "capture", "eager", "replay", "result", "stores",
         "wait_for_warm_up", "load_keys", "check_plan_memory", "schedule", "output_digest", "row_maxima",
         "upload_rows", "run_task", "kernel", "module", "evaluate_check", "_run_results", "_load", "validate_once",
         "_stored_keys", "bind_inputs", "uniform_residues", "cbd", "encrypt_rows", "get", "download")


def _group(name: str) -> str:
    return name.rstrip("0123456789_").rstrip("-_") or name


def _profile_threads() -> None:
    run = threading.Thread.run

    def profiled(self):
        prof = cProfile.Profile()
        PROFILES[_group(self.name)].append(prof)
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()
    threading.Thread.run = profiled


SPANS: list[tuple[float, float, str, str]] = []  # (start, seconds, thread, what), from T0


def _span(what: str, fn):
    """``fn`` recording its wall-clock span (thread, start, seconds) in SPANS."""
    def wrapped(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            SPANS.append((t - T0, time.perf_counter() - t, threading.current_thread().name, what))
    return wrapped


def _after_import(name: str, then) -> None:
    """Call ``then(module)`` once module ``name`` has been imported (by whichever thread), right after
    its code ran; at once if it is imported already."""
    import importlib.abc
    import importlib.util

    if name in sys.modules:
        then(sys.modules[name])
        return

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path, target=None):
            if fullname != name:
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(fullname)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                then(module)
            spec.loader.exec_module = exec_module
            return spec
    sys.meta_path.insert(0, Finder())


def _wrap_compiler(compiler) -> None:
    """Spans of CuPy's module loads and of NVRTC's empty-file preprocessing (once per option set)."""
    inner = compiler._compile_with_cache_cuda

    def load(source, options, arch, cache_dir, *args, **kwargs):
        return _span(f"module ({len(source)} chars)", inner)(source, options, arch, cache_dir, *args, **kwargs)
    compiler._compile_with_cache_cuda = load
    pre = compiler._preprocess

    def preprocess(source, options, *args, **kwargs):
        opts = " ".join(o for o in options if not o.startswith("-I"))
        return _span(f"preprocess ({opts})", pre)(source, options, *args, **kwargs)
    compiler._preprocess = preprocess


def _timeline() -> None:
    """Wrap CuPy's module loads and caramel's steps with :func:`_span` (module attributes looked up
    at call time, so the callers see the wrappers). CuPy's compiler is wrapped when the run imports
    it (:func:`_after_import`), so that CuPy is imported where a plain run imports it."""
    import importlib

    _after_import("cupy.cuda.compiler", _wrap_compiler)
    for mod, names in (("caramel.api", ("prepare_inputs", "executor", "output_digest", "evaluate_check")),
                       ("caramel.ckks.keystore", ("load_keys",)),
                       ("caramel.ckks.device", ("wait_for_warm_up",)),
                       ("caramel.execute.cuda_graph", ("run_gpu", "check_plan_memory", "gpu_device_programs")),
                       ("caramel.backends.cuda.transfer", ("upload_rows", "row_maxima")),
                       ("caramel.ckks.bind", ("bind_inputs",)),
                       ("caramel.ckks.check", ("prepare_check",)),
                       ("caramel.ckks.device", ("load_client_kernels", "encrypt_rows", "to_ntt_rows")),
                       ("caramel.ckks.check", ("plaintext_from_coeffs", "encode", "encrypt")),
                       ("caramel.ckks.keystore", ("_device_redraws", "_device_load")),
                       ("caramel.backends.cuda.context", ("twiddle_tables",)),
                       ("caramel.ckks.pcg", ("device_words",)),
                       ("caramel.backends.cuda.basis", ("BaseConversion",)),
                       ("caramel.backends.cuda.ntt", ("PrologueTables",)),
                       ("caramel.backends.cuda.crt", ("CrtBasis",))):
        m = importlib.import_module(mod)
        for name in names:
            setattr(m, name, _span(f"{mod.rsplit('.', 1)[-1]}.{name}", getattr(m, name)))
    from caramel.execute import cuda_graph

    from caramel.backends.cuda.backend import CupyBackend
    from caramel.execute.runner import DeviceRun

    for name in ("eager", "capture", "replay", "result", "__init__"):
        setattr(cuda_graph.MultiGpuRun, name, _span(f"MultiGpuRun.{name}", getattr(cuda_graph.MultiGpuRun, name)))
    for cls, names in ((DeviceRun, ("__init__", "schedule")), (CupyBackend, ("__init__", "read"))):
        for name in names:  # the parts of MultiGpuRun.__init__ and .result
            setattr(cls, name, _span(f"{cls.__name__}.{name}", getattr(cls, name)))
    for name in KINDS:  # host seconds per kernel kind, summed (first call of each lowered call apart)
        setattr(CupyBackend, name, _summed(name, getattr(CupyBackend, name)))


#: The CupyBackend methods whose host seconds ``--timeline`` sums per kind.
KINDS = ("elementwise", "ntt", "ntt_prologue", "intt", "automorphism", "base_convert", "sud_lift", "rsv", "mod")
SUMS: dict[tuple[str, str, bool], list] = defaultdict(lambda: [0, 0.0])  # (thread, kind, first) -> [calls, s]
_SEEN: set = set()


def _summed(kind: str, fn):
    """``fn`` (a backend method) adding its host seconds to SUMS, the first call with these index
    arrays apart from the later ones."""
    def wrapped(self, *args, **kwargs):
        key = (kind, id(self), tuple(id(a) for a in args))
        first = key not in _SEEN
        _SEEN.add(key)
        t = time.perf_counter()
        try:
            return fn(self, *args, **kwargs)
        finally:
            s = SUMS[(threading.current_thread().name, kind, first)]
            s[0] += 1
            s[1] += time.perf_counter() - t
    return wrapped


IMPORTS: list[tuple[float, str, str, str]] = []  # (start, thread, module, stack) of every import


def _watch_imports(stack_of: tuple[str, ...]) -> None:
    """Record every import (an audit hook): time, thread, module, and for the modules named in
    ``stack_of`` (and their submodules) the importing stack."""
    import traceback

    def hook(event, args):
        if event == "import":
            name = args[0]
            st = ""
            if any(name == m or name.startswith(m + ".") for m in stack_of) and not any(
                    r[2] == name for r in IMPORTS):
                st = "".join(traceback.format_stack(limit=25)[:-1])
            IMPORTS.append((time.perf_counter() - T0, threading.current_thread().name, name, st))
    sys.addaudithook(hook)


def _imports_text() -> str:
    seen, lines = set(), []
    for t, thread, name, st in IMPORTS:
        if name in seen:
            continue
        seen.add(name)
        lines.append(f"{t:8.3f} {thread:24s} {name}")
        if st:
            lines.append(st)
    return "\n".join(lines) + "\n"


def _timeline_text() -> str:
    lines = [f"{t0:8.3f} {s:7.3f}  {thread:24s} {what}" for t0, s, thread, what in sorted(SPANS)]
    mods = [(thread, s) for _, s, thread, what in SPANS if what.startswith("module")]
    per = defaultdict(lambda: [0, 0.0])
    for thread, s in mods:
        per[_group(thread)][0] += 1
        per[_group(thread)][1] += s
    summary = "; ".join(f"{k}: {n} modules {s:.3f} s" for k, (n, s) in sorted(per.items()))
    sums = [f"{thread} {kind} {'first' if first else 'again'}: {n} calls {sec:.3f} s"
            for (thread, kind, first), (n, sec) in sorted(SUMS.items())]
    return ("start(s) seconds thread                   what\n" + "\n".join(lines) + "\nhost seconds per kernel kind:\n"
            + "\n".join(sums) + f"\nmodule loads: {summary}\n")


def _eager_one_shot() -> None:
    """A one-shot run without capture: the fused plan launched once over the streams (bit-identical)."""
    from dataclasses import replace

    from caramel.execute import cuda_graph

    def once(run, graph, repeats):
        if repeats:
            run.run(graph)
            timing = run.time(repeats, graph=graph)
        else:
            run.run(False)
            timing = None
        return replace(run.result(), timing=timing)
    cuda_graph._run_once = once


def _report(out: Path, top: int) -> list[str]:
    lines = []
    for group, profs in sorted(PROFILES.items()):
        stats = None
        for p in profs:
            try:
                stats = pstats.Stats(p) if stats is None else stats.add(p)
            except TypeError:  # a profile with no data
                continue
        if stats is None:
            continue
        buf = io.StringIO()
        stats.stream = buf
        stats.sort_stats("cumulative").print_stats(top)
        stats.sort_stats("tottime").print_stats(top)
        (out / f"prof-{group}.txt").write_text(buf.getvalue())
        found = []
        for (file, _line, fn), (cc, nc, tt, ct, _callers) in stats.stats.items():
            if fn in WATCH or f"{Path(file).name}:{fn}" in WATCH:
                found.append((ct, f"{fn} ({Path(file).name}) calls {nc} cum {ct:.3f} s"))
        found.sort(reverse=True)
        lines.append(f"[{group}] threads {len(profs)}: " + "; ".join(x for _, x in found[:30]))
    return lines


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--keys", required=True)
    ap.add_argument("--n", default="65536")
    ap.add_argument("--out", default="gpu_profile")
    ap.add_argument("--top", type=int, default=45)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--backend", default="gpu")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--serial-warmup", action="store_true")
    ap.add_argument("--imports", metavar="MODULES", help="record every import (imports.txt), with the importing "
                    "stack of these modules (comma-separated, e.g. cupyx,scipy)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    if not args.no_profile and sys.version_info < (3, 12):
        _profile_threads()
    if args.imports:
        _watch_imports(tuple(args.imports.split(",")))
    main_prof = cProfile.Profile()
    if not args.no_profile:
        PROFILES["MainThread" if sys.version_info < (3, 12) else "all-threads"].append(main_prof)
        main_prof.enable()
    import caramel.cli

    t_import = time.perf_counter()
    if args.timeline:
        _timeline()
    if args.eager:
        _eager_one_shot()
    if args.serial_warmup:  # the warm-up alone: the main thread waits for it as soon as it starts
        from caramel.ckks import device

        start = device.warm_up
        device.warm_up = lambda n: (start(n), device.wait_for_warm_up())
    rc = caramel.cli.main(["run", args.program, "--n", args.n, "--backend", args.backend, "--keys", args.keys,
                           "--json", str(out / "run.json"), "-v"])
    t_end = time.perf_counter()
    main_prof.disable()
    faulthandler.cancel_dump_traceback_later()
    lines = [f"import caramel.cli {t_import - T0:.3f} s, cli.main {t_end - t_import:.3f} s, rc {rc}"]
    try:
        doc = json.loads((out / "run.json").read_text())
        t = doc["timings_s"]
        lines.append("timings_s: " + " ".join(f"{k} {v:.3f}" for k, v in t.items())
                     + f" | sum {sum(t.values()):.3f} | keys+encrypt {t['keys'] + t['encrypt']:.3f}"
                     + f" | digest {doc.get('digest', '')[:16]}")
    except (OSError, ValueError, KeyError) as exc:
        lines.append(f"no timings: {exc}")
    if not args.no_profile:
        lines += _report(out, args.top)
    if args.timeline:
        text = _timeline_text()
        (out / "timeline.txt").write_text(text)
        lines.append(text.splitlines()[-1])
    if args.imports:
        (out / "imports.txt").write_text(_imports_text())
    text = "\n".join(lines)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return rc


if __name__ == "__main__":
    sys.exit(main())
