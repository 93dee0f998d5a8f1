"""Several GPUs of one host, in one call: NCCL's health, every multi-chip program against the CPU reference limb for
limb, BootstrapLike_51L on 1..G GPUs (the scaling table, its PNG and trace), the compute floor of each device, and
process mode against one process.

    NCCL_NVLS_ENABLE=0 python -m bench multi [--parts probe,tests,launch,checks,bootstrap,scaling,floor]
    python -m bench multi --parts sweep --sweep-streams 2,3,4    # K-chip programs on K GPUs, S streams a GPU

Parts: ``probe`` NCCL between processes without caramel (broadcast and reduce, eager and in a graph); ``tests`` the
multi-GPU test modules (their skips listed); ``launch`` ``caramel launch --nproc 2`` of BootstrapLike_51L_2c against
the same run on 2 GPUs in one process and the stored reference digest; ``checks`` every K-chip program of ``--corpus``
on min(K, G) GPUs (and on 1 and 2 for K >= 4, unless ``--max-only``) against the CPU reference; ``bootstrap``
BootstrapLike_51L_4c on 2 GPUs and _8c on min(4, G), digests against the stored reference; ``scaling``
``caramel.scaling.profile_scaling`` on ``--gpus`` (PNG, trace and table in ``--out``; digests against the stored
references of ``caramel run --seed 1``); ``floor`` each device's replay without collectives; ``sweep`` streams a GPU.
``--backend cpu-plan`` runs checks, bootstrap and scaling on NumPy devices in host threads.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.corpus import reference
from bench.harness import (ROOT, Record, add_common, bench_inputs, digest_key, family_archive, find_program, log,
                           need_gpu, open_run, program_dirs, same_stores, stored_digests)

PARTS = ("probe", "tests", "launch", "checks", "bootstrap", "scaling", "floor", "sweep")
GPU_ONLY = ("probe", "tests", "launch", "floor", "sweep")
FAMILY = "BootstrapLike_51L"


def family(args) -> str:
    """The family of the K-chip runs: ``--family`` (an archive, or a path without ``_Kc``), else the
    BootstrapLike_51L archive, looked up as the harness looks programs up."""
    return args.family or family_archive(FAMILY)


def member(args, chips: int):
    """The family's program of ``chips`` chips."""
    from caramel.scaling import family_member

    return find_program(family_member(family(args), chips))


# ----------------------------------------------------------------------------------------------
# NCCL between processes, without caramel


