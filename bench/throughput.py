"""Throughput figures of record in one call (issue 39): instances per second served, and
``caramel run --batch B --keys DIR`` end to end, on this tree and on a base tree, same device, same call.

    python -m bench.throughput --out DIR [--base .ab] [--program BootstrapLike_51L_1c] [--n 65536]
                               [--backend gpu] [--batch 64] [--instances 64] [--singles 2]
    # several GPUs (nvidia-h200-x2: --nproc 2), the batch in one process against `caramel launch`, 3 rounds:
    python -m bench.throughput --out DIR --skip-family --batch 256 --nproc 2 --nproc-rounds 3
    # at a small N without a GPU (what the tests run, so that this does not rot):
    python -m bench.throughput --out /tmp/tp --program programs/MulRotate_4L_1c --n 1024 --backend cpu-plan \\
        --batch 4 --instances 4 --singles 1 --base .

Every figure comes from the caramel command line of its tree, each in a fresh process (``PYTHONPATH`` and the
working folder set to the tree), so that a base tree of an earlier commit (``python -m bench ab prepare REV``
makes one in ``.ab/``) needs nothing it lacks:

* ``batch``: ``caramel run PROGRAM --batch B --keys DIR --json`` (every input drawn, encoded and encrypted per
  instance; the batch summary's instances per second);
* ``serving``: this tree, ``caramel profile PROGRAM --throughput --repeats I --keys DIR --json`` (plaintexts and
  scalars shared and resident, ciphertexts encrypted ahead on the host), with its end-to-end rate beside;
* ``serving, every input per instance``: both trees, ``caramel profile FAMILY --gpus 1 --throughput --repeats I``
  (the one-device point of the family's 1-chip program: every input of each instance uploaded; the figure the
  base commit can take).

* ``processes`` (``--nproc P``): this tree's batch of B in one process, in P (``caramel launch --nproc P -- run ...``,
  a process a device; B / P instances each) and as P x B instances in P (B each), alternating, ``--nproc-rounds``
  rounds: every round's rate, and each P-process form against one process by the medians of the rounds (a host's
  speed drifts from round to round). The first ratio splits one batch: each process pays the batch's fill (its first
  instance's draw, replay and digest) on a P-th of the work. The second gives each process the one process's work:
  the rate of P GPUs at the load of one. Every digest of an instance is the same in each form.

The key store DIR is made once (``caramel keys``, this tree) unless ``--keys`` names one. The digests of the
batch's first ``--singles`` instances are compared with single runs of this tree (``caramel run --seed S+i
--key-seed S --keys DIR``), and the two trees' batch digests with each other. One JSON record,
``throughput.json`` under ``--out``, holds every figure, command, digest check and the environment.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from bench.harness import ROOT, commit, log, program_path

#: The program of the figures of record.
PROGRAM = "BootstrapLike_51L_1c"


def find_program(name: str) -> str:
    """:func:`bench.harness.program_path` of ``name`` as an absolute path (the commands run in other trees)."""
    path = program_path(name)
    if "#" in path:
        archive, member = path.split("#", 1)
        return f"{Path(archive).resolve()}#{member}"
    return str(Path(path).resolve())


def family_of(program: str) -> str | None:
    """The family argument of ``caramel profile FAMILY --gpus 1`` for a 1-chip program path: the archive of
    ``ARCHIVE#NAME_1c``, or the folder path without its ``_1c``; None for another program."""
    if "#" in program:
        archive, member = program.split("#", 1)
        return archive if member.endswith("_1c") else None
    return program[: -len("_1c")] if program.endswith("_1c") else None


