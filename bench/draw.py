"""An instance's inputs drawn on the host (``caramel.instance.draw_inputs``, what an executor's prepare threads do):
the time per instance, one at a time and with several threads at once, on the CPU.

    python -m bench draw [--program BootstrapLike_51L_1c] [--n 65536] [--client none|host|posed|gpu]
                         [--instances 4] [--workers 1,2] [--base .ab]

``--client none`` (default) measures the host's share of the GPU client: the draws, the ciphertexts' encodings,
the scalars and the objects, with the client's arithmetic after the draws (the plaintexts' encoding, residues, NTTs,
encryption products) skipped, as the GPU does it there (the rows are left uninitialised: the figures are times, not
bits). ``host`` is the host client whole (its NTTs included); ``posed`` the GPU client's code on NumPy; ``gpu`` the
GPU client whole, as an executor's prepare thread runs it (inputs kept on the GPU, each thread on its own CUDA
stream, waited for at the end of each instance). Each
figure is the median over ``--instances`` instances (seeds 0, 1, ...) after one untimed instance: milliseconds of
wall time and of process CPU time (every thread) per instance, one at a time; then, for each ``--workers`` W, W
threads drawing instances at once (as the executor's prepare workers), instances per second.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from bench.harness import BIG, Record, ab_runs, add_common, find_program, log


def timing_client():
    """A host client that does only the host's share of the GPU client's work (module docstring)."""
    from caramel.ckks.arith import HostArith

    class HostShare(HostArith):
        def encode_rows(self, parts, scales, n, out):
            return list(out)

        def transform(self, res, ctx, limbs, inverse=False):
            return np.asarray(res)

        def to_ntt_rows(self, coeffs, ctx, limbs):
            return np.empty((len(limbs), ctx.n), dtype=np.uint32)

        def plaintext_rows(self, coeffs, ctx, groups):
            return np.empty((sum(len(g) for g in groups), ctx.n), dtype=np.uint32)

        def uniform(self, ctx, limbs, rng):
            return np.empty((len(limbs), ctx.n), dtype=np.uint32)

        def error(self, n, rng):
            return np.zeros(n, dtype=np.int64)

        def rlwe_c0(self, ctx, limbs, a, s, e, m, factor=None, perm=None):
            return np.empty(a.shape, dtype=np.uint32)

    return HostShare()


def client(name: str):
    from caramel.ckks.arith import GPU, HOST, GpuArith

    return {"none": timing_client, "host": lambda: HOST, "posed": lambda: GpuArith(array_module=np, cuda_ntt=False),
            "gpu": lambda: GPU}[name]()


def gpu_scope(local: threading.local):
    """Inputs kept on the GPU, on the calling thread's own stream (made on first use)."""
    import contextlib

    import cupy as cp

    from caramel.ckks.device import keeping_inputs

    stream = getattr(local, "stream", None)
    if stream is None:
        stream = local.stream = cp.cuda.Stream(non_blocking=True)
    stack = contextlib.ExitStack()
    stack.enter_context(keeping_inputs(True))
    stack.enter_context(stream)
    stack.callback(stream.synchronize)
    return stack


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m bench draw", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--program", default=BIG, help=f"program path or name (default {BIG})")
    ap.add_argument("--client", default="none", choices=("none", "host", "posed", "gpu"))
    ap.add_argument("--instances", type=int, default=4, help="timed instances per figure (default 4)")
    ap.add_argument("--workers", default="1,2", help="threads drawing at once, comma-separated (default 1,2)")
    add_common(ap, backend=None, configs=False, repeats=1)
    args = ap.parse_args(argv)
    if args.base:
        return ab_runs("draw", argv, args.base, args.rounds, args.json)
    from caramel.ckks.device import using
    from caramel.ckks.keys import Secrets
    from caramel.ckks.keyset import input_rng, key_rng
    from caramel.instance import default_spec, draw_inputs, input_plan, resolve_check
    from caramel.ring import Context

    import contextlib

    rec = Record("draw", argv, "gpu" if args.client == "gpu" else "cpu-plan")
    program = find_program(args.program)
    ctx = Context(n=args.n)
    plan = input_plan(program, ctx, resolve_check(program, "auto") or default_spec(program))
    secrets = Secrets.generate(args.n, key_rng(0))
    dev = client(args.client)
    kinds = [str(plan.kind(x)) for x in plan.names]
    detail = {"program": program.name, "n": args.n, "client": args.client,
              "inputs": {k: kinds.count(k) for k in sorted(set(kinds))}}

    local = threading.local()

    def one(seed: int) -> None:
        with using(dev), gpu_scope(local) if args.client == "gpu" else contextlib.nullcontext():
            draw_inputs(plan, secrets, input_rng(seed), plan.names)

    one(0)  # untimed: tables, thread pools, compiled kernels
    walls, cpus = [], []
    for i in range(args.instances):
        w, c = time.perf_counter(), time.process_time()
        one(i + 1)
        walls.append(1e3 * (time.perf_counter() - w))
        cpus.append(1e3 * (time.process_time() - c))
    rec.add("wall per instance, one at a time", statistics.median(walls), "ms", min=min(walls), max=max(walls),
            **detail)
    rec.add("CPU per instance, one at a time (every thread)", statistics.median(cpus), "ms", min=min(cpus),
            max=max(cpus), **detail)
    for workers in [int(w) for w in args.workers.split(",") if w]:
        seeds = iter(range(100, 100 + workers * args.instances))
        lock = threading.Lock()

        def loop() -> None:
            while True:
                with lock:
                    seed = next(seeds, None)
                if seed is None:
                    return
                one(seed)

        start = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            for f in [pool.submit(loop) for _ in range(workers)]:
                f.result()
        wall = time.perf_counter() - start
        rec.add(f"instances per second, {workers} threads at once", workers * args.instances / wall, "1/s",
                instances=workers * args.instances, wall_s=round(wall, 3), **detail)
    log(f"cores: {__import__('os').cpu_count()}")
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
