"""On the CPU: loading and validation, the plan, accuracy by decryption, the client's input preparation, and the
reference digests that the GPU benchmarks check against.

    python -m bench cpu [load] [plan] [fusion] [accuracy] [client] [--program NAME ...] [--n 65536]
    python -m bench cpu digests [--program BootstrapLike_51L_1c ...] [--run-seed 1]   # bench/reference_digests.json

``load``: per program a cold parse (no cache), a cold parse that writes the cache (an empty cache folder), a cached
load and ``validate``, each ``--repeats`` times, best and median (default BootstrapLike_51L_8c and _1c, unpacked from
their archive). ``plan``: the SSA renaming, the networkx graph, the resource graph before renaming and the plan
(wall and CPU seconds, ``--memory``: tracemalloc's retained and peak), then the plan report. ``fusion``: what fusion
across NTT boundaries could still remove from the plan's traffic (nothing runs). ``accuracy``: precision
by decryption (largest and median slot error in bits) of ``--program`` (default Mul, MulRotate, PolyX8 members) in
each mode. ``client``: the CPU client's keys and inputs (CPU seconds too), the key store written and loaded.
``digests``: the CPU reference's output digests of the benchmark inputs (``bench.harness.bench_inputs``; with
``--run-seed S`` those of ``caramel run --seed S``), stored for the GPU runs.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tarfile
import tempfile
import time
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path

from bench.harness import (DIGESTS, Record, add_common, bench_inputs, digest_key, find_program, log, program_dirs,
                           stored_digests)

PARTS = ("load", "plan", "fusion", "accuracy", "client", "digests")
ACCURACY = ["Mul_4L_1c", "Mul_10L_1c", "MulRotate_10L_4c", "PolyX8_10L_2c", "Mul_51L_8c"]


def folder_of(name: str, tmp: Path) -> Path:
    """A program folder to parse: the path given, a folder of the lookup, or the member unpacked from its archive."""
    if Path(name).is_dir():
        return Path(name)
    for d in program_dirs():
        if (d / name).is_dir():
            return d / name
        archive = d / f"{name.rsplit('_', 1)[0]}.tar.xz"
        if archive.is_file():
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if m.name == name or m.name.startswith(name + "/")]
                tar.extractall(tmp, members=members, filter="data")
            return tmp / name
    raise SystemExit(f"bench cpu: program {name} not found")


def load(rec: Record, args) -> None:
    from caramel.parse import load_program
    from caramel.validate import check

    saved = os.environ.get("CARAMEL_CACHE")
    with tempfile.TemporaryDirectory(prefix="bench-load-") as tmp:
        for name in args.program or ["BootstrapLike_51L_8c", "BootstrapLike_51L_1c"]:
            folder = folder_of(name, Path(tmp))
            times: dict[str, list[float]] = {"cold (no cache)": [], "cold + cache write": [], "cached": [],
                                             "validate": []}
            program = None
            for _ in range(args.repeats):
                times["cold (no cache)"].append(_timed(lambda: load_program(folder, cache=False, progress=False)))
                with tempfile.TemporaryDirectory(prefix="bench-cache-") as cache:
                    os.environ["CARAMEL_CACHE"] = cache  # this process's cache: an empty folder, then filled
                    times["cold + cache write"].append(_timed(lambda: load_program(folder, progress=False)))
                    t0 = time.perf_counter()
                    program = load_program(folder, progress=False)
                    times["cached"].append(time.perf_counter() - t0)
                found: list = []
                times["validate"].append(_timed(lambda: found.extend(check(program))))
                if found:
                    rec.check(f"{folder.name} validates", False, str(found[0]))
            for what, t in times.items():
                rec.add(f"{folder.name} {what}", min(t), "s", median=statistics.median(t),
                        instructions=program.instruction_count)
    if saved is None:
        os.environ.pop("CARAMEL_CACHE", None)
    else:
        os.environ["CARAMEL_CACHE"] = saved


def _timed(fn) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(fn, memory: bool):
    """(result, wall s, CPU s, (retained, peak) bytes of Python allocations or None): time on a run with the cyclic
    collector paused (as the planner runs), memory on a second run under tracemalloc (about 10x slower)."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    gc.disable()
    try:
        out = fn()
    finally:
        gc.enable()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    mem = None
    if memory:
        gc.collect()
        tracemalloc.start()
        kept = fn()
        mem = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del kept
    return out, wall, cpu, mem


