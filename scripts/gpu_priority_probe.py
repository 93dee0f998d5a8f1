#!/usr/bin/env python3
"""Probe (not a tool yet): does the 4-stream replay of BootstrapLike_51L_1c gain when its critical chain runs on a
stream of its own at a higher priority? Measures the kernels one by one (the roofline's instrumented replay), takes
the longest chain of hazards by those times, pins it to the last stream, lets the others take the rest, captures the
graph, instantiates it with CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY (the kernel nodes keep their capturing
stream's priority) and times it against the default schedule; every variant's outputs compared with the default's.
Run from the repository root with .data/."""
from __future__ import annotations

import ctypes
import dataclasses
import sys
import time

import numpy as np

sys.path.insert(0, "scripts")

from caramel.api import output_digest  # noqa: E402
from caramel.execute.cuda_graph import GpuRun, StreamLauncher, launch_device  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.plan.streams import assign_streams, check_schedule, hazards  # noqa: E402
from caramel.profile import _instrument_gpu  # noqa: E402
from caramel.ring import Context  # noqa: E402
from reference_digests import bootstrap_inputs, reference_digest  # noqa: E402

import cupy as cp  # noqa: E402

cuda = ctypes.CDLL("libcuda.so.1")


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUresult {rc}")


def instantiate(graph: int, flags: int) -> int:
    ex = ctypes.c_void_p()
    check(cuda.cuGraphInstantiateWithFlags(ctypes.byref(ex), ctypes.c_void_p(graph), ctypes.c_ulonglong(flags)),
          "cuGraphInstantiateWithFlags")
    return ex.value


def priority_stream(priority: int):
    try:
        return cp.cuda.Stream(non_blocking=True, priority=priority)
    except TypeError:
        s = ctypes.c_void_p()
        check(cuda.cuStreamCreateWithPriority(ctypes.byref(s), 1, priority), "cuStreamCreateWithPriority")
        return cp.cuda.ExternalStream(s.value)


def critical_chain(tasks, cost):
    need = hazards(tasks)
    finish, back = [0.0] * len(tasks), [-1] * len(tasks)
    for k in range(len(tasks)):
        j = max(need[k], key=lambda j: finish[j], default=-1)
        finish[k] = cost[k] + (finish[j] if j >= 0 else 0.0)
        back[k] = j
    k = max(range(len(tasks)), key=lambda k: finish[k])
    chain = []
    while k >= 0:
        chain.append(k)
        k = back[k]
    return set(chain), max(finish)


def main():
    program = load_program(".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c")
    ctx = Context(n=65536)
    memory = bootstrap_inputs(program, ctx)
    plan = build_plan(program)
    stored = reference_digest(".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c", 65536)
    cp.cuda.Device().synchronize()  # a current context
    least, greatest = ctypes.c_int(), ctypes.c_int()
    check(cuda.cuCtxGetStreamPriorityRange(ctypes.byref(least), ctypes.byref(greatest)), "cuCtxGetStreamPriorityRange")
    lo, hi = least.value, greatest.value
    print(f"stream priorities: least {lo}, greatest {hi}", flush=True)

    one = GpuRun(plan, ctx, memory, "exact", streams=1)
    one.run(graph=False)
    rec = _instrument_gpu(one)
    dur = {}
    for r in rec:
        dur[r.index] = dur.get(r.index, 0.0) + r.dur_ms
    del one

    run = GpuRun(plan, ctx, memory, "exact", streams=4)
    run.run(graph=False)
    run.capture()
    t = run.time(repeats=10, warmup=2)
    digest = output_digest(program, run.result().memory)
    print(f"default 4 streams: {t}; digest {digest[:16]} reference {digest == stored}", flush=True)

    dev = run.runs[0]
    tasks = dev.tasks
    kernel_task = {}
    for k, rng in enumerate(dev.task_calls):
        for c in rng:
            if dev.kernel_of[c] is not None:
                kernel_task[dev.kernel_of[c][1]] = k
    cost = [0.0] * len(tasks)
    for i, ms in dur.items():
        cost[kernel_task[i]] += ms
    chain, length = critical_chain(tasks, cost)
    print(f"critical chain: {len(chain)} of {len(tasks)} tasks, {length:.3f} ms of {sum(cost):.3f}", flush=True)

    origin = run.streams[0]
    mode = getattr(cp.cuda.runtime, "streamCaptureModeRelaxed", 2)

    def traffic_cost(k):
        kern = dev.kernel_of[dev.task_calls[k][0]]
        if kern is None:
            return 1
        kern = kern[2]
        two_pass = kern.kind.value in ("ntt", "intt") and not kern.half
        return max(1, kern.traffic() + (2 * len(kern.rows) if two_pass else 0))

    costs = {"rows (default)": [t.cost for t in tasks], "measured": [max(1, int(1000 * c)) for c in cost],
             "traffic": [traffic_cost(k) for k in range(len(tasks))]}
    for name, cs in costs.items():
        for n_streams in (4, 6):
            tk = [dataclasses.replace(t, cost=cs[k]) for k, t in enumerate(tasks)]
            sch = assign_streams(tk, n_streams)
            check_schedule(tk, sch)
            launcher = StreamLauncher(sch, origin)
            with origin:
                launch_device(dev, launcher)
            origin.synchronize()
            cp.cuda.runtime.streamBeginCapture(origin.ptr, mode)
            with origin:
                launch_device(dev, launcher)
            g = cp.cuda.runtime.streamEndCapture(origin.ptr)
            ex = instantiate(g, 0)
            times = []
            for r in range(12):
                a, b = cp.cuda.Event(), cp.cuda.Event()
                origin.synchronize()
                a.record(origin)
                check(cuda.cuGraphLaunch(ctypes.c_void_p(ex), ctypes.c_void_p(origin.ptr)), "cuGraphLaunch")
                b.record(origin)
                b.synchronize()
                times.append(cp.cuda.get_elapsed_time(a, b))
            d = output_digest(program, run.result().memory)
            times = sorted(times[2:])
            print(f"costs {name}, {n_streams} streams: median {times[len(times) // 2]:.3f} ms (min {times[0]:.3f}, "
                  f"max {times[-1]:.3f}); digest equal {d == digest}", flush=True)
            check(cuda.cuGraphExecDestroy(ctypes.c_void_p(ex)), "cuGraphExecDestroy")
            cp.cuda.runtime.graphDestroy(g)
    t = run.time(repeats=10, warmup=1)
    print(f"default 4 streams again: {t}", flush=True)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"{time.time() - t0:.0f} s")
