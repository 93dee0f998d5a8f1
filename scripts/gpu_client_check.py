#!/usr/bin/env python3
"""GPU client vs CPU client, bit for bit, on a folder of compiled programs; then the GPU client's time.

Usage: python3 scripts/gpu_client_check.py PROGRAMS_DIR [--n 4096] [--pattern '*_4L_*c' '*_10L_*c']
                                           [--bootstrap ARCHIVE#MEMBER] [--big-n 65536] [--store DIR]

For each program: the key set (secrets and every evaluation key) and the prepared input image (encoded
plaintexts, encrypted ciphertexts, keys) are made with the same seeds on the CPU client (NumPy) and on
the GPU client (CuPy); every array must be identical, and the decryptions of the encrypted inputs too.
Then, for the bootstrap program at --big-n: the GPU client's key generation and input preparation time,
the first keys again on the CPU (compared), writing a key store and loading it back (timed), and one
`run_program` on the GPU with the stored keys. Exit status 1 on any difference.
"""

from __future__ import annotations

import argparse
import os
from collections import ChainMap
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import caramel
from caramel.api import default_spec, resolve_check
from caramel.ckks.bind import requirements
from caramel.ckks.check import prepare_check
from caramel.ckks.device import using
from caramel.ckks.encrypt import Ciphertext, decrypt
from caramel.ckks.keys import Secrets, generate_evalkeys
from caramel.ckks.keyset import generate_keyset, input_rng, key_rng
from caramel.ckks.keystore import load_keys, save_keys
from caramel.parse import load_program
from caramel.ring import Context


def prepare(program, ctx, device: str, seed: int):
    keyset = generate_keyset(program, ctx, seed, device=device)
    with using(device):
        spec = resolve_check(program, "auto") or default_spec(program)
        prepared = prepare_check(spec, program, ctx, rng=input_rng(seed), secrets=keyset.secrets,
                                 keys=dict(keyset.keys))
    return keyset, prepared


def same_client(program, ctx, seed: int) -> tuple[bool, str]:
    ks_c, prep_c = prepare(program, ctx, "cpu", seed)
    ks_g, prep_g = prepare(program, ctx, "gpu", seed)
    if set(ks_c.keys) != set(ks_g.keys):
        return False, "key ids differ"
    for k, key in ks_c.keys.items():
        if not (np.array_equal(key.c0, ks_g.keys[k].c0) and np.array_equal(key.c1, ks_g.keys[k].c1)):
            return False, f"key {k} differs"
    if prep_c.memory.keys() != prep_g.memory.keys():
        return False, "input image terms differ"
    for m, v in prep_c.memory.items():
        if not np.array_equal(v, prep_g.memory[m]):
            return False, f"input term {m} differs"
    checked = 0
    for name, obj in prep_c.objects.items():
        if isinstance(obj, Ciphertext):
            a = decrypt(ctx, ks_c.secrets.s, obj, device="cpu")
            b = decrypt(ctx, ks_c.secrets.s, obj, device="gpu")
            if not np.array_equal(a, b):
                return False, f"decryption of {name} differs"
            checked += 1
    return True, f"{len(ks_c.keys)} keys, {len(prep_c.memory)} input terms, {checked} decryptions identical"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--pattern", nargs="*", default=["*_4L_*c", "*_10L_*c"])
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--bootstrap", help="ARCHIVE#MEMBER to time at --big-n (default: none)")
    ap.add_argument("--big-n", type=int, default=65536)
    ap.add_argument("--compare-keys", type=int, default=6)
    ap.add_argument("--store", help="key store folder for the timing (default: a temporary folder)")
    args = ap.parse_args()
    paths = sorted({p for pat in args.pattern for p in Path(args.root).glob(pat) if p.is_dir()})
    bad = 0
    ctx = Context(n=args.n)
    start = time.time()
    for i, path in enumerate(paths):
        program = load_program(path)
        ok, why = same_client(program, ctx, args.seed)
        bad += not ok
        print(f"[{i + 1}/{len(paths)}] {path.name} N={args.n}: {'same' if ok else 'DIFFERENT'} ({why})", flush=True)
    print(f"{len(paths) - bad}/{len(paths)} programs: GPU client = CPU client ({time.time() - start:.0f} s)", flush=True)
    if args.bootstrap:
        bad += bootstrap(args)
    return 1 if bad else 0


