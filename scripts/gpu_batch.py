"""Program-level parallelism on the device (issue 16): a batch of B instances of a program
(default BootstrapLike_51L_1c at N = 65536; a K-chip program runs G // K instances at once, or one on
all G GPUs when G < K) on G GPUs, with each instance's run phase (the first on a slot uploads and
captures, later ones rebind and replay), every instance's digest compared with a
single run (``run_program(seed=S+i, key_seed=S)``) on the same backend, then the throughput
(instances/s, speedup, efficiency) on each device count of ``--throughput``. Writes a JSON record.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_batch.py [--batch 4] [--gpus 1] [--throughput 1,2,4,8]
    # a dry run without a GPU (simulated devices):
    PYTHONPATH=. python3 scripts/gpu_batch.py --program programs/MulRotate_4L_1c --n 1024 --backend cpu-plan --gpus 2

Programs are read from --program, or BootstrapLike_51L.tar.xz of --programs (default <repo>/.data, then
../shared/programs, then /work/shared/programs).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caramel.api import run_program  # noqa: E402
from caramel.batch import instance_line, measure_throughput, run_batch  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.results import document, environment, write_json  # noqa: E402


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def find_program(args):
    if args.program:
        return load_program(args.program)
    for d in [ROOT / ".data", ROOT.parent / "shared" / "programs", Path("/work/shared/programs"), *args.programs]:
        archive = Path(d) / "BootstrapLike_51L.tar.xz"
        if archive.exists():
            return load_program(f"{archive}#BootstrapLike_51L_1c")
    raise SystemExit("BootstrapLike_51L.tar.xz not found; give --program")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--program")
    p.add_argument("--programs", nargs="*", default=[])
    p.add_argument("--n", type=int, default=65536)
    p.add_argument("--backend", default="gpu", choices=("gpu", "cpu-plan"))
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--throughput", default="", help="device counts, e.g. 1,2,4,8 (default: --gpus only)")
    p.add_argument("--rounds", type=int, default=3, help="instances per device in the throughput run")
    p.add_argument("--skip-singles", action="store_true", help="do not compare with single runs")
    p.add_argument("--json", default="gpu_batch.json")
    args = p.parse_args()

    program = find_program(args)
    log(f"{program.name}: {program.instruction_count} instructions, N = {args.n}, backend {args.backend}, "
        f"env {environment()}")
    t0 = time.perf_counter()
    result = run_batch(program, n=args.n, backend=args.backend, seed=args.seed, batch=args.batch, gpus=args.gpus,
                       check=None, log=log)
    log(f"batch done in {time.perf_counter() - t0:.1f} s (keys {result.timings['keys']:.1f} s)")
    for record in result.records:
        print(instance_line(record))
        print(f"  instance {record['instance']} run {record['timings_s']['run']:.4f} s (devices {record['devices']})")
    print(result.summary.line())
    ok = True
    singles = []
    if not args.skip_singles:
        for i in range(args.batch):
            t = time.perf_counter()
            single = run_program(program, n=args.n, backend=args.backend, seed=args.seed + i, key_seed=args.seed,
                                 check=None)
            same = single.digest == result.records[i]["digest"]
            ok &= same
            singles.append({"instance": i, "digest": single.digest, "same": same,
                            "seconds": time.perf_counter() - t, "run_s": single.timings.get("run")})
            log(f"single run seed {args.seed + i}: digest {'==' if same else '!='} instance {i}'s; its run phase "
                f"{single.timings.get('run', float('nan')):.4f} s (a fresh executor: upload, warm-up, capture)")
    counts = [int(x) for x in args.throughput.split(",") if x.strip()] or [args.gpus]
    points = measure_throughput(program, counts, n=args.n, backend=args.backend, seed=args.seed,
                                rounds=args.rounds, log=log)
    for pt in points:
        print(f"throughput on {pt.gpus} device(s): {pt.instances} instances in {pt.wall_s:.3f} s = "
              f"{pt.per_second:.2f}/s, speedup {pt.speedup:.2f}x, efficiency {pt.efficiency:.0%}")
    body = result.body()
    body["singles"] = singles
    body["throughput"] = [vars(pt) for pt in points]
    body["command"] = " ".join(sys.argv)
    log(f"record: {write_json(args.json, document('gpu_batch', body))}")
    print("digests of the batch equal the single runs':", "yes" if ok else "NO")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
