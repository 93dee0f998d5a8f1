"""Process mode: one process per GPU, possibly on several machines, under a standard launcher.

Each process reads its place from the environment (:func:`launch_env`): ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` (torchrun and :func:`launch`), ``OMPI_COMM_WORLD_RANK``/
``_SIZE``/``_LOCAL_RANK`` (Open MPI's mpirun) or ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``
(srun). Process r drives device r of the run (of WORLD_SIZE devices) on its CUDA device
LOCAL_RANK, with the same plan, the same inputs (generated from the same seed) and the same
device programs as the threaded executor (:class:`~caramel.execute.multi_gpu.MultiGpuRun` with
``local=[r]``).

Rendezvous goes through a file that every process can read (``CARAMEL_RENDEZVOUS``, on a shared
file system across machines): rank 0 creates one NCCL unique id per device group and writes them
there atomically (write, then rename); the others wait for the file (with a timeout). Results
are gathered the same way: each rank writes its chips' stores beside the rendezvous file, rank 0
waits for all and merges them into one :class:`~caramel.execute.reference.RunResult`.

With ``--backend cpu-plan`` the processes run on NumPy and exchange limbs through files
(:class:`FileFabric`): the whole process mode (launcher, rendezvous, per-rank device programs,
gathering, check) runs and is tested without GPUs. On GPUs it runs on 2 H200s (a decryption check
passes at N = 65536). Each process reports its phases on stderr. A process destroys its
communicators only after its CUDA graph is gone: ``ncclCommDestroy`` waits forever while a graph
holding the communicator's work exists (NCCL 2.28.9), which is why the first GPU runs never
exited.

Example (one machine, 2 GPUs)::

    caramel launch --nproc 2 -- run programs/Mul_4L_2c --n 4096 --backend gpu
    # or, with torchrun:  torchrun --nproc-per-node 2 -m caramel.cli run programs/Mul_4L_2c --backend gpu --distributed
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.execute.collectives import CollectiveKind
from caramel.execute.devices import (
    DeviceRun, Fabric, RowOp, collective_result, device_groups, device_programs, merge_results,
)
from caramel.execute.plan_engine import check_plan_memory
from caramel.execute.reference import RunResult
from caramel.program import Mem

_ENV = (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"))


@dataclass(frozen=True)
class Place:
    """This process: ``rank`` of ``world`` processes, on CUDA device ``local_rank``; ``rendezvous``
    is the path of the shared id file."""

    rank: int
    world: int
    local_rank: int
    rendezvous: Path


def launch_env(env: Mapping[str, str] | None = None) -> Place | None:
    """This process's :class:`Place` from the launcher's variables, or None outside a launcher."""
    env = os.environ if env is None else env
    for rank, world, local in _ENV:
        if rank in env and world in env:
            try:
                r, w = int(env[rank]), int(env[world])
                lr = int(env.get(local, r))
            except ValueError:
                raise ExecutionError(f"{rank}/{world}/{local} must be integers, got "
                                     f"{env.get(rank)!r}/{env.get(world)!r}/{env.get(local)!r}") from None
            if not 0 <= r < w:
                raise ExecutionError(f"{rank} = {r} is outside 0..{w - 1} ({world} = {w})")
            where = env.get("CARAMEL_RENDEZVOUS")
            if not where:
                raise ExecutionError("process mode needs CARAMEL_RENDEZVOUS: a file path that every process "
                                     "can read (e.g. on a shared file system)")
            return Place(r, w, lr, Path(where))
    return None


def _wait_for(path: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise ExecutionError(f"waited {timeout:g} s for {what} at {path}; did every process start?")
        time.sleep(0.05)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def exchange_ids(groups: Sequence[tuple[int, ...]], place: Place, make_id: Callable[[], tuple] | None = None,
                 timeout: float = 120.0) -> dict[tuple[int, ...], tuple]:
    """One NCCL unique id per device group, created by rank 0 and read by every rank from
    ``place.rendezvous`` (``make_id``: default ``nccl.get_unique_id``)."""
    if place.rank == 0:
        if make_id is None:
            from cupy.cuda import nccl

            make_id = nccl.get_unique_id
        ids = {json.dumps(list(g)): list(make_id()) for g in groups}
        _write_atomic(place.rendezvous, json.dumps({"world": place.world, "ids": ids}).encode())
    else:
        _wait_for(place.rendezvous, timeout, "the NCCL ids of rank 0")
    data = json.loads(place.rendezvous.read_text())
    if data["world"] != place.world:
        raise ExecutionError(f"{place.rendezvous} was written for {data['world']} processes, this run has "
                             f"{place.world} (a stale file from an earlier run?)")
    got = {tuple(json.loads(k)): tuple(v) for k, v in data["ids"].items()}
    missing = [g for g in groups if g not in got]
    if missing:
        raise ExecutionError(f"{place.rendezvous} lacks the ids of device groups {missing}")
    return got


def gather_stores(stores: Sequence[Mapping[Mem, np.ndarray]], chips: Sequence[int], place: Place,
                  timeout: float = 600.0) -> list[dict[Mem, np.ndarray]] | None:
    """Every chip's stores at rank 0 (None on the other ranks): rank r writes the stores of its
    ``chips`` beside the rendezvous file; rank 0 reads them all."""
    def path(r: int) -> Path:
        return place.rendezvous.with_name(f"{place.rendezvous.name}.stores{r}.npz")

    arrays = {f"{c}|{m}": a for c, s in zip(chips, stores) for m, a in s.items()}
    arrays["__chips__"] = np.array(chips, dtype=np.int64)
    tmp = path(place.rank).with_name(f".{path(place.rank).name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    os.replace(tmp, path(place.rank))
    if place.rank != 0:
        return None
    out: dict[int, dict[Mem, np.ndarray]] = {}
    for r in range(place.world):
        _wait_for(path(r), timeout, f"the stores of rank {r}")
        with np.load(path(r)) as f:
            for c in f["__chips__"]:
                out.setdefault(int(c), {})
            for key in f.files:
                if key != "__chips__":
                    c, name = key.split("|", 1)
                    term, limb = name[:-1].rsplit("(", 1)
                    out[int(c)][Mem(term, int(limb))] = f[key]
    return [out.get(c, {}) for c in range(max(out) + 1)] if out else []


def _communicator(nccl, size: int, uid: tuple, rank: int):
    """``ncclCommInitRank``; CuPy takes the id as bytes (recent) or as a tuple of ints (older)."""
    try:
        return nccl.NcclCommunicator(size, bytes(x & 0xFF for x in uid), rank)
    except TypeError:
        return nccl.NcclCommunicator(size, tuple(uid), rank)


class FileFabric(Fabric):
    """Collectives between processes through files beside the rendezvous file (NCCL's semantics,
    like :class:`~caramel.execute.devices.FakeNetwork`): the CPU stand-in for NCCL that lets the
    whole process mode run, and be tested, without GPUs. The k-th call on a device group is
    ``<rendezvous>.g<group>.c<k>.r<rank>.npy`` for every member that sends."""

    def __init__(self, place: Place, timeout: float):
        self.device, self.place, self.timeout = place.rank, place, timeout
        self.calls: dict[tuple[int, ...], int] = {}

    def _path(self, op: RowOp, k: int, rank: int) -> Path:
        g = "-".join(map(str, op.group))
        return self.place.rendezvous.with_name(f"{self.place.rendezvous.name}.g{g}.c{k}.r{rank}.npy")

    def group(self, backend, ops) -> None:
        posted = []
        for op in ops:
            k = self.calls.get(op.group, 0)
            self.calls[op.group] = k + 1
            if op.send >= 0:
                path = self._path(op, k, self.device)
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npy")
                np.save(tmp, backend.read(np.arange(op.send, op.send + op.rows)))
                os.replace(tmp, path)
            posted.append((op, k))
        for op, k in posted:
            if op.recv < 0:
                continue
            senders = [op.root] if op.kind is CollectiveKind.BROADCAST else list(op.group)
            sent = {}
            for r in senders:
                path = self._path(op, k, r)
                _wait_for(path, self.timeout, f"device {r}'s part of {op.kind.value} id {op.sync} among {op.group}")
                sent[r] = np.load(path)
            backend.write(np.arange(op.recv, op.recv + op.rows), collective_result(op, sent))


def run_distributed(plan, ctx, memory, mode, place: Place, *, backend: str = "gpu", graph: bool = True,
                    timeout: float = 300.0, streams: int | None = None) -> RunResult | None:
    """Run this process's device of ``plan`` (see the module docstring) on a GPU over NCCL
    (``backend="gpu"``) or on NumPy over :class:`FileFabric` (``"cpu-plan"``); the merged result
    on rank 0, None elsewhere."""
    def log(text: str) -> None:  # each phase, so that a stalled process says where it is
        logging.getLogger("caramel.distributed").info("rank %d/%d: %s", place.rank, place.world, text)

    if place.world > len(plan.chips):
        raise ExecutionError(f"{place.world} processes for a {len(plan.chips)}-chip program: use at most one per chip")
    progs = device_programs(plan, place.world, ctx.primes, ctx.n)
    chips = list(progs[place.rank].chips)
    if backend == "gpu":
        mine = _gpu_stores(plan, ctx, memory, mode, place, progs, graph, timeout, streams, log)
    else:
        from caramel.backends.numpy_backend import NumpyBackend

        check_plan_memory(plan, ctx, memory)
        run = DeviceRun(progs[place.rank], plan, ctx, memory, mode, NumpyBackend, FileFabric(place, timeout))
        run.run()
        mine = run.stores()
    log("ran; gathering the outputs")
    stores = gather_stores(mine, chips, place, timeout)
    return None if stores is None else merge_results(plan, memory, [(tuple(range(len(stores))), stores)])


def _gpu_stores(plan, ctx, memory, mode, place: Place, progs, graph: bool, timeout: float, streams: int | None,
                log) -> list[dict]:
    """This rank's device on its GPU: NCCL communicators from the shared ids, a one-device
    :class:`~caramel.execute.multi_gpu.MultiGpuRun`; the stores of its chips."""
    import cupy as cp
    from cupy.cuda import nccl

    from caramel.execute.multi_gpu import MultiGpuRun, nccl_environment

    nccl_environment()
    groups = device_groups(progs)
    ids = exchange_ids(groups, place, timeout=timeout)
    log(f"NCCL ids of {len(groups)} device group(s) read from {place.rendezvous}")
    comms: dict[int, dict] = {place.rank: {}}
    with cp.cuda.Device(place.local_rank):
        for g in groups:  # the same order on every rank
            if place.rank in g:
                comms[place.rank][g] = _communicator(nccl, len(g), ids[g], g.index(place.rank))
    log(f"communicators created on CUDA device {place.local_rank}")
    with MultiGpuRun(plan, ctx, memory, mode, place.world, local=[place.rank], device_ids=[place.local_rank],
                     timeout=timeout, comms=comms, streams=streams) as run:
        log("set up (inputs uploaded, kernels loaded)")
        if graph:
            run.replay(1)
        else:
            run.eager()
        mine = run.result()
    for comm in comms[place.rank].values():  # after close() dropped the graph (MultiGpuRun.close)
        comm.destroy()
    log("communicators destroyed")
    return [mine.stores[c] for c in progs[place.rank].chips]


def launch(nproc: int, args: Sequence[str], timeout: float | None = None) -> int:
    """Start ``nproc`` processes of ``caramel ARGS --distributed`` on this machine (RANK,
    WORLD_SIZE, LOCAL_RANK and a fresh CARAMEL_RENDEZVOUS set; NCCL_NVLS_ENABLE=0 unless set) and
    wait for all; returns the first non-zero exit status (the others are then stopped)."""
    with tempfile.TemporaryDirectory(prefix="caramel-rdv-") as tmp:
        env = {**os.environ, "WORLD_SIZE": str(nproc), "CARAMEL_RENDEZVOUS": str(Path(tmp) / "ids.json")}
        env.setdefault("NCCL_NVLS_ENABLE", "0")
        procs = [subprocess.Popen([sys.executable, "-m", "caramel.cli", *args, "--distributed"],
                                  env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in range(nproc)]
        status = 0
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            while any(p.poll() is None for p in procs):
                failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
                if failed or (deadline is not None and time.monotonic() > deadline):
                    status = failed[0] if failed else 124
                    break
                time.sleep(0.1)
            status = status or next((p.returncode for p in procs if p.returncode), 0)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        return status


__all__ = ["Place", "exchange_ids", "gather_stores", "launch", "launch_env", "run_distributed"]
