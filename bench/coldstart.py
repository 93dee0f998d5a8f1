"""The cold path: a first ``caramel run`` on a fresh machine, again, a program not seen before, and after ``caramel
compile``, each in a fresh process, with the DEBUG lines of every cold-path phase.

    python -m bench coldstart [--program BootstrapLike_51L_1c] [--new BootstrapLike_51L_2c RotMulAdd_10L_1c] [--n 65536]
    python -m bench coldstart --rounds 3        # the runs' steps three times, each round with empty caches

Steps, every run ``caramel run PROGRAM --backend gpu --no-check -v`` (its process wall time, its phases and its
``cold path:`` lines): ``cold`` with an empty CuPy kernel cache and empty caramel caches; ``again`` (every cache
warm); per program of ``--new`` its first run (its own load and plan caches empty, the kernel cache warm from the runs
before: a program not seen before) and its second; then, with every cache empty again, ``caramel compile PROGRAM`` and
``after compile``. The runs before ``caramel compile`` take one kernel per instruction (``--fusion auto``: no fused plan
is cached), the run after it the fused plan, so the one-digest check compares the two plans. Also how many binaries each step added to CuPy's kernel cache (the kernels it compiled). Checks:
the cold run within ``--cold-limit`` seconds, each new program's first run within ``--new-ratio`` times its second,
the run after ``caramel compile`` compiles nothing, and every run of a program prints one digest. With ``--rounds R``
the steps up to the new programs' run R times, each round with empty caches (steps labelled ``#1`` .. ``#R``), and
the checks take the median over the rounds of the cold run and of each new program's ratio (every round's figure is
recorded): one machine's runs vary by a second or more from one to the next.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import ROOT, Record, log, program_path

_DIGEST = re.compile(r"output digest \(sha256\): ([0-9a-f]{64})")


def kernel_files(folder: Path) -> int:
    """Binaries in CuPy's kernel cache folder."""
    return sum(1 for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def caramel(argv: list[str], env: dict, timeout: float) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "caramel", *argv], capture_output=True, text=True, env=env,
                       timeout=timeout)
    return time.perf_counter() - t0, r


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench coldstart", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--program", default="BootstrapLike_51L_1c")
    ap.add_argument("--new", nargs="*", default=["BootstrapLike_51L_2c", "RotMulAdd_10L_1c"],
                    help="programs run after --program, each not seen before (default: %(default)s)")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--mode", default="exact")
    ap.add_argument("--cold-limit", type=float, default=10.0, help="seconds (default 10)")
    ap.add_argument("--new-ratio", type=float, default=2.0, help="first run / second run (default 2)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of the runs, each with empty caches (default 1)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    rec = Record("coldstart", argv, backend="gpu")
    env0 = {**os.environ, "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                      if os.environ.get("PYTHONPATH") else "")}
    ring = ["--n", str(args.n), "--mode", args.mode]
    digests: dict[str, set[str]] = {}
    walls: dict[str, list[float]] = {}  # a step's wall times, one a round

    def step(label: str, command: list[str], env: dict, kernels: Path, round_: str = "") -> None:
        before = kernel_files(kernels)
        wall, r = caramel(command, env, args.timeout)
        added = kernel_files(kernels) - before
        if r.returncode:
            rec.check(f"{label}{round_}: caramel {command[0]}", False, (r.stdout + r.stderr)[-600:])
            return
        walls.setdefault(label, []).append(wall)
        lines = [line.split("cold path: ", 1)[1] for line in r.stderr.splitlines() if "cold path: " in line]
        phases = next((line for line in r.stdout.splitlines() if line.startswith("time: ")), "")
        rec.add(f"{label}{round_}: caramel {command[0]} {Path(command[1].split('#')[-1]).name}", wall, "s",
                kernels_compiled=added, phases=phases or None, cold_path=lines or None)
        for line in lines:
            log(f"  {line}")
        got = _DIGEST.search(r.stdout)
        if got:
            digests.setdefault(command[1], set()).add(got.group(1))

    def run_of(name: str) -> list[str]:
        return ["run", program_path(name), *ring, "--backend", "gpu", "--no-check", "-v"]

    main_run = run_of(args.program)
    with tempfile.TemporaryDirectory(prefix="bench-coldstart-") as tmp:
        def empty_caches(label: str) -> tuple[Path, dict]:
            kernels = Path(tmp) / f"cupy-{label}"
            return kernels, {**env0, "CUPY_CACHE_DIR": str(kernels),
                             "CARAMEL_CACHE": str(Path(tmp) / f"caramel-{label}")}

        for r in range(args.rounds):
            kernels, env = empty_caches(f"run{r}")
            mark = f" #{r + 1}" if args.rounds > 1 else ""
            step("cold", main_run, env, kernels, mark)
            step("again", main_run, env, kernels, mark)
            for name in args.new:
                new_run = run_of(name)
                step(f"new {name}", new_run, env, kernels, mark)
                step(f"new {name} again", new_run, env, kernels, mark)
        kernels, env = empty_caches("compile")
        step("compile", ["compile", program_path(args.program), *ring, "-v"], env, kernels)
        before = kernel_files(kernels)
        step("after compile", main_run, env, kernels)
        rec.check("the run after caramel compile compiles no kernel", kernel_files(kernels) == before,
                  f"{kernel_files(kernels) - before} added")
    median = " (median of the rounds)" if args.rounds > 1 else ""
    if "cold" in walls:
        cold = statistics.median(walls["cold"])
        rec.check(f"cold run within {args.cold_limit:g} s{median}", cold <= args.cold_limit, f"{cold:.2f} s")
    for name in args.new:
        pairs = list(zip(walls.get(f"new {name}", []), walls.get(f"new {name} again", [])))
        if pairs:
            ratios = [first / second for first, second in pairs]
            for r, ratio in enumerate(ratios):
                rec.add(f"{name} (not seen before): first run / second run" + (f" #{r + 1}" if args.rounds > 1 else ""),
                        ratio, "x")
            ratio = statistics.median(ratios)
            rec.check(f"{name}: first run within {args.new_ratio:g}x its second{median}", ratio <= args.new_ratio,
                      f"{ratio:.2f}x")
    rec.check("one digest per program", all(len(d) == 1 for d in digests.values()),
              "; ".join(f"{Path(p.split('#')[-1]).name}: {len(d)}" for p, d in digests.items()))
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
