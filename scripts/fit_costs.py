#!/usr/bin/env python3
"""Refit the kernels' estimated GPU times (caramel.plan.cost.COSTS) from a roofline's measured kernel times.

    python3 scripts/gpu_roofline.py --json roofline.json          # on the GPU
    PYTHONPATH=. python3 scripts/fit_costs.py roofline.json       # anywhere: prints a COSTS table to paste

The records' kernel indices are those of the program's fused plan (``--program``, default BootstrapLike_51L_1c
from .data/), rebuilt here; a record whose kernel does not match (rows, kind) stops the fit (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys

from caramel.parse import load_program
from caramel.plan.cost import COSTS, family, fit
from caramel.plan_cache import cached_plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("records", help="the JSON of scripts/gpu_roofline.py --json")
    ap.add_argument("--program", default=".data/BootstrapLike_51L.tar.xz#BootstrapLike_51L_1c")
    ap.add_argument("--n", type=int, default=65536)
    args = ap.parse_args()
    with open(args.records) as f:
        records = json.load(f)
    kernels = cached_plan(load_program(args.program)).chips[0].kernels
    samples = []
    for r in records:
        k = kernels[r["index"]] if 0 <= r["index"] < len(kernels) else None
        if k is None or len(k.rows) != r["rows"] or family(k) != r["kind"]:
            print(f"{args.records}: record of kernel {r['index']} does not match the plan of {args.program}",
                  file=sys.stderr)
            return 2
        samples.append((k, 1000.0 * r["dur_ms"]))
    print("COSTS = {  # fitted by scripts/fit_costs.py: family: Cost(base_us, per_limb_us[, per_pass_us])  R^2, was")
    for name, (c, r2) in fit(samples, args.n).items():
        terms = ", ".join(f"{v:.3f}" for v in (c if name == "epilogue" else c[:2]))
        was = tuple(COSTS[name]) if name in COSTS else "as elementwise"
        print(f'    "{name}": Cost({terms}),  # R^2 {r2:.3f}, was {was}')
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
