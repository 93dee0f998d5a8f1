"""Process mode: one process per GPU, possibly on several machines, under a standard launcher
(or one rank per worker of a Dask cluster, :mod:`caramel.cluster`).

Each process reads its place from the launcher's variables (:func:`launch_env`: torchrun and
:func:`caramel.launch.launch`, Open MPI's mpirun, srun, MPICH). Process r drives device r of the
run (of WORLD_SIZE devices) on its CUDA device LOCAL_RANK, with the same plan, the same inputs
(generated from the same seed) and the same device programs as the threaded executor
(:class:`~caramel.execute.cuda_graph.MultiGpuRun` with ``hosted=[r]``).

The ranks meet and talk through a :class:`~caramel.execute.rendezvous.Rendezvous` (MPI under
mpirun/srun, torch's store under torchrun, a file beside ``CARAMEL_RENDEZVOUS`` otherwise; Dask's
worker-to-worker comms on a cluster): every rank's hello is compared first (world size, run,
program, N, mode, seeds, check, backend: a disagreement fails every rank within seconds, naming
it); rank 0 creates one NCCL unique id per device group and broadcasts them; at the end rank 0
gathers every rank's chip stores and merges them into one :class:`~caramel.execute.result.RunResult`.

With ``--backend cpu-plan`` the processes run on NumPy and exchange limbs as messages through the
same rendezvous (:class:`~caramel.execute.fabric.messages.MessageFabric`): the whole process mode
runs and is tested without GPUs. Each process logs its phases; its communicators are destroyed
only after its CUDA graph is gone (:meth:`MultiGpuRun.close
<caramel.execute.cuda_graph.MultiGpuRun.close>` says why).

Example (one machine, 2 GPUs)::

    caramel launch --nproc 2 -- run programs/Mul_4L_2c --n 4096 --backend gpu
    # or, with torchrun:  torchrun --nproc-per-node 2 -m caramel.cli run programs/Mul_4L_2c --backend gpu --distributed
    # or, with MPI:       mpirun -n 2 caramel run programs/Mul_4L_2c --backend gpu --distributed
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.execute.memory import check_plan_memory
from caramel.execute.placement import device_groups, device_programs
from caramel.execute.rendezvous import Rendezvous, RunIdentity
from caramel.execute.result import RunResult, merge_results
from caramel.execute.runner import DeviceRun
from caramel.program import Mem

_ENV = (("RANK", "WORLD_SIZE", "LOCAL_RANK"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"))


@dataclass(frozen=True)
class Place:
    """This process: ``rank`` of ``world`` processes, on CUDA device ``local_rank``;
    ``rendezvous``: the file path of the file rendezvous (``CARAMEL_RENDEZVOUS``, None when not
    set); ``run_id``: the launcher's name of the run, when it gives one; ``launcher``: the pid of the
    ``caramel launch`` that started the ranks (``CARAMEL_LAUNCHER``), which starts one process per rank."""

    rank: int
    world: int
    local_rank: int
    rendezvous: Path | None = None
    run_id: str | None = None
    launcher: int | None = None


#: Variables that name one run of a launcher, in the order tried: every rank of a run sees the same.
_RUN_ID_ENV = ("CARAMEL_RUN_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")


def _env_run_id(env: Mapping[str, str]) -> str | None:
    for name in _RUN_ID_ENV:
        if env.get(name):
            return env[name]
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    return None


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
            where, launcher = env.get("CARAMEL_RENDEZVOUS"), env.get("CARAMEL_LAUNCHER", "")
            return Place(r, w, lr, Path(where) if where else None, _env_run_id(env),
                         int(launcher) if launcher.isdigit() else None)
    return None


def _communicator(nccl, size: int, uid: tuple, rank: int):
    """``ncclCommInitRank``; CuPy takes the id as bytes (recent) or as a tuple of ints (older)."""
    try:
        return nccl.NcclCommunicator(size, bytes(x & 0xFF for x in uid), rank)
    except TypeError:
        return nccl.NcclCommunicator(size, tuple(uid), rank)


def _stores_payload(chips: Sequence[int], stores: Sequence[Mapping[Mem, np.ndarray]]) -> list:
    """A rank's chip stores as a rendezvous value: ``[[chip, [[term, limb, limb values], ...]], ...]``."""
    return [[int(c), [[m.term, int(m.limb), np.asarray(a)] for m, a in s.items()]] for c, s in zip(chips, stores)]


