"""``python -m bench cluster``: caramel on a Dask cluster against the same devices in one process.

1. **Instances.** A batch of ``--program`` (default BootstrapLike_51L_1c), ``--batch`` instances, on ``--gpus`` G
   devices: first in this process (:func:`caramel.batch.run_batch`, one executor with G lanes), then on a local Dask
   cluster of G worker processes, one per GPU, each holding one executor (:class:`caramel.cluster.ClusterExecutor`).
   Both sides take one :class:`~caramel.options.RunOptions` (``--shared`` inputs resident on both). Each side runs
   one warm-up batch (kernels loaded, plan cached), then the timed batch ``--repeats`` times, each on a fresh
   executor (in this process; on the cluster a fresh job whose executors :meth:`~caramel.cluster.ClusterExecutor.
   warm_up` makes on every worker first). The figure of record: instances per second once the executors are made
   (every instance encrypted, uploaded, run, downloaded and digested; the batch summary's rate, the median of the
   repeats) on each side and their ratio (target >= ``--target``, 0.95); the seconds end to end (keys, plan, graphs,
   on the cluster shipping the job) beside them. The digests must agree instance for instance.
2. **A partitioned program.** ``--partitioned`` (default BootstrapLike_51L_2c; ``''`` skips it) as K ranks on K
   workers (fewer workers: several chips per rank; :meth:`~caramel.cluster.ClusterExecutor.run_partitioned`), its
   digest against the CPU reference of the inputs of ``caramel run --seed S`` (``bench.harness.reference_digest``:
   the stored digest of ``bench/reference_digests.json``, else a CPU reference run).

On a GPU machine (``--backend gpu``; one worker per GPU, CUDA_VISIBLE_DEVICES set per worker, as many threads as
instances its executor works on at once) and on the CPU (``--backend cpu-plan``, simulated devices: small N, the path
checked, figures meaningless). ``--cluster ADDRESS`` uses a running scheduler instead of a local cluster (the
figures are then of its workers). The record (date, commit, device, command and every figure) is written as JSON
(``--json``, default ``$OUT/cluster-<time>.json`` or ``bench-results/``); the exit status is 1 when a check failed.

    python -m bench cluster --gpus 1 --batch 32 --partitioned ''      # nvidia-h200
    python -m bench cluster --gpus 2 --batch 64                        # nvidia-h200-x2
    python -m bench cluster --backend cpu-plan --n 1024 --gpus 2 --batch 4 --program Mul_4L_1c --partitioned Mul_4L_2c
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Sequence

from bench.harness import (BIG, Record, add_common, bench_inputs, find_program, free_device_memory, log, need_gpu,
                           reference_digest)

#: The partitioned program of the figures of record.
SPLIT = "BootstrapLike_51L_2c"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench cluster", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, help="devices, one worker each (default: every GPU; on the CPU 2)")
    p.add_argument("--batch", type=int, help="timed instances (default 16 per device)")
    p.add_argument("--seed", type=int, default=1, help="instance i: inputs from seed + i, keys from seed (default 1)")
    p.add_argument("--program", default=BIG, help=f"the batch's program (default {BIG})")
    p.add_argument("--partitioned", default=SPLIT, help=f"the partitioned program (default {SPLIT}; '' skips it)")
    p.add_argument("--shared", default="", help="inputs every instance shares (RunOptions.shared: names, patterns, "
                   "or plaintexts,scalars), resident on both sides")
    p.add_argument("--target", type=float, default=0.95, help="cluster / one process throughput to reach")
    p.add_argument("--cluster", default="local", help="a scheduler address instead of a local cluster")
    add_common(p, configs=False, ab=False, repeats=1)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(argv or [])
    args = parser().parse_args(argv)
    need_gpu(args.backend)
    import distributed

    from caramel.batch import run_batch
    from caramel.cluster import ClusterExecutor, local_cluster
    from caramel.options import RunOptions
    from caramel.ring import Context

    if args.backend == "gpu":
        import cupy as cp

        gpus = args.gpus or cp.cuda.runtime.getDeviceCount()
    else:
        gpus = args.gpus or 2
    batch = args.batch or 16 * gpus
    repeats = max(1, args.repeats)
    rec = Record("cluster", argv, args.backend)
    rec.extra["devices"] = gpus
    options = RunOptions(n=args.n, backend=args.backend, seed=args.seed, check=None, shared=args.shared)

    program = find_program(args.program)
    run_batch(program, options, batch=gpus, gpus=gpus)  # warm-up: kernels compiled, plan cached
    rates, ends, one = [], [], None
    for _ in range(repeats):
        t = time.perf_counter()
        one = run_batch(program, options, batch=batch, gpus=gpus)
        ends.append(time.perf_counter() - t)
        rates.append(one.summary.per_second)
    one_rate, one_end = statistics.median(rates), statistics.median(ends)
    rec.add(f"{program.name}: {batch} instances in one process on {gpus} device(s)", one_rate, "instances/s",
            end_to_end_s=round(one_end, 3), setup_s={k: round(v, 3) for k, v in one.timings.items()},
            shared=",".join(one.shared) or None)
    free_device_memory(args.backend)  # this process's pooled GPU memory, for the workers

    t = time.perf_counter()
    made = None
    if args.cluster == "local":
        made = local_cluster(gpus, args.backend, options=options)
        client = distributed.Client(made)
        client.wait_for_workers(gpus, timeout=300)
    else:
        client = distributed.Client(args.cluster, timeout=60)
    rec.add("cluster start", time.perf_counter() - t, "s", workers=len(client.scheduler_info()["workers"]))
    try:
        with ClusterExecutor(program, options, cluster=client) as pool:
            workers = len(pool.infos)
            pool.run_batch(workers)  # warm-up: the workers' processes (CUDA contexts, kernels loaded)
        rates, ends, setups, have = [], [], [], None
        for _ in range(repeats):
            t = time.perf_counter()
            with ClusterExecutor(program, options, cluster=client) as pool:
                setup = pool.warm_up()
                setups.append(time.perf_counter() - t)
                have = pool.run_batch(batch)
            ends.append(time.perf_counter() - t)
            rates.append(have.summary.per_second)
        many_rate, many_end = statistics.median(rates), statistics.median(ends)
        rec.add(f"{program.name}: {batch} instances on {workers} Dask worker(s)", many_rate, "instances/s",
                end_to_end_s=round(many_end, 3), job_and_executors_s=round(statistics.median(setups), 3),
                setup_s={w: {k: round(v, 3) for k, v in secs.items()} for w, secs in setup.items()})
        ratio = many_rate / one_rate
        rec.add("cluster / one process (instances per second, executors made)", ratio, "x", target=args.target)
        rec.add("cluster / one process (end to end, setup included)", one_end / many_end, "x")
        rec.check(f"cluster throughput >= {args.target:g} x one process", ratio >= args.target, f"{ratio:.3f} x")
        rec.check("cluster digests = one-process digests, instance for instance",
                  not have.failed and [r["digest"] for r in have.records] == [r["digest"] for r in one.records],
                  "; ".join(f"instance {i}: {e}" for i, e in sorted(have.failed.items())))

        if args.partitioned:
            split = find_program(args.partitioned)
            with ClusterExecutor(split, options.with_(shared=()), cluster=client) as pool:
                t = time.perf_counter()
                run = pool.run_partitioned()
                rec.add(f"{split.name}: one run as {run.ranks} rank(s) on {run.ranks} Dask worker(s)",
                        time.perf_counter() - t, "s", **{f"{k}_s": round(v, 3) for k, v in run.timings.items()})
            ctx = Context(n=args.n)
            want, source = reference_digest(split, ctx, None, seed=args.seed, policy="stored")
            if want is None:
                log(f"no stored digest of {split.name} at N = {args.n}: a CPU reference run")
                memory = bench_inputs(split, ctx, args.seed, "gpu" if args.backend == "gpu" else "cpu")
                want, source = reference_digest(split, ctx, memory, seed=args.seed, policy="run")
            rec.add(f"{split.name} digest", run.digest, note=f"against the {source}")
            rec.check(f"{split.name} on the cluster has the reference digest", run.digest == want, source)
    finally:
        client.close()
        if made is not None:
            made.close()
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