def run(cmd: Sequence[str], tree: Path, timeout: float, record: list) -> subprocess.CompletedProcess:
    """``cmd`` in a fresh process of ``tree``'s caramel; its command line, exit code and seconds go to ``record``."""
    env = {**os.environ, "PYTHONPATH": str(tree), "CARAMEL_PROGRESS": "0"}
    start = time.perf_counter()
    log(f"[{tree.name or tree}] {shlex.join(cmd)}")
    done = subprocess.run(list(cmd), cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    record.append({"tree": str(tree), "command": shlex.join(cmd), "exit": done.returncode,
                   "seconds": round(seconds, 3)})
    if done.returncode not in (0, 1):  # 1: a decryption check failed, still a measurement
        log(f"failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def batch_command(args, program: str, keys: Path, path: Path, prefix: Sequence[str] = (),
                  batch: int | None = None) -> list[str]:
    """``caramel [PREFIX] run PROGRAM --batch B --keys DIR --json PATH`` (``prefix``: e.g. ``launch --nproc P --``;
    ``batch``: default ``--batch``)."""
    return [sys.executable, "-m", "caramel.cli", *prefix, "run", program, "--n", str(args.n), "--backend", args.backend,
            "-q", "--batch", str(batch or args.batch), "--seed", str(args.seed), "--keys", str(keys), "--json", str(path)]


def measure(tree: Path, tag: str, args, program: str, keys: Path, out: Path, commands: list) -> dict[str, Any]:
    """Every figure of one tree (module docstring)."""
    py, cli = sys.executable, ["-m", "caramel.cli"]
    common = ["--n", str(args.n), "--backend", args.backend, "-q"]
    figures: dict[str, Any] = {"tree": str(tree), "commit": commit(tree.resolve())}
    batch_json = out / f"{tag}-batch.json"
    run(batch_command(args, program, keys, batch_json), tree, args.timeout, commands)
    doc = read_json(batch_json)
    if doc is not None:
        figures["batch_per_second"] = doc["summary"]["per_second"]
        figures["batch_wall_s"] = doc["summary"]["wall_s"]
        figures["batch_digests"] = [r["digest"] for r in doc["instances"]]
    if tag == "after":
        tp_json = out / f"{tag}-throughput.json"
        run([py, *cli, "profile", program, *common, "--throughput", "--repeats", str(args.instances), "--seed",
             str(args.seed), "--keys", str(keys), "--json", str(tp_json)], tree, args.timeout, commands)
        doc = read_json(tp_json)
        if doc is not None:
            figures["serving_per_second"] = doc["per_second"].get("serving")
            figures["end_to_end_per_second"] = doc["per_second"].get("end to end")
            figures["phases_s"] = {r["name"]: r["phases_s"] for r in doc["rates"]}
            figures["serving_shared"] = next((r["shared"] for r in doc["rates"] if r["name"] == "serving"), None)
    family = family_of(program)
    if family is not None and not args.skip_family:
        fam_json = out / f"{tag}-family.json"
        run([py, *cli, "profile", family, *common, "--gpus", "1", "--throughput", "--repeats", str(args.rounds),
             "--seed", str(args.seed), "--json", str(fam_json)], tree, args.timeout, commands)
        doc = read_json(fam_json)
        if doc is not None and doc.get("throughput"):
            figures["every_input_per_second"] = doc["throughput"][0]["per_second"]
    return figures


def singles(args, program: str, keys: Path, out: Path, commands: list) -> list[str]:
    """The digests of single runs ``--seed S+i --key-seed S`` (i < ``--singles``) of this tree."""
    digests = []
    for i in range(args.singles):
        path = out / f"single-{i}.json"
        run([sys.executable, "-m", "caramel.cli", "run", program, "--n", str(args.n), "--backend", args.backend, "-q",
             "--seed", str(args.seed + i), "--key-seed", str(args.seed), "--keys", str(keys), "--json", str(path)],
            ROOT, args.timeout, commands)
        doc = read_json(path)
        digests.append(doc["digest"] if doc else None)
    return digests


def processes(args, program: str, keys: Path, out: Path, commands: list) -> dict[str, Any]:
    """This tree's batch in one process and in ``--nproc`` processes, split and each the whole, alternating (module
    docstring)."""
    launch = ("launch", "--nproc", str(args.nproc), "--")
    forms = {"one": ((), args.batch), "launched": (launch, args.batch), "launched_each": (launch, args.batch * args.nproc)}
    rates: dict[str, list] = {form: [] for form in forms}
    digests: list = []
    for r in range(args.nproc_rounds):
        for form, (prefix, batch) in forms.items():
            path = out / f"processes-{form}-{r}.json"
            run(batch_command(args, program, keys, path, prefix, batch), ROOT, args.timeout, commands)
            doc = read_json(path)
            rates[form].append(doc["summary"]["per_second"] if doc else None)
            digests.append([x["digest"] for x in doc["instances"]][: args.batch] if doc else None)
    measured = {form: [x for x in got if x is not None] for form, got in rates.items()}
    medians = {form: statistics.median(got) for form, got in measured.items() if got}

    def ratio(form: str) -> float | None:
        return medians[form] / medians["one"] if form in medians and "one" in medians else None

    return {"nproc": args.nproc, "rounds": args.nproc_rounds, "batch_each": args.batch * args.nproc,
            "per_second": rates, "medians": medians, "ratio": ratio("launched"), "ratio_each": ratio("launched_each"),
            "digests_equal": digests[0] is not None and all(d == digests[0] for d in digests)}


def table(record: dict[str, Any]) -> str:
    rows = [("figure", *record["trees"])]
    names = [("serving_per_second", "serving instances/s (shared resident)"),
             ("end_to_end_per_second", "end to end instances/s (profile)"),
             ("batch_per_second", f"caramel run --batch {record['batch']} instances/s"),
             ("every_input_per_second", "serving, every input per instance, instances/s")]
    for key, label in names:
        cells = [record["trees"][t].get(key) for t in record["trees"]]
        if any(c is not None for c in cells):
            rows.append((label, *(f"{c:.2f}" if isinstance(c, (int, float)) else "-" for c in cells)))
    scaled = record.get("processes")
    if scaled:
        def after_only(text: str | None):
            return tuple(text if text is not None and t == "after" else "-" for t in record["trees"])

        p, batch, each = scaled["nproc"], record["batch"], scaled["batch_each"]
        for form, label, ratio in (("one", f"one process, --batch {batch}", None),
                                   ("launched", f"{p} processes, --batch {batch} ({batch // p} each)", "ratio"),
                                   ("launched_each", f"{p} processes, --batch {each} ({batch} each)", "ratio_each")):
            got = scaled["medians"].get(form)
            rows.append((f"  {label}, median of {scaled['rounds']}", *after_only(None if got is None else f"{got:.2f}")))
            if ratio:
                x = scaled[ratio]
                rows.append(("    / one process", *after_only(None if x is None else f"{x:.2f}x")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder of the record (throughput.json) and of every command's JSON")
    p.add_argument("--base", help="a base tree (e.g. .ab/ from python -m bench ab prepare REV), measured in the same "
                   "call")
    p.add_argument("--program", default=PROGRAM, help=f"program path or name (default {PROGRAM})")
    p.add_argument("--n", type=int, default=65536)
    p.add_argument("--backend", default="gpu", choices=("gpu", "cpu-plan"))
    p.add_argument("--batch", type=int, default=64, help="instances of `caramel run --batch` (default 64)")
    p.add_argument("--instances", type=int, default=64, help="instances of each rate of `profile --throughput`")
    p.add_argument("--rounds", type=int, default=8, help="rounds of `profile FAMILY --gpus 1 --throughput`")
    p.add_argument("--singles", type=int, default=2, help="batch instances compared with single runs (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keys", help="an existing key store for the program (default: made under --out)")
    p.add_argument("--skip-family", action="store_true", help="skip the `profile FAMILY --gpus 1` figure")
    p.add_argument("--nproc", type=int, default=1, help="also the batch in this many processes (`caramel launch`), "
                   "against one process (default 1: not taken)")
    p.add_argument("--nproc-rounds", type=int, default=3, help="rounds of --nproc, alternating (default 3)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds per command")
    args = p.parse_args(argv)
    if args.nproc < 1 or args.nproc_rounds < 1:
        p.error("--nproc and --nproc-rounds must be at least 1")

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    program = find_program(args.program)
    commands: list[dict[str, Any]] = []
    keys = Path(args.keys).resolve() if args.keys else out / "keys"
    if not args.keys and not keys.exists():
        done = run([sys.executable, "-m", "caramel.cli", "keys", program, "--n", str(args.n), "--seed", str(args.seed),
                    "--device", "gpu" if args.backend == "gpu" else "cpu", "--out", str(keys)], ROOT, args.timeout,
                   commands)
        if done.returncode:
            print(done.stderr[-2000:], file=sys.stderr)
            return 2
    trees = {}
    if args.base:
        trees["before"] = measure(Path(args.base).resolve(), "before", args, program, keys, out, commands)
    trees["after"] = measure(ROOT, "after", args, program, keys, out, commands)
    scaled = processes(args, program, keys, out, commands) if args.nproc > 1 else None
    single = singles(args, program, keys, out, commands)
    after = trees["after"].get("batch_digests") or []
    checks = {"singles": single, "singles_equal": bool(single) and single == after[: len(single)]}
    if "before" in trees:
        checks["before_equal_after"] = trees["before"].get("batch_digests") == after
    if scaled is not None:
        checks["processes_equal"] = scaled["digests_equal"]
    from caramel.results import environment  # this tree's

    record = {"bench": "throughput", "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "program": program, "n": args.n, "backend": args.backend, "batch": args.batch,
              "instances": args.instances, "seed": args.seed, "keys": str(keys), "trees": trees, "checks": checks,
              **({"processes": scaled} if scaled is not None else {}),
              "commands": commands,
              "command": shlex.join([sys.executable, "-m", "bench.throughput", *(argv or sys.argv[1:])]),
              "environment": environment()}
    path = out / "throughput.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(table(record))
    print(f"digests: batch == single runs: {'yes' if checks['singles_equal'] else 'NO'}"
          + (f"; before == after: {'yes' if checks['before_equal_after'] else 'NO'}" if "before" in trees else "")
          + (f"; {args.nproc} processes == one: {'yes' if checks['processes_equal'] else 'NO'}"
             if scaled is not None else ""))
    print(f"record: {path}")
    ok = checks["singles_equal"] and checks.get("before_equal_after", True) and checks.get("processes_equal", True) \
        and all(c["exit"] in (0, 1) for c in commands)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
