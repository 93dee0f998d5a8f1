"""The client: the GPU client against the CPU client bit for bit, the big program's keys and inputs timed, its key
store written and loaded, and ``caramel run`` end to end (cold, again, with stored keys).

    python -m bench client [--parts same,big,runs] [--corpus DIR] [--program BootstrapLike_51L_1c] [--runs 3]

Parts: ``same`` every program of ``--corpus`` matching ``--pattern`` at ``--small-n``: keys, every input term and the
decryptions of the encrypted inputs made with the same seeds on the CPU client and on the GPU client, all identical;
``big`` ``--program`` at ``--n``: keys and inputs timed on the client of ``--backend``, again with the keys copied back
while the inputs are encrypted, its first ``--compare-keys`` keys made again on the other client (compared), the key
store written and loaded twice (on the host, and onto the GPU), loaded = generated; ``runs`` ``caramel run`` in fresh
processes (an empty cache, then again, then ``caramel keys`` and ``--runs`` runs with ``--keys``): their phases
(``timings_s``) and process wall time, every digest equal to the others and to the stored CPU reference of
``caramel run --seed S``. ``--backend cpu-plan`` times the CPU client and the plan engine (``same`` needs a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import ChainMap
from pathlib import Path

import numpy as np

from bench.harness import (BIG, ROOT, Record, add_common, digest_key, find_program, log, need_gpu, program_dirs,
                           program_path, stored_digests)

PARTS = ("same", "big", "runs")


def prepare(program, ctx, device: str, seed: int, background: bool = False):
    """(key set, prepared inputs) of ``program`` on the ``device`` client, keys and inputs from ``seed``."""
    from caramel.api import default_spec, resolve_check
    from caramel.ckks.check import prepare_check
    from caramel.ckks.device import using
    from caramel.ckks.keyset import generate_keyset, input_rng

    keyset = generate_keyset(program, ctx, seed, device=device, background=background)
    with using(device):
        spec = resolve_check(program, "auto") or default_spec(program)
        prepared = prepare_check(spec, program, ctx, rng=input_rng(seed), secrets=keyset.secrets,
                                 keys=ChainMap({}, keyset.keys))
    return keyset, prepared


def same_keys(a, b) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k].c0, b[k].c0) and np.array_equal(a[k].c1, b[k].c1)
                                        for k in a)


def same_client(program, ctx, seed: int) -> tuple[bool, str]:
    """The CPU client and the GPU client with the same seeds: keys, input image and decryptions identical."""
    from caramel.ckks.encrypt import Ciphertext, decrypt

    ks_c, prep_c = prepare(program, ctx, "cpu", seed)
    ks_g, prep_g = prepare(program, ctx, "gpu", seed)
    if not same_keys(dict(ks_c.keys), dict(ks_g.keys)):
        return False, "keys differ"
    if prep_c.memory.keys() != prep_g.memory.keys() or not all(
            np.array_equal(v, prep_g.memory[m]) for m, v in prep_c.memory.items()):
        return False, "input images differ"
    checked = 0
    for name, obj in prep_c.objects.items():
        if isinstance(obj, Ciphertext):
            if not np.array_equal(decrypt(ctx, ks_c.secrets.s, obj, device="cpu"),
                                  decrypt(ctx, ks_c.secrets.s, obj, device="gpu")):
                return False, f"decryption of {name} differs"
            checked += 1
    return True, f"{len(ks_c.keys)} keys, {len(prep_c.memory)} input terms, {checked} decryptions"


def same(rec: Record, args) -> None:
    from caramel.parse import load_program
    from caramel.ring import Context

    root = Path(args.corpus) if args.corpus else next((d for d in program_dirs() if any(d.glob("*_4L_*c"))), None)
    if root is None:
        raise SystemExit("bench client: no corpus found (give --corpus)")
    paths = sorted({p for pat in args.pattern for p in root.glob(pat) if p.is_dir()})
    ctx = Context(n=args.small_n)
    bad, start = [], time.time()
    for i, path in enumerate(paths):
        ok, why = same_client(load_program(path), ctx, args.seed)
        print(f"[{i + 1}/{len(paths)}] {path.name} N={args.small_n}: {'same' if ok else 'DIFFERENT'} ({why})",
              flush=True)
        if not ok:
            bad.append(path.name)
    rec.check(f"GPU client = CPU client on {len(paths)} programs at N={args.small_n}", bool(paths) and not bad,
              ", ".join(bad), seconds=round(time.time() - start))


def big(rec: Record, args) -> None:
    from caramel.ckks.bind import requirements
    from caramel.ckks.keys import Secrets, generate_evalkeys
    from caramel.ckks.keyset import key_rng
    from caramel.ckks.keystore import load_keys, save_keys
    from caramel.ring import Context

    device = "gpu" if args.backend == "gpu" else "cpu"
    program = find_program(args.program)
    ctx = Context(n=args.n)
    if device == "gpu":  # CuPy's modules of the client loaded once, outside the timings
        prepare(find_program(str(ROOT / "programs" / "Mul_4L_1c")), ctx, "gpu", 0)
    sync = _synchronize(device)
    for background in (False, True) if device == "gpu" else (False,):
        t0 = time.perf_counter()
        made, _ = prepare(program, ctx, device, args.seed, background)
        sync()
        what = "keys copied back while the inputs are encrypted" if background else "keys, then inputs"
        rec.add(f"{program.name} N={args.n} {device} client: {what}", time.perf_counter() - t0, "s",
                keys=len(made.keys), gib=round(sum(k.c0.nbytes + k.c1.nbytes for k in made.keys.values())
                                               / 2**30, 3))
        if not background:
            keyset = made  # stored and compared below
    keys = dict(keyset.keys)
    if args.compare_keys:
        other = "cpu" if device == "gpu" else "gpu" if _gpu() else None
        if other:
            rng = key_rng(args.seed)
            Secrets.generate(ctx.n, rng)
            ids = list(requirements(program).keys)[: args.compare_keys]
            theirs = generate_evalkeys(ctx, ids, keyset.secrets, rng, other)
            rec.check(f"first {len(ids)} keys on the {other} client = the {device} client's",
                      same_keys({k: keys[k] for k in ids}, dict(theirs)))
    with tempfile.TemporaryDirectory(prefix="bench-keys-") as tmp:
        store = Path(tmp) / "keys"
        t0 = time.perf_counter()
        save_keys(keyset, ctx, store, key_seed=args.seed, program=program.name)
        rec.add("key store written", time.perf_counter() - t0, "s",
                gib=round(sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 2**30, 3))
        for on_device in (False, True) if device == "gpu" else (False,):
            for attempt in (1, 2):
                t0 = time.perf_counter()
                back = load_keys(store, ctx, on_device=on_device)
                sync()
                rec.add(f"key store loaded {'onto the GPU' if on_device else 'on the host'} ({attempt})",
                        time.perf_counter() - t0, "s")
            loaded = dict(back.keys)
            rec.check(f"keys loaded {'onto the GPU' if on_device else 'on the host'} = generated keys",
                      loaded.keys() == keys.keys() and all(np.array_equal(_host(loaded[k].c0), v.c0)
                                                           and np.array_equal(_host(loaded[k].c1), v.c1)
                                                           for k, v in keys.items()))
            del back, loaded


def _host(a) -> np.ndarray:
    from caramel.ckks.device import host_array

    return host_array(a)


def _gpu() -> bool:
    from caramel.api import gpu_available

    return gpu_available()


def _synchronize(device: str):
    if device != "gpu":
        return lambda: None
    import cupy as cp

    return cp.cuda.Device().synchronize


def runs(rec: Record, args) -> None:
    """``caramel run`` end to end in fresh processes: phases, process wall time and digests."""
    path = program_path(args.program)
    env = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                     if os.environ.get("PYTHONPATH") else "")}
    base = ["run", path, "--n", str(args.n), "--backend", args.backend, "--seed", str(args.seed)]
    digests = []
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        env["CARAMEL_CACHE"] = str(Path(tmp) / "cache")  # the first run finds every cache of caramel empty
        store = str(Path(tmp) / "keys")
        steps = [("cold", base), ("again", base), ("keys", ["keys", path, "--n", str(args.n), "--seed",
                                                            str(args.seed), "--out", store])]
        steps += [(f"--keys {i + 1}", base + ["--keys", store]) for i in range(args.runs)]
        for label, argv in steps:
            out = Path(tmp) / "run.json"
            out.unlink(missing_ok=True)
            cmd = [sys.executable, "-m", "caramel", *argv] + (["--json", str(out)] if argv[0] == "run" else [])
            t0 = time.perf_counter()
            r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
            wall = time.perf_counter() - t0
            if r.returncode or (argv[0] == "run" and not out.exists()):
                rec.check(f"caramel {label}", False, (r.stdout + r.stderr)[-400:])
                continue
            if argv[0] != "run":
                rec.add(f"caramel {argv[0]}", wall, "s")
                continue
            doc = json.loads(out.read_text())
            t = doc.get("timings_s", {})
            rec.add(f"caramel run, {label}: phases", sum(t.values()), "s", wall_s=round(wall, 3), **t)
            digests.append(doc.get("digest"))
    name = Path(path.split("#")[-1]).name
    want = stored_digests().get(digest_key(name, args.n, args.seed))
    rec.check("every caramel run's digest agrees" + (" with the CPU reference" if want else ""),
              bool(digests) and len(set(digests)) == 1 and (want is None or digests[0] == want),
              "" if len(set(digests)) <= 1 else ", ".join(d[:16] for d in digests if d))


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m bench client", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--parts", default="same,big,runs", help=f"of {', '.join(PARTS)}")
    ap.add_argument("--corpus", help="folder of programs of the part same (default .data/corpus, else the corpus)")
    ap.add_argument("--pattern", nargs="*", default=["*_4L_*c", "*_10L_*c"])
    ap.add_argument("--small-n", type=int, default=4096, help="ring degree of the part same (default 4096)")
    ap.add_argument("--program", default=BIG, help=f"the program of the parts big and runs (default {BIG})")
    ap.add_argument("--seed", type=int, default=1, help="keys and inputs (default 1: the stored reference's)")
    ap.add_argument("--compare-keys", type=int, default=6, help="keys made again on the other client")
    ap.add_argument("--runs", type=int, default=3, help="`caramel run --keys` runs (default 3)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a `caramel` process may take")
    add_common(ap, configs=False, ab=False, repeats=1)
    args = ap.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    if not set(parts) <= set(PARTS):
        raise SystemExit(f"bench client: --parts takes {', '.join(PARTS)}")
    if "same" in parts and args.backend != "gpu":
        raise SystemExit("bench client: the part same compares the GPU client with the CPU client (--backend gpu)")
    need_gpu(args.backend)
    rec = Record("client", argv, args.backend)
    for part in parts:
        log(f"part {part}")
        {"same": same, "big": big, "runs": runs}[part](rec, args)
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
