"""Slack in one replay: BootstrapLike_51L_1c's fused graph (4 streams) captured twice (two arenas), the two graphs
replayed one after the other and then together (on two streams): if together takes as long as one after the other,
one replay already fills the GPU; if less, one replay leaves the GPU idle part of the time.

    PYTHONPATH=. PYTHONUNBUFFERED=1 python3 scripts/gpu_pair.py [--repeats 10] [--streams 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from caramel.execute.cuda_graph import GpuRun  # noqa: E402
from caramel.execute.timing import Timing  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.ring import Context  # noqa: E402
from gpu_bench import find, log  # noqa: E402
from reference_digests import bootstrap_inputs  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--program", default="BootstrapLike_51L_1c")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--streams", type=int, default=4)
    args = ap.parse_args()
    import cupy as cp

    program = find([ROOT / ".data", Path("/work/shared/programs")], args.program)
    ctx = Context(n=args.n)
    memory = bootstrap_inputs(program, ctx)
    plan = build_plan(program)
    runs = [GpuRun(plan, ctx, memory, "exact", streams=args.streams) for _ in range(2)]
    for r in runs:
        r.capture()
    graphs = [r.graphs[r.local[0]] for r in runs]
    lanes = [cp.cuda.Stream(non_blocking=True) for _ in range(2)]

    def timed(together: bool) -> float:
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        cp.cuda.Device().synchronize()
        start.record(lanes[0])
        if together:
            mid = cp.cuda.Event()
            mid.record(lanes[0])
            lanes[1].wait_event(mid)
            graphs[0].launch(lanes[0])
            graphs[1].launch(lanes[1])
            done = cp.cuda.Event()
            done.record(lanes[1])
            lanes[0].wait_event(done)
        else:
            graphs[0].launch(lanes[0])
            graphs[1].launch(lanes[0])
        stop.record(lanes[0])
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop)

    for label, together in (("one after the other", False), ("together", True), ("one after the other", False),
                            ("together", True)):
        timed(together)
        t = Timing.of([timed(together) for _ in range(args.repeats)])
        log(f"two replays, {label}: {t}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
