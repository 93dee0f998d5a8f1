"""``python -m bench COMMAND [ARGS]``: the laboratory's entry points (docs/BENCHMARKS.md).

A command is a module ``bench/<name>.py`` whose ``main(argv: list[str]) -> int`` parses its own arguments (so
``--help`` works) and returns the exit status: 0, 1 when a check failed, 2 for bad arguments.
"""

from __future__ import annotations

import importlib
import sys

#: Command -> what it does, in the order ``python -m bench`` lists them.
COMMANDS = {
    "kernels": "every CUDA kernel against the CPU reference limb for limb, then timed (--config variants)",
    "replay": "BootstrapLike_51L_1c replayed: eager, graph, fusion, streams; --config and --plan variants; digest",
    "corpus": "every program of a folder on a backend against the CPU reference, limb for limb",
    "roofline": "time per kernel kind against the copy rate, the slowest kernels; --fit refits the plan's costs",
    "timeline": "the timeline model: per-device kernel times, predictions beside measured replays (bench/timeline.py)",
    "multi": "several GPUs: NCCL, K-chip programs against the reference, scaling, compute floors, process mode",
    "throughput": "instances per second and where an instance's time goes (bench/throughput.py)",
    "draw": "an instance's inputs drawn, encoded and encrypted on the host: ms per instance, instances/s by threads",
    "coldstart": "a first run on a fresh machine, again, programs not seen before, after `caramel compile`",
    "cluster": "a batch on a local Dask cluster against one process; a K-chip program as ranks (bench/cluster.py)",
    "client": "the client: GPU client = CPU client, keys and inputs timed, the key store, `caramel run` end to end",
    "cpu": "on the CPU: load, plan, accuracy, the client, the reference digests",
    "all": "one call of the figures of record: kernels, replay, plans, GPU test modules, corpus in three modes",
    "ab": "an earlier commit's tree beside this one (.ab/), checked against its manifest, for A/B in one call",
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    return ("usage: python -m bench COMMAND [ARGS]   (python -m bench COMMAND --help)\n\ncommands:\n"
            + "\n".join(f"  {name:<{width}}  {what}" for name, what in COMMANDS.items()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"bench: unknown command {name!r}\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(f"bench.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"bench.{name}":
            raise
        print(f"bench {name}: not in this tree (bench/{name}.py)", file=sys.stderr)
        return 2
    try:
        return int(module.main(rest) or 0)
    except SystemExit as e:  # argparse's --help and usage errors, the harness's refusals
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        return int(e.code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
