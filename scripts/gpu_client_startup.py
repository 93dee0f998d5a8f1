#!/usr/bin/env python3
"""The first seconds of a GPU client process, step by step (wall clock, CUDA synchronised).

Usage: python3 scripts/gpu_client_startup.py [--n 65536] [--limbs 51] [--ciphertexts 48]

Times, in order, in this fresh process: importing NumPy, caramel's CLI (the package), CuPy; the CUDA
context; caramel's CUDA modules; a Context(N); its 64 NTT tables; the CUDA ring's twiddle tables
(host, then upload); the first NTT launch (module load); the first PCG64 words (module load); then
encrypting one and then ``--ciphertexts`` more fresh ciphertexts on ``--limbs`` limbs on the GPU
client (what `caramel run --keys` waits for: devmod.warm_up does the steps up to the PCG words in a
thread). One line per step.
"""

from __future__ import annotations

import argparse
import time

t0 = time.perf_counter()
marks: list[tuple[str, float]] = []


def mark(name: str, sync=None) -> None:
    if sync is not None:
        sync()
    marks.append((name, time.perf_counter()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--limbs", type=int, default=51)
    ap.add_argument("--ciphertexts", type=int, default=48)
    args = ap.parse_args()
    import numpy as np

    mark("import numpy")
    import caramel.cli  # noqa: F401

    mark("import caramel (the CLI's imports)")
    import cupy as cp

    mark("import cupy")
    sync = cp.cuda.Device().synchronize
    cp.empty(1)
    mark("CUDA context (first allocation)", sync)
    from caramel.backends.cuda import ntt as cuda_ntt
    from caramel.backends.cuda.backend import cuda_ring
    from caramel.ckks import pcg

    mark("import caramel.backends.cuda, ckks.pcg")
    from caramel.ring import Context

    ctx = Context(n=args.n)
    mark("Context(N)")
    for i in range(len(ctx.primes)):
        ctx.ntt_table(i)
    mark(f"{len(ctx.primes)} NTT tables (host)")
    ring = cuda_ring(ctx)
    ring.host_twiddles()
    mark("CUDA ring: host twiddle tables")
    ring.prime_table, ring.twiddles  # noqa: B018
    mark("CUDA ring: device tables (computed on the GPU; what a run builds, no host table)", sync)
    arena = cp.zeros((2, ctx.n), dtype=np.uint32)
    slots = cp.arange(2, dtype=np.int32)
    cuda_ntt.ntt(ring, arena, slots[:1], slots[1:], cp.zeros(1, dtype=np.int32))
    mark("first NTT launch (module)", sync)
    pcg.device_words(1, 1, 1, cp)
    mark("first PCG64 words (module)", sync)
    from caramel.ckks.encrypt import encrypt
    from caramel.ckks.keys import Secrets

    sec = Secrets.generate(ctx.n, 1)
    rng = np.random.default_rng(2)
    coeffs = rng.integers(-2**40, 2**40, ctx.n)
    limbs = tuple(range(args.limbs))
    encrypt(ctx, sec.s, coeffs, limbs, rng, device="gpu")
    mark(f"first encryption ({args.limbs} limbs; secret rows, client kernels)", sync)
    for _ in range(args.ciphertexts):
        encrypt(ctx, sec.s, coeffs, limbs, rng, device="gpu")
    mark(f"{args.ciphertexts} more encryptions", sync)
    last = t0
    for name, t in marks:
        print(f"{t - last:8.3f} s  {name}")
        last = t
    print(f"{last - t0:8.3f} s  in all (from the script's start)")


if __name__ == "__main__":
    main()
