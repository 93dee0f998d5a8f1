#!/usr/bin/env python3
"""NTT epilogues on one GPU: a forward NTT whose outputs only an elementwise program reads, run as today (the two-pass
transform, then the program) against the epilogue (the transform's column pass, then the program running the row
pass in its load: ``ntt._launch(half=True)`` and ``FusedProgram.transformed``), per program shape.

    PYTHONPATH=. python3 scripts/gpu_epilogue_bench.py [--rows 150] [--shapes 2x13x2,1x24x1,...]
        [--variants "EPILOGUE_APART=0 EPILOGUE_SCALAR_FROM=17,ew.LAZY_SUMS=0"]

A shape FxPxO is the key-switching inner product of tests/backends/test_cuda_epilogue.py: F transformed operands,
P plain ones, O outputs, over R rows (F R transformed limbs). Checks the two against each other first (the same
outputs, bit for bit, for every variant), then times both (graph replays over rotating arenas, N = 65536) and
prints the limbs each moves (two-pass transform: 4 a limb; the program: its operands and outputs) and the measured
rates; "kernel" is the epilogue kernel alone. Exit status 1 when the outputs differ.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from gpu_kernels_check import Bench, KernelSettings, sets_for  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=150)
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--shapes", default="2x13x2,2x7x2,1x24x1,4x12x2,8x14x3,12x12x4,14x18x5")
    ap.add_argument("--variants", default="", help="kernel settings to check and time, space separated; each a "
                    "comma-separated list of NAME=INT (caramel.backends.cuda.ntt) or ew.NAME=INT (elementwise), e.g. "
                    "EPILOGUE_APART=0,ew.LAZY_SUMS=0 (default: the modules' own)")
    args = ap.parse_args()
    import cupy as cp

    from caramel.backends.cuda import CudaRing
    from caramel.backends.cuda import elementwise as dew
    from caramel.backends.cuda import ntt as dntt
    from caramel.ring import Context
    from tests.backends.test_cuda_epilogue import inner_products

    ctx = Context(args.n)
    ring = CudaRing(ctx)
    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"device {props['name'].decode()}, N = {args.n}, R = {args.rows}", flush=True)
    rng = np.random.default_rng(7)
    bench = Bench(cp, args.n)
    limb = 4 * args.n
    failures = []
    settings = KernelSettings()
    variants = args.variants.split() or [""]
    for variant in variants:
        settings.check(variant)

    def i32(a):
        return cp.asarray(np.ascontiguousarray(np.asarray(a, dtype=np.int32)))

    for shape in args.shapes.split(","):
        f, p, o = (int(x) for x in shape.split("x"))
        program = inner_products(f, p, o)
        plain_program = dew.FusedProgram(program.n_vec, 0, program.ops, program.outputs)
        rows, nv = args.rows, program.n_vec
        per = rows * (nv + o)
        sets = sets_for(per * limb)
        primes = i32(np.arange(rows) % 64)
        vec = [i32(np.arange(rows * nv).reshape(rows, nv) + s * per) for s in range(sets)]
        out = [i32(np.arange(rows * o).reshape(rows, o) + s * per + rows * nv) for s in range(sets)]
        tslots = [i32(cp.asnumpy(v)[:, list(program.transformed)].ravel()) for v in vec]
        tprimes = i32(np.repeat(np.arange(rows) % 64, f))
        arena = cp.asarray(rng.integers(0, 1 << 27, (per * sets, args.n), dtype=np.uint32))
        initial = arena.copy()

        def before(s):
            dntt._launch(ring, arena, tslots[s], tslots[s], tprimes, False)
            dew.fused(ring, plain_program, arena, out[s], vec[s], primes)

        def after(s):
            dntt._launch(ring, arena, tslots[s], tslots[s], tprimes, False, half=True)
            dew.fused(ring, program, arena, out[s], vec[s], primes)

        def outputs(run, variant=""):
            settings.apply(variant)
            arena[...] = initial
            run(0)
            return cp.asnumpy(arena[cp.asnumpy(out[0]).ravel()])

        expected = outputs(before)
        wrong = [v or "default" for v in variants if not np.array_equal(outputs(after, v), expected)]
        if wrong:
            failures.append(f"{shape} ({', '.join(wrong)})")
            print(f"{shape}: the epilogue's outputs differ ({', '.join(wrong)})", flush=True)
            continue

        def alone(s):  # the epilogue kernel alone (on the half transform's output of the checks above)
            dew.fused(ring, program, arena, out[s], vec[s], primes)

        moved = {"before": rows * (4 * f + nv + o), "after": rows * (2 * f + nv + o), "kernel": rows * (nv + o)}
        for label, run, variant in [("before", before, "")] + [(label, run, v) for v in variants
                                                               for label, run in (("after", after), ("kernel", alone))]:
            settings.apply(variant)
            t = bench.time(run, sets)
            bench.add(f"{shape} {label}" + (f", {variant}" if variant else ""), f"R={rows}", t,
                      f"{moved[label]} limbs, {moved[label] * limb / t / 1e9:6.0f} GB/s")
        settings.apply("")
        del arena, initial
        cp.get_default_memory_pool().free_all_blocks()
    return bench.report(("shape FxPxO", "what", "us", "traffic"), failures)


if __name__ == "__main__":
    raise SystemExit(main())
