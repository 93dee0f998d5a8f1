#!/usr/bin/env python3
"""What fusion across NTT boundaries could save in a plan: an estimate from the plan alone (nothing runs).

    PYTHONPATH=. python scripts/ntt_fusion_estimate.py PROGRAM [--n 65536]

Walks each chip's fused plan built without the NTT loads (``build_plan(program, fuse_ntt=False)``;
the plan's own fusion across NTT boundaries, :func:`caramel.plan.fusion.fuse_ntt_loads`, does the
"kind -> NTT" rows below) in kernel order and links every read of a buffer to the row that last
wrote it. A forward NTT row whose input was written by a row of kind K, read by nothing else and not
stored, could compute K's row inside its load: that limb is then neither written nor read again,
2 limbs of traffic saved. An INTT row whose output is read by exactly one row (of kind K) and not
stored could feed that row from its store, again 2 limbs. Prints, per neighbouring kind, the rows and
the traffic such fusions would remove from the plan model's traffic (each kernel reads its inputs and
writes its outputs once), and the total. Neither kind of row is counted twice. Last, the traffic of
the plan that ``caramel plan`` prints (with the NTT loads) and its fused rows per kind.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from caramel.parse import load_program
from caramel.plan import build_plan, plan_stats
from caramel.plan.kernel import Kind


def estimate(plan) -> tuple[int, Counter, Counter]:
    """(plan traffic in limbs, rows by producer kind of fusable NTT inputs, rows by consumer kind of
    fusable INTT outputs)."""
    total = 0
    before, after = Counter(), Counter()
    for chip in plan.chips:
        writer: dict[int, tuple[int, int]] = {}  # buffer -> (kernel, row) that last wrote it
        readers: dict[tuple[int, int, int], set] = defaultdict(set)  # (kernel, row, buffer) -> reading rows
        reads_of: dict[tuple[int, int], list] = {}  # (kernel, row) -> writers of its inputs
        for k, kernel in enumerate(chip.kernels):
            total += len(kernel.reads()) + len(kernel.writes())
            if kernel.kind is Kind.COMM:
                rows = [((c.src,) if c.src >= 0 else (), (c.dst,) if c.dst >= 0 else ()) for c in kernel.comms]
            else:
                rows = [(r.ins, r.outs) for r in kernel.rows]
            for i, (ins, outs) in enumerate(rows):
                srcs = []
                for b in dict.fromkeys(ins):
                    if b in writer:
                        w = (*writer[b], b)
                        readers[w].add((k, i))
                        srcs.append(w)
                reads_of[(k, i)] = srcs
                for b in outs:
                    writer[b] = (k, i)
        pinned = {(*writer[b], b) for b in chip.stores.values() if b in writer}
        fused = set()  # (kernel, row, buffer) already removed
        for k, kernel in enumerate(chip.kernels):
            if kernel.kind is Kind.NTT:
                for i in range(len(kernel.rows)):
                    for w in reads_of[(k, i)]:
                        if w not in pinned and len(readers[w]) == 1 and w not in fused:
                            fused.add(w)
                            before[chip.kernels[w[0]].kind.value] += 1
            elif kernel.kind is Kind.INTT:
                for i, row in enumerate(kernel.rows):
                    w = (k, i, row.outs[0])
                    if w not in pinned and len(readers[w]) == 1 and w not in fused:
                        fused.add(w)
                        (rk, _), = readers[w]
                        after[chip.kernels[rk].kind.value] += 1
    return total, before, after


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("--n", type=int, default=65536)
    args = ap.parse_args()
    program = load_program(args.program)
    total, before, after = estimate(build_plan(program, fuse_ntt=False))
    gib = 4 * args.n / 2**30
    print(f"plan traffic {total * gib:.1f} GiB")
    print("| fusion | rows | GiB saved |\n| --- | --- | --- |")
    saved = 0
    for label, counts in (("{} -> NTT (in the NTT's load)", before), ("INTT -> {} (from the INTT's store)", after)):
        for kind, rows in counts.most_common():
            print(f"| {label.format(kind)} | {rows} | {2 * rows * gib:.2f} |")
            saved += 2 * rows
    print(f"all of them: {saved * gib:.1f} GiB saved, {(total - saved) * gib:.1f} GiB left")
    stats = plan_stats(build_plan(program), n=args.n)
    rows = ", ".join(f"{k} {v}" for k, v in sorted(stats["ntt_prologue_rows"].items(), key=lambda kv: -kv[1]))
    print(f"the plan with its NTT loads: {stats['plan_bytes'] / 2**30:.1f} GiB (fused NTT rows: {rows or 'none'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