def _stores_of(payload) -> tuple[list[int], list[dict[Mem, np.ndarray]]]:
    chips = [int(c) for c, _ in payload]
    return chips, [{Mem(str(t), int(l)): a for t, l, a in entries} for _, entries in payload]


def run_distributed(plan, ctx, memory, mode, place: Place, rdv: Rendezvous, *, backend: str = "gpu",
                    graph: bool = True, timeout: float = 300.0, streams: int | None = None) -> RunResult | None:
    """Run this process's device of ``plan`` (see the module docstring) on a GPU over NCCL
    (``backend="gpu"``) or on NumPy over messages (``"cpu-plan"``), through ``rdv``, the run's
    rendezvous, met already (:meth:`~caramel.execute.rendezvous.Rendezvous.meet`, where the
    ranks compared their identities); the merged result on rank 0, None elsewhere."""
    def log(text: str) -> None:  # each phase, so that a stalled process says where it is
        logging.getLogger("caramel.distributed").info("rank %d/%d: %s", place.rank, place.world, text)

    if place.world > len(plan.chips):
        raise ExecutionError(f"{place.world} processes for a {len(plan.chips)}-chip program: use at most one per chip")
    progs = device_programs(plan, place.world, ctx.primes)
    chips = list(progs[place.rank].chips)
    if backend == "gpu":
        mine = _gpu_stores(plan, ctx, memory, mode, place, rdv, progs, graph, timeout, streams, log)
    else:
        from caramel.backends.numpy_backend import NumpyBackend

        check_plan_memory(plan, ctx, memory)
        run = DeviceRun(progs[place.rank], plan, ctx, memory, mode, NumpyBackend, rdv.fabric(place.rank, timeout))
        run.run()
        mine = run.stores()
    log("ran; gathering the outputs at rank 0")
    parts = rdv.gather("stores", _stores_payload(chips, mine), timeout)
    if parts is None:
        return None
    return merge_results(plan, memory, [_stores_of(p) for p in parts])


def _gpu_stores(plan, ctx, memory, mode, place: Place, rdv: Rendezvous, progs, graph: bool, timeout: float,
                streams: int | None, log) -> list[dict]:
    """This rank's device on its GPU: NCCL communicators from the ids rank 0 broadcast, a
    one-device :class:`~caramel.execute.cuda_graph.MultiGpuRun`; the stores of its chips."""
    from cupy.cuda import nccl

    from caramel.backends.cuda.device import on_device
    from caramel.execute.cuda_graph import MultiGpuRun
    from caramel.execute.fabric.nccl import nccl_environment

    nccl_environment()
    groups = device_groups(progs)
    made = [[list(g), [int(x) for x in nccl.get_unique_id()]] for g in groups] if place.rank == 0 else None
    ids = {tuple(g): tuple(uid) for g, uid in rdv.broadcast("nccl-ids", made, timeout)}
    missing = [g for g in groups if g not in ids]
    if missing:
        raise ExecutionError(f"rank 0 sent no NCCL id for device groups {missing}")
    log(f"NCCL ids of {len(groups)} device group(s) received")
    comms: dict[int, dict] = {place.rank: {}}
    with on_device(place.local_rank):
        for g in groups:  # the same order on every rank
            if place.rank in g:
                comms[place.rank][g] = _communicator(nccl, len(g), ids[g], g.index(place.rank))
    log(f"communicators created on CUDA device {place.local_rank}")

    def abort() -> None:  # another rank failed while this one may wait in a collective
        for comm in comms[place.rank].values():
            try:
                comm.abort()
            except Exception:  # noqa: BLE001 (best effort: the run is failing already)
                pass
    rdv.on_abort(abort)
    with MultiGpuRun(plan, ctx, memory, mode, place.world, hosted=[place.rank], device_ids=[place.local_rank],
                     timeout=timeout, comms=comms, streams=streams) as run:
        log("set up (inputs uploaded, kernels loaded)")
        run.run(graph)
        mine = run.result()
    for comm in comms[place.rank].values():  # after close() dropped the graph (MultiGpuRun.close)
        comm.destroy()
    log("communicators destroyed")
    return [mine.stores[c] for c in progs[place.rank].chips]


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


__all__ = ["Place", "RunIdentity", "check_digest", "launch_env", "run_distributed"]
