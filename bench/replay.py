"""A whole program replayed (default BootstrapLike_51L_1c at N = 65536): one CUDA graph of the fused plan on 1 and 4
streams, each kernel configuration (``--config``) and plan (``--plan``) timed in this process, every output digest
checked against the CPU reference's.

    python -m bench replay [--streams 1,4] [--config default --config ntt.split_from=6/6] [--plan max_outputs=1]
    python -m bench replay --unfused          # also eager per instruction, eager and graph of the unfused plan
    python -m bench replay --base .ab         # the same on an earlier commit's tree, alternating (A/B)
    python -m bench replay --waits            # where a multi-stream replay waits (a stamp after every task)
    python -m bench replay --pair             # two replays at once against one after the other: what one leaves idle

``--backend cpu-plan`` runs the plan on the NumPy plan engine (host threads, wall clock; ``--streams S`` runs each
device's tasks in a random order that S streams allow), for a small program and N.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.harness import (BIG, Record, ab_runs, add_common, bench_inputs, config_sets, find_program, log, need_gpu,
                           open_run, plan_options, reference_digest)


def parser() -> argparse.ArgumentParser:
    from caramel.plan.plan import REUSE

    ap = argparse.ArgumentParser(prog="python -m bench replay", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--program", default=BIG, help=f"a name looked up in .data/ and the corpus, or a path "
                    f"(default {BIG})")
    ap.add_argument("--streams", default="1,4", help="stream counts of the fused graph (default 1,4)")
    ap.add_argument("--unfused", action="store_true", help="also eager per instruction (GPU), eager and graph of the "
                    "unfused plan")
    ap.add_argument("--plan", action="append", default=[], metavar="OPTS",
                    help="build_plan options, e.g. max_outputs=1 or fuse_epilogue=False ('' for the default plan); "
                    "one plan each (repeatable)")
    ap.add_argument("--reuse", default="auto", help=f"arena row reuse, comma separated: auto (the run's choice) or "
                    f"{', '.join(REUSE)}")
    ap.add_argument("--reference", default="auto", choices=("auto", "stored", "run", "none"),
                    help="the digest to check: the stored CPU reference digest when there is one, else a CPU "
                    "reference run (auto); only the stored one; a run; none")
    ap.add_argument("--waits", action="store_true", help="(GPU) the fused graph on the largest --streams with a "
                    "stamp after every task: how long 1, 2, ... tasks run at once, the tasks alone the longest")
    ap.add_argument("--top", type=int, default=25, help="with --waits: tasks listed")
    ap.add_argument("--trace", metavar="FILE", help="with --waits: a Chrome / Perfetto trace of the tasks")
    ap.add_argument("--pair", action="store_true", help="(GPU) two captures of the fused graph replayed one after "
                    "the other, then together on two streams")
    add_common(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    args = parser().parse_args(argv)
    if args.base:
        return ab_runs("replay", argv, args.base, args.rounds, args.json)
    need_gpu(args.backend)
    from caramel.api import output_digest
    from caramel.plan import build_plan, plan_stats
    from caramel.ring import Context

    configs = config_sets(args.config)
    plans = [(text or "default", plan_options(text)) for text in (args.plan or [""])]
    streams = [int(s) for s in args.streams.split(",") if s]
    reuses = [None if r == "auto" else r for r in args.reuse.split(",") if r]
    gpu = args.backend == "gpu"
    if (args.waits or args.pair) and not gpu:
        raise SystemExit("bench replay: --waits and --pair time CUDA graphs (--backend gpu)")
    rec = Record("replay", argv, args.backend)
    t0 = time.perf_counter()
    program = find_program(args.program)
    ctx = Context(n=args.n)
    memory = bench_inputs(program, ctx, client="gpu" if gpu else "cpu")
    log(f"{program.name}: loaded, keys and inputs at N = {args.n} in {time.perf_counter() - t0:.1f} s")
    want, source = reference_digest(program, ctx, memory, policy=args.reference)
    rec.add("reference digest", want or "-", note=source)
    digests: list[str] = []

    def measure(label: str, plan, *, graph: bool = True, per_row: bool = False, streams: int = 1, reuse=None,
                config=None, config_label: str = "default", repeats: int | None = None, warmup: int = 1) -> None:
        t = time.perf_counter()
        run = open_run(plan, ctx, memory, args.backend, streams=streams, per_row=per_row, reuse=reuse, config=config)
        setup = time.perf_counter() - t
        try:
            timing = run.time(repeats or args.repeats, warmup, graph=graph)
            digest = output_digest(program, run.result().memory)
            launches, arena = run.launches, run.arena_bytes
        finally:
            run.close()
        digests.append(digest)
        rec.timing(f"{program.name} N={args.n} {label}", timing, config=config_label, launches=launches,
                   arena_gib=round(arena / 2**30, 2), setup_s=round(setup, 2), digest=digest)
        if want is not None:
            rec.check(f"digest of {label} = reference", digest == want, "" if digest == want else digest[:16],
                      config=config_label)

    if args.unfused:
        unfused = build_plan(program, fuse=False)
        if gpu:
            measure("eager per instruction", unfused, graph=False, per_row=True, repeats=min(args.repeats, 3))
        measure("eager unfused", unfused, graph=False)
        measure("graph unfused", unfused)
        del unfused
    fused_plan = None
    for plan_label, options in plans:
        plan = build_plan(program, **options)
        stats = plan_stats(plan, n=args.n)
        tag = "" if plan_label == "default" else f" [plan {plan_label}]"
        rec.add(f"plan traffic{tag}", stats["plan_bytes"] / 2**30, "GiB", kernels=plan.kernels)
        fused_plan = plan if fused_plan is None else fused_plan
        for config_label, config in configs:
            for reuse in reuses:
                for s in streams:
                    what = ("graph fused" if gpu else "plan engine") + f", {s} stream{'s' if s > 1 else ''}"
                    what += tag + ("" if reuse is None else f", rows {reuse}")
                    measure(what, plan, streams=s, reuse=reuse, config=config, config_label=config_label)
    if want is None and len(digests) > 1:
        rec.check("every run's digest agrees", len(set(digests)) == 1)
    if args.waits:
        waits(rec, program, fused_plan, ctx, memory, max(streams), args)
    if args.pair:
        pair(rec, fused_plan, ctx, memory, max(streams), args.repeats)
    return rec.finish(args.json)


# ----------------------------------------------------------------------------------------------
# where a replay waits


#: One thread writes the global timer (ns) at t[k]: CUDA events recorded inside a graph cannot be timed.
STAMP_SRC = r"""extern "C" __global__ void stamp(unsigned long long* t, int k) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    t[k] = now;
}"""


def spans(ends: list[float], stream: list[int], waits: list[tuple[int, ...]]) -> list[tuple[float, float]]:
    """(start, end) of every task from its end: the later of its stream's previous task's end and the ends of the
    tasks it waits for (0 for the first of a stream); a task that ended before it could start (a stamp of a task with
    nothing to do) gets an empty span."""
    last: dict[int, float] = {}
    out = []
    for k, (end, s) in enumerate(zip(ends, stream)):
        start = max([last.get(s, 0.0)] + [ends[j] for j in waits[k]])
        out.append((start, max(start, end)))
        last[s] = end
    return out


def concurrency(span: list[tuple[float, float]], ready: list[float]) -> tuple[dict[int, list[float]], list[float]]:
    """Per count c of tasks running at once, [ms with c running, of which ms with some task ready but not started]
    (``ready[k]``: when task k's data dependencies had ended), up to the last end; and each task's time alone."""
    points = sorted({t for s in span for t in s} | set(ready))
    by_count: dict[int, list[float]] = {}
    alone = [0.0] * len(span)
    for a, b in zip(points, points[1:]):
        running = [k for k, (s, e) in enumerate(span) if s <= a and e >= b]
        waiting = any(ready[k] <= a and span[k][0] >= b for k in range(len(span)))
        entry = by_count.setdefault(len(running), [0.0, 0.0])
        entry[0] += b - a
        entry[1] += (b - a) if waiting else 0.0
        if len(running) == 1:
            alone[running[0]] += b - a
    return by_count, alone


def stamped_ends(gpu_run, repeats: int) -> tuple[list[float], list[float]]:
    """(replay times, each task's end in ms after the origin in the last replay) of a multi-stream
    :class:`~caramel.execute.cuda_graph.GpuRun`'s graph captured with a stamp at the origin and after every task."""
    import cupy as cp

    launcher = gpu_run.launchers[gpu_run.hosted[0]]
    tasks = len(launcher.schedule.stream)
    stamp = cp.RawKernel(STAMP_SRC, "stamp")
    stamps = cp.zeros(tasks + 1, dtype=cp.uint64)  # [k]: task k's end, [-1]: the origin
    plain_launch = launcher.launch

    def launch(issue) -> None:  # this launcher's own launch, with the stamps (an attribute of this object only)
        with launcher.streams[0]:
            stamp((1,), (1,), (stamps, np.int32(tasks)))

        def marked(k: int) -> None:
            issue(k)
            stamp((1,), (1,), (stamps, np.int32(k)))
        plain_launch(marked)

    launcher.launch = launch
    replay = [t[0] for t in gpu_run.replay(repeats + 1)]
    got = cp.asnumpy(stamps).astype(np.int64)
    return replay, ((got[:-1] - got[-1]) / 1e6).tolist()


def waits(rec: Record, program, plan, ctx, memory, streams: int, args) -> None:
    """The stamped replay's figures (see the module docstring) into ``rec``; ``--trace``: a Chrome trace."""
    from caramel.plan.cost import family

    if streams < 2:
        raise SystemExit("bench replay --waits: give --streams of 2 or more")
    run = open_run(plan, ctx, memory, "gpu", streams=streams)
    try:
        gpu_run = run.run
        dev, sch = gpu_run.device, gpu_run.schedule
        replay, ends = stamped_ends(gpu_run, args.repeats)
    finally:
        run.close()
    span = spans(ends, list(sch.stream), [tuple(w) for w in sch.waits])
    kernels = [dev.kernel_of[calls[0]] if len(calls) else None for calls in dev.task_calls]
    deps = plan.chips[0].deps
    task_of = {kern[1]: k for k, kern in enumerate(kernels) if kern is not None}
    ready = [max([ends[task_of[j]] for j in deps[kern[1]]], default=0.0) if kern is not None else span[k][0]
             for k, kern in enumerate(kernels)]
    by_count, alone = concurrency(span, ready)
    rec.add(f"stamped replay, {streams} streams (median)", float(np.median(replay)), "ms")
    for c in sorted(by_count):
        ms, waiting = by_count[c]
        rec.add(f"{c} task(s) at once", round(ms, 3), "ms", ready_task_waiting_ms=round(waiting, 3))
    rows = []
    for k, ((s, e), kern) in enumerate(zip(span, kernels)):
        what = ({"family": family(kern[2]), "rows": len(kern[2].rows), "kernel": kern[1]} if kern is not None
                else {"family": "comm", "rows": 0})
        rows.append(dict(task=k, stream=int(sch.stream[k]), start=s, end=e, ready=ready[k], alone=alone[k], **what))
    print(f"\nthe {args.top} tasks alone the longest (of {sum(alone):.3f} ms with one task running):")
    print("| task | family | rows | span us | alone us | start ms |\n| --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: -r["alone"])[: args.top]:
        print(f"| {r['task']} | {r['family']} | {r['rows']} | {1000 * (r['end'] - r['start']):.1f} "
              f"| {1000 * r['alone']:.1f} | {r['start']:.3f} |")
    fam: dict[str, list[float]] = {}
    for r in rows:
        f = fam.setdefault(r["family"], [0, 0.0])
        f[0] += 1
        f[1] += r["alone"]
    for name, (count, al) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        rec.add(f"alone, {name}", round(al, 3), "ms", tasks=count)
    if args.trace:
        events = [{"name": f"{r['family']} x{r['rows']}", "ph": "X", "pid": 0, "tid": r["stream"],
                   "ts": 1000 * r["start"], "dur": 1000 * (r["end"] - r["start"]), "args": r} for r in rows]
        Path(args.trace).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms",
                                                "otherData": {"program": program.name, "streams": streams}}))
        log(f"trace: {args.trace}")


