#!/usr/bin/env python3
"""Fusion across NTT boundaries on one GPU: the fused NTT loads against the two kernels they replace.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_ntt_fusion_bench.py [--repeats 10] [--skip-program]

1. Kernels at N = 65536 (CUDA-graph-free launches timed with events, median of --repeats): a base
   conversion of S limbs to D primes then the NTT of the D outputs (``BaseConversion.convert`` +
   ``ntt``) against ``ntt_prologue(..., "baseconv")``; R sud lifts then their NTT against the lifting
   load; each checked bit for bit against the other.
2. BootstrapLike_51L_1c at N = 65536: the CUDA graph of the fused plan on 4 streams with the default
   NTT loads (``build_plan(program)``: lift and mod), without (``fuse_ntt=False``) and with every load
   (``fuse_ntt="all"``: the converting load too), median / min / max of --repeats replays,
   each digest against the stored CPU reference digest (scripts/reference_digests.json).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))

from caramel.ring import Context, Mode  # noqa: E402


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def kernels(ctx: Context, repeats: int) -> list[tuple[str, str]]:
    import cupy as cp

    from caramel.backends.cuda import basis as dbasis
    from caramel.backends.cuda import ntt as dntt
    from caramel.backends.cuda.backend import cuda_ring
    from caramel.execute.timing import time_runs

    ring = cuda_ring(ctx)
    rng = np.random.default_rng(1)
    rows = []
    stream = cp.cuda.Stream(non_blocking=True)
    i32 = lambda a: cp.asarray(np.ascontiguousarray(np.asarray(a, dtype=np.int32)))  # noqa: E731
    for s, d, b in ((13, 50, 1), (13, 50, 2), (20, 40, 2), (3, 52, 2)):
        for mode in (Mode.EXACT, Mode.TEXTBOOK):
            in_limbs, out_limbs = list(range(s)), list(range(s, s + d))
            host = np.zeros((b * s + 2 * b * d, ctx.n), dtype=np.uint32)
            for j in range(b * s):
                host[j] = rng.integers(0, ctx.q(in_limbs[j % s]), ctx.n)
            arena = cp.asarray(host)
            ins = np.arange(b * s).reshape(b, s)
            mid = b * s + np.arange(b * d).reshape(b, d)
            out_a, out_b = mid.reshape(-1), b * s + b * d + np.arange(b * d)
            primes = i32(out_limbs * b)
            conv = dbasis.BaseConversion(ring, in_limbs, out_limbs)
            tables = dntt.PrologueTables(ring, in_limbs)
            d_ins, d_mid, d_outa, d_outb = i32(ins), i32(mid), i32(out_a), i32(out_b)
            d_rows = i32(np.repeat(ins, d, axis=0))
            zeros = i32(np.zeros(b * d))
            cp.cuda.Device().synchronize()  # the uploads (default stream) done before `stream` reads them

            def two():
                conv.convert(arena, d_ins, d_mid, mode)
                dntt.ntt(ring, arena, d_outa, d_outa, primes)

            def one():
                dntt.ntt_prologue(ring, arena, "baseconv", d_rows, d_outb, primes, zeros, mode, tables)

            with stream:
                t2 = time_runs(two, stream, repeats, warmup=2)
                t1 = time_runs(one, stream, repeats, warmup=2)
            same = bool(cp.array_equal(arena[d_outa], arena[d_outb]))
            label = f"conversion {s} -> {d} x{b} + NTT, {mode.value}"
            log(f"{label}: two kernels {t2.median_ms * 1e3:.1f} us, fused {t1.median_ms * 1e3:.1f} us, same {same}")
            rows.append((label, f"two kernels {t2.median_ms * 1e3:.1f} us, fused load {t1.median_ms * 1e3:.1f} us, "
                                f"{'BIT-EXACT' if same else 'MISMATCH'}"))
    for r in (8, 40):
        host = np.stack([rng.integers(0, ctx.q(j % 60), ctx.n) for j in range(r)]).astype(np.uint32)
        arena = cp.asarray(np.concatenate([host, host, host]))
        src, mid, dst = (i32(np.arange(k * r, (k + 1) * r)) for k in range(3))
        ts, ls = i32([60 + j % 4 for j in range(r)]), i32([j % 60 for j in range(r)])
        cp.cuda.Device().synchronize()

        def two():
            dbasis.sud_lift(ring, arena, src, mid, ts, ls, Mode.EXACT)
            dntt.ntt(ring, arena, mid, mid, ls)

        def one():
            dntt.ntt_prologue(ring, arena, "sud_lift", src.reshape(r, 1), dst, ls, ts, Mode.EXACT)

        with stream:
            t2 = time_runs(two, stream, repeats, warmup=2)
            t1 = time_runs(one, stream, repeats, warmup=2)
        same = bool(cp.array_equal(arena[mid], arena[dst]))
        log(f"lift + NTT x{r}: two kernels {t2.median_ms * 1e3:.1f} us, fused {t1.median_ms * 1e3:.1f} us, same {same}")
        rows.append((f"sud lift + NTT, {r} rows, exact", f"two kernels {t2.median_ms * 1e3:.1f} us, fused load "
                                                          f"{t1.median_ms * 1e3:.1f} us, {'BIT-EXACT' if same else 'MISMATCH'}"))
    return rows


def program(ctx: Context, repeats: int, streams: int) -> list[tuple[str, str]]:
    import cupy as cp

    from caramel.api import output_digest
    from caramel.execute.cuda_graph import GpuRun
    from caramel.plan import build_plan, plan_stats
    from gpu_bench import find
    from reference_digests import bootstrap_inputs, reference_digest

    dirs = [ROOT.parent / ".data", Path("/work/shared/programs")]
    prog = find(dirs, "BootstrapLike_51L_1c")
    memory = bootstrap_inputs(prog, ctx)
    stored = reference_digest("BootstrapLike_51L_1c", ctx.n)
    rows = []
    for label, fuse_ntt in (("default NTT loads (lift, mod)", True), ("no NTT loads", False),
                            ("every NTT load (conversion too)", "all"), ("default NTT loads, again", True)):
        plan = build_plan(prog, fuse_ntt=fuse_ntt)
        gib = plan_stats(plan, n=ctx.n)["plan_bytes"] / 2**30
        run = GpuRun(plan, ctx, memory, "exact", streams=streams)
        run.run(graph=False)
        run.capture()
        t = run.time(graph=True, repeats=repeats, warmup=1)
        digest = output_digest(prog, run.result().memory)
        ok = digest == stored
        log(f"{label}: {run.kernels} launches, plan {gib:.1f} GiB, {t}; digest {digest[:16]} "
            f"{'= stored reference' if ok else 'MISMATCH'}")
        rows.append((f"BootstrapLike_51L_1c graph, {streams} streams, {label} ({run.kernels} launches, {gib:.1f} GiB)",
                     f"median {t.median_ms:.2f} ms  min {t.min_ms:.2f}  max {t.max_ms:.2f}; digest {digest[:16]} "
                     f"{'= reference' if ok else 'MISMATCH'}"))
        del run
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--skip-program", action="store_true")
    args = ap.parse_args()
    ctx = Context(n=65536)
    rows = kernels(ctx, args.repeats)
    if not args.skip_program:
        rows += program(ctx, args.repeats, args.streams)
    print("\n| what | result |\n| --- | --- |")
    for a, b in rows:
        print(f"| {a} | {b} |")
    return 0 if all("MISMATCH" not in b for _, b in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
