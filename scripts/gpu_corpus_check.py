#!/usr/bin/env python3
"""GPU vs CPU reference, limb for limb, over a folder of compiled programs.

Usage: python3 scripts/gpu_corpus_check.py PROGRAMS_DIR [--n 4096,65536] [--pattern '*_4L_*c' ...]
For each program and N: random inputs from the program's check file (or random inputs at scale 2^28),
the CPU reference in worker processes, the GPU executor (one CUDA graph for 1-chip programs, the plan
engine's transport for several chips on one GPU) in the main process; every store of every chip must be
identical. Prints one line per program and a summary; exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np

from caramel.api import default_spec, resolve_check
from caramel.ckks.check import prepare_check
from caramel.execute.cuda_graph import gpu_executor
from caramel.execute.reference import run_reference
from caramel.parse import load_program
from caramel.ring import Context, Mode


def reference(path: str, n: int, mode: str, seed: int):
    program = load_program(path, cache=False)
    ctx = Context(n=n)
    spec = resolve_check(program, "auto") or default_spec(program)
    prepared = prepare_check(spec, program, ctx, rng=np.random.default_rng(seed))
    return path, n, prepared.memory, run_reference(program, ctx, prepared.memory, mode).stores


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--n", default="4096,65536")
    ap.add_argument("--pattern", nargs="*", default=["*_4L_*c", "*_10L_*c"])
    ap.add_argument("--mode", default="exact")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=12)
    args = ap.parse_args()
    paths = sorted({str(p) for pat in args.pattern for p in Path(args.root).glob(pat) if p.is_dir()})
    jobs = [(p, int(n)) for n in args.n.split(",") for p in paths]
    bad, done, start = [], 0, time.time()
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(reference, p, n, args.mode, args.seed) for p, n in jobs]
        contexts: dict[int, Context] = {}
        for fut in cf.as_completed(futures):
            path, n, memory, want = fut.result()
            ctx = contexts.setdefault(n, Context(n=n))
            program = load_program(path, cache=False)
            have = gpu_executor(program, ctx, Mode(args.mode))(memory).stores
            same = len(have) == len(want) and all(
                h.keys() == w.keys() and all(np.array_equal(h[k], w[k]) for k in w) for h, w in zip(have, want)
            )
            limbs = sum(len(w) for w in want)
            done += 1
            print(f"{'ok  ' if same else 'DIFF'} {program.name:28s} N={n:<6d} {limbs:5d} stored limbs", flush=True)
            if not same:
                bad.append(f"{program.name} N={n}")
    print(f"{done} program runs, {len(bad)} mismatches, {time.time() - start:.0f} s, mode {args.mode}"
          + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
