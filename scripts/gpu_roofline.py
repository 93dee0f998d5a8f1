#!/usr/bin/env python3
"""The roofline of BootstrapLike_51L_1c (graph + fusion, one stream) at N = 65536 on one GPU: the replay
time, then one instrumented replay (a one-stream graph with an event between every two kernels), per kernel
kind and the slowest kernels; ``--json FILE`` writes every kernel's record. Run from the repository root
with .data/."""
import argparse
import dataclasses
import json

import numpy as np

from caramel.api import default_spec
from caramel.ckks.check import prepare_check
from caramel.ckks.device import using
from caramel.execute.cuda_graph import GpuRun
from caramel.parse import load_program
from caramel.plan_cache import cached_plan
from caramel.profile import _instrument_gpu, copy_bandwidth, render_roofline
from caramel.ring import Context

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--program", default=".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c")
ap.add_argument("--n", type=int, default=65536)
ap.add_argument("--top", type=int, default=25, help="list this many of the slowest kernels")
ap.add_argument("--json", help="write every kernel's record here")
args = ap.parse_args()

p = load_program(args.program)
ctx = Context(n=args.n)
with using("gpu"):
    mem = prepare_check(default_spec(p), p, ctx, rng=np.random.default_rng(1)).memory
plan = cached_plan(p)
run = GpuRun(plan, ctx, mem, "exact")
run.run(graph=False)
run.capture()
print("replay, one stream:", run.time(graph=True, repeats=10, warmup=1))
rec = _instrument_gpu(run)
copy = copy_bandwidth()
print(f"instrumented replay: {sum(r.dur_ms for r in rec):.3f} ms in {len(rec)} kernels; copy {copy:.0f} GB/s")
print(render_roofline(rec, copy))
kernels = plan.chips[0].kernels
print(f"\nslowest {args.top} kernels:")
print(f"{'#':>4} {'kind':<12} {'rows':>5} {'us':>8} {'MiB':>8} {'GB/s':>6}  what")
for r in sorted(rec, key=lambda r: -r.dur_ms)[:args.top]:
    k = kernels[r.index]
    what = (f"prologue {k.prologue.kind.value}" if k.prologue is not None else
            k.expr.text()[:60] if k.expr is not None else "")
    print(f"{r.index:>4} {r.kind:<12} {r.rows:>5} {1e3 * r.dur_ms:>8.1f} {r.bytes / 2**20:>8.1f} "
          f"{r.bytes / (r.dur_ms * 1e6):>6.0f}  {what}")
if args.json:
    with open(args.json, "w") as f:
        json.dump([dataclasses.asdict(r) for r in rec], f)
