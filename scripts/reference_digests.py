#!/usr/bin/env python3
"""Output digests of the CPU reference for the BootstrapLike_51L programs at N = 65536.

The inputs are those of scripts/gpu_bench.py and scripts/gpu_multi_bench.py (random inputs of the
default spec from numpy's default_rng(1), exact mode); the digests are written to
scripts/reference_digests.json so that GPU runs are checked against them without rerunning the
(minutes-long) reference on the GPU machine.

    PYTHONPATH=. python3 scripts/reference_digests.py [--chips 1,2,4,8] [--n 65536] [--run-seed S]

With ``--run-seed S`` the inputs are those of ``caramel run --seed S`` and ``caramel profile``
(the scaling table of scripts/gpu_multi_bench.py is checked against these).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from caramel.api import default_spec, output_digest
from caramel.ckks.check import prepare_check
from caramel.execute.reference import run_reference
from caramel.parse import load_program
from caramel.ring import Context

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "scripts" / "reference_digests.json"


def bootstrap_inputs(program, ctx):
    """The benchmark inputs of a program: the default spec with numpy's default_rng(1)."""
    return prepare_check(default_spec(program), program, ctx, rng=np.random.default_rng(1)).memory


def stored() -> dict:
    return json.loads(STORE.read_text()) if STORE.exists() else {}


def run_inputs(program, ctx, seed: int):
    """The inputs of ``caramel run --seed S`` (and of ``caramel profile``, :mod:`caramel.scaling`):
    keys from ``seed``, random inputs of the default spec from ``seed``."""
    from caramel.api import prepare_inputs
    from caramel.ckks.keyset import generate_keyset

    return prepare_inputs(program, ctx, generate_keyset(program, ctx, seed), seed).memory


def store_key(name: str, n: int, seed: int | None = None) -> str:
    """The key of a digest: the bench draws (:func:`bootstrap_inputs`) when ``seed`` is None, else
    those of ``caramel run --seed seed`` (:func:`run_inputs`)."""
    return f"{name} N={n} exact" + ("" if seed is None else f" run --seed {seed}")


def reference_digest(name: str, n: int = 65536, seed: int | None = None) -> str | None:
    """The stored CPU reference digest of program ``name`` at ring degree ``n`` (exact mode) for the
    inputs of :func:`store_key`, or None."""
    return stored().get(store_key(name, n, seed))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archive", default=str(ROOT.parent / "shared" / "programs" / "BootstrapLike_51L.tar.xz"))
    ap.add_argument("--chips", default="1,2,4,8")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--run-seed", type=int, help="the inputs of `caramel run --seed S` instead of the bench draws")
    args = ap.parse_args()
    ctx = Context(n=args.n)
    for chips in map(int, args.chips.split(",")):
        name = f"BootstrapLike_51L_{chips}c"
        t0 = time.perf_counter()
        program = load_program(f"{args.archive}#{name}")
        seed = args.run_seed
        memory = bootstrap_inputs(program, ctx) if seed is None else run_inputs(program, ctx, seed)
        digest = output_digest(program, run_reference(program, ctx, memory, "exact").memory)
        data = stored()
        data[store_key(name, args.n, seed)] = digest
        STORE.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        print(f"{name} N={args.n}: {digest} ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
