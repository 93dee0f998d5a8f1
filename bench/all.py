"""The figures of record and every GPU check in one device call (from the repository root, ``.data/`` holding
``corpus/`` and ``BootstrapLike_51L.tar.xz``):

    python -m bench all [--base .ab] [--config ...] [--steps replay,plans,kernels,tests,corpus,roofline]

Steps, each a fresh process with its output in ``$OUT/<step>.txt`` and its record in ``$OUT/<step>.json``:
``replay`` BootstrapLike_51L_1c eager, unfused graph and the fused graph on 1, 4 and 8 streams, digests against the
stored CPU reference (``--base``: A/B against an earlier tree, ``--config``: kernel variants); ``plans`` the fused graph
without sibling rows, without automorphisms in their readers' loads, without NTT epilogues; ``kernels`` every kernel
against the CPU reference, then timed; ``tests`` the GPU test modules; ``corpus`` every 4L/10L program at N = 4096 and
65536 in the three modes; ``roofline`` time per kernel kind; ``client`` (not by default) the client's checks and
``caramel run`` end to end. ``--STEP-args 'ARGS'`` adds arguments to a step. A summary is printed last; exit status 1
if any step failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from bench.harness import BIG, ROOT, default_json, log

STEPS = ("replay", "plans", "kernels", "tests", "corpus", "roofline", "client")
DEFAULT = "replay,plans,kernels,tests,corpus,roofline"
#: The GPU test modules (with those of tests/backends/ named test_cuda_*).
GPU_TESTS = ("tests/plan/test_cuda_plan.py", "tests/execute/test_gpu.py", "tests/test_profile_roofline.py")


def step_commands(args) -> dict[str, list[str]]:
    common = ["--backend", args.backend, "--n", str(args.n)]
    configs = [a for c in args.config for a in ("--config", c)]
    base = [a for b in args.base for a in ("--base", b)] + (["--rounds", str(args.rounds)] if args.base else [])
    program = ["--program", args.program]
    xdist = ["-n", "8"] if _has("xdist") else []
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "backends").glob("test_cuda_*.py"))
    tests += [t for t in GPU_TESTS if (ROOT / t).exists()]
    return {
        "replay": ["replay", *common, *program, "--unfused", "--streams", "1,4,8", *configs, *base],
        "plans": ["replay", *common, *program, "--streams", "4", "--plan", "", "--plan", "max_outputs=1",
                  "--plan", "fuse_automorphism=False", "--plan", "fuse_epilogue=False"],
        "kernels": ["kernels", "--backend", args.backend, "--n", str(args.n), *configs],
        "tests": ["pytest", "-q", "-rs", "-p", "no:cacheprovider", *xdist, *tests],
        "corpus": ["corpus", *([args.corpus] if args.corpus else []), "--backend", args.backend, "--mode", "all",
                   "--workers", str(args.workers), *configs],
        "roofline": ["roofline", *common, *program],
        "client": ["client", "--backend", args.backend, "--program", args.program, "--n", str(args.n),
                   *(["--corpus", args.corpus] if args.corpus else [])],
    }


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    ap = argparse.ArgumentParser(prog="python -m bench all", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--steps", default=DEFAULT, help=f"of {', '.join(STEPS)} (default {DEFAULT})")
    ap.add_argument("--backend", default="gpu", choices=("gpu", "cpu-plan"))
    ap.add_argument("--program", default=BIG)
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--corpus", help="folder of the corpus step (default .data/corpus, else the corpus)")
    ap.add_argument("--workers", type=int, default=14, help="CPU reference processes of the corpus step")
    ap.add_argument("--config", action="append", default=[], help="kernel settings for replay, kernels and corpus")
    ap.add_argument("--base", action="append", default=[], help="the replay step's A/B trees (bench ab prepare)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=os.environ.get("OUT") or str(default_json("all").parent),
                    help="folder of the steps' outputs and records (default $OUT)")
    for s in STEPS:
        ap.add_argument(f"--{s}-args", default="", metavar="ARGS", help=f"more arguments of the {s} step")
    args = ap.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    if not set(steps) <= set(STEPS):
        raise SystemExit(f"bench all: --steps takes {', '.join(STEPS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    commands = step_commands(args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")}
    if (ROOT / ".data" / "corpus").is_dir():  # the 10L programs of the GPU test modules
        env.setdefault("CARAMEL_PROGRAMS", str(ROOT / ".data" / "corpus"))
        env.setdefault("CARAMEL_SHARED_PROGRAMS", str(ROOT / ".data" / "corpus"))
    summary, status = [], 0
    for name in steps:
        cmd = commands[name] + shlex.split(getattr(args, f"{name.replace('-', '_')}_args"))
        record = out / f"{name}.json"
        if cmd[0] == "pytest":
            full = [sys.executable, "-m", *cmd]
        else:
            full = [sys.executable, "-m", "bench", *cmd, "--json", str(record)]
        log(f"step {name}: {shlex.join(full[1:])}")
        t0 = time.perf_counter()
        with open(out / f"{name}.txt", "w") as f:
            rc = subprocess.run(full, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
        status |= rc != 0
        failed = ""
        if record.exists():
            doc = json.loads(record.read_text())
            failed = "; ".join(doc.get("failures", [])) or "; ".join(
                f"{r['label']}: failed" for r in doc.get("runs", []) if r.get("failed") or r.get("failures"))
        summary.append(f"{name:<10} rc={rc}  {time.perf_counter() - t0:5.0f} s" + (f"  FAILED: {failed}" if failed
                                                                                    else ""))
        tail = (out / f"{name}.txt").read_text().splitlines()[-40:]
        print(f"=== {name} (last lines)\n" + "\n".join(tail), flush=True)
    print("=== summary\n" + "\n".join(summary))
    return int(status)


if __name__ == "__main__":
    raise SystemExit(main())
