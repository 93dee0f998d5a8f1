#!/usr/bin/env python3
"""BootstrapLike_51L_1c on one GPU under several plan build options: replay time and digest of each.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_plan_bench.py [--repeats 10] [--streams 4] \
        [--options max_outputs=1] [--options max_outputs=4,max_inputs=24] [--options fuse_ntt=all] ...

Each ``--options`` is a comma-separated list of ``build_plan`` keywords (``max_inputs``, ``max_outputs``:
integers; ``fuse_ntt``: ``all``, ``none`` or ``+``-joined kinds; ``fuse_automorphism``, ``fuse_epilogue``: True or
False), and
``row_order``: ``recent`` (the default) or ``batch``; without any, the default plan and
the plan without sibling rows (``max_outputs=1``). Per option set: the plan's traffic model and
kernel count, the CUDA graph of the plan on ``--streams`` streams (median / min / max of
``--repeats`` replays) and the output digest against the stored CPU reference
(scripts/reference_digests.json). Prints a Markdown table last; exit status 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from caramel.ring import Context  # noqa: E402

_CASTS = {"max_inputs": int, "max_outputs": int, "fuse_ntt": lambda v: v.replace("+", ","),
          "fuse_automorphism": lambda v: {"true": True, "false": False}[v.strip().lower()],
          "row_order": lambda v: {"batch": "batch", "recent": "recent"}[v.strip().lower()],
          "fuse_epilogue": lambda v: {"true": True, "false": False}[v.strip().lower()]}


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def parse_options(text: str) -> dict:
    """``"max_outputs=4,fuse_ntt=all"`` -> ``{"max_outputs": 4, "fuse_ntt": "all"}``."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, _, value = item.partition("=")
        if key not in _CASTS:
            raise SystemExit(f"unknown build option {key!r} (known: {', '.join(_CASTS)})")
        out[key] = _CASTS[key](value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--options", action="append", default=[], help="build_plan keywords, e.g. max_outputs=2")
    ap.add_argument("--roofline", action="store_true", help="with --streams 1: each plan's roofline by kernel kind")
    args = ap.parse_args()

    import cupy as cp

    from caramel.api import output_digest
    from caramel.execute.cuda_graph import GpuRun
    from caramel.plan import build_plan, plan_stats
    from caramel.profile import _instrument_gpu, copy_bandwidth, render_roofline
    from gpu_bench import find
    from reference_digests import bootstrap_inputs, reference_digest

    ctx = Context(n=65536)
    prog = find([ROOT.parent / ".data", Path("/work/shared/programs")], "BootstrapLike_51L_1c")
    memory = bootstrap_inputs(prog, ctx)
    stored = reference_digest("BootstrapLike_51L_1c", ctx.n)
    rows = []
    copy_gbs = 0.0
    for text in args.options or ["", "max_outputs=1"]:
        options = parse_options(text)
        label = text or "default"
        plan = build_plan(prog, **options)
        stats = plan_stats(plan, n=ctx.n)
        run = GpuRun(plan, ctx, memory, "exact", streams=args.streams)
        run.run(graph=False)
        run.capture()
        t = run.time(graph=True, repeats=args.repeats, warmup=1)
        digest = output_digest(prog, run.result().memory)
        if args.roofline and args.streams == 1:
            copy_gbs = copy_gbs or copy_bandwidth()
            print(f"roofline [{label}] (plan traffic model; copy {copy_gbs:.0f} GB/s):")
            print(render_roofline(_instrument_gpu(run), copy_gbs))
        verdict = "= reference" if digest == stored else "MISMATCH"
        gib = stats["plan_bytes"] / 2**30
        log(f"{label}: {run.kernels} launches, plan {gib:.1f} GiB, {t}; digest {digest[:16]} {verdict}")
        rows.append((label, run.kernels, f"{gib:.1f} GiB", f"{t.median_ms:.2f} / {t.min_ms:.2f} / {t.max_ms:.2f}",
                     f"{digest[:16]} {verdict}"))
        del run
        cp.get_default_memory_pool().free_all_blocks()
    print(f"\n| build options | launches | plan traffic | replay ms, {args.streams} streams (median / min / max) "
          "| digest |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(map(str, r)) + " |")
    return 0 if all("MISMATCH" not in r[-1] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
