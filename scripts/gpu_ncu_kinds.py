#!/usr/bin/env python3
"""Hardware counters of every kernel of one BootstrapLike_51L_1c pass (N = 65536, one stream, eager), summed by
kernel family: what bounds each family, the memory or the multiprocessors' pipes.

    ncu --profile-from-start off --clock-control none --metrics "$(python3 scripts/gpu_ncu_kinds.py metrics)" \\
        --csv --page raw python3 scripts/gpu_ncu_kinds.py run > raw.csv
    python3 scripts/gpu_ncu_kinds.py summarize raw.csv

``metrics stalls`` lists counters of why warps wait (read them with ``--page raw``). ``ntt ROWS`` instead profiles
one batched NTT and one INTT of ROWS limbs, fused (one kernel) and in two kernels.
``run`` prepares the run (as scripts/gpu_roofline.py), makes one untimed pass (compiles, loads), then one pass
between cudaProfilerStart and cudaProfilerStop, so that ncu (``--profile-from-start off``) sees each kernel of the
plan once. ``summarize`` groups ncu's rows by family (the kernel name; an elementwise kernel with dynamic shared
memory is an NTT epilogue) and prints, per family: kernels, time under ncu (each kernel alone, caches flushed), DRAM
bytes and their rate, and the time-weighted shares of issue-active cycles, of the busiest integer pipe (fmaheavy:
IMAD; alu: IADD3, LOP3, min/max) and of the achieved occupancy. Run from the repository root with .data/.
"""

from __future__ import annotations

import csv
import re
import sys
from collections import defaultdict

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

#: With ``metrics stalls``: why warps wait (cycles a warp stalls per issued instruction, by reason), shared-memory
#: wavefronts and bank conflicts, instructions.
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

#: Kernel name pattern -> family, first match.
FAMILIES = (
    (r"^fused_", "elementwise"),
    (r"^ntt_fwd_col_pro|^ntt_fwd_pro", "ntt prologue"),
    (r"^ntt_fwd_col", "ntt column"),
    (r"^ntt_fwd_row", "ntt row"),
    (r"^ntt_inv_row", "intt row"),
    (r"^ntt_inv_col", "intt column"),
    (r"^ntt_fwd_fused", "ntt fused"),
    (r"^ntt_inv_fused", "intt fused"),
    (r"^ntt_", "ntt one kernel"),
    (r"base_conv|basis|tc_", "baseconv"),
    (r"^sud_lift", "sud_lift"),
    (r"^aut|automorph", "automorphism"),
    (r"^rsv|^mod_", "rsv/mod"),
)


def family(name: str, smem: float) -> str:
    for pattern, fam in FAMILIES:
        if re.search(pattern, name):
            return "epilogue" if fam == "elementwise" and smem > 0 else fam
    return "other: " + name.split("(")[0][:24]


def run() -> None:
    import cupy as cp
    import numpy as np

    from caramel.api import default_spec
    from caramel.ckks.check import prepare_check
    from caramel.ckks.device import using
    from caramel.execute.cuda_graph import GpuRun
    from caramel.parse import load_program
    from caramel.plan_cache import cached_plan
    from caramel.ring import Context

    p = load_program(".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c")
    ctx = Context(n=65536)
    with using("gpu"):
        mem = prepare_check(default_spec(p), p, ctx, rng=np.random.default_rng(1)).memory
    gpu = GpuRun(cached_plan(p), ctx, mem, "exact")
    gpu.run(graph=False)
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStart()
    gpu.run(graph=False)
    cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()


def ntt(rows: int) -> None:
    import cupy as cp

    from caramel.backends.cuda import ntt as dntt
    from caramel.backends.cuda.backend import cuda_ring
    from caramel.ring import Context
    from gpu_bench import batched_limbs  # scripts/ beside this file

    ctx = Context(n=65536)
    ring = cuda_ring(ctx)
    arena, ins, outs, dp, counters = batched_limbs(ctx, rows)
    for profile in (False, True):
        cp.cuda.Device().synchronize()
        if profile:
            cp.cuda.runtime.profilerStart()
        for inverse in (False, True):
            for fused in (True, False):
                dntt._launch(ring, arena, ins, outs, dp, inverse, fused=fused, counters=counters)
        cp.cuda.Device().synchronize()
    cp.cuda.runtime.profilerStop()


def summarize(path: str) -> None:
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages are not CSV rows
    rows = list(csv.reader(lines))
    head, body = rows[0], [r for r in rows[2:] if len(r) == len(rows[0])]  # rows[1]: units
    col = {m: head.index(m) for m in METRICS}
    name_col = head.index("Kernel Name")

    def num(r, m) -> float:
        return float(r[col[m]].replace(",", "") or 0)

    fams: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in body:
        t = num(r, "gpu__time_duration.sum") / 1e3  # ns -> us
        f = fams[family(r[name_col], num(r, "launch__shared_mem_per_block_dynamic"))]
        f["n"] += 1
        f["us"] += t
        f["dram"] += num(r, "dram__bytes.sum")
        for m, c in METRICS.items():
            if c in ("issue", "fmaheavy", "alu", "occupancy"):
                f[c] += t * num(r, m)  # time-weighted
    total = sum(f["us"] for f in fams.values())
    print(f"{'family':<16}{'kernels':>8}{'ms':>9}{'share':>7}{'GB':>8}{'TB/s':>7}{'issue%':>8}{'fmaheavy%':>10}"
          f"{'alu%':>7}{'occup%':>8}")
    for name, f in sorted(fams.items(), key=lambda kv: -kv[1]["us"]):
        us = f["us"] or 1.0
        print(f"{name:<16}{int(f['n']):>8}{f['us'] / 1e3:>9.3f}{f['us'] / total:>7.1%}{f['dram'] / 1e9:>8.2f}"
              f"{f['dram'] / us / 1e6:>7.2f}{f['issue'] / us:>8.1f}{f['fmaheavy'] / us:>10.1f}{f['alu'] / us:>7.1f}"
              f"{f['occupancy'] / us:>8.1f}")
    print(f"{'total':<16}{len(body):>8}{total / 1e3:>9.3f}")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "metrics":
        print(",".join(STALLS if sys.argv[2:] == ["stalls"] else METRICS))
    elif cmd == "run":
        run()
    elif cmd == "ntt" and len(sys.argv) == 3:
        ntt(int(sys.argv[2]))
    elif cmd == "summarize" and len(sys.argv) == 3:
        summarize(sys.argv[2])
    else:
        sys.exit(__doc__)
