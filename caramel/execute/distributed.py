"""Process mode: one process per GPU, possibly on several machines, under a standard launcher.

Each process reads its place from the launcher's variables (:func:`launch_env`: torchrun and
:func:`caramel.launch.launch`, Open MPI's mpirun, srun, MPICH). Process r drives device r of the
run (of WORLD_SIZE devices) on its CUDA device LOCAL_RANK, with the same plan, the same inputs
(generated from the same seed) and the same device programs as the threaded executor
(:class:`~caramel.execute.cuda_graph.MultiGpuRun` with ``local=[r]``).

Rendezvous goes through a file that every process can read (``CARAMEL_RENDEZVOUS``, on a shared
file system across machines): rank 0 creates one NCCL unique id per device group and writes them
there atomically (write, then rename); the others wait for the file (with a timeout). Results
are gathered the same way: each rank writes its chips' stores beside the rendezvous file, rank 0
waits for all and merges them into one :class:`~caramel.execute.result.RunResult`.

With ``--backend cpu-plan`` the processes run on NumPy and exchange limbs through files
(:class:`FileFabric`): the whole process mode runs and is tested without GPUs. Each process logs
its phases; its communicators are destroyed only after its CUDA graph is gone
(:meth:`MultiGpuRun.close <caramel.execute.cuda_graph.MultiGpuRun.close>` says why).

Example (one machine, 2 GPUs)::

    caramel launch --nproc 2 -- run programs/Mul_4L_2c --n 4096 --backend gpu
    # or, with torchrun:  torchrun --nproc-per-node 2 -m caramel.cli run programs/Mul_4L_2c --backend gpu --distributed
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.execute.fabric import Fabric, RowOp, collective_result
from caramel.execute.memory import check_plan_memory
from caramel.execute.placement import device_groups, device_programs
from caramel.execute.result import RunResult, merge_results
from caramel.execute.runner import DeviceRun
from caramel.outfiles import replace_atomically
from caramel.plan.collectives import CollectiveKind
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
    run_id: str | None = None

    def data_path(self, suffix: str) -> Path:
        """A data file of this run beside the rendezvous file: named with the run id, so that
        files of an earlier run at the same path are never read as this run's."""
        return self.rendezvous.with_name(f"{self.rendezvous.name}.{self.run_id or 'run'}.{suffix}")


#: Variables that name one run of a launcher, in the order tried: every rank of a run sees the same.
_RUN_ID_ENV = ("CARAMEL_RUN_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")


def _env_run_id(env: Mapping[str, str]) -> str | None:
    for name in _RUN_ID_ENV:
        if env.get(name):
            return env[name]
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    return None


@dataclass(frozen=True)
class RunIdentity:
    """What every rank of one run must agree on; written into the rendezvous file by rank 0 and
    checked by every rank (and in the stores rank 0 gathers)."""

    program: str  # SHA-256 of the program's files (caramel.parse.source_digest)
    n: int
    mode: str
    seed: int
    world: int
    backend: str
    check: str | None = None  # SHA-256 of the check file's text, or None
    key_seed: int | None = None  # the seed of the key material (caramel.ckks.keyset), when not ``seed``

    def to_json(self) -> dict:
        return dict(vars(self))

    def mismatch(self, other: Mapping, rank: int, where: Path) -> ExecutionError | None:
        """An error naming every field where ``other`` (rank 0's) differs, or None."""
        fields = [f"{k} {v!r} here, {other.get(k)!r} at rank 0" for k, v in self.to_json().items()
                  if other.get(k) != v]
        if not fields:
            return None
        if other.get("world") != self.world:
            return ExecutionError(f"{where} was written for {other.get('world')} processes, this run has "
                                  f"{self.world} (a stale file from an earlier run?)")
        return ExecutionError(f"rank {rank} does not match rank 0 ({'; '.join(fields)}): every rank must run the "
                              f"same program with the same N, mode, seed, check, backend and world size")


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
            return Place(r, w, lr, Path(where), _env_run_id(env))
    return None


