#!/usr/bin/env python3
"""Where the seconds of one `caramel run` on the GPU go: client keys and inputs, plan, executor setup.

Usage: python3 scripts/gpu_setup_profile.py ARCHIVE#MEMBER [--n 65536] [--profile]

Prints wall-clock phases (CUDA synchronised): first CUDA use, keys, inputs, plan (built, then through
the plan cache: written, read back and compared), then the executor
(GpuRun: device programs, DeviceRun with its upload and lowering, eager warm-up, capture, replay,
read-back), a second GpuRun on the same image in the same process, the kernel modules compiled or
loaded (count and seconds) and the files of CuPy's on-disk kernel cache before and after.
``--profile``: cProfile tables (cumulative) of the keys and of the first GpuRun. ``--digest``: also
prepare the inputs of scripts/reference_digests.py (default spec, numpy's default_rng(1)) on the GPU
client, run them, and compare the output digest with scripts/reference_digests.json (exit status 1
when it differs).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from pathlib import Path


def cache_files() -> int:
    d = Path(os.environ.get("CUPY_CACHE_DIR", Path.home() / ".cupy" / "kernel_cache"))
    return sum(1 for _ in d.glob("*")) if d.is_dir() else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--digest", action="store_true")
    args = ap.parse_args()
    before = cache_files()
    t0 = time.perf_counter()
    marks: list[tuple[str, float]] = []

    def mark(name: str) -> None:
        cp.cuda.Device().synchronize()
        marks.append((name, time.perf_counter()))
        print(f"  {name}: {marks[-1][1] - (marks[-2][1] if len(marks) > 1 else t0):.3f} s", flush=True)

    import cupy as cp

    import caramel
    from caramel.api import default_spec, prepare_inputs, resolve_check
    from caramel.backends.cuda import context as cuctx
    from caramel.ckks.device import using
    from caramel.ckks.keyset import generate_keyset
    from caramel.execute import cuda_graph
    from caramel.plan import build_plan
    from caramel.plan_cache import cached_plan
    from caramel.ring import Context

    compiled = {"n": 0, "s": 0.0}
    orig_kernel = cuctx.CudaRing.kernel

    def timed_kernel(self, key, source_fn, name):
        if (key, name) in self._functions:
            return self._functions[(key, name)]
        t = time.perf_counter()
        fn = orig_kernel(self, key, source_fn, name)
        compiled["n"] += 1
        compiled["s"] += time.perf_counter() - t
        return fn

    cuctx.CudaRing.kernel = timed_kernel
    cp.zeros(1).sum()
    mark("import + first CUDA use")
    program = caramel.load_program(args.program)
    ctx = Context(n=args.n)
    mark("load")
    prof = cProfile.Profile() if args.profile else None
    if prof:
        prof.enable()
    keys = generate_keyset(program, ctx, 0, device="gpu")
    if prof:
        prof.disable()
    mark("keys")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)
    with using("gpu"):
        prepared = prepare_inputs(program, ctx, keys, 0, resolve_check(program, "auto") or default_spec(program))
    mark("inputs")
    plan = build_plan(program, fuse=True)
    mark("plan")
    cached_plan(program)
    mark("plan cache: plan built and written")
    cached = cached_plan(program)
    mark("plan cache: read")
    if cached.chips != plan.chips:
        raise SystemExit("the cached plan differs from build_plan's")
    for attempt in (1, 2):
        compiled.update(n=0, s=0.0)
        prof = cProfile.Profile() if args.profile and attempt == 1 else None
        if prof:
            prof.enable()
        run = cuda_graph.GpuRun(plan, ctx, prepared.memory, "exact", streams=cuda_graph.GRAPH_STREAMS)
        mark(f"[{attempt}] GpuRun (upload, lowering)")
        run.eager()
        mark(f"[{attempt}] eager warm-up ({compiled['n']} modules, {compiled['s']:.2f} s)")
        run.stream.begin_capture()
        run.eager()
        run.graph = run.stream.end_capture()
        mark(f"[{attempt}] capture")
        run.replay()
        mark(f"[{attempt}] first replay (instantiate)")
        run.replay()
        mark(f"[{attempt}] second replay")
        res = run.result()
        mark(f"[{attempt}] read back")
        if prof:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
        del run, res
    print(f"kernel cache files: {before} before, {cache_files()} after; "
          f"total {time.perf_counter() - t0:.2f} s", flush=True)
    if args.digest:
        import json

        import numpy as np

        from caramel.api import output_digest
        from caramel.ckks.check import prepare_check

        with using("gpu"):
            memory = prepare_check(default_spec(program), program, ctx, rng=np.random.default_rng(1)).memory
        run = cuda_graph.GpuRun(plan, ctx, memory, "exact", streams=cuda_graph.GRAPH_STREAMS)
        run.run()
        got = output_digest(program, run.result().memory)
        table = json.loads((Path(__file__).resolve().parent / "reference_digests.json").read_text())
        want = table.get(f"{program.name} N={args.n} exact")
        print(f"digest {got[:16]}... {'= the CPU reference' if got == want else f'!= the CPU reference {want}'}")
        if got != want:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
