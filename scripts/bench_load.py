#!/usr/bin/env python
"""Benchmark program loading and validation on the largest corpus program (BootstrapLike_51L).

For each program: cold parse (``cache=False``), cold parse that writes the cache (empty cache
folder), cached load, and ``validate``; each timed ``--repeat`` times in a fresh state, best and
median reported. Prints one table with the machine (CPUs, Python version).

    python scripts/bench_load.py                      # BootstrapLike_51L_8c and _1c from the archive
    python scripts/bench_load.py --programs 8 4 2 1 --repeat 3
    python scripts/bench_load.py --source /tmp/bl     # an already unpacked folder
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from caramel.parse import load_program  # noqa: E402
from caramel.validate import check  # noqa: E402

ARCHIVE = REPO.parent / "shared" / "programs" / "BootstrapLike_51L.tar.xz"


def timed(fn) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(folder: Path, repeat: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"cold (no cache)": [], "cold + cache write": [], "cached": [], "validate": []}
    instructions = 0
    for _ in range(repeat):
        times["cold (no cache)"].append(timed(lambda: load_program(folder, cache=False, progress=False)))
        with tempfile.TemporaryDirectory(prefix="caramel-bench-cache-") as cache:
            os.environ["CARAMEL_CACHE"] = cache
            times["cold + cache write"].append(timed(lambda: load_program(folder, progress=False)))
            program = None

            def cached():
                nonlocal program
                program = load_program(folder, progress=False)

            times["cached"].append(timed(cached))
        instructions = program.instruction_count
        found: list = []
        times["validate"].append(timed(lambda: found.extend(check(program))))
        if found:
            raise SystemExit(f"{folder.name} does not validate: {found[0]}")
    times["instructions"] = [instructions]
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", nargs="+", type=int, default=[8, 1], metavar="CHIPS",
                        help="chip counts of BootstrapLike_51L to measure (default: 8 1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (default 3)")
    parser.add_argument("--source", type=Path,
                        help="folder holding BootstrapLike_51L_<K>c (default: unpack the archive)")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="BootstrapLike_51L.tar.xz")
    args = parser.parse_args(argv)

    saved_cache = os.environ.get("CARAMEL_CACHE")
    with tempfile.TemporaryDirectory(prefix="caramel-bench-") as tmp:
        source = args.source
        if source is None:
            t = time.perf_counter()
            with tarfile.open(args.archive) as tar:
                tar.extractall(tmp, filter="data")
            print(f"unpacked {args.archive.name} in {time.perf_counter() - t:.2f} s", file=sys.stderr)
            source = Path(tmp)
        results = {}
        for chips in args.programs:
            name = f"BootstrapLike_51L_{chips}c"
            print(f"measuring {name} ...", file=sys.stderr)
            results[name] = bench(source / name, args.repeat)
    if saved_cache is None:
        os.environ.pop("CARAMEL_CACHE", None)
    else:
        os.environ["CARAMEL_CACHE"] = saved_cache

    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"machine: {platform.machine()}, {cpus} CPU(s) (nproc), {platform.python_implementation()} "
          f"{platform.python_version()}, {platform.system()} {platform.release()}")
    print(f"best and median of {args.repeat} run(s), seconds\n")
    columns = ["cold (no cache)", "cold + cache write", "cached", "validate"]
    header = ["program", "instructions", *columns, "cold + validate"]
    rows = []
    for name, t in results.items():
        cells = [name, str(t["instructions"][0])]
        for column in columns:
            cells.append(f"{min(t[column]):.2f} / {statistics.median(t[column]):.2f}")
        cells.append(f"{min(t['cold (no cache)']) + min(t['validate']):.2f}")
        rows.append(cells)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
