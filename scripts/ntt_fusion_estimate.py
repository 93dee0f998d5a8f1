#!/usr/bin/env python3
"""What fusion across NTT boundaries could save in a plan: an estimate from the plan alone (nothing runs).

    PYTHONPATH=. python scripts/ntt_fusion_estimate.py PROGRAM [--n 65536]

Walks each chip's fused plan built without the NTT loads (``build_plan(program, fuse_ntt=False)``;
the plan's own fusion across NTT boundaries, :func:`caramel.plan.fusion.fuse_ntt_loads`, does the
"kind -> NTT" rows below) in kernel order and links every read of a buffer to the row that last
wrote it. Four fusions, each saving 2 limbs of traffic (the limb between the two rows is neither written
nor read again) where the limb is read by one row only and not stored:

* K -> NTT: a forward NTT row reads a limb that a row of kind K wrote: its first pass (the column kernel)
  computes K's row in its load;
* NTT -> K: a forward NTT row's output is read by a row of kind K: that row runs the NTT's second pass (the
  row kernel) in its load, the NTT only its first pass (of the two-pass kernels, the second pass's read and
  write go; the plan does this for elementwise readers, :func:`caramel.plan.fusion.fuse_ntt_epilogues`);
* K -> INTT: an INTT row reads a limb that a row of kind K wrote: its first pass (the row kernel) computes it;
* INTT -> K: an INTT row's output is read by a row of kind K: the INTT's second pass feeds it from its store.

Prints, per fusion and neighbouring kind, the rows and the traffic such fusions would remove from the plan
model's traffic (each kernel reads its inputs and writes its outputs once), and the total. No limb is
counted twice. Last, the traffic of the plan that ``caramel plan`` prints (with the NTT loads) and its fused
rows per kind.
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from caramel.parse import load_program
from caramel.plan import build_plan, plan_stats
from caramel.plan.kernel import Kind


def estimate(plan) -> tuple[int, dict[str, Counter]]:
    """(plan traffic in limbs, {fusion: rows by neighbouring kind}) for the four fusions of the module docstring,
    keyed "{} -> NTT", "NTT -> {}", "{} -> INTT", "INTT -> {}"."""
    total = 0
    fusions = {name: Counter() for name in ("{} -> NTT", "NTT -> {}", "{} -> INTT", "INTT -> {}")}
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

        def take(w, counter: Counter, kind: Kind) -> None:
            if w not in pinned and len(readers[w]) == 1 and w not in fused:
                fused.add(w)
                counter[kind.value] += 1

        for k, kernel in enumerate(chip.kernels):
            if kernel.kind in (Kind.NTT, Kind.INTT):
                name = kernel.kind.name
                for i, row in enumerate(kernel.rows):
                    for w in reads_of[(k, i)]:  # the producer in this transform's first pass
                        take(w, fusions["{} -> " + name], chip.kernels[w[0]].kind)
                    w = (k, i, row.outs[0])  # the consumer running this transform's second pass
                    if len(readers[w]) == 1:
                        (rk, _), = readers[w]
                        take(w, fusions[name + " -> {}"], chip.kernels[rk].kind)
    return total, fusions


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("--n", type=int, default=65536)
    args = ap.parse_args()
    program = load_program(args.program)
    total, fusions = estimate(build_plan(program, fuse_ntt=False))
    gib = 4 * args.n / 2**30
    print(f"plan traffic {total * gib:.1f} GiB")
    print("| fusion | rows | GiB saved |\n| --- | --- | --- |")
    saved = 0
    for label, counts in fusions.items():
        for kind, rows in counts.most_common():
            print(f"| {label.format(kind)} | {rows} | {2 * rows * gib:.2f} |")
            saved += 2 * rows
    print(f"all of them: {saved * gib:.1f} GiB saved, {(total - saved) * gib:.1f} GiB left")
    stats = plan_stats(build_plan(program), n=args.n)
    rows = ", ".join(f"{k} {v}" for k, v in sorted(stats["ntt_prologue_rows"].items(), key=lambda kv: -kv[1]))
    print(f"the plan with its NTT loads: {stats['plan_bytes'] / 2**30:.1f} GiB (fused NTT rows: {rows or 'none'}; "
          f"NTT epilogues, whose second pass the reader runs: {stats['ntt_epilogue_rows']} rows, 2 limbs each of "
          "the two-pass traffic)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
