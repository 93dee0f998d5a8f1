#!/usr/bin/env python3
"""Probe: BootstrapLike_51L_1c's 4-stream replay under other stream schedules of the same tasks, in one process,
alternated with the default: the critical chain by estimated cost (caramel.plan.cost) pinned to a stream of its own
beside 3 or 4 list-scheduled streams. Every variant's outputs are compared with the default's. Run from the
repository root with .data/."""
from __future__ import annotations

import dataclasses
import sys

sys.path.insert(0, "scripts")

import cupy as cp  # noqa: E402

from caramel.api import output_digest  # noqa: E402
from caramel.execute.cuda_graph import GpuRun, StreamLauncher, launch_device  # noqa: E402
from caramel.execute.timing import Timing  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.plan.streams import assign_streams, check_schedule, hazards  # noqa: E402
from caramel.ring import Context  # noqa: E402
from reference_digests import bootstrap_inputs  # noqa: E402


def critical_chain(tasks) -> set[int]:
    need = hazards(tasks)
    finish, back = [0.0] * len(tasks), [-1] * len(tasks)
    for k in range(len(tasks)):
        j = max(need[k], key=lambda j: finish[j], default=-1)
        finish[k] = tasks[k].cost + (finish[j] if j >= 0 else 0.0)
        back[k] = j
    k = max(range(len(tasks)), key=lambda k: finish[k])
    chain = []
    while k >= 0:
        chain.append(k)
        k = back[k]
    print(f"critical chain: {len(chain)} of {len(tasks)} tasks, {max(finish) / 1e6:.3f} of "
          f"{sum(t.cost for t in tasks) / 1e6:.3f} ms estimated", flush=True)
    return set(chain)


def main():
    program = load_program(".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c")
    ctx = Context(n=65536)
    memory = bootstrap_inputs(program, ctx)
    run = GpuRun(build_plan(program), ctx, memory, "exact", streams=4)
    run.run(graph=False)
    dev = run.runs[0]
    tasks = dev.tasks
    chain = critical_chain(tasks)
    origin = run.streams[0]
    schedules = {}
    for name, n, pin in (("default", 4, False), ("chain + 3", 4, True), ("chain + 4", 5, True)):
        tk = [dataclasses.replace(t, stream=n - 1) if pin and k in chain else t for k, t in enumerate(tasks)]
        sch = assign_streams(tk, n, reserved=1 if pin else 0)
        check_schedule(tk, sch)
        launcher = StreamLauncher(sch, origin)
        with origin:
            launch_device(dev, launcher)
        origin.synchronize()
        origin.begin_capture(getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", 1))
        with origin:
            launch_device(dev, launcher)
        schedules[name] = origin.end_capture()
    digest = None
    for rnd in range(3):
        for name, graph in schedules.items():
            times = []
            for r in range(12):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                origin.synchronize()
                a.record(origin)
                graph.launch(origin)
                b.record(origin)
                b.synchronize()
                times.append(cp.cuda.get_elapsed_time(a, b))
            d = output_digest(program, run.result().memory)
            digest = digest or d
            print(f"round {rnd} {name}: {Timing.of(times[2:])}; digest equal {d == digest}", flush=True)


if __name__ == "__main__":
    main()
