"""Figures of a plan: kernels by kind, memory traffic, critical path, parallel width, build time.

Traffic model (bytes of device memory read and written, 4 bytes per residue, N residues a limb):

* per instruction: every instruction is its own pass over its limb operands, each read or
  written once: vector registers and BCU slots read, the register or memory limb written,
  memory limbs loaded, the BCU input written by ``pl1``/``bcw``, the accumulator words of
  ``rsi``/``rsv``/``mod`` (``loas``, ``bci`` and scalar operands count 0);
* plan: every kernel reads each of its input buffers once and writes each output buffer once
  (a ``dis``/``joi`` contribution reads its limb, a receive writes one); aliases cost nothing; an
  NTT whose load computes its input (a prologue, fusion across NTT boundaries) reads the
  producer's inputs instead, a converting load each distinct input once
  (:meth:`~caramel.plan.kernel.Kernel.traffic`): the limb between them is never written or read;
  an elementwise operand read through an automorphism (a gathered operand) is charged as one read
  of the automorphism's input;
* cache model: the plan's limb accesses, NTT and INTT as their two passes, through an LRU cache of the target's
  last-level cache (:mod:`caramel.plan.cache_model`; a target without one has no such figures): the reads it
  serves, and what still goes to and from memory, in the plan's row order (by recency,
  :func:`caramel.plan.order.recent_first`, unless built otherwise).

The target (:class:`caramel.target.Target`, default the plan's own) also gives the copy bandwidth at which the
traffic floor is priced.

The "instructions" of a kind are the source instructions its kernels execute (a ``sud`` counts
in each kind it lowers to; a ``ntt`` or ``sud`` that first reads a unit also counts as baseconv).
"""

from __future__ import annotations

from collections import Counter

from caramel.plan import cache_model
from caramel.plan.kernel import Kind, Plan
from caramel.plan.plan import ALIASES, assign_rows
from caramel.stats import instruction_limbs
from caramel.program import Program
from caramel.target import NEUTRAL, Target

def plan_stats(plan: Plan, program: Program | None = None, n: int = 65536) -> dict:
    """The figures of :func:`plan_report` as a dict (traffic in bytes at ring degree ``n``)."""
    limb = 4 * n
    by_kind: dict[str, list[int]] = {k.value: [0, 0, 0] for k in Kind}  # kernels, rows, instructions
    bytes_by_kind: dict[str, int] = {k.value: 0 for k in Kind}  # the plan model's traffic floor per kind
    chip_traffic, chip_levels, chip_paths, chip_rows, widths = [], [], [], [], []
    exprs = set()
    fused_rows: Counter = Counter()  # NTT rows whose load computes their input, by producer kind
    half_rows = 0  # NTT rows whose reader runs their second pass (Kernel.half)
    sibling_rows: Counter = Counter()  # elementwise rows by number of outputs (merged siblings: > 1)
    gathered_reads, gathered_limbs = 0, set()  # operands read through an automorphism; distinct (chip, limb, step)
    for chip in plan.chips:
        traffic = 0
        per_level: Counter = Counter()
        path = [0] * len(chip.kernels)
        for k, (kernel, deps) in enumerate(zip(chip.kernels, chip.deps)):
            entry = by_kind[kernel.kind.value]
            entry[0] += 1
            entry[1] += kernel.size
            entry[2] += len(kernel.lines)
            moved = kernel.traffic()
            if kernel.prologue is not None:
                fused_rows[kernel.prologue.kind.value] += kernel.size
            half_rows += kernel.size if kernel.half else 0
            traffic += moved
            bytes_by_kind[kernel.kind.value] += moved * limb
            per_level[kernel.level] += 1
            path[k] = 1 + max((path[d] for d in deps), default=0)
            if kernel.expr is not None:
                exprs.add(kernel.expr)
                if len(kernel.expr.outputs) > 1:
                    sibling_rows[len(kernel.expr.outputs)] += kernel.size
                for r in kernel.rows if kernel.expr.gathered else ():
                    gathered_reads += len(r.gather)
                    gathered_limbs.update((chip.chip, r.ins[k], a) for k, a in zip(kernel.expr.gathered, r.gather))
        chip_traffic.append(traffic * limb)
        chip_levels.append(per_level)
        chip_paths.append(max(path, default=0))
        chip_rows.append(assign_rows(chip)[1])
        widths.append(max(per_level.values(), default=0))
    levels = 1 + max((max(lv, default=-1) for lv in chip_levels), default=-1)
    stats = {
        "program": plan.name,
        "chips": len(plan.chips),
        "n": n,
        "instructions": plan.instructions,
        "kernels": plan.kernels,
        "by_kind": by_kind,
        "bytes_by_kind": bytes_by_kind,
        "expressions": len(exprs),
        "ntt_prologue_rows": dict(fused_rows),
        "ntt_epilogue_rows": half_rows,
        "multi_output_rows": dict(sorted(sibling_rows.items())),
        "gathered_reads": gathered_reads,
        "gathered_automorphisms": len(gathered_limbs),
        "plan_bytes": sum(chip_traffic),
        "plan_bytes_busiest_chip": max(chip_traffic, default=0),
        "critical_path": levels,
        "critical_path_per_chip": max(chip_paths, default=0),
        "parallel_width_mean": plan.kernels / levels if levels else 0.0,
        "parallel_width_max": max(widths, default=0),
        "arena_rows": chip_rows,
        "timings": dict(plan.timings),
    }
    if program is not None:
        per_chip = [sum(instruction_limbs(i) for i in s.instructions) for s in program.streams]
        stats["instruction_bytes"] = sum(per_chip) * limb
        stats["instruction_bytes_busiest_chip"] = max(per_chip, default=0) * limb
        stats["aliases"] = sum(1 for s in program.streams for i in s.instructions if i.op in ALIASES)
    return stats


