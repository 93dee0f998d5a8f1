#!/usr/bin/env python3
"""Profile the GPU client's key generation (cProfile, host view) for the first K keys of a program.

Usage: python3 scripts/gpu_client_profile.py ARCHIVE#MEMBER [--n 65536] [--keys 40]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import caramel
from caramel.ckks.bind import requirements
from caramel.ckks.keys import Secrets, generate_evalkeys
from caramel.ckks.keyset import key_rng
from caramel.ring import Context


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--keys", type=int, default=40)
    args = ap.parse_args()
    import cupy

    program = caramel.load_program(args.program)
    ctx = Context(n=args.n)
    ids = list(requirements(program).keys)
    rng = key_rng(0)
    sec = Secrets.generate(ctx.n, rng)
    generate_evalkeys(ctx, ids[:3], sec, rng, "gpu")  # warm up
    cupy.cuda.Device().synchronize()
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    generate_evalkeys(ctx, ids[3 : 3 + args.keys], sec, rng, "gpu")
    prof.disable()
    print(f"{args.keys} keys in {time.perf_counter() - t:.2f} s")
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