def pair(rec: Record, plan, ctx, memory, streams: int, repeats: int) -> None:
    """Two captures of the graph (two arenas) replayed one after the other, then together on two streams: when
    together takes less, one replay leaves the GPU idle part of the time."""
    import cupy as cp

    from caramel.execute.timing import Timing

    runs = [open_run(plan, ctx, memory, "gpu", streams=streams) for _ in range(2)]
    try:
        for r in runs:
            r.run.capture()
        graphs = [r.run.graphs[r.run.hosted[0]] for r in runs]
        lanes = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]

        def timed(together: bool) -> float:
            start, stop = cp.cuda.Event(), cp.cuda.Event()
            cp.cuda.Device().synchronize()
            start.record(lanes[0])
            if together:
                lanes[1].wait_event(start)
                graphs[0].launch(lanes[0])
                graphs[1].launch(lanes[1])
                done = cp.cuda.Event()
                done.record(lanes[1])
                lanes[0].wait_event(done)
            else:
                graphs[0].launch(lanes[0])
                graphs[1].launch(lanes[0])
            stop.record(lanes[0])
            stop.synchronize()
            return cp.cuda.get_elapsed_time(start, stop)

        for label, together in (("one after the other", False), ("together", True)):
            timed(together)
            rec.timing(f"two replays, {label}", Timing.of([timed(together) for _ in range(repeats)]))
    finally:
        for r in runs:
            r.close()


if __name__ == "__main__":
    raise SystemExit(main())
