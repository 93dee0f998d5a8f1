"""NCCL across processes on this machine, without caramel: a health check for process mode.

Starts ``--nproc`` processes (spawned), one per GPU; rank 0 makes an NCCL unique id and hands it
to the others through a queue; each creates its communicator (``ncclCommInitRank``), broadcasts a
uint32 vector from rank 0 and SUM-reduces one to rank 0 on its own stream, then checks the values.
Prints one line per phase per rank, so that a stall shows where it is.

    NCCL_NVLS_ENABLE=0 python3 scripts/nccl_probe.py --nproc 2 [--graph]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time


def _log(rank: int, text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] rank {rank}: {text}", file=sys.stderr, flush=True)


def _worker(rank: int, world: int, queue, graph: bool) -> None:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import cupy as cp
    from cupy.cuda import nccl

    if rank == 0:
        uid = nccl.get_unique_id()
        _log(rank, f"unique id made ({type(uid).__name__} of {len(uid)})")
        for _ in range(world - 1):
            queue.put(uid)
    else:
        uid = queue.get(timeout=60)
    with cp.cuda.Device(rank):
        key = bytes(x & 0xFF for x in uid) if not isinstance(uid, bytes) else uid
        try:
            comm = nccl.NcclCommunicator(world, key, rank)
        except TypeError:
            comm = nccl.NcclCommunicator(world, tuple(uid), rank)
        _log(rank, "communicator created")
        n = 1 << 16
        x = cp.full(n, rank + 1, dtype=cp.uint32)
        y = cp.zeros(n, dtype=cp.uint32)
        s = cp.cuda.Stream(non_blocking=True)

        def step():
            comm.broadcast(x.data.ptr, x.data.ptr, n, nccl.NCCL_UINT32, 0, s.ptr)
            comm.reduce(x.data.ptr, y.data.ptr, n, nccl.NCCL_UINT32, nccl.NCCL_SUM, 0, s.ptr)

        step()
        s.synchronize()
        _log(rank, "eager broadcast + reduce done")
        g = None
        if graph:
            x.fill(rank + 1)
            s.synchronize()
            s.begin_capture(getattr(cp.cuda.runtime, "streamCaptureModeThreadLocal", 1))
            step()
            g = s.end_capture()
            g.launch(s)
            s.synchronize()
            _log(rank, "graph broadcast + reduce done")
        ok = int(x[0]) == 1 and (rank != 0 or int(y[0]) == world)
        _log(rank, f"values {'right' if ok else 'WRONG'}: x={int(x[0])} y={int(y[0])}")
        g = None  # a live graph holding NCCL work makes ncclCommDestroy wait forever (NCCL 2.28.9)
        comm.destroy()
        _log(rank, "communicator destroyed")
        if not ok:
            sys.exit(1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--graph", action="store_true", help="also capture the two calls into a CUDA graph")
    p.add_argument("--timeout", type=float, default=90)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, a.nproc, queue, a.graph)) for r in range(a.nproc)]
    for q in procs:
        q.start()
    deadline = time.monotonic() + a.timeout
    for q in procs:
        q.join(max(0.1, deadline - time.monotonic()))
    stuck = [r for r, q in enumerate(procs) if q.is_alive()]
    for q in procs:
        if q.is_alive():
            q.kill()
    if stuck:
        print(f"nccl_probe: ranks {stuck} did not finish in {a.timeout:g} s", file=sys.stderr)
        return 124
    bad = [r for r, q in enumerate(procs) if q.exitcode]
    print("nccl_probe: " + (f"ranks {bad} failed" if bad else f"{a.nproc} processes: broadcast and reduce right"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