def plan(rec: Record, args) -> None:
    from caramel.plan import build_plan, dag, plan_report, plan_stats

    for name in args.program or ["BootstrapLike_51L_1c", "BootstrapLike_51L_8c"]:
        program = find_program(name)
        for what, fn in (("SSA renaming", lambda: dag.program_ssa(program)),
                         ("networkx graph", lambda: dag.program_graph(program, dag.program_ssa(program))),
                         ("graph before renaming", lambda: [dag.resource_graph(s) for s in program.streams])):
            _, wall, cpu, mem = measure(fn, args.memory)
            rec.add(f"{program.name} {what}", wall, "s", cpu_s=round(cpu, 3),
                    retained_mib=None if mem is None else round(mem[0] / 2**20), peak_mib=None if mem is None
                    else round(mem[1] / 2**20))
        best = None
        for i in range(args.repeats):
            built, wall, cpu, mem = measure(lambda: build_plan(program), args.memory and i == 0)
            best = (wall, cpu, mem, built) if best is None or wall < best[0] else best
        wall, cpu, mem, built = best
        stats = plan_stats(built, program, n=args.n)
        rec.add(f"{program.name} plan build (best of {args.repeats})", wall, "s", cpu_s=round(cpu, 3),
                kernels=built.kernels, instructions=program.instruction_count,
                plan_gib=round(stats["plan_bytes"] / 2**30, 2),
                per_instruction_gib=round(stats["instruction_bytes"] / 2**30, 2))
        print(plan_report(built, program), end="")


def fusion_estimate(plan) -> tuple[int, dict[str, Counter]]:
    """(plan traffic in limbs, {fusion: rows by neighbouring kind}) of four fusions across NTT boundaries, each
    removing 2 limbs of traffic where the limb between the two rows is read by one row only and not stored:
    "K -> NTT" (a forward NTT's first pass computes the row of kind K that wrote its input), "NTT -> K" (the reader
    of kind K runs the NTT's second pass in its load), "K -> INTT", "INTT -> K". No limb is counted twice."""
    from caramel.plan.kernel import Kind

    total = 0
    fusions = {name: Counter() for name in ("{} -> NTT", "NTT -> {}", "{} -> INTT", "INTT -> {}")}
    for chip in plan.chips:
        writer: dict[int, tuple[int, int]] = {}  # buffer -> (kernel, row) that last wrote it
        readers: dict[tuple[int, int, int], set] = defaultdict(set)  # (kernel, row, buffer) -> reading rows
        reads_of: dict[tuple[int, int], list] = {}  # (kernel, row) -> writers of its inputs
        for k, kernel in enumerate(chip.kernels):
            total += len(kernel.reads()) + len(kernel.writes())
            if kernel.kind is Kind.COMM:
                rows = [((c.src,) if c.src >= 0 else (), (c.dst,) if c.dst >= 0 else ()) for c in kernel.comms]
            else:
                rows = [(r.ins, r.outs) for r in kernel.rows]
            for i, (ins, outs) in enumerate(rows):
                srcs = []
                for b in dict.fromkeys(ins):
                    if b in writer:
                        w = (*writer[b], b)
                        readers[w].add((k, i))
                        srcs.append(w)
                reads_of[(k, i)] = srcs
                for b in outs:
                    writer[b] = (k, i)
        pinned = {(*writer[b], b) for b in chip.stores.values() if b in writer}
        fused = set()  # (kernel, row, buffer) already counted

        def take(w, counter: Counter, kind) -> None:
            if w not in pinned and len(readers[w]) == 1 and w not in fused:
                fused.add(w)
                counter[kind.value] += 1

        for k, kernel in enumerate(chip.kernels):
            if kernel.kind in (Kind.NTT, Kind.INTT):
                name = kernel.kind.name
                for i, row in enumerate(kernel.rows):
                    for w in reads_of[(k, i)]:
                        take(w, fusions["{} -> " + name], chip.kernels[w[0]].kind)
                    w = (k, i, row.outs[0])
                    if len(readers[w]) == 1:
                        (rk, _), = readers[w]
                        take(w, fusions[name + " -> {}"], chip.kernels[rk].kind)
    return total, fusions


def fusion(rec: Record, args) -> None:
    from caramel.plan import build_plan

    gib = 4 * args.n / 2**30
    for name in args.program or ["BootstrapLike_51L_1c"]:
        program = find_program(name)
        total, fusions = fusion_estimate(build_plan(program, fuse_ntt=False))
        rec.add(f"{program.name} traffic of the plan without NTT loads", total * gib, "GiB")
        saved = 0
        for label, counts in fusions.items():
            for kind, rows in counts.most_common():
                rec.add(f"{program.name} fusion {label.format(kind)}", 2 * rows * gib, "GiB removed", rows=rows)
                saved += 2 * rows
        rec.add(f"{program.name} all of them", saved * gib, "GiB removed")


def accuracy(rec: Record, args) -> None:
    import caramel
    from caramel.ring import Context

    ctx = Context(n=args.n)
    for name in args.program or ACCURACY:
        program = find_program(name)
        for mode in args.modes.split(","):
            out = caramel.run_program(program, ctx=ctx, mode=mode, seed=args.seed, backend="cpu")
            for term, r in out.report.results.items():
                rec.add(f"{program.name} {mode} {term}: largest error", round(r.precision_bits, 1), "bits",
                        median_bits=round(r.median_bits, 1), bar=r.tolerance_bits,
                        verdict={None: "not judged", True: "pass", False: "FAIL"}[r.passed],
                        run_s=round(out.seconds, 1),
                        secrets=str(out.report.secrets))
                if r.passed is False:
                    rec.check(f"{program.name} {mode} {term} within its bar", False)