def cache_model_stats(plan: Plan, target: Target, n: int = 65536) -> dict:
    """The cache model's figures (bytes at ring degree ``n``) for ``target``'s last-level cache, in the plan's row
    order. Only the report prints them: :func:`plan_stats` leaves them out (its other callers need not simulate the
    cache)."""
    limb, capacity = 4 * n, target.l2_bytes // (4 * n)
    have = cache_model.plan_traffic(plan, capacity, target)
    return {"cache_bytes": target.l2_bytes, "read_bytes": have.reads * limb, "hit_bytes": have.hits * limb,
            "writeback_bytes": have.writebacks * limb, "memory_bytes": have.memory * limb}


def _bytes(x: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.1f} {unit}" if unit != "B" else f"{int(x)} B"
        x /= 1024
    return ""


def traffic_floor_lines(stats: dict, bandwidth_gbs: float = 0.0) -> list[str]:
    """The plan model's traffic floor per kernel kind (each kernel reads its inputs and writes its
    outputs once): bytes, share of the plan's bytes, and (``bandwidth_gbs`` > 0: a target's copy bandwidth) the time
    those bytes take at that rate."""
    total = max(stats["plan_bytes"], 1)

    def ms(b: int) -> str:
        return f"{b / bandwidth_gbs / 1e6:>10.3f}" if bandwidth_gbs > 0 else ""

    at = f"; time at {bandwidth_gbs:.0f} GB/s copy bandwidth" if bandwidth_gbs > 0 else ""
    out = [f"  traffic floor per kind (the model above{at}):",
           f"    {'kind':<14}{'bytes':>12}{'share':>8}" + (f"{'floor ms':>10}" if bandwidth_gbs > 0 else "")]
    for kind, b in sorted(stats["bytes_by_kind"].items(), key=lambda kv: -kv[1]):
        if b:
            out.append(f"    {kind:<14}{_bytes(b):>12}{100 * b / total:>7.1f}%{ms(b)}")
    out.append(f"    {'total':<14}{_bytes(stats['plan_bytes']):>12}{'100.0%':>8}{ms(stats['plan_bytes'])}")
    return out