def _probe_worker(rank: int, world: int, queue, graph: bool) -> None:
    import cupy as cp
    from cupy.cuda import nccl

    def say(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] rank {rank}: {text}", file=sys.stderr, flush=True)

    if rank == 0:
        uid = nccl.get_unique_id()
        for _ in range(world - 1):
            queue.put(uid)
    else:
        uid = queue.get(timeout=60)
    with cp.cuda.Device(rank):
        try:  # CuPy 14 takes the id as bytes, earlier versions as a tuple
            comm = nccl.NcclCommunicator(world, uid if isinstance(uid, bytes) else bytes(x & 0xFF for x in uid), rank)
        except TypeError:
            comm = nccl.NcclCommunicator(world, tuple(uid), rank)
        say("communicator created")
        n = 1 << 16
        x = cp.full(n, rank + 1, dtype=cp.uint32)
        y = cp.zeros(n, dtype=cp.uint32)
        s = cp.cuda.Stream(non_blocking=True)

        def step():
            comm.broadcast(x.data.ptr, x.data.ptr, n, nccl.NCCL_UINT32, 0, s.ptr)
            comm.reduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_UINT32, nccl.NCCL_SUM, 0, s.ptr)

        step()
        s.synchronize()
        say("eager broadcast + reduce done")
        g = None
        if graph:
            x.fill(rank + 1)
            s.synchronize()
            s.begin_capture(getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", 1))
            step()
            g = s.end_capture()
            g.launch(s)
            s.synchronize()
            say("graph broadcast + reduce done")
        ok = int(x[0]) == 1 and (rank != 0 or int(y[0]) == world)
        say(f"values {'right' if ok else 'WRONG'}: x={int(x[0])} y={int(y[0])}")
        g = None  # noqa: F841  (a live graph holding NCCL work makes ncclCommDestroy wait forever)
        comm.destroy()
        if not ok:
            sys.exit(1)


def probe(rec: Record, gpus: int, timeout: float = 90) -> None:
    """One process per GPU (spawned): an NCCL unique id handed out by rank 0, a communicator each, a broadcast and a
    SUM reduce of a uint32 vector, eagerly and captured in a graph; the values checked."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_probe_worker, args=(r, gpus, queue, True)) for r in range(gpus)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
    bad = [r for r, p in enumerate(procs) if p.exitcode]
    rec.check(f"NCCL between {gpus} processes: broadcast and reduce, eager and in a graph", not stuck and not bad,
              f"ranks {stuck} did not finish in {timeout:g} s" if stuck else f"ranks {bad} failed" if bad else "")


# ----------------------------------------------------------------------------------------------
# caramel on several GPUs


def caramel(*argv: str, timeout: float = 300) -> tuple[int, str]:
    """``python -m caramel ARGV`` in a fresh process (the tree's caramel): (exit status, output)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                     if os.environ.get("PYTHONPATH") else "")}
    try:
        r = subprocess.run([sys.executable, "-m", "caramel", *argv], capture_output=True, text=True, timeout=timeout,
                           env=env)
    except subprocess.TimeoutExpired:
        return 124, f"timed out after {timeout:g} s"
    return r.returncode, r.stdout + r.stderr


def tests(rec: Record) -> None:
    env = dict(os.environ)
    if (ROOT / ".data" / "corpus").is_dir():  # the 10L programs of the test modules
        env.setdefault("CARAMEL_PROGRAMS", str(ROOT / ".data" / "corpus"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "tests/execute/test_multi_gpu.py", "tests/execute/test_rebind.py",
                        "tests/execute/test_distributed.py"], cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env=env)
    print(r.stdout[-4000:])
    rec.check("multi-GPU test modules", r.returncode == 0, r.stdout.strip().splitlines()[-1] if r.stdout else "")


def launch(rec: Record, args) -> None:
    """Process mode (``caramel launch --nproc 2``) of the family's 2-chip program against the same run on 2 GPUs in
    one process: equal digests, equal to the stored CPU reference of ``caramel run --seed 1``."""
    from caramel.scaling import family_member

    path, n = family_member(family(args), 2), args.n
    digests = []
    for label, argv in (("process mode", ("launch", "--nproc", "2", "--", "run", path)),
                        ("one process", ("run", path, "--gpus", "2"))):
        rc, out = caramel(*argv, "--n", str(n), "--backend", "gpu", "--seed", "1")
        lines = [line.split()[-1] for line in out.splitlines() if line.startswith("output digest")]
        digest = lines[0] if rc == 0 and lines else None
        name = Path(path.split("#")[-1]).name
        rec.add(f"{name} on 2 GPUs, {label}", digest or f"failed (status {rc})", note=None if rc == 0 else
                out[-300:])
        digests.append(digest)
    want = stored_digests().get(digest_key(name, n, 1))
    rec.check("process mode = one process = the CPU reference", None not in digests and len(set(digests)) == 1
              and (want is None or digests[0] == want))


def checks(rec: Record, args, gpus: int) -> None:
    """Every K-chip program (K > 1) of ``--corpus`` on min(K, G) devices, and for K >= 4 also on 1 and 2 (several chips
    a device), against the CPU reference (in worker processes)."""
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context

    root = Path(args.corpus) if args.corpus else next((d for d in program_dirs() if any(d.glob("*_10L_*c"))), None)
    if root is None:
        raise SystemExit("bench multi: no corpus found (give --corpus)")
    paths = sorted(str(p) for pat in args.pattern for p in root.glob(pat) if p.is_dir() and not p.name.endswith("_1c"))
    ctx = Context(n=args.n)
    comms: dict[int, dict] = {}
    if args.backend == "gpu":  # one communicator per device prefix, shared by every run
        from caramel.execute.fabric.nccl import nccl_communicators

        for g in range(2, gpus + 1):
            for d, c in nccl_communicators([tuple(range(g))], list(range(g))).items():
                comms.setdefault(d, {}).update(c)
    ok, bad, start = 0, [], time.time()
    with cf.ProcessPoolExecutor(args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for fut in cf.as_completed([pool.submit(reference, p, args.n, "exact", 7) for p in paths]):
            path, _, memory, want = fut.result()
            program = load_program(path, cache=False)
            plan = build_plan(program)
            k = program.chips
            for g in sorted({min(k, gpus)} | (set() if args.max_only else ({1, 2} if k >= 4 else {1}))):
                if g > gpus:
                    continue
                if args.backend == "gpu":  # every run on the communicators made once
                    from caramel.execute.cuda_graph import MultiGpuRun

                    run = MultiGpuRun(plan, ctx, memory, "exact", g, comms=comms, timeout=60)
                    try:
                        run.replay(1)
                        good = same_stores(want, run.result().stores)
                    finally:
                        run.close()
                else:
                    run = open_run(plan, ctx, memory, args.backend, gpus=g)
                    good = same_stores(want, run.once().stores)
                ok += good
                if not good:
                    bad.append(f"{program.name} on {g}")
                log(f"{'ok  ' if good else 'DIFF'} {program.name:28s} N={args.n} on {g} device(s)")
    rec.add("multi-chip programs run", ok + len(bad), seconds=round(time.time() - start))
    rec.check(f"every {'/'.join(args.pattern)} program = CPU reference, limb for limb", not bad and ok > 0,
              ", ".join(bad))


def bootstrap(rec: Record, args, gpus: int) -> None:
    """BootstrapLike_51L_4c on 2 devices and _8c on min(4, G): fewer devices than chips; replay and digest."""
    from caramel.api import output_digest
    from caramel.plan import build_plan
    from caramel.ring import Context

    ctx = Context(n=args.n)
    for chips, g in ((4, min(2, gpus)), (8, min(4, gpus))):
        program = member(args, chips)
        name = program.name
        memory = bench_inputs(program, ctx)
        run = open_run(build_plan(program), ctx, memory, args.backend, gpus=g)
        try:
            timing = run.time(args.repeats, 1)
            digest = output_digest(program, run.result().memory)
        finally:
            run.close()
        rec.timing(f"{name} N={args.n} on {g} devices", timing, digest=digest)
        want = stored_digests().get(digest_key(name, args.n))
        if want is not None:
            rec.check(f"{name} on {g} devices = CPU reference", digest == want, digest[:16])


def scaling(rec: Record, args, counts: list[int]) -> None:
    from caramel.scaling import plot_scaling, profile_scaling, render_scaling, scaling_trace

    result = profile_scaling(family(args), counts, n=args.n, seed=1, repeats=args.repeats, backend=args.backend,
                             log=log)
    text = render_scaling(result)
    print(text, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scaling.txt").write_text(text + "\n")
    (out / "scaling_trace.json").write_text(json.dumps(scaling_trace(result)))
    try:
        plot_scaling(result, out / "scaling.png")
    except ImportError as e:  # matplotlib is an extra
        log(f"no plot: {e}")
    for p in result.points:
        s = result.speedup(p)
        rec.add(f"scaling {p.program} on {p.gpus} devices", p.median_ms, "ms", min=p.min_ms, max=p.max_ms,
                speedup=None if s is None else round(s, 3), **{k: v for k, v in vars(p).items()
                                                        if k not in ("program", "gpus", "median_ms", "min_ms",
                                                                     "max_ms")})
        want = stored_digests().get(digest_key(p.program, args.n, 1))
        if want is not None:
            rec.check(f"scaling {p.program} = CPU reference", p.digest == want, p.digest[:16])


def floor(rec: Record, args, counts: list[int]) -> None:
    """Per device, the replay time of its program without collectives, one device after another on GPU 0: the
    compute floor of each K-GPU run of BootstrapLike_51L."""
    from caramel.plan import build_plan
    from caramel.ring import Context
    from caramel.scaling import compute_only_ms

    ctx = Context(n=args.n)
    for k in counts:
        if k < 2:
            continue
        program = member(args, k)
        ms = compute_only_ms(build_plan(program), ctx, bench_inputs(program, ctx), "exact", k, args.repeats,
                             args.floor_streams)
        rec.add(f"{program.name} compute floor per device (no collectives)", " / ".join(f"{t:.2f}" for t in ms), "ms",
                busiest=max(ms), streams=args.floor_streams)


def sweep(rec: Record, args, counts: list[int]) -> None:
    """BootstrapLike_51L_Kc on K GPUs with S streams a GPU (the last one the communication's) for each S."""
    from caramel.api import output_digest
    from caramel.plan import build_plan
    from caramel.ring import Context

    ctx = Context(n=args.n)
    for k in counts:
        program = member(args, k)
        name = program.name
        memory = bench_inputs(program, ctx)
        plan = build_plan(program)
        want = stored_digests().get(digest_key(name, args.n))
        for s in (int(x) for x in args.sweep_streams.split(",")):
            run = open_run(plan, ctx, memory, "gpu", gpus=k, streams=s)
            try:
                timing = run.time(args.repeats, 1)
                digest = output_digest(program, run.result().memory)
            finally:
                run.close()
            rec.timing(f"{name} on {k} GPUs, {s} streams a GPU", timing, digest=digest)
            if want is not None:
                rec.check(f"{name} on {k} GPUs, {s} streams = CPU reference", digest == want, digest[:16])


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m bench multi", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--parts", default="probe,tests,launch,checks,bootstrap,scaling,floor",
                    help=f"of {', '.join(PARTS)} (default all but sweep; split them over calls of 10 minutes)")
    ap.add_argument("--gpus", default="1,2,4,8", help="device counts of the scaling and floors (those present)")
    ap.add_argument("--corpus", help="folder of the multi-chip programs (default .data/corpus, else the corpus)")
    ap.add_argument("--pattern", nargs="*", default=["*_10L_*c"])
    ap.add_argument("--family", help=f"the family of the K-chip runs: an archive such as {FAMILY}.tar.xz, or a path "
                    "without _Kc (default: the archive, looked up as programs are)")
    ap.add_argument("--max-only", action="store_true", help="checks only on min(K, G) devices")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 4))
    ap.add_argument("--out", default=os.environ.get("OUT", "bench-results"), help="scaling PNG, trace and table")
    ap.add_argument("--floor-streams", type=int, default=1, help="streams of the compute floors (default 1)")
    ap.add_argument("--sweep-streams", default="2,3,4", help="with --parts sweep: streams a GPU")
    add_common(ap, configs=False, ab=False)
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if not set(parts) <= set(PARTS):
        raise SystemExit(f"bench multi: --parts takes {', '.join(PARTS)}")
    if args.backend != "gpu" and set(parts) & set(GPU_ONLY):
        raise SystemExit(f"bench multi: {', '.join(sorted(set(parts) & set(GPU_ONLY)))} need --backend gpu")
    need_gpu(args.backend)
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if args.backend == "gpu":
        import cupy as cp

        present = cp.cuda.runtime.getDeviceCount()
    else:
        present = max(int(x) for x in args.gpus.split(","))
    counts = [k for k in (int(x) for x in args.gpus.split(",")) if k <= present]
    rec = Record("multi", argv, args.backend)
    rec.add("devices", present, nccl_nvls=os.environ.get("NCCL_NVLS_ENABLE"))
    for part in parts:
        log(f"part {part}")
        if part == "probe":
            probe(rec, present)
        elif part == "tests":
            tests(rec)
        elif part == "launch":
            launch(rec, args)
        elif part == "checks":
            checks(rec, args, present)
        elif part == "bootstrap":
            bootstrap(rec, args, present)
        elif part == "scaling":
            scaling(rec, args, counts)
        elif part == "floor":
            floor(rec, args, counts)
        else:
            sweep(rec, args, [k for k in counts if k > 1])
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
