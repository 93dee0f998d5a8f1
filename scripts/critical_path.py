#!/usr/bin/env python3
"""Where multi-GPU time goes, estimated on the CPU: the device programs of a K-chip plan on G
devices, timed with a cost model, under three disciplines.

* ``in order``: each device runs its tasks in order on one stream and every communication step
  waits for all its participants (what a one-stream CUDA graph per GPU with NCCL inside does);
* ``dataflow``: unlimited streams, each task starts when the tasks it depends on (row hazards of
  :mod:`caramel.plan.streams`) and its communication peers are done: the critical path, a lower
  bound that no stream assignment on these device programs can beat;
* ``compute``: the busiest device's kernels alone (no communication, no waiting).

Cost model (calibrated on the one-GPU profile of BootstrapLike_51L_1c, N = 65536, docs/PERFORMANCE.md):
a kernel costs ``per_unit[kind] * work + gap`` microseconds, where work is the limbs an
elementwise kernel reads and writes, the input-times-output limbs of a base conversion, else the
rows, and ``per_unit`` is each kind's measured milliseconds over its work in the 1-chip plan
(``gap`` spreads the 6.1 ms of launch gaps over its 519 kernels); a communication step costs ``--latency`` microseconds plus its limbs (256 KiB each
at N = 65536) over ``--bandwidth`` GB/s. The model is an estimate: compare its ``in order``
figure with the measured replay before trusting the others.

    PYTHONPATH=. python3 scripts/critical_path.py .data/BootstrapLike_51L.tar.xz --gpus 1,2,4,8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caramel.execute.collectives import CommStep  # noqa: E402
from caramel.execute.devices import DeviceRun, device_programs  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.plan.streams import hazards  # noqa: E402
from caramel.ring import Context, Mode  # noqa: E402
from caramel.scaling import family_member  # noqa: E402

# measured milliseconds inside the kernels of each kind, one instrumented run of BootstrapLike_51L_1c
# (H200, N = 65536, 2026-11-21, docs/PERFORMANCE.md), and the replay's gaps between kernels
MEASURED_MS = {"ntt": 9.312, "intt": 3.566, "elementwise": 7.342, "baseconv": 6.091, "automorphism": 0.910,
               "sud_lift": 0.489, "rsv": 0.046, "mod": 0.035}
GAP_US = (33.901 - 27.792) * 1e3 / 519
LIMB_BYTES = 65536 * 4


def work(kernel) -> int:
    """A kernel's work units: limbs read and written (elementwise), input times output limbs
    (base conversion: multiply-accumulates), else rows."""
    kind = kernel.kind.value
    if kind == "elementwise":
        return sum(len(r.ins) + len(r.outs) for r in kernel.rows)
    if kind == "baseconv":
        return sum(len(r.ins) * len(r.outs) for r in kernel.rows)
    return max(1, kernel.size)


def calibrate(plan_1c) -> dict[str, float]:
    """Microseconds per work unit of each kind: the measured time over the 1-chip plan's units."""
    units: dict[str, int] = {}
    for kernel in plan_1c.chips[0].kernels:
        units[kernel.kind.value] = units.get(kernel.kind.value, 0) + work(kernel)
    return {k: MEASURED_MS[k] * 1e3 / units[k] for k in units if k in MEASURED_MS}


def device_costs(plan, devices: int, per_unit: dict[str, float], latency: float, bandwidth: float):
    """Per device: (tasks' costs in µs, hazards, level of each communication task or None)."""
    ctx = Context(n=64)
    memory = _zero_memory(plan, ctx)
    out = []
    for prog in device_programs(plan, devices, ctx.primes, reuse="fifo"):
        run = DeviceRun(prog, plan, ctx, memory, Mode.EXACT, _NullBackend, None)
        costs, levels = [], []
        for step in prog.steps:
            if isinstance(step, CommStep):
                limbs = len(step.ops)
                costs.append(latency + limbs * LIMB_BYTES / (bandwidth * 1e3) if step.ops else GAP_US)
                levels.append(step.level)
            else:
                kernel = step[1]
                costs.append(per_unit[kernel.kind.value] * work(kernel) + GAP_US)
                levels.append(None)
        out.append((costs, hazards(run.tasks), levels))
    return out


def estimate(per_device) -> dict[str, float]:
    """Milliseconds under the three disciplines of the module docstring."""
    result = {}
    for discipline in ("in order", "dataflow"):
        finish = [[0.0] * len(c) for c, _, _ in per_device]
        # communication steps synchronise by level; process (level, device) in order
        order = sorted({lv for _, _, lvs in per_device for lv in lvs if lv is not None})
        pos = [0] * len(per_device)

        def advance(d: int, upto_level) -> None:
            costs, need, levels = per_device[d]
            while pos[d] < len(costs) and (levels[pos[d]] is None or levels[pos[d]] != upto_level):
                if levels[pos[d]] is not None:
                    return  # the next communication step of another level
                k = pos[d]
                start = max((finish[d][j] for j in need[k]), default=0.0)
                if discipline == "in order" and k:
                    start = max(start, finish[d][k - 1])
                finish[d][k] = start + costs[k]
                pos[d] += 1

        for lv in order + [None]:
            for d in range(len(per_device)):
                advance(d, lv)
            if lv is None:
                break
            members = [d for d in range(len(per_device)) if pos[d] < len(per_device[d][0])
                       and per_device[d][2][pos[d]] == lv]
            ready = {}
            for d in members:
                costs, need, _ = per_device[d]
                k = pos[d]
                r = max((finish[d][j] for j in need[k]), default=0.0)
                if discipline == "in order" and k:
                    r = max(r, finish[d][k - 1])
                ready[d] = r
            start = max(ready.values(), default=0.0)
            for d in members:
                k = pos[d]
                finish[d][k] = start + per_device[d][0][k]
                pos[d] += 1
        result[discipline] = max(max(f, default=0.0) for f in finish) / 1e3
    result["compute"] = max(sum(c for c, lv in zip(costs, levels) if lv is None)
                            for costs, _, levels in per_device) / 1e3
    return result


class _NullBackend:
    """A backend that does nothing: the tasks are only inspected."""

    def __init__(self, ctx, rows):
        pass

    def __getattr__(self, name):
        return lambda *a, **k: None


class _Zeros(dict):
    def __missing__(self, key):  # a scalar memory entry
        return np.uint32(0)


def _zero_memory(plan, ctx):
    return _Zeros({m: np.zeros(ctx.n, dtype=np.uint32) for chip in plan.chips for m in chip.inputs})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family", help="a program family (see caramel profile --gpus)")
    ap.add_argument("--gpus", default="1,2,4,8")
    ap.add_argument("--latency", type=float, default=20.0, help="µs per communication step (default 20)")
    ap.add_argument("--bandwidth", type=float, default=150.0, help="GB/s per device (default 150)")
    args = ap.parse_args()
    print("| devices | program | in order (ms) | dataflow, any streams (ms) | compute, busiest device (ms) |")
    print("|---|---|---|---|---|")
    per_unit = calibrate(build_plan(load_program(family_member(args.family, 1))))
    for g in map(int, args.gpus.split(",")):
        program = load_program(family_member(args.family, g))
        plan = build_plan(program)
        e = estimate(device_costs(plan, g, per_unit, args.latency, args.bandwidth))
        print(f"| {g} | {program.name} | {e['in order']:.2f} | {e['dataflow']:.2f} | {e['compute']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