def plan_report(plan: Plan, program: Program | None = None, n: int = 65536, target: Target | None = None) -> str:
    """A text report of ``plan``: instructions -> kernels by kind, bytes moved per instruction
    vs by the plan (at ring degree ``n``; the per-instruction figure needs ``program``), critical
    path, parallel width, arena rows and build times; the traffic priced and cached on ``target`` (default: the
    one the plan was ordered for, else :data:`~caramel.target.NEUTRAL`)."""
    target = target or plan.target or NEUTRAL
    s = plan_stats(plan, program, n)
    out = [
        f"plan of {s['program']}: {s['chips']} chip(s), {s['instructions']} instructions -> {s['kernels']} kernels"
        f" ({s['instructions'] / max(s['kernels'], 1):.1f} instructions per kernel)",
        "",
        f"  {'kind':<14}{'kernels':>9}{'rows':>9}{'instructions':>14}",
    ]
    for kind, (k, r, i) in s["by_kind"].items():
        if k:
            out.append(f"  {kind:<14}{k:>9}{r:>9}{i:>14}")
    if "aliases" in s:
        out.append(f"  {'(aliases)':<14}{0:>9}{'-':>9}{s['aliases']:>14}   load/evg/mov/bcw/store/spill/bci/rsi/loas")
    out.append(f"  distinct elementwise expressions: {s['expressions']}")
    fused = s["ntt_prologue_rows"]
    if fused:
        out.append("  NTT rows computing their input in the load (fusion across NTT boundaries): "
                   + ", ".join(f"{kind} {rows}" for kind, rows in sorted(fused.items(), key=lambda kv: -kv[1])))
    if s["ntt_epilogue_rows"]:
        out.append(f"  NTT rows whose only reader runs their second pass (NTT epilogues): {s['ntt_epilogue_rows']}")
    if s["multi_output_rows"]:
        out.append("  elementwise rows with several outputs (sibling trees sharing inputs): "
                   + ", ".join(f"{rows} of {k}" for k, rows in s["multi_output_rows"].items()))
    if s["gathered_reads"]:
        out.append(f"  automorphisms computed in their consumers' loads: {s['gathered_automorphisms']} distinct"
                   f" (limb, rotation), read {s['gathered_reads']} times as gathered elementwise operands")
    out += ["",
            f"memory traffic at N = {n} (4 bytes per residue):"]
    if "instruction_bytes" in s:
        ib, pb = s["instruction_bytes"], s["plan_bytes"]
        out.append(f"  per instruction: {_bytes(ib)} (busiest chip {_bytes(s['instruction_bytes_busiest_chip'])})")
        out.append(f"  plan:            {_bytes(pb)} (busiest chip {_bytes(s['plan_bytes_busiest_chip'])}),"
                   f" {pb / ib:.2f}x of per instruction")
    else:
        out.append(f"  plan: {_bytes(s['plan_bytes'])} (busiest chip {_bytes(s['plan_bytes_busiest_chip'])})")
    out.extend(traffic_floor_lines(s, target.copy_gbs))
    if target.l2_bytes:
        c = cache_model_stats(plan, target, n)
        out.append(f"  cache model (LRU of {_bytes(c['cache_bytes'])}, NTT/INTT as two passes): "
                   f"{_bytes(c['memory_bytes'])} to and from memory, {_bytes(c['hit_bytes'])} of "
                   f"{_bytes(c['read_bytes'])} read from the cache")
    out += ["", f"critical path: {s['critical_path']} kernels (levels of the whole program;"
                f" longest chain inside one chip {s['critical_path_per_chip']})",
            f"parallel width: {s['parallel_width_mean']:.1f} kernels per level on average,"
            f" at most {s['parallel_width_max']} on one chip"]
    rows = s["arena_rows"]
    out.append(f"arena rows (peak live buffers, in plan order): {max(rows, default=0)} on the busiest chip"
               f" ({_bytes(max(rows, default=0) * 4 * n)})")
    t = s["timings"]
    if t:
        out.append("build time: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()))
    return "\n".join(out) + "\n"
