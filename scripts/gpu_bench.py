"""One command on the GPU machine: bit-exactness checks against the CPU reference (small N), then
timings of BootstrapLike_51L_1c at N = 65536: eager (one launch per kernel of the unfused plan),
one CUDA graph of the unfused plan, one CUDA graph of the fused plan; batched NTT throughput; the
output digest (compared with the CPU reference's unless --skip-reference). Prints a table last.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_bench.py [--skip-reference] [--repeats 10]

Programs are read from --programs (default: <repo>/.data, then /work/shared/programs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caramel.api import output_digest  # noqa: E402
from caramel.ckks.check import check_path, prepare_check  # noqa: E402
from caramel.api import gpu_available  # noqa: E402
from caramel.execute.cuda_graph import GpuRun, run_gpu  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.profile import _instrument_gpu, copy_bandwidth, render_roofline  # noqa: E402
from caramel.ring import Context  # noqa: E402
from gpu_kernels_check import Bench, KernelSettings  # noqa: E402  (scripts/ beside this file)
from reference_digests import bootstrap_inputs, reference_digest  # noqa: E402

CHECKS = ["Mul_10L_1c", "MulRotate_10L_1c", "PolyX8_10L_1c", "BootstrapModRaise_10L_1c", "Mul_10L_2c"]


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def find(dirs, name):
    for d in dirs:
        if (d / name).is_dir():
            return load_program(d / name)
        if name.startswith("BootstrapLike_51L") and (d / "BootstrapLike_51L.tar.xz").exists():
            return load_program(f"{d / 'BootstrapLike_51L.tar.xz'}#{name}")
    raise SystemExit(f"{name} not found in {dirs}")


def same(want, have) -> bool:
    return len(want.stores) == len(have.stores) and all(
        w.keys() == h.keys() and all(np.array_equal(w[m], h[m]) for m in w) for w, h in zip(want.stores, have.stores))


def batched_limbs(ctx, rows: int):
    """(arena, ins, outs, primes, counters) of a batched transform of ``rows`` random limbs at ``ctx``'s N, primes
    cycling, made on the current stream: inputs in arena rows 0 .. rows - 1, outputs in the next ``rows``, zeroed
    counters for a fused transform (which leaves them zeroed)."""
    import cupy as cp

    from caramel.backends.cuda import ntt as dntt

    primes = np.arange(rows, dtype=np.int32) % len(ctx.primes)
    q = np.array([int(ctx.primes[i]) for i in primes], dtype=np.uint64)
    host = (np.random.default_rng(0).integers(0, 2**62, size=(rows, ctx.n), dtype=np.uint64) % q[:, None])
    arena = cp.asarray(np.concatenate([host, host]).astype(np.uint32))
    return (arena, cp.arange(rows, dtype=cp.int32), cp.arange(rows, 2 * rows, dtype=cp.int32), cp.asarray(primes),
            cp.zeros(dntt.counter_words(rows), dtype=cp.int32))


#: --ntt-floors: timing-only forms of the transforms (wrong results; keyword arguments of ntt._launch): the loads and
#: stores alone, and constant twiddles (no twiddle loads).
NTT_FLOORS = {"loads and stores only": dict(body=False), "constant twiddles": dict(tw_fake=True)}
#: Launches of the batched transform a CUDA graph of the throughput timing holds.
NTT_PER_REPLAY = 8


def ntt_throughput(ctx, rows: int, repeats: int, inverse: bool = False, floor: dict | None = None) -> float:
    """Limbs a second of one batched NTT (INTT) of ``rows`` limbs at ``ctx``'s N, primes cycling: a CUDA graph of
    NTT_PER_REPLAY launches, replayed (``gpu_kernels_check.Bench.time``), so that the GPU's time is measured without
    the host's launch overhead (the eager timing of sessions 15-19's first calls included it); ``floor``: a
    timing-only form of NTT_FLOORS."""
    import cupy as cp

    from caramel.backends.cuda import ntt as dntt
    from caramel.backends.cuda.backend import cuda_ring

    ring = cuda_ring(ctx)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:  # every array made on the stream that reads it (a non-blocking stream does not wait for stream 0)
        arena, ins, outs, dp, counters = batched_limbs(ctx, rows)  # counters: a fused transform can be captured
        stream.synchronize()
    seconds = Bench(cp, ctx.n).time(
        lambda _: dntt._launch(ring, arena, ins, outs, dp, inverse, counters=counters, **(floor or {})), 1,
        per_replay=NTT_PER_REPLAY, reps=repeats)
    log(f"batched {'INTT' if inverse else 'NTT'} of {rows} limbs at N = {ctx.n}{' ' + str(floor) if floor else ''}: "
        f"{seconds * 1e6:.1f} us a launch (median of {repeats} replays of {NTT_PER_REPLAY})")
    return rows / seconds


def ntt_rates(ctx, args, ntt_sets, settings, rows: list) -> None:
    """The batched NTT's throughput (and the INTT's with --ntt-only) per setting and size, as rows of the table."""
    for ntt_set in ntt_sets:
        settings.apply(ntt_set)
        floors = [("", None)] + (list(NTT_FLOORS.items()) if args.ntt_floors else [])
        for count in map(int, args.ntt_rows.split(",")):
            for inverse in (False, True) if args.ntt_only else (False,):
                for name, floor in floors:
                    rate = ntt_throughput(ctx, count, args.repeats, inverse, floor)
                    rows.append((f"{'INTT' if inverse else 'NTT'} throughput (batched {count} limbs, N={args.n}) "
                                 f"[{ntt_set}{', ' + name if name else ''}]", f"{rate:.3e} limbs/s"))
    settings.apply("default")


def print_table(rows: list) -> None:
    """The (what, result) rows as a Markdown table."""
    print("\n| what | result |\n| --- | --- |")
    for a, b in rows:
        print(f"| {a} | {b} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=Path, action="append")
    ap.add_argument("--small-n", type=int, default=4096)
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--program", default="BootstrapLike_51L_1c")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--checks", default=",".join(CHECKS))
    ap.add_argument("--skip-reference", action="store_true", help="do not run the CPU reference of the big program")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--ntt-rows", default="1024", help="limbs of the batched NTT and INTT timings (comma separated)")
    ap.add_argument("--ntt-only", action="store_true", help="only the batched NTT and INTT timings")
    ap.add_argument("--ntt-floors", action="store_true",
                    help="also time the batched transforms' timing-only forms (NTT_FLOORS: wrong results)")
    ap.add_argument("--fused-only", action="store_true", help="time only the graphs of the fused plan")
    ap.add_argument("--streams", default="1,4,8", help="stream counts of the fused graphs (comma separated)")
    ap.add_argument("--ntt-set", action="append", default=[],
                    help="kernel settings NAME=V[,NAME=V] (NTT module, e.g. LOAD_CG=0; ew.NAME for the elementwise "
                         "module; plan.NAME for caramel.plan.order, the fused plan then built under it), one timing "
                         "of the fused graphs each, in this process (repeatable; 'default' for the modules' own)")
    args = ap.parse_args()
    dirs = args.programs or [ROOT / ".data", Path("/work/shared/programs")]
    if not gpu_available():
        raise SystemExit("no usable GPU (CuPy or CUDA device missing)")
    import cupy as cp

    props = cp.cuda.runtime.getDeviceProperties(0)
    log("device:", props["name"].decode() if isinstance(props["name"], bytes) else props["name"], "date:",
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    rows = []
    ntt_sets = args.ntt_set or ["default"]
    settings = KernelSettings()
    for ntt_set in ntt_sets:
        settings.check(ntt_set)
    if args.ntt_only:
        ntt_rates(Context(n=args.n), args, ntt_sets, settings, rows)
        print_table(rows)
        return 0
    # 1. bit-exactness at small N
    if not args.skip_checks:
        small = Context(n=args.small_n)
        for name in [c for c in args.checks.split(",") if c]:
            program = find(dirs, name)
            memory = prepare_check(check_path(program.name), program, small, rng=5).memory
            want = run_reference(program, small, memory, "exact")
            for graph in (True, False):
                ok = same(want, run_gpu(program, small, memory, "exact", graph=graph))
                label = "graph" if graph else "eager"
                log(f"check {name} N={args.small_n} {label}: {'BIT-EXACT' if ok else 'MISMATCH'}")
                rows.append((f"check {name} N={args.small_n} {label}", "ok" if ok else "MISMATCH"))
    # 2. the big program
    t0 = time.perf_counter()
    program = find(dirs, args.program)
    log(f"loaded {args.program} in {time.perf_counter() - t0:.1f} s")
    ctx = Context(n=args.n)
    t0 = time.perf_counter()
    memory = bootstrap_inputs(program, ctx)
    log(f"inputs and keys at N = {args.n} in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    unfused, fused = build_plan(program, fuse=False), build_plan(program)
    log(f"plans in {time.perf_counter() - t0:.1f} s")
    digests = {}
    variants = (("eager per instruction", unfused, False, True, 1), ("eager unfused kernels", unfused, False, False, 1),
                ("graph unfused", unfused, True, False, 1), ("graph fused", fused, True, False, 1),
                ("graph fused, 4 streams", fused, True, False, 4), ("graph fused, 8 streams", fused, True, False, 8))
    copy_gbs = copy_bandwidth()
    runs = [(f"{label} [{ntt_set}]" if len(ntt_sets) > 1 and label.startswith("graph fused") else label, plan, graph,
             per_row, streams, ntt_set)
            for ntt_set in ntt_sets for label, plan, graph, per_row, streams in variants
            if label.startswith("graph fused") or ntt_set == ntt_sets[0]]
    for label, plan, graph, per_row, streams, ntt_set in runs:
        if args.fused_only and not label.startswith("graph fused"):
            continue
        if label.startswith("graph fused") and str(streams) not in args.streams.split(","):
            continue
        settings.apply(ntt_set)
        if plan is fused and "plan." in ntt_set:  # a setting of caramel.plan.order: the plan built under it
            plan = build_plan(program)
        t0 = time.perf_counter()
        run = GpuRun(plan, ctx, memory, "exact", per_row=per_row, streams=streams)
        run.run(graph=False)  # warm-up: compiles kernels, uploads index arrays
        if graph:
            run.capture()
        setup = time.perf_counter() - t0
        timing = run.time(graph=graph, repeats=min(args.repeats, 3) if per_row else args.repeats,
                          warmup=0 if per_row else 1)
        digests[label] = output_digest(program, run.result().memory)
        if label.startswith("graph fused") and streams == 1:  # one instrumented run, kernel by kernel: the roofline
            print(f"\nroofline of the fused plan [{ntt_set}], kernel by kernel (plan traffic model; copy "
                  f"{copy_gbs:.0f} GB/s):")
            print(render_roofline(_instrument_gpu(run), copy_gbs))
        log(f"{label}: {run.kernels} launches, arena {run.backend.nbytes / 2**30:.2f} GiB, setup {setup:.1f} s, "
            f"{timing}; digest {digests[label][:16]}")
        rows.append((f"{args.program} N={args.n} {label} ({run.kernels} launches)",
                     f"median {timing.median_ms:.2f} ms  min {timing.min_ms:.2f}  max {timing.max_ms:.2f}"))
        del run
        cp.get_default_memory_pool().free_all_blocks()
    agree = len(set(digests.values())) == 1
    rows.append(("digests of the three modes agree", str(agree)))
    rows.append(("digest", next(iter(digests.values()))))
    ntt_rates(ctx, args, ntt_sets, settings, rows)
    stored = reference_digest(args.program, args.n)
    if stored is not None:
        # The CPU reference's digest for these inputs, computed once on the dev VM by
        # scripts/reference_digests.py, so that a GPU run is checked without rerunning it.
        match = next(iter(digests.values())) == stored
        rows.append(("stored CPU reference digest matches", str(match)))
        agree = agree and match
    if not args.skip_reference:
        t0 = time.perf_counter()
        want = run_reference(program, ctx, memory, "exact")
        ref = output_digest(program, want.memory)
        log(f"CPU reference in {time.perf_counter() - t0:.1f} s: digest {ref[:16]}")
        rows.append(("CPU reference digest matches", str(ref == next(iter(digests.values())))))
    rows.append(("device copy bandwidth (256 MiB, read + write)", f"{copy_gbs:.0f} GB/s"))
    print_table(rows)
    return 0 if agree and all(b != "MISMATCH" for _, b in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