def bootstrap(args) -> int:
    program = caramel.load_program(args.bootstrap)
    ctx = Context(n=args.big_n)
    prepare(caramel.load_program(sorted(Path(args.root).glob("Mul_4L_1c"))[0]), ctx, "gpu", 0)  # warm up CuPy
    import cupy

    cupy.cuda.Device().synchronize()
    t = time.perf_counter()
    keyset = generate_keyset(program, ctx, args.seed, device="gpu")
    t_keys = time.perf_counter() - t
    with using("gpu"):
        spec = resolve_check(program, "auto") or default_spec(program)
        prepared = prepare_check(spec, program, ctx, rng=input_rng(args.seed), secrets=keyset.secrets,
                                 keys=dict(keyset.keys))
    t_all = time.perf_counter() - t
    size = sum(k.c0.nbytes + k.c1.nbytes for k in keyset.keys.values())
    print(f"{program.name} N={args.big_n} GPU client: keys {t_keys:.2f} s ({len(keyset.keys)} keys, "
          f"{size / 2**30:.2f} GiB), inputs {t_all - t_keys:.2f} s, total {t_all:.2f} s", flush=True)
    t = time.perf_counter()  # again, as `caramel run` prepares: keys copied back while the inputs are encrypted
    later = generate_keyset(program, ctx, args.seed, device="gpu", background=True)
    t_keys2 = time.perf_counter() - t
    with using("gpu"):
        prepared2 = prepare_check(spec, program, ctx, rng=input_rng(args.seed), secrets=later.secrets,
                                  keys=ChainMap({}, later.keys))
    t_all2 = time.perf_counter() - t
    same = all(np.array_equal(prepared.memory[m], prepared2.memory[m]) for m in prepared.memory)
    print(f"{program.name} N={args.big_n} GPU client, keys copied back in the background: keys {t_keys2:.2f} s, "
          f"inputs (and the copies) {t_all2 - t_keys2:.2f} s, total {t_all2:.2f} s; image "
          f"{'identical' if same else 'DIFFERENT'}", flush=True)
    bad = int(not same)
    if args.compare_keys:
        rng = key_rng(args.seed)
        Secrets.generate(ctx.n, rng)
        ids = list(requirements(program).keys)[: args.compare_keys]
        t = time.perf_counter()
        cpu = generate_evalkeys(ctx, ids, keyset.secrets, rng, "cpu")
        same = all(np.array_equal(cpu[k].c0, keyset.keys[k].c0) and np.array_equal(cpu[k].c1, keyset.keys[k].c1)
                   for k in ids)
        print(f"first {len(ids)} keys on the CPU ({time.perf_counter() - t:.1f} s): "
              f"{'bit-identical' if same else 'DIFFERENT'}", flush=True)
        bad += not same
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(args.store or Path(tmp) / "keys")
        t = time.perf_counter()
        save_keys(keyset, ctx, store, key_seed=args.seed, program=program.name)
        print(f"key store written in {time.perf_counter() - t:.2f} s", flush=True)
        stored = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
        print(f"key store: {stored / 2**30:.2f} GiB on disk", flush=True)
        for attempt in (1, 2):
            t = time.perf_counter()
            back = load_keys(store, ctx)
            print(f"key store loaded in {time.perf_counter() - t:.2f} s (load {attempt}, on the host, "
                  f"c1 drawn again there, {os.cpu_count()} CPUs)", flush=True)
        same = all(np.array_equal(back.keys[k].c0, v.c0) and np.array_equal(back.keys[k].c1, v.c1)
                   for k, v in keyset.keys.items())
        print(f"keys loaded on the host = generated keys: {same}", flush=True)
        bad += not same
        for attempt in (1, 2):
            import cupy

            cupy.cuda.Device().synchronize()
            t = time.perf_counter()
            dev = load_keys(store, ctx, on_device=True)
            print(f"key store loaded onto the GPU in {time.perf_counter() - t:.2f} s (load {attempt}: c0 read into "
                  f"pinned buffers and copied up, c1 drawn again on the GPU)", flush=True)
        on_gpu = all(np.array_equal(dev.keys[k].c0.get(), v.c0) and np.array_equal(dev.keys[k].c1.get(), v.c1)
                     for k, v in keyset.keys.items())
        print(f"keys loaded onto the GPU = generated keys: {on_gpu}", flush=True)
        bad += not on_gpu
        del dev
        t = time.perf_counter()
        outcome = caramel.run_program(program, ctx=ctx, backend="gpu", seed=args.seed, keys=back)
        print(f"run_program on the GPU with stored keys: {time.perf_counter() - t:.2f} s end to end (run "
              f"{outcome.seconds:.3f} s), digest {outcome.digest[:16]}", flush=True)
        t = time.perf_counter()
        outcome2 = caramel.run_program(program, ctx=ctx, backend="gpu", seed=args.seed, key_seed=args.seed)
        print(f"run_program on the GPU generating keys on the GPU: {time.perf_counter() - t:.2f} s end to end, "
              f"digest {'same' if outcome2.digest == outcome.digest else 'DIFFERENT'}", flush=True)
        bad += outcome2.digest != outcome.digest
    return bad


if __name__ == "__main__":
    sys.exit(main())
