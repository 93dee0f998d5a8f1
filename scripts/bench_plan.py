#!/usr/bin/env python
"""Benchmark the dependency DAG and the plan on BootstrapLike_51L (1 and 8 chips by default).

Per program: the SSA renaming and the networkx whole-program graph (time, nodes, edges, memory),
the resource graph before renaming (raw/war/waw edges), the plan build (wall and CPU time, best of
``--repeat``), then the plan report: instructions -> kernels by kind, memory traffic per
instruction vs plan at N = 65536, critical path, parallel width. Memory is measured with
tracemalloc on a separate run (what the built structure retains, and the peak while building);
``--no-memory`` skips it.

    python scripts/bench_plan.py                          # BootstrapLike_51L_1c and _8c
    python scripts/bench_plan.py --programs 1 2 4 8 --repeat 3
    python scripts/bench_plan.py --source /tmp/bl         # an already unpacked folder
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan, dag  # noqa: E402
from caramel.plan.report import plan_report, plan_stats  # noqa: E402

ARCHIVE = REPO.parent / "shared" / "programs" / "BootstrapLike_51L.tar.xz"


def measure(fn, memory: bool):
    """(result, wall s, cpu s, (retained, peak) bytes of Python allocations or None).

    Time is taken on a run without tracing (the garbage collector paused, as the planner does);
    memory on a second run under tracemalloc (about 10x slower): ``retained`` is what the result
    holds, ``peak`` the most allocated at once while building it."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    gc.disable()
    try:
        out = fn()
    finally:
        gc.enable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    mem = None
    if memory:
        gc.collect()
        tracemalloc.start()
        kept = fn()
        mem = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del kept
    return out, wall, cpu, mem


def mib(mem) -> str:
    return "memory not measured" if mem is None else f"memory {mem[0] / 2**20:.0f} MiB (peak {mem[1] / 2**20:.0f} MiB)"


def bench(source: str, repeat: int, memory: bool) -> dict:
    t = time.perf_counter()
    program = load_program(source, progress=False)
    load = time.perf_counter() - t
    print(f"\n=== {program.name}: {program.instruction_count} instructions on {program.chips} chip(s)"
          f" (loaded in {load:.2f} s)")
    chips, w, c, mem = measure(lambda: dag.program_ssa(program), memory)
    print(f"SSA renaming:          {w:6.2f} s wall {c:6.2f} s cpu  {mib(mem)}"
          f"  {sum(ch.n_values for ch in chips)} values, {sum(ch.n_buffers for ch in chips)} buffers")
    graph, w, c, mem = measure(lambda: dag.program_graph(program, chips), memory)
    comm = sum(1 for _, _, d in graph.edges(data=True) if d["dep"] == "comm")
    print(f"networkx DAG:          {w:6.2f} s wall {c:6.2f} s cpu  {mib(mem)}"
          f"  {graph.number_of_nodes()} nodes, {graph.number_of_edges()} edges ({comm} cross-chip)")
    del graph
    graphs, w, c, mem = measure(lambda: [dag.resource_graph(s) for s in program.streams], memory)
    counts = {"raw": 0, "war": 0, "waw": 0}
    for g in graphs:
        for _, _, d in g.edges(data=True):
            counts[d["dep"]] += 1
    print(f"graph before renaming: {w:6.2f} s wall {c:6.2f} s cpu  {mib(mem)}"
          f"  raw {counts['raw']}, war {counts['war']}, waw {counts['waw']} (renaming removes war/waw)")
    del graphs, chips
    best = None
    for i in range(repeat):
        plan, w, c, mem = measure(lambda: build_plan(program), memory and i == 0)
        if best is None or w < best[0]:
            best = (w, c, mem if best is None else best[2])
    w, c, mem = best
    print(f"plan build:            {w:6.2f} s wall {c:6.2f} s cpu  {mib(mem)}  best of {repeat}")
    print()
    print(plan_report(plan, program), end="")
    stats = plan_stats(plan, program)
    return {"program": program.name, "instructions": program.instruction_count, "kernels": plan.kernels,
            "plan_s": w, "traffic": stats["plan_bytes"] / stats["instruction_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--programs", type=int, nargs="+", default=[1, 8], help="chip counts (default 1 8)")
    parser.add_argument("--source", default=None, help="folder holding BootstrapLike_51L_<K>c (default: the archive)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--no-memory", action="store_true", help="skip the tracemalloc runs (10x slower)")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs,"
          f" Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    rows = []
    for k in args.programs:
        name = f"BootstrapLike_51L_{k}c"
        if args.source:
            source = str(Path(args.source) / name)
        elif Path("/tmp/bl", name).is_dir():
            source = str(Path("/tmp/bl", name))
        else:
            source = f"{ARCHIVE}#{name}"
        rows.append(bench(source, args.repeat, not args.no_memory))
    print("\nsummary")
    for r in rows:
        print(f"  {r['program']:<24} {r['instructions']:>7} instructions -> {r['kernels']:>5} kernels"
              f" ({r['instructions'] / r['kernels']:.0f}x), plan traffic {r['traffic']:.2f}x per-instruction,"
              f" plan built in {r['plan_s']:.2f} s")


if __name__ == "__main__":
    main()
