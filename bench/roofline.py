"""Where a replay's time goes: BootstrapLike_51L_1c's fused plan timed kernel by kernel on the GPU alone
(``caramel.profile``: one stream, a clock stamp between every two kernels), per kernel kind against the copy rate,
and the slowest kernels; every kernel's record goes into the JSON record.

    python -m bench roofline [--program BootstrapLike_51L_1c] [--top 25]
    python -m bench roofline --fit RECORD.json        # refit the plan's kernel costs from those records (any machine)
    ncu --profile-from-start off --clock-control none --metrics "$(python -m bench roofline --ncu-metrics)" \\
        --csv --page raw python -m bench roofline --ncu-pass > raw.csv
    python -m bench roofline --ncu-summary raw.csv    # ncu's counters summed by kernel family

``--ncu-metrics stalls`` lists why warps wait instead. ``--ncu-pass`` makes one untimed pass (compiles, loads), then
one pass between cudaProfilerStart and cudaProfilerStop, so that ncu sees each kernel of the plan once.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from bench.harness import BIG, Record, add_common, bench_inputs, find_program, log, need_gpu

#: ncu metric -> column of the summary.
METRICS = {
    "gpu__time_duration.sum": "us",
    "dram__bytes.sum": "dram",
    "sm__issue_active.avg.pct_of_peak_sustained_active": "issue",
    "sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active": "fmaheavy",
    "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active": "alu",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy",
    "launch__shared_mem_per_block_dynamic": "smem",
}
#: ``--ncu-metrics stalls``: why warps wait (cycles a warp stalls per issued instruction, by reason), shared-memory
#: wavefronts and bank conflicts, the pipes.
STALLS = ("gpu__time_duration.sum", "smsp__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
          "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__bytes.sum", "lts__t_sector_hit_rate.pct",
          "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
          "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
          "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
          "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
          "sm__pipe_fmaheavy_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
          "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active") + tuple(
    f"smsp__average_warps_issue_stalled_{r}_per_issue_active.ratio"
    for r in ("long_scoreboard", "barrier", "short_scoreboard", "math_pipe_throttle", "mio_throttle", "lg_throttle",
              "wait", "not_selected", "selected", "no_instruction", "dispatch_stall", "membar", "sleeping", "drain",
              "branch_resolving", "misc"))
#: Kernel name pattern -> family, first match (an elementwise kernel with dynamic shared memory is an epilogue).
FAMILIES = ((r"^fused_", "elementwise"), (r"^ntt_fwd_col_pro|^ntt_fwd_pro", "ntt prologue"),
            (r"^ntt_fwd_col", "ntt column"), (r"^ntt_fwd_row", "ntt row"), (r"^ntt_inv_row", "intt row"),
            (r"^ntt_inv_col", "intt column"), (r"^ntt_fwd_fused", "ntt fused"), (r"^ntt_inv_fused", "intt fused"),
            (r"^ntt_", "ntt one kernel"), (r"base_conv|basis|tc_", "baseconv"), (r"^sud_lift", "sud_lift"),
            (r"^aut|automorph", "automorphism"), (r"^rsv|^mod_", "rsv/mod"))


def ncu_family(name: str, smem: float) -> str:
    for pattern, fam in FAMILIES:
        if re.search(pattern, name):
            return "epilogue" if fam == "elementwise" and smem > 0 else fam
    return "other: " + name.split("(")[0][:24]


def ncu_summary(path: str) -> str:
    """ncu's raw CSV (``--csv --page raw`` with :data:`METRICS`) summed by kernel family: kernels, time (each kernel
    alone, caches flushed), DRAM bytes and rate, and the time-weighted shares of issue, of the busiest integer pipes
    and of occupancy."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not CSV rows
    rows = list(csv.reader(lines))
    if not rows:
        raise SystemExit(f"bench roofline: {path}: no CSV rows")
    head, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]  # rows[1]: units
    try:
        col = {m: head.index(m) for m in METRICS}
        name_col = head.index("Kernel Name")
    except ValueError as e:
        raise SystemExit(f"bench roofline: {path}: {e} (collect with --metrics of --ncu-metrics)") from None

    def num(r, m) -> float:
        return float(r[col[m]].replace(",", "") or 0)

    fams: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in body:
        t = num(r, "gpu__time_duration.sum") / 1e3  # ns -> us
        f = fams[ncu_family(r[name_col], num(r, "launch__shared_mem_per_block_dynamic"))]
        f["n"] += 1
        f["us"] += t
        f["dram"] += num(r, "dram__bytes.sum")
        for m, c in METRICS.items():
            if c in ("issue", "fmaheavy", "alu", "occupancy"):
                f[c] += t * num(r, m)
    total = sum(f["us"] for f in fams.values()) or 1.0
    out = [f"{'family':<16}{'kernels':>8}{'ms':>9}{'share':>7}{'GB':>8}{'TB/s':>7}{'issue%':>8}{'fmaheavy%':>10}"
           f"{'alu%':>7}{'occup%':>8}"]
    for name, f in sorted(fams.items(), key=lambda kv: -kv[1]["us"]):
        us = f["us"] or 1.0
        out.append(f"{name:<16}{int(f['n']):>8}{f['us'] / 1e3:>9.3f}{f['us'] / total:>7.1%}{f['dram'] / 1e9:>8.2f}"
                   f"{f['dram'] / us / 1e6:>7.2f}{f['issue'] / us:>8.1f}{f['fmaheavy'] / us:>10.1f}"
                   f"{f['alu'] / us:>7.1f}{f['occupancy'] / us:>8.1f}")
    out.append(f"{'total':<16}{len(body):>8}{total / 1e3:>9.3f}")
    return "\n".join(out)


