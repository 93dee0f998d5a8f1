"""Where a multi-stream replay waits: BootstrapLike_51L_1c's fused graph (4 streams) captured with a one-thread kernel
after every task that writes the GPU's global timer (CUDA events recorded in a graph cannot be timed), replayed,
and each task's end read. A task starts when its stream's previous task and every task it waits for have ended
(launch latency and queueing for the multiprocessors are part of its span; the stamps add a launch to each).

Prints how long the replay runs 0, 1, 2, ... tasks at once, and of that how long some other task could have started
(its plan's data dependencies done) but waited for its stream or a row it would overwrite; then the tasks that ran
alone the longest (the narrow places of the graph: there the kernels themselves must fill the GPU) and the time by
kernel family. Writes a Chrome / Perfetto trace (one track a stream) and the spans as JSON.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_timeline.py [--streams 4] [--reuse none] [--repeats 5] \
        [--trace timeline.trace.json] [--json timeline.json] [--top 25]

``--time fifo:4,none:4,auto:4`` instead times plain replays (no stamps) of each row reuse and stream count, one
after the other in this process (``auto``: the runs' own choice).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from caramel.execute.cuda_graph import GpuRun  # noqa: E402
from caramel.outfiles import write_atomic  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.plan.cost import family  # noqa: E402
from caramel.plan.plan import REUSE  # noqa: E402
from caramel.ring import Context  # noqa: E402
from gpu_bench import find, log  # noqa: E402
from reference_digests import bootstrap_inputs  # noqa: E402

#: One thread writes the global timer (ns) at t[k].
STAMP_SRC = r"""extern "C" __global__ void stamp(unsigned long long* t, int k) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    t[k] = now;
}"""


def spans(ends: list[float], stream: list[int], waits: list[tuple[int, ...]]) -> list[tuple[float, float]]:
    """(start, end) of every task from its end: the later of its stream's previous task's end and the ends of the
    tasks it waits for (0 for the first of a stream)."""
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


def time_layouts(plan, ctx, memory, configs: list[str], repeats: int) -> None:
    """Plain replays of every REUSE:STREAMS configuration, one after the other."""
    import cupy as cp

    for config in configs:
        reuse, streams = config.split(":")
        run = GpuRun(plan, ctx, memory, "exact", streams=int(streams), reuse=None if reuse == "auto" else reuse)
        log(f"{plan.name}, {streams} streams, reuse {reuse}, arena {run.backend.nbytes / 2**30:.2f} GiB: "
            f"{run.time(repeats)}, after one replay")
        run.close()
        del run
        cp.get_default_memory_pool().free_all_blocks()


def stamped_ends(run: GpuRun, repeats: int) -> tuple[list[float], list[float]]:
    """(replay times, each task's end in ms after the origin in the last replay) of ``run``'s graph captured with a
    stamp at the origin and after every task."""
    import cupy as cp

    launcher = run.launchers[run.local[0]]
    tasks = len(launcher.schedule.stream)
    stamp = cp.RawKernel(STAMP_SRC, "stamp")
    stamps = cp.zeros(tasks + 1, dtype=cp.uint64)  # [k]: task k's end, [-1]: the origin
    plain_launch = launcher.launch

    def launch(issue) -> None:  # the launcher's, with the stamps
        with launcher.streams[0]:
            stamp((1,), (1,), (stamps, np.int32(tasks)))

        def marked(k: int) -> None:
            issue(k)
            stamp((1,), (1,), (stamps, np.int32(k)))
        plain_launch(marked)

    launcher.launch = launch
    replay = [t[0] for t in run.replay(repeats + 1)]
    got = cp.asnumpy(stamps).astype(np.int64)
    return replay, ((got[:-1] - got[-1]) / 1e6).tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="BootstrapLike_51L_1c")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5, help="replays before the one read (the last)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--trace", default="timeline.trace.json", help="Chrome trace to write")
    ap.add_argument("--json", default="timeline.json", help="the spans as JSON")
    ap.add_argument("--reuse", choices=REUSE, help="arena row reuse (default: the runs' choice)")
    ap.add_argument("--time", default="", help="REUSE:STREAMS,... (e.g. fifo:4,none:64,auto:4): only time plain "
                    "replays (no stamps) of each, in this process, and stop")
    args = ap.parse_args()

    program = find([ROOT / ".data", Path("/work/shared/programs")], args.program)
    ctx = Context(n=args.n)
    plan = build_plan(program)
    memory = bootstrap_inputs(program, ctx)
    if args.time:
        time_layouts(plan, ctx, memory, [c for c in args.time.split(",") if c], args.repeats)
        return 0
    run = GpuRun(plan, ctx, memory, "exact", streams=args.streams, reuse=args.reuse)
    dev, sch = run.device, run.schedule
    replay, ends = stamped_ends(run, args.repeats)
    span = spans(ends, list(sch.stream), [tuple(w) for w in sch.waits])
    kernels = [dev.kernel_of[calls[0]] if len(calls) else None for calls in dev.task_calls]
    deps = plan.chips[0].deps
    task_of = {kern[1]: k for k, kern in enumerate(kernels) if kern is not None}
    ready = [max([ends[task_of[j]] for j in deps[kern[1]]], default=0.0) if kern is not None else span[k][0]
             for k, kern in enumerate(kernels)]
    by_count, alone = concurrency(span, ready)
    log(f"{args.program}, {args.streams} streams, arena {dev.backend.nbytes / 2**30:.2f} GiB: replays "
        f"{', '.join(f'{t:.3f}' for t in replay)} ms; last task ends at {max(ends):.3f} ms")
    total = max(e for _, e in span)
    print("| tasks at once | ms | share | ms with a task ready but waiting |")
    print("| --- | --- | --- | --- |")
    for c in sorted(by_count):
        ms, waiting = by_count[c]
        print(f"| {c} | {ms:.3f} | {100 * ms / total:.1f}% | {waiting:.3f} |")
    rows = []
    for k, ((s, e), kern) in enumerate(zip(span, kernels)):
        what = ({"family": family(kern[2]), "rows": len(kern[2].rows), "kernel": kern[1], "level": kern[2].level}
                if kern is not None else {"family": "comm", "rows": 0})
        rows.append(dict(task=k, name=dev.tasks[k].name, stream=int(sch.stream[k]), start=s, end=e, ready=ready[k],
                         alone=alone[k], **what))
    print(f"\nthe {args.top} tasks alone the longest (of {sum(alone):.3f} ms with one task running):")
    print("| task | family | rows | level | span us | alone us | start ms |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in sorted(rows, key=lambda r: -r["alone"])[: args.top]:
        span_us = 1000 * (r["end"] - r["start"])
        print(f"| {r['task']} | {r['family']} | {r['rows']} | {r.get('level', '')} | {span_us:.1f} "
              f"| {1000 * r['alone']:.1f} | {r['start']:.3f} |")
    fam: dict[str, list[float]] = {}
    for r in rows:
        f = fam.setdefault(r["family"], [0, 0.0, 0.0])
        f[0] += 1
        f[1] += r["end"] - r["start"]
        f[2] += r["alone"]
    print("\n| family | tasks | summed span ms | alone ms |")
    print("| --- | --- | --- | --- |")
    for name, (count, sp, al) in sorted(fam.items(), key=lambda kv: -kv[1][2]):
        print(f"| {name} | {count} | {sp:.3f} | {al:.3f} |")
    meta = {"program": args.program, "streams": args.streams, "arena_bytes": dev.backend.nbytes, "replays_ms": replay}
    events = [{"name": f"{r['family']} x{r['rows']}", "ph": "X", "pid": 0, "tid": r["stream"],
               "ts": 1000 * r["start"], "dur": 1000 * (r["end"] - r["start"]), "args": r} for r in rows]
    write_atomic(args.trace, json.dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": meta}))
    write_atomic(args.json, json.dumps(dict(meta, tasks_at_once_ms={str(c): v for c, v in by_count.items()},
                                            tasks=rows), indent=1))
    log(f"wrote {args.trace} and {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
