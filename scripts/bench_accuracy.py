#!/usr/bin/env python3
"""Precision of Mul, MulRotate and PolyX8 by decryption, in every arithmetic mode.

Usage: python scripts/bench_accuracy.py [--n 65536] [--seed 1] [PROGRAM ...]
Prints a Markdown table (largest and median slot error in bits, i.e. -log2(err / max(1, |expected|)))
for docs/ACCURACY.md, with the secret distributions used.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
from pathlib import Path

import caramel
from caramel.ring import Context

SHARED = Path(__file__).resolve().parents[2] / "shared" / "programs"
DEFAULT = ["Mul_4L_1c", "Mul_10L_1c", "MulRotate_10L_4c", "PolyX8_10L_2c", "Mul_51L_8c"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("programs", nargs="*", default=DEFAULT)
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="exact,textbook,emulator")
    args = ap.parse_args()
    ctx = Context(n=args.n)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"# N = {args.n}, seed {args.seed}, {datetime.date.today()}, commit {commit}, "
          f"{platform.node()} ({os.cpu_count()} cores), CPU reference")
    print("| program | mode | largest error (bits) | median error (bits) | bar | pass | run s | secrets |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.programs:
        path = Path(name) if Path(name).exists() else SHARED / name
        program = caramel.load_program(path)
        for mode in args.modes.split(","):
            out = caramel.run_program(program, ctx=ctx, mode=mode, seed=args.seed)
            for r in out.report.results.values():
                bar = "-" if r.tolerance_bits is None else f"{r.tolerance_bits:g}"
                ok = {None: "not judged", True: "yes", False: "no"}[r.passed]
                print(f"| {program.name} | {mode} | {r.precision_bits:.1f} | {r.median_bits:.1f} | {bar} | {ok} "
                      f"| {out.seconds:.1f} | {out.report.secrets} |", flush=True)


if __name__ == "__main__":
    main()
