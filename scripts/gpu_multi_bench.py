#!/usr/bin/env python3
"""One command on a multi-GPU machine: multi-chip programs on several GPUs against the CPU
reference, limb for limb, then the scaling profile of BootstrapLike_51L (table, PNG, trace).

    NCCL_NVLS_ENABLE=0 PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_multi_bench.py \
        [--corpus .data/corpus] [--n 65536] [--gpus 1,2,4] [--out DIR] [--skip-checks] [--skip-scaling]

1. Checks: every K-chip program (K > 1) of ``--corpus`` matching ``--pattern`` runs on min(K, G)
   GPUs (one CUDA graph per GPU, NCCL) and, for K >= 4, also on 2 GPUs and on 1 GPU (several chips
   per GPU); the CPU reference runs in worker processes; every store of every chip must match.
2. BootstrapLike_51L_4c on 2 GPUs and _8c on 4 (fewer GPUs than chips) at N = 65536: output
   digests against scripts/reference_digests.json (the CPU reference's, computed by
   scripts/reference_digests.py with the same inputs).
3. The scaling profile (caramel.scaling) of BootstrapLike_51L_{K}c on K GPUs for K in --gpus:
   table, PNG and Chrome trace in --out, digests against the stored CPU reference digests.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caramel.api import default_spec, output_digest, resolve_check  # noqa: E402
from caramel.ckks.check import prepare_check  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.ring import Context  # noqa: E402
from reference_digests import bootstrap_inputs, reference_digest  # noqa: E402  (scripts/ beside this file)


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def reference(path: str, n: int, seed: int):
    program = load_program(path, cache=False)
    ctx = Context(n=n)
    spec = resolve_check(program, "auto") or default_spec(program)
    memory = prepare_check(spec, program, ctx, rng=np.random.default_rng(seed)).memory
    return path, memory, run_reference(program, ctx, memory, "exact").stores


def same(want, have) -> bool:
    return len(want) == len(have) and all(
        w.keys() == h.keys() and all(np.array_equal(w[m], h[m]) for m in w) for w, h in zip(want, have))


def checks(args, gpus: int, rows: list) -> bool:
    from caramel.execute.cuda_graph import MultiGpuRun
    from caramel.execute.fabric.nccl import nccl_communicators

    paths = sorted(str(p) for pat in args.pattern for p in Path(args.corpus).glob(pat)
                   if p.is_dir() and not p.name.endswith("_1c"))
    ctx = Context(n=args.n)
    comms: dict[int, dict] = {}
    for g in range(2, gpus + 1):  # one communicator per device prefix, shared by every run
        for d, c in nccl_communicators([tuple(range(g))], list(range(g))).items():
            comms.setdefault(d, {}).update(c)
    ok, bad, start = 0, [], time.time()
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(reference, p, args.n, 7) for p in paths]
        for fut in cf.as_completed(futures):
            path, memory, want = fut.result()
            program = load_program(path, cache=False)
            plan = build_plan(program)
            k = program.chips
            configs = sorted({min(k, gpus)} | ({1, 2} if k >= 4 else {1}) if not args.max_only else {min(k, gpus)})
            for g in configs:
                if g > gpus:
                    continue
                run = MultiGpuRun(plan, ctx, memory, "exact", g, comms=comms, timeout=60)
                try:
                    run.replay(1)
                    good = same(want, run.result().stores)
                finally:
                    run.close()
                ok += good
                if not good:
                    bad.append(f"{program.name} on {g} GPU(s)")
                log(f"{'ok  ' if good else 'DIFF'} {program.name:28s} N={args.n} on {g} GPU(s)")
    rows.append((f"corpus {'/'.join(args.pattern)} N={args.n}: runs bit-identical to the CPU reference",
                 f"{ok} of {ok + len(bad)} ({time.time() - start:.0f} s)" + (f"; DIFF: {', '.join(bad)}" if bad else "")))
    return not bad


def bootstrap(args, gpus: int, rows: list) -> bool:
    from caramel.execute.cuda_graph import MultiGpuRun

    ctx = Context(n=65536)
    good = True
    configs = [(4, 2), (8, min(4, gpus))]  # fewer GPUs than chips (K GPUs for K chips: the scaling phase)
    for chips, g in configs:
        name = f"BootstrapLike_51L_{chips}c"
        program = load_program(f"{args.archive}#{name}")
        memory = bootstrap_inputs(program, ctx)
        t0 = time.perf_counter()
        with MultiGpuRun(build_plan(program), ctx, memory, "exact", g, timeout=90) as run:
            run.replay(1)
            digest = output_digest(program, run.result().memory)
            timing = run.time(args.repeats)
        want = reference_digest(name)
        match = "no stored digest" if want is None else str(digest == want)
        good &= want is None or digest == want
        log(f"{name} on {g} GPU(s): {timing}; digest {digest[:16]}; matches the CPU reference: {match} "
            f"({time.perf_counter() - t0:.0f} s)")
        rows.append((f"{name} N=65536 on {g} GPU(s): replay", f"{timing}"))
        rows.append((f"{name} on {g} GPU(s): digest matches the CPU reference", match))
    return good


def scaling(args, gpus: int, rows: list) -> bool:
    from caramel.scaling import plot_scaling, profile_scaling, render_scaling, scaling_trace

    counts = [k for k in map(int, args.gpus.split(",")) if k <= gpus]
    result = profile_scaling(args.archive, counts, n=65536, seed=1, repeats=args.repeats, backend="gpu", log=log)
    print(render_scaling(result), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_scaling(result, out / "scaling_bootstraplike51.png")
    (out / "scaling_trace.json").write_text(json.dumps(scaling_trace(result)))
    (out / "scaling.txt").write_text(render_scaling(result) + "\n")
    good = True
    for p in result.points:
        want = reference_digest(p.program, seed=1)  # profile_scaling's draws: `caramel run --seed 1`
        match = "no stored digest" if want is None else str(p.digest == want)
        good &= want is None or p.digest == want
        rows.append((f"scaling {p.program} on {p.gpus} GPU(s)", f"{p.median_ms:.2f} ms, {result.speedup(p):.2f}x, "
                     f"digest matches the CPU reference: {match}"))
    return good


def sweep_streams(args, gpus: int, rows: list) -> bool:
    """BootstrapLike_51L_{K}c on K GPUs with S streams per GPU for each S of --sweep-streams
    (S = 1: kernels and collectives in one order; S > 1: collectives on a stream of their own):
    replay times and digests."""
    from caramel.execute.cuda_graph import MultiGpuRun
    from caramel.execute.fabric.nccl import NcclFabric
    from caramel.scaling import compute_only_ms

    ctx = Context(n=65536)
    good = True
    if args.sync_only:
        NcclFabric.payload_limit = 1  # every collective moves one uint32: synchronisation without bandwidth
    what = " (sync only: 1 element per collective, outputs wrong)" if args.sync_only else ""
    for k in (k for k in map(int, args.gpus.split(",")) if k <= gpus):
        name = f"BootstrapLike_51L_{k}c"
        program = load_program(f"{args.archive}#{name}")
        memory = bootstrap_inputs(program, ctx)
        plan = build_plan(program)
        for s in map(int, args.sweep_streams.split(",")):
            with MultiGpuRun(plan, ctx, memory, "exact", k, streams=s, timeout=120) as run:
                timing = run.time(args.repeats)
                digest = output_digest(program, run.result().memory)
            floor = max(compute_only_ms(plan, ctx, memory, "exact", k, args.repeats, s)) if k > 1 else timing.median_ms
            want = reference_digest(name)
            good &= want is None or digest == want or args.sync_only
            log(f"{name} on {k} GPU(s), {s} stream(s) per GPU{what}: {timing}; compute floor {floor:.2f} ms; "
                f"digest matches the CPU reference: {want is None or digest == want}")
            rows.append((f"{name} on {k} GPU(s), {s} stream(s) per GPU{what}",
                         f"median {timing.median_ms:.2f} ms (min {timing.min_ms:.2f}, max {timing.max_ms:.2f}); "
                         f"compute floor {floor:.2f} ms; digest matches: {want is None or digest == want}"))
    return good


def compute_floor(args, rows: list) -> None:
    """Per device, the replay time of its program without collectives (caramel.scaling.compute_only_ms),
    one device after another on GPU 0: the compute floor of each K-GPU run of BootstrapLike_51L."""
    from caramel.scaling import compute_only_ms

    ctx = Context(n=65536)
    for k in map(int, args.gpus.split(",")):
        if k < 2:
            continue
        program = load_program(f"{args.archive}#BootstrapLike_51L_{k}c")
        memory = bootstrap_inputs(program, ctx)
        ms = compute_only_ms(build_plan(program), ctx, memory, "exact", k, args.repeats)
        log(f"BootstrapLike_51L_{k}c on {k} devices, compute only (no collectives): "
            + ", ".join(f"device {d}: {t:.2f} ms" for d, t in enumerate(ms)))
        rows.append((f"BootstrapLike_51L_{k}c compute floor per device (ms, no collectives)",
                     " / ".join(f"{t:.2f}" for t in ms)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(ROOT / ".data" / "corpus"))
    ap.add_argument("--archive", default=str(ROOT / ".data" / "BootstrapLike_51L.tar.xz"))
    ap.add_argument("--pattern", nargs="*", default=["*_10L_*c"])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--gpus", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 4))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/caramel-multi"))
    ap.add_argument("--max-only", action="store_true", help="checks only on min(K, GPUs) GPUs")
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--skip-bootstrap", action="store_true")
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--compute-floor", action="store_true", help="only the compute floors (one GPU is enough)")
    ap.add_argument("--sync-only", action="store_true", help="with --sweep-streams: every collective moves one "
                    "element (timing only: what synchronisation costs without the bandwidth)")
    ap.add_argument("--sweep-streams", metavar="1,2,3", help="only: time BootstrapLike_51L_Kc on K GPUs (K in --gpus) "
                    "with each number of streams per GPU")
    args = ap.parse_args()
    import cupy as cp
    from cupy.cuda import nccl

    gpus = cp.cuda.runtime.getDeviceCount()
    name = cp.cuda.runtime.getDeviceProperties(0)["name"]
    log(f"{gpus} x {name.decode() if isinstance(name, bytes) else name}, NCCL {nccl.get_version()}, "
        f"NCCL_NVLS_ENABLE={os.environ.get('NCCL_NVLS_ENABLE')}, "
        f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    rows: list = []
    good = True
    if args.compute_floor:
        compute_floor(args, rows)
        args.skip_checks = args.skip_bootstrap = args.skip_scaling = True
    if args.sweep_streams:
        good &= sweep_streams(args, gpus, rows)
        args.skip_checks = args.skip_bootstrap = args.skip_scaling = True
    if not args.skip_checks:
        good &= checks(args, gpus, rows)
    if not args.skip_bootstrap:
        good &= bootstrap(args, gpus, rows)
    if not args.skip_scaling:
        good &= scaling(args, gpus, rows)
    print("\n| what | result |\n| --- | --- |")
    for a, b in rows:
        print(f"| {a} | {b} |")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
