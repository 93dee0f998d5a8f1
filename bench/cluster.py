"""``python -m bench cluster``: caramel on a Dask cluster against the same devices in one process.

1. **Instances.** A batch of ``--program`` (default BootstrapLike_51L_1c), ``--batch`` instances, on ``--gpus`` G
   devices: first in this process (:func:`caramel.batch.run_batch`, G slots), then on a local Dask cluster of G
   worker processes, one per GPU (:class:`caramel.cluster.ClusterExecutor`). Each side runs one warm-up batch of G
   instances (kernels compiled, plan cached), then the timed batch, end to end: keys, resident runners (upload,
   graph capture), every instance encrypted, run, decrypted and checked. The figure: instances per second on each
   side and their ratio (target >= ``--target``, 0.95); the digests must agree instance for instance.
2. **A partitioned program.** ``--partitioned`` (default BootstrapLike_51L_2c) as K ranks on K workers
   (:meth:`~caramel.cluster.ClusterExecutor.run_partitioned`), its digest against the CPU reference's of
   ``scripts/reference_digests.json`` (the inputs of ``caramel run --seed S``; at another N, or when absent there,
   against a run in this process).

On a GPU machine (``--backend gpu``; one worker per GPU, CUDA_VISIBLE_DEVICES set per worker) and on the CPU
(``--backend cpu-plan``, simulated devices: small N, the path checked, figures meaningless). ``--cluster ADDRESS``
uses a running scheduler instead of a local cluster (the figures are then of its workers). The record (date, commit,
device, command and every figure) is written as JSON (``--json``, default ``$OUT/cluster-<time>.json`` or
``bench-results/``); the exit status is 1 when a check failed.

    python -m bench cluster --gpus 2 --batch 32                       # nvidia-h200-x2
    python -m bench cluster --backend cpu-plan --n 1024 --gpus 2 --batch 4 --program Mul_4L_1c --partitioned Mul_4L_2c
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
DIGESTS = ROOT / "scripts" / "reference_digests.json"


def log(*parts: object) -> None:
    print(time.strftime("%H:%M:%S"), *parts, file=sys.stderr, flush=True)


def find(name: str) -> str:
    """A program by name: a folder in ``.data/``, ``$CARAMEL_SHARED_PROGRAMS``, ``../shared/programs`` or
    ``programs/``, or the member of ``<family>.tar.xz`` there (BootstrapLike_51L_2c in BootstrapLike_51L.tar.xz)."""
    dirs = [ROOT / ".data", *([Path(os.environ["CARAMEL_SHARED_PROGRAMS"])]
                              if os.environ.get("CARAMEL_SHARED_PROGRAMS") else []),
            ROOT.parent / "shared" / "programs", ROOT / "programs"]
    family = name.rsplit("_", 1)[0]
    for d in dirs:
        if (d / name).is_dir():
            return str(d / name)
        if (d / f"{family}.tar.xz").is_file():
            return f"{d / family}.tar.xz#{name}"
    raise SystemExit(f"bench cluster: program {name} not found in {', '.join(map(str, dirs))}")


def commit() -> str:
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"], timeout=30).returncode
        return (rev + ("-dirty" if dirty else "")) if rev else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device(backend: str, gpus: int) -> str:
    if backend == "gpu":
        import cupy as cp

        name = cp.cuda.runtime.getDeviceProperties(0)["name"]
        return f"{gpus} x {name.decode() if isinstance(name, bytes) else name}"
    return f"{gpus} simulated device(s) on {platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def reference(name: str, n: int, seed: int) -> str | None:
    try:
        return json.loads(DIGESTS.read_text()).get(f"{name} N={n} exact run --seed {seed}")
    except (OSError, ValueError):
        return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("gpu", "cpu-plan"), default="gpu")
    p.add_argument("--n", type=int, default=65536)
    p.add_argument("--gpus", type=int, help="devices (default: every GPU; on the CPU 2)")
    p.add_argument("--batch", type=int, help="timed instances (default 16 per device)")
    p.add_argument("--seed", type=int, default=1, help="instance i: inputs from seed + i, keys from seed (default 1)")
    p.add_argument("--program", default="BootstrapLike_51L_1c", help="the batch's program")
    p.add_argument("--partitioned", default="BootstrapLike_51L_2c", help="the partitioned program ('' to skip)")
    p.add_argument("--target", type=float, default=0.95, help="cluster / one process throughput to reach")
    p.add_argument("--cluster", default="local", help="a scheduler address instead of a local cluster")
    p.add_argument("--json", metavar="FILE", help="the record (default $OUT/cluster-<time>.json or bench-results/)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import distributed

    from caramel.api import gpu_available, run_program
    from caramel.batch import run_batch
    from caramel.cluster import ClusterExecutor, local_cluster
    from caramel.parse import load_program

    if args.backend == "gpu" and not gpu_available():
        raise SystemExit("bench cluster: no usable GPU; try --backend cpu-plan")
    if args.backend == "gpu":
        import cupy as cp

        gpus = args.gpus or cp.cuda.runtime.getDeviceCount()
    else:
        gpus = args.gpus or 2
    batch = args.batch or 16 * gpus
    figures: list[dict[str, Any]] = []
    failures: list[str] = []

    def add(what: str, value: Any, unit: str = "", **detail: Any) -> None:
        figures.append({"what": what, "value": value, "unit": unit, **detail})
        log(f"{what}: {value:.4g} {unit}" if isinstance(value, float) else f"{what}: {value} {unit}")

    def check(what: str, ok: bool, note: str = "") -> None:
        add(what, "ok" if ok else "FAIL", note=note or None)
        if not ok:
            failures.append(what + (f" ({note})" if note else ""))

    header = {"command": "python -m bench cluster " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": commit(),
              "device": device(args.backend, gpus), "backend": args.backend}
    log(f"{header['command']}: commit {header['commit']}, {header['device']}")
    options = dict(n=args.n, backend=args.backend, seed=args.seed, check=None)

    program = load_program(find(args.program))
    run_batch(program, batch=gpus, gpus=gpus, **options)  # warm-up: kernels compiled, plan cached
    t = time.perf_counter()
    one = run_batch(program, batch=batch, gpus=gpus, **options)
    one_s = time.perf_counter() - t
    add(f"{program.name}: {batch} instances in one process on {gpus} device(s)", batch / one_s, "instances/s",
        wall_s=round(one_s, 3), keys_s=round(one.timings.get("keys", 0.0), 3))

    t = time.perf_counter()
    made = None
    if args.cluster == "local":
        made = local_cluster(gpus, args.backend)
        client = distributed.Client(made)
        client.wait_for_workers(gpus, timeout=300)
    else:
        client = distributed.Client(args.cluster, timeout=60)
    add("cluster start", time.perf_counter() - t, "s", workers=len(client.scheduler_info()["workers"]))
    try:
        with ClusterExecutor(program, cluster=client, **options) as pool:
            list(pool.map(range(len(pool.infos))))  # warm-up on every worker, then a fresh job timed end to end
        with ClusterExecutor(program, cluster=client, **options) as pool:
            t = time.perf_counter()
            have = pool.run_batch(batch)
            many_s = time.perf_counter() - t
            workers = len(pool.infos)
        add(f"{program.name}: {batch} instances on {workers} Dask worker(s)", batch / many_s, "instances/s",
            wall_s=round(many_s, 3))
        ratio = one_s / many_s
        add("cluster / one process (instances per second)", ratio, "x", target=args.target)
        check(f"cluster throughput >= {args.target:g} x one process", ratio >= args.target, f"{ratio:.3f} x")
        check("cluster digests = one-process digests, instance for instance",
              [r["digest"] for r in have.records] == [r["digest"] for r in one.records])

        if args.partitioned:
            split = load_program(find(args.partitioned))
            with ClusterExecutor(split, cluster=client, **options) as pool:
                t = time.perf_counter()
                run = pool.run_partitioned()
                add(f"{split.name}: one run as {run.ranks} ranks on {run.ranks} Dask workers", time.perf_counter() - t,
                    "s", **{f"{k}_s": round(v, 3) for k, v in run.timings.items()})
            want = reference(split.name, args.n, args.seed)
            source = "scripts/reference_digests.json"
            if want is None:
                want = run_program(split, n=args.n, backend=args.backend, seed=args.seed, check=None).digest
                source = "a run in this process"
            add(f"{split.name} digest", run.digest, note=f"against {source}")
            check(f"{split.name} on the cluster has the reference digest ({source})", run.digest == want)
    finally:
        client.close()
        if made is not None:
            made.close()

    print("| what | result |\n| --- | --- |")
    for f in figures:
        value = f"{f['value']:.4g}" if isinstance(f["value"], float) else str(f["value"])
        print(f"| {f['what']} | {value} {f['unit']}".rstrip() + " |")
    print("checks: " + ("all passed" if not failures else "FAILED: " + "; ".join(failures)))
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "bench-results"
    path = Path(args.json) if args.json else folder / f"cluster-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    from caramel.outfiles import write_atomic

    write_atomic(path, json.dumps({**header, "figures": figures, "failures": failures}, indent=2) + "\n")
    log(f"record: {path}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