def _wait_for(path: Path, timeout: float, what: str, place: Place | None = None) -> None:
    """Wait until ``path`` exists; with ``place``, stop at once when another rank of the run has
    reported a failure (:func:`report_failure`)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if place is not None:
            failed = sorted(place.rendezvous.parent.glob(f"{place.rendezvous.name}.{place.run_id or 'run'}.failed*"))
            if failed:
                try:
                    reason = failed[0].read_text()[:2000]
                except OSError:
                    reason = "(unreadable)"
                rank = failed[0].name.rpartition(".failed")[2]
                raise ExecutionError(f"stopped waiting for {what}: rank {rank} failed: {reason}")
        if time.monotonic() > deadline:
            raise ExecutionError(f"waited {timeout:g} s for {what} at {path}; did every process start?")
        time.sleep(0.05)


def report_failure(place: Place, reason: str) -> None:
    """Tell the other ranks of this run that this rank failed (a file they look for while they wait)."""
    try:
        replace_atomically(place.data_path(f"failed{place.rank}"), reason)
    except OSError:
        pass


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def rendezvous(place: Place, identity: RunIdentity | None = None, payload: Mapping | None = None,
               timeout: float = 120.0) -> tuple[Place, dict]:
    """Meet the other ranks through ``place.rendezvous``: rank 0 writes its run id (``place.run_id``,
    or a fresh uuid when the launcher gave none), ``identity`` and ``payload``; every other rank
    waits for a file of its run (one with another run id is an earlier run's, never read as this
    one's) and refuses an identity that differs from its own. Returns ``place`` with the run id,
    and the data rank 0 wrote."""
    if place.rank == 0:
        run_id = place.run_id or uuid.uuid4().hex
        data = {"run_id": run_id, "world": place.world,
                "identity": None if identity is None else identity.to_json(), **(payload or {})}
        place.rendezvous.parent.mkdir(parents=True, exist_ok=True)
        replace_atomically(place.rendezvous, json.dumps(data))
        return replace(place, run_id=run_id), data
    deadline = time.monotonic() + timeout
    seen = None
    while True:
        data = _read_json(place.rendezvous) if place.rendezvous.exists() else None
        if data is not None:
            seen = data.get("run_id")
            if place.run_id is None or seen == place.run_id:
                break
        if time.monotonic() > deadline:
            if seen is not None:
                raise ExecutionError(f"{place.rendezvous} holds run {seen}, not this run {place.run_id}: a stale file "
                                     f"of an earlier run, and rank 0 of this run did not write it in {timeout:g} s")
            raise ExecutionError(f"waited {timeout:g} s for the rendezvous data of rank 0 at {place.rendezvous}; "
                                 "did every process start?")
        time.sleep(0.05)
    if data.get("world") != place.world:
        raise ExecutionError(f"{place.rendezvous} was written for {data.get('world')} processes, this run has "
                             f"{place.world} (a stale file from an earlier run?)")
    place = replace(place, run_id=data.get("run_id"))
    if identity is not None:
        error = identity.mismatch(data.get("identity") or {}, place.rank, place.rendezvous)
        if error is not None:
            report_failure(place, str(error))
            raise error
    return place, data


def exchange_ids(groups: Sequence[tuple[int, ...]], place: Place, make_id: Callable[[], tuple] | None = None,
                 timeout: float = 120.0, identity: RunIdentity | None = None) -> tuple[Place, dict[tuple, tuple]]:
    """One NCCL unique id per device group, created by rank 0 and read by every rank from
    ``place.rendezvous`` (``make_id``: default ``nccl.get_unique_id``), with :func:`rendezvous`'s
    checks: ``place`` with the run id, and the ids."""
    payload = None
    if place.rank == 0:
        if make_id is None:
            from cupy.cuda import nccl

            make_id = nccl.get_unique_id
        payload = {"ids": {json.dumps(list(g)): list(make_id()) for g in groups}}
    place, data = rendezvous(place, identity, payload, timeout)
    got = {tuple(json.loads(k)): tuple(v) for k, v in (data.get("ids") or {}).items()}
    missing = [g for g in groups if g not in got]
    if missing:
        raise ExecutionError(f"{place.rendezvous} lacks the ids of device groups {missing}")
    return place, got


def gather_stores(stores: Sequence[Mapping[Mem, np.ndarray]], chips: Sequence[int], place: Place,
                  timeout: float = 600.0, identity: RunIdentity | None = None) -> list[dict[Mem, np.ndarray]] | None:
    """Every chip's stores at rank 0 (None on the other ranks): rank r writes the stores of its
    ``chips`` beside the rendezvous file (named with the run id, with its identity); rank 0 reads
    them all and refuses a rank whose identity differs from its own."""
    def path(r: int) -> Path:
        return place.data_path(f"stores{r}.npz")

    arrays = {f"{c}|{m}": a for c, s in zip(chips, stores) for m, a in s.items()}
    arrays["__chips__"] = np.array(chips, dtype=np.int64)
    ident = json.dumps(None if identity is None else identity.to_json()).encode()
    arrays["__identity__"] = np.frombuffer(ident, dtype=np.uint8)
    replace_atomically(path(place.rank), lambda f: np.savez(f, **arrays))
    if place.rank != 0:
        return None
    out: dict[int, dict[Mem, np.ndarray]] = {}
    for r in range(place.world):
        _wait_for(path(r), timeout, f"the stores of rank {r}", place)
        with np.load(path(r), allow_pickle=False) as f:
            theirs = json.loads(bytes(f["__identity__"]).decode()) if "__identity__" in f.files else None
            if identity is not None and theirs != identity.to_json():
                error = RunIdentity(**theirs).mismatch(identity.to_json(), r, path(r)) if isinstance(theirs, dict) \
                    else None
                raise error or ExecutionError(f"rank {r}'s stores at {path(r)} are not of this run")
            for c in f["__chips__"]:
                out.setdefault(int(c), {})
            for key in f.files:
                if key not in ("__chips__", "__identity__"):
                    c, name = key.split("|", 1)
                    term, limb = name[:-1].rsplit("(", 1)
                    out[int(c)][Mem(term, int(limb))] = f[key]
    return [out.get(c, {}) for c in range(max(out) + 1)] if out else []


def clean_up(place: Place) -> list[Path]:
    """Remove the files of this run (its data files and a rendezvous file of this run id); the paths removed."""
    if place.run_id is None:
        return []
    paths = list(place.rendezvous.parent.glob(f"{place.rendezvous.name}.{place.run_id}.*"))
    data = _read_json(place.rendezvous) if place.rendezvous.exists() else None
    if data is not None and data.get("run_id") == place.run_id:
        paths.append(place.rendezvous)
    removed = []
    for p in paths:
        try:
            p.unlink()
            removed.append(p)
        except OSError:
            pass
    return removed


def _communicator(nccl, size: int, uid: tuple, rank: int):
    """``ncclCommInitRank``; CuPy takes the id as bytes (recent) or as a tuple of ints (older)."""
    try:
        return nccl.NcclCommunicator(size, bytes(x & 0xFF for x in uid), rank)
    except TypeError:
        return nccl.NcclCommunicator(size, tuple(uid), rank)


class FileFabric(Fabric):
    """Collectives between processes through files beside the rendezvous file (NCCL's semantics,
    like :class:`~caramel.execute.fabric.threads.FakeNetwork`): the CPU stand-in for NCCL that lets the
    whole process mode run, and be tested, without GPUs. The k-th call on a device group is
    ``<rendezvous>.g<group>.c<k>.r<rank>.npy`` for every member that sends."""

    def __init__(self, place: Place, timeout: float):
        self.device, self.place, self.timeout = place.rank, place, timeout
        self.calls: dict[tuple[int, ...], int] = {}

    def _path(self, op: RowOp, k: int, rank: int) -> Path:
        g = "-".join(map(str, op.group))
        return self.place.data_path(f"g{g}.c{k}.r{rank}.npy")

    def group(self, backend, ops) -> None:
        posted = []
        for op in ops:
            k = self.calls.get(op.group, 0)
            self.calls[op.group] = k + 1
            if op.send >= 0:
                data = backend.read(np.arange(op.send, op.send + op.rows))
                replace_atomically(self._path(op, k, self.device), lambda f, data=data: np.save(f, data))
            posted.append((op, k))
        for op, k in posted:
            if op.recv < 0:
                continue
            senders = [op.root] if op.kind is CollectiveKind.BROADCAST else list(op.group)
            sent = {}
            for r in senders:
                path = self._path(op, k, r)
                _wait_for(path, self.timeout, f"device {r}'s part of {op.kind.value} id {op.sync} among {op.group}",
                          self.place)
                sent[r] = np.load(path, allow_pickle=False)
            backend.write(np.arange(op.recv, op.recv + op.rows), collective_result(op, sent))


def run_distributed(plan, ctx, memory, mode, place: Place, *, backend: str = "gpu", graph: bool = True,
                    timeout: float = 300.0, streams: int | None = None,
                    identity: RunIdentity | None = None) -> RunResult | None:
    """Run this process's device of ``plan`` (see the module docstring) on a GPU over NCCL
    (``backend="gpu"``) or on NumPy over :class:`FileFabric` (``"cpu-plan"``); the merged result
    on rank 0, None elsewhere. Every rank first meets rank 0 (:func:`rendezvous`; ``identity``
    checked); rank 0 removes the run's files once it has gathered the stores."""
    def log(text: str) -> None:  # each phase, so that a stalled process says where it is
        logging.getLogger("caramel.distributed").info("rank %d/%d: %s", place.rank, place.world, text)

    if place.world > len(plan.chips):
        raise ExecutionError(f"{place.world} processes for a {len(plan.chips)}-chip program: use at most one per chip")
    progs = device_programs(plan, place.world, ctx.primes)
    chips = list(progs[place.rank].chips)
    if backend == "gpu":
        mine, place = _gpu_stores(plan, ctx, memory, mode, place, progs, graph, timeout, streams, log, identity)
    else:
        from caramel.backends.numpy_backend import NumpyBackend

        place, _ = rendezvous(place, identity, timeout=timeout)
        check_plan_memory(plan, ctx, memory)
        run = DeviceRun(progs[place.rank], plan, ctx, memory, mode, NumpyBackend, FileFabric(place, timeout))
        run.run()
        mine = run.stores()
    log("ran; gathering the outputs")
    stores = gather_stores(mine, chips, place, timeout, identity)
    if stores is None:
        return None
    clean_up(place)
    return merge_results(plan, memory, [(tuple(range(len(stores))), stores)])


def _gpu_stores(plan, ctx, memory, mode, place: Place, progs, graph: bool, timeout: float, streams: int | None,
                log, identity: RunIdentity | None = None) -> tuple[list[dict], Place]:
    """This rank's device on its GPU: NCCL communicators from the shared ids, a one-device
    :class:`~caramel.execute.cuda_graph.MultiGpuRun`; the stores of its chips."""
    import cupy as cp
    from cupy.cuda import nccl

    from caramel.execute.cuda_graph import MultiGpuRun
    from caramel.execute.fabric.nccl import nccl_environment

    nccl_environment()
    groups = device_groups(progs)
    place, ids = exchange_ids(groups, place, None, timeout, identity)
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
        run.run(graph)
        mine = run.result()
    for comm in comms[place.rank].values():  # after close() dropped the graph (MultiGpuRun.close)
        comm.destroy()
    log("communicators destroyed")
    return [mine.stores[c] for c in progs[place.rank].chips], place


__all__ = ["Place", "RunIdentity", "clean_up", "exchange_ids", "gather_stores", "launch_env", "rendezvous",
           "run_distributed"]


def check_digest(spec) -> str | None:
    """SHA-256 of a check spec's file (its text), or of its repr when it has no file; None without a check."""
    import hashlib

    if spec is None:
        return None
    path = getattr(spec, "path", None)
    try:
        data = Path(path).read_bytes() if path else repr(spec).encode()
    except OSError:
        data = repr(spec).encode()
    return hashlib.sha256(data).hexdigest()