def ncu_pass(args) -> int:
    """One untimed pass of the fused plan, then one between cudaProfilerStart and cudaProfilerStop."""
    import cupy as cp

    from caramel.plan import build_plan
    from caramel.ring import Context

    from bench.harness import open_run

    program = find_program(args.program)
    ctx = Context(n=args.n)
    run = open_run(build_plan(program), ctx, bench_inputs(program, ctx, client="gpu"), "gpu")
    try:
        run.once(graph=False)
        cp.cuda.Device().synchronize()
        cp.cuda.runtime.profilerStart()
        run.once(graph=False)
        cp.cuda.Device().synchronize()
        cp.cuda.runtime.profilerStop()
    finally:
        run.close()
    return 0


def records_of(path: str) -> list[dict]:
    """The kernel records of a roofline: this command's JSON record (``kernels``), or a bare list of records."""
    data = json.loads(Path(path).read_text())
    return data["kernels"] if isinstance(data, dict) else data


def fit_costs(args) -> int:
    """Refit the kernels' estimated times (``caramel.backends.cuda.target.COSTS``) from a roofline's measured kernel times; the
    records' indices are those of ``--program``'s fused plan, rebuilt here (exit 2 on a record that does not match
    it). Prints a table to paste."""
    from caramel.backends.cuda.target import COSTS
    from caramel.plan.cost import family, fit
    from caramel.plan_cache import cached_plan

    records = records_of(args.fit)
    kernels = cached_plan(find_program(args.program)).chips[0].kernels
    samples = []
    for r in records:
        k = kernels[r["index"]] if 0 <= r["index"] < len(kernels) else None
        if k is None or len(k.rows) != r["rows"] or family(k) != r["kind"]:
            print(f"{args.fit}: record of kernel {r['index']} does not match the plan of {args.program}",
                  file=sys.stderr)
            return 2
        samples.append((k, 1000.0 * r["dur_ms"]))
    print("COSTS = {  # fitted by `python -m bench roofline --fit`: family: Cost(base_us, per_limb_us[, per_pass_us])"
          "  R^2, was")
    for name, (c, r2) in fit(samples, args.n).items():
        terms = ", ".join(f"{v:.3f}" for v in (c if name == "epilogue" else c[:2]))
        was = tuple(COSTS[name]) if name in COSTS else "as elementwise"
        print(f'    "{name}": Cost({terms}),  # R^2 {r2:.3f}, was {was}')
    print("}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m bench roofline", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--program", default=BIG, help=f"a name looked up in .data/ and the corpus, or a path "
                    f"(default {BIG})")
    ap.add_argument("--top", type=int, default=25, help="list this many of the slowest kernels")
    ap.add_argument("--fit", metavar="RECORD", help="only refit caramel.plan.cost's table from these records")
    ap.add_argument("--ncu-metrics", nargs="?", const="kinds", choices=("kinds", "stalls"),
                    help="only print ncu's --metrics list")
    ap.add_argument("--ncu-pass", action="store_true", help="only one profiled pass of the plan (run under ncu)")
    ap.add_argument("--ncu-summary", metavar="CSV", help="only sum ncu's raw CSV by kernel family")
    add_common(ap, repeats=5, configs=False, ab=False)
    args = ap.parse_args(argv)
    if args.ncu_metrics:
        print(",".join(STALLS if args.ncu_metrics == "stalls" else METRICS))
        return 0
    if args.ncu_summary:
        print(ncu_summary(args.ncu_summary))
        return 0
    if args.fit:
        return fit_costs(args)
    need_gpu(args.backend)
    if args.ncu_pass:
        return ncu_pass(args)
    from caramel.plan import build_plan
    from caramel.profile import profile_program, render_roofline, roofline_table
    from caramel.ring import Context

    rec = Record("roofline", argv, args.backend)
    program = find_program(args.program)
    ctx = Context(n=args.n)
    memory = bench_inputs(program, ctx, client="gpu" if args.backend == "gpu" else "cpu")
    result = profile_program(program, n=args.n, memory=memory, repeats=args.repeats, backend=args.backend, log=log)
    for v in result.variants:
        rec.add(f"{program.name} N={args.n} {v.name}, 1 stream", v.median_ms, "ms", min=v.min_ms, max=v.max_ms,
                repeats=v.repeats, launches=v.launches, digest=v.digest)
    rec.check("the variants' digests agree", result.digests_agree)
    total = sum(r.dur_ms for r in result.kernels)
    rec.add("instrumented replay (sum of the kernels)", total, "ms", kernels=len(result.kernels))
    rec.add("critical path of the kernels", result.critical_ms, "ms")
    if result.copy_gbs:
        rec.add("device copy (ceiling)", round(result.copy_gbs), "GB/s")
    for row in roofline_table(result.kernels, result.copy_gbs):
        rec.add(f"kind {row.kind}", row.ms, "ms", **{k: v for k, v in dataclasses.asdict(row).items()
                                                     if k not in ("kind", "ms")})
    print(render_roofline(result.kernels, result.copy_gbs))
    kernels = build_plan(program).chips[0].kernels
    print(f"\nslowest {args.top} kernels:\n{'#':>4} {'kind':<12} {'rows':>5} {'us':>8} {'MiB':>8} {'GB/s':>6}  what")
    for r in sorted(result.kernels, key=lambda r: -r.dur_ms)[: args.top]:
        k = kernels[r.index]
        what = (f"prologue {k.prologue.kind.value}" if k.prologue is not None else
                k.expr.text()[:60] if k.expr is not None else "")
        print(f"{r.index:>4} {r.kind:<12} {r.rows:>5} {1e3 * r.dur_ms:>8.1f} {r.bytes / 2**20:>8.1f} "
              f"{r.bytes / max(r.dur_ms * 1e6, 1e-9):>6.0f}  {what}")
    rec.extra["kernels"] = [dataclasses.asdict(r) for r in result.kernels]
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
