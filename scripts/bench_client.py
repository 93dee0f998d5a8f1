#!/usr/bin/env python3
"""Time the client's input preparation of one program: keys, then encoded and encrypted inputs.

Usage: python3 scripts/bench_client.py [PROGRAM] [--n 65536] [--device cpu|gpu] [--seed 0]
                                      [--store DIR] [--compare-keys K]

PROGRAM defaults to BootstrapLike_51L_1c from the shared programs' archive. Prints the seconds of key
generation (secrets and every evaluation key), of the inputs (encoding, encryption, binding), and with
--store DIR of writing the keys to a key store and loading them back (the load is checked against the
generated keys). --compare-keys K also generates the first K keys on the other device and compares
them bit for bit. Environment: CARAMEL_CLIENT_THREADS (host threads, default the CPU count).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import caramel
from caramel.api import default_spec, resolve_check
from caramel.ckks.bind import requirements
from caramel.ckks.check import prepare_check
from caramel.ckks.keys import Secrets, generate_evalkeys
from caramel.ckks.keyset import generate_keyset, input_rng, key_rng
from caramel.ckks.keystore import load_keys, save_keys
from caramel.ring import Context
from caramel.ring.ntt import client_threads

ROOT = Path(__file__).resolve().parents[1]


def default_program() -> str:
    shared = Path(os.environ.get("CARAMEL_SHARED_PROGRAMS", ROOT.parent / "shared" / "programs"))
    for base in (shared, shared.parent, ROOT / ".data"):
        archive = base / "BootstrapLike_51L.tar.xz"
        if archive.exists():
            return f"{archive}#BootstrapLike_51L_1c"
    raise SystemExit("BootstrapLike_51L.tar.xz not found; pass PROGRAM")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program", nargs="?")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--device", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--store", metavar="DIR")
    ap.add_argument("--compare-keys", type=int, default=0, metavar="K")
    args = ap.parse_args()
    path = args.program or default_program()
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "?"
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} commit {commit}, {platform.node()}, {os.cpu_count()} CPUs, "
          f"{client_threads()} client threads, device {args.device}, load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    t = time.perf_counter()
    program = caramel.load_program(path)
    ctx = Context(n=args.n)
    print(f"{program.name} at N = {args.n}: loaded in {time.perf_counter() - t:.1f} s", flush=True)
    if args.device == "cpu":
        from caramel.ring import ntt_jit

        try:
            import numba
            jit = f"Numba {numba.__version__}, compiled in the background during the keys"
        except ImportError:
            jit = "no Numba: NumPy kernels"
        print(f"host kernels: {'NumPy (CARAMEL_NUMBA=0)' if ntt_jit.disabled() else jit}", flush=True)
    t, c = time.perf_counter(), time.process_time()
    keyset = generate_keyset(program, ctx, args.seed, device=args.device)
    t_keys, c_keys = time.perf_counter() - t, time.process_time() - c
    size = sum(k.c0.nbytes + k.c1.nbytes for k in keyset.keys.values())
    print(f"keys: {len(keyset.keys)} evaluation keys, {size / 2**30:.2f} GiB, {t_keys:.2f} s "
          f"(CPU time {c_keys:.2f} s, load average {os.getloadavg()[0]:.1f})", flush=True)
    t, c = time.perf_counter(), time.process_time()
    from caramel.ckks.device import using

    with using(args.device):
        spec = resolve_check(program, "auto") or default_spec(program)
        prepared = prepare_check(spec, program, ctx, rng=input_rng(args.seed), secrets=keyset.secrets,
                                 keys=dict(keyset.keys))
    t_inputs, c_inputs = time.perf_counter() - t, time.process_time() - c
    print(f"inputs: {len(prepared.objects)} encoded/encrypted, {t_inputs:.2f} s (CPU time {c_inputs:.2f} s, "
          f"load average {os.getloadavg()[0]:.1f})", flush=True)
    print(f"total input preparation: {t_keys + t_inputs:.2f} s", flush=True)
    status = 0
    if args.compare_keys:
        other = "cpu" if args.device == "gpu" else "gpu"
        rng = key_rng(args.seed)
        Secrets.generate(ctx.n, rng)
        ids = list(requirements(program).keys)[: args.compare_keys]
        t = time.perf_counter()
        theirs = generate_evalkeys(ctx, ids, keyset.secrets, rng, other)
        same = all(np.array_equal(theirs[k].c0, keyset.keys[k].c0) and np.array_equal(theirs[k].c1, keyset.keys[k].c1)
                   for k in ids)
        print(f"first {len(ids)} keys on {other} ({time.perf_counter() - t:.1f} s): "
              f"{'bit-identical' if same else 'DIFFERENT'}", flush=True)
        status |= 0 if same else 1
    if args.store:
        t = time.perf_counter()
        save_keys(keyset, ctx, args.store, key_seed=args.seed, program=program.name)
        print(f"store: written in {time.perf_counter() - t:.2f} s", flush=True)
        t = time.perf_counter()
        back = load_keys(args.store, ctx)
        t_load = time.perf_counter() - t
        same = all(np.array_equal(back.keys[k].c0, v.c0) and np.array_equal(back.keys[k].c1, v.c1)
                   for k, v in keyset.keys.items())
        print(f"store: loaded in {t_load:.2f} s ({'identical' if same else 'DIFFERENT'})", flush=True)
        status |= 0 if same else 1
    return status


if __name__ == "__main__":
    sys.exit(main())