def client(rec: Record, args) -> None:
    from caramel.api import default_spec, resolve_check
    from caramel.ckks.check import prepare_check
    from caramel.ckks.device import using
    from caramel.ckks.keyset import generate_keyset, input_rng
    from caramel.ckks.keystore import load_keys, save_keys
    from caramel.ring import Context

    ctx = Context(n=args.n)
    for name in args.program or ["BootstrapLike_51L_1c"]:
        program = find_program(name)
        t, c = time.perf_counter(), time.process_time()
        keyset = generate_keyset(program, ctx, args.seed, device="cpu")
        rec.add(f"{program.name} N={args.n} CPU client: keys", time.perf_counter() - t, "s",
                cpu_s=round(time.process_time() - c, 2), keys=len(keyset.keys),
                load_average=round(os.getloadavg()[0], 1))
        t, c = time.perf_counter(), time.process_time()
        with using("cpu"):
            spec = resolve_check(program, "auto") or default_spec(program)
            prepared = prepare_check(spec, program, ctx, rng=input_rng(args.seed), secrets=keyset.secrets,
                                     keys=dict(keyset.keys))
        rec.add(f"{program.name} N={args.n} CPU client: inputs", time.perf_counter() - t, "s",
                cpu_s=round(time.process_time() - c, 2), inputs=len(prepared.objects))
        with tempfile.TemporaryDirectory(prefix="bench-keys-") as tmp:
            t = time.perf_counter()
            save_keys(keyset, ctx, Path(tmp) / "keys", key_seed=args.seed, program=program.name)
            rec.add("key store written", time.perf_counter() - t, "s")
            t = time.perf_counter()
            back = load_keys(Path(tmp) / "keys", ctx)
            rec.add("key store loaded", time.perf_counter() - t, "s")
            import numpy as np

            rec.check("keys loaded = generated keys", all(
                np.array_equal(back.keys[k].c0, v.c0) and np.array_equal(back.keys[k].c1, v.c1)
                for k, v in keyset.keys.items()))


def digests(rec: Record, args) -> None:
    """The CPU reference's digests of the benchmark inputs, written to ``--store`` (default
    bench/reference_digests.json)."""
    import json

    from caramel.api import output_digest
    from caramel.execute.reference import run_reference
    from caramel.results import write_json
    from caramel.ring import Context

    store = Path(args.store)
    ctx = Context(n=args.n)
    for name in args.program or [f"BootstrapLike_51L_{k}c" for k in (1, 2, 4, 8)]:
        t0 = time.perf_counter()
        program = find_program(name)
        memory = bench_inputs(program, ctx, args.run_seed)
        digest = output_digest(program, run_reference(program, ctx, memory, "exact").memory)
        data = json.loads(store.read_text()) if store.exists() else {}
        key = digest_key(program.name, args.n, args.run_seed)
        old = data.get(key)
        data[key] = digest
        write_json(store, dict(sorted(data.items())))
        rec.add(key, digest, seconds=round(time.perf_counter() - t0))
        if old is not None:
            rec.check(f"{key}: the same as the stored one", old == digest, old[:16])


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m bench cpu", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("parts", nargs="*", default=["load", "plan", "client"], help=f"of {', '.join(PARTS)} "
                    "(default load plan client)")
    ap.add_argument("--program", action="append", default=[], help="a program of every part (repeatable; "
                    "default per part)")
    ap.add_argument("--modes", default="exact,textbook,emulator", help="arithmetic modes of accuracy")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--memory", action="store_true", help="plan: also tracemalloc's retained and peak memory")
    ap.add_argument("--run-seed", type=int, help="digests: the inputs of `caramel run --seed S`")
    ap.add_argument("--store", default=str(DIGESTS), help="digests: the file (default bench/reference_digests.json)")
    add_common(ap, backend=None, repeats=3, configs=False, ab=False)
    args = ap.parse_args(argv)
    if not set(args.parts) <= set(PARTS):
        raise SystemExit(f"bench cpu: parts are {', '.join(PARTS)}")
    rec = Record("cpu", argv, "cpu-plan")
    rec.add("load average", round(os.getloadavg()[0], 2))
    for part in args.parts:
        log(f"part {part}")
        {"load": load, "plan": plan, "fusion": fusion, "accuracy": accuracy, "client": client,
         "digests": digests}[part](rec, args)
    if "digests" in args.parts and Path(args.store) == DIGESTS:
        log(f"{len(stored_digests())} digests in {DIGESTS}")
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
