"""Every program of a folder on a backend against the CPU reference, limb for limb, in each arithmetic mode.

    python -m bench corpus [DIR] [--n 4096,65536] [--mode exact|textbook|emulator|all] [--pattern '*_4L_*c' ...]

For each program and N: random inputs from the program's check file (else the default spec), seed ``--seed``; the
CPU reference in worker processes; the backend in this process (``gpu``: one CUDA graph on 4 streams for a 1-chip
program, every chip of a K-chip program on one GPU; ``cpu-plan``: NumPy devices in host threads, one per chip). Every
store of every chip must be identical. One line per run, a figure per mode; exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import time
from pathlib import Path

import numpy as np

from bench.harness import Record, ab_runs, add_common, config_sets, log, need_gpu, open_run, program_dirs, same_stores

MODES = ("exact", "textbook", "emulator")


def reference(path: str, n: int, mode: str, seed: int):
    """(path, n, the input image, the reference's stores): run in a worker process."""
    from caramel.api import default_spec, resolve_check
    from caramel.ckks.check import prepare_check
    from caramel.execute.reference import run_reference
    from caramel.parse import load_program
    from caramel.ring import Context

    program = load_program(path, cache=False)
    ctx = Context(n=n)
    spec = resolve_check(program, "auto") or default_spec(program)
    memory = prepare_check(spec, program, ctx, rng=np.random.default_rng(seed)).memory
    return path, n, memory, run_reference(program, ctx, memory, mode).stores


def default_root() -> Path:
    """``.data/corpus`` when a device call carried it, else the first folder of the lookup that holds 4L programs."""
    for d in program_dirs():
        if any(d.glob("*_4L_*c")):
            return d
    raise SystemExit("bench corpus: no folder of programs found (give DIR)")


def check_mode(rec: Record, args, paths: list[str], mode: str, config, label: str) -> None:
    from caramel.execute.cuda_graph import DEFAULT_STREAMS, GRAPH_STREAMS
    from caramel.parse import load_program
    from caramel.plan_cache import cached_plan
    from caramel.ring import Context

    jobs = [(p, int(n)) for n in args.n_list for p in paths]
    bad, done, start = [], 0, time.time()
    contexts: dict[int, Context] = {}
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(reference, p, n, mode, args.seed) for p, n in jobs]
        for fut in cf.as_completed(futures):
            path, n, memory, want = fut.result()
            ctx = contexts.setdefault(n, Context(n=n))
            program = load_program(path, cache=False)
            plan = cached_plan(program)
            if args.backend == "gpu":
                one = len(plan.chips) == 1
                run = open_run(plan, ctx, memory, "gpu", streams=GRAPH_STREAMS if one else DEFAULT_STREAMS,
                               gpus=None if one else 1, config=config, mode=mode)
            else:
                run = open_run(plan, ctx, memory, "cpu-plan", mode=mode)
            try:
                have = run.once().stores
            finally:
                run.close()
            same = same_stores(want, have)
            done += 1
            print(f"{'ok  ' if same else 'DIFF'} {program.name:28s} N={n:<6d} {sum(map(len, want)):5d} stored limbs "
                  f"{mode}", flush=True)
            if not same:
                bad.append(f"{program.name} N={n}")
    rec.add(f"corpus {mode}: program runs", done, config=label, seconds=round(time.time() - start))
    rec.check(f"corpus {mode}: GPU = CPU reference, limb for limb" if args.backend == "gpu" else
              f"corpus {mode}: plan engine = CPU reference, limb for limb", not bad and done == len(jobs),
              f"{len(bad)} mismatches: {', '.join(bad)}" if bad else "", config=label)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m bench corpus", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("root", nargs="?", help="folder of compiled programs (default .data/corpus, else the corpus)")
    ap.add_argument("--sizes", default="4096,65536", help="ring degrees, comma separated (default 4096,65536)")
    ap.add_argument("--pattern", nargs="*", default=["*_4L_*c", "*_10L_*c"], help="program folders to take")
    ap.add_argument("--mode", default="exact", choices=(*MODES, "all"))
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=12, help="processes of the CPU reference (default 12)")
    add_common(ap, n=None, repeats=1)
    args = ap.parse_args(argv)
    if args.base:
        return ab_runs("corpus", argv, args.base, args.rounds, args.json)
    need_gpu(args.backend)
    args.n_list = [int(x) for x in args.sizes.split(",") if x]
    root = Path(args.root) if args.root else default_root()
    paths = sorted({str(p) for pat in args.pattern for p in root.glob(pat) if p.is_dir()})
    if not paths:
        raise SystemExit(f"bench corpus: no program of {root} matches {' '.join(args.pattern)}")
    rec = Record("corpus", argv, args.backend)
    rec.add("programs", len(paths), root=str(root), sizes=args.sizes)
    log(f"{len(paths)} programs of {root}, N = {args.sizes}")
    for label, config in config_sets(args.config):
        for mode in MODES if args.mode == "all" else (args.mode,):
            check_mode(rec, args, paths, mode, config, label)
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
