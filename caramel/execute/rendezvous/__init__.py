"""How the ranks of one process-mode run meet and talk: one small interface, one file per way.

A :class:`Rendezvous` is one process's end: its ``rank`` of ``world``; :meth:`~Rendezvous.meet`
(every rank's hello compared, a disagreement named within seconds), point-to-point
:meth:`~Rendezvous.send` / :meth:`~Rendezvous.receive` of tagged values, and the collectives built
on them (:meth:`~Rendezvous.broadcast` of the NCCL ids, :meth:`~Rendezvous.gather` of the results at
rank 0); :meth:`~Rendezvous.fail` tells the other ranks that this one failed, so that none waits on it.
The CPU backend's limbs go through the same channel (:meth:`~Rendezvous.fabric`,
:class:`~caramel.execute.fabric.messages.MessageFabric`).

The implementations, chosen by :func:`select` (``$CARAMEL_RENDEZVOUS_BACKEND`` overrides):

=============================  ===========================================  ====================================
launcher                       rendezvous                                   module
=============================  ===========================================  ====================================
mpirun, mpiexec, srun          MPI (mpi4py), when mpi4py imports            :mod:`.mpi`
torchrun                       torch's TCP store, when torch imports        :mod:`.store`
``caramel launch``, any other  a shared file (``CARAMEL_RENDEZVOUS``)       :mod:`.file`
a Dask cluster                 Dask's comms, worker to worker               :mod:`.dask_comms`
=============================  ===========================================  ====================================

Values are JSON-like (None, bool, int, float, str, lists, string-keyed dicts) with NumPy arrays
inside; the file and store ways write them in the format of :func:`encode` (never pickle), MPI and
Dask pickle them within one job.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import Mapping

from caramel.errors import ExecutionError
from caramel.execute.rendezvous.base import (MPI_ENV, TORCHRUN_ENV, Disagreement, PeerFailed, Rendezvous, RunIdentity,
                                             compare, decode, disagreements, encode, hello, who)

#: The names accepted by ``$CARAMEL_RENDEZVOUS_BACKEND``.
KINDS = ("file", "mpi", "store")


def importable(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def select(env: Mapping[str, str] | None = None) -> str:
    """Which rendezvous this process uses (module docstring's table): ``$CARAMEL_RENDEZVOUS_BACKEND``
    when set, else MPI under an MPI launcher when mpi4py imports, else the store under torchrun when
    torch imports, else the file ``$CARAMEL_RENDEZVOUS``."""
    env = os.environ if env is None else env
    forced = env.get("CARAMEL_RENDEZVOUS_BACKEND")
    if forced:
        if forced not in KINDS:
            raise ExecutionError(f"CARAMEL_RENDEZVOUS_BACKEND={forced!r}: choose one of {', '.join(KINDS)}")
        return forced
    if any(v in env for v in MPI_ENV) and importable("mpi4py"):
        return "mpi"
    if any(v in env for v in TORCHRUN_ENV) and "MASTER_PORT" in env and importable("torch"):
        return "store"
    if env.get("CARAMEL_RENDEZVOUS"):
        return "file"
    raise ExecutionError("process mode needs a way for the ranks to meet: mpi4py under mpirun/srun (pip install "
                         "mpi4py), torch under torchrun, or CARAMEL_RENDEZVOUS=PATH, a file path that every process "
                         "can read (e.g. on a shared file system)")


def open_rendezvous(place, env: Mapping[str, str] | None = None, *, kind: str | None = None,
                    timeout: float = 300.0) -> Rendezvous:
    """This process's :class:`Rendezvous` for ``place`` (:func:`caramel.execute.distributed.launch_env`)
    of the way :func:`select` picks (or ``kind``)."""
    env = os.environ if env is None else env
    kind = kind or select(env)
    logging.getLogger("caramel.distributed").info("rank %d/%d: rendezvous through %s", place.rank, place.world,
                                                  {"mpi": "MPI", "store": "torch's TCP store"}.get(
                                                      kind, f"files beside {place.rendezvous}"))
    if kind == "mpi":
        from caramel.execute.rendezvous.mpi import MpiRendezvous

        return MpiRendezvous(place)
    if kind == "store":
        from caramel.execute.rendezvous.store import torch_store_rendezvous

        return torch_store_rendezvous(place, env, timeout)
    from caramel.execute.rendezvous.file import FileRendezvous

    if place.rendezvous is None:
        raise ExecutionError("the file rendezvous needs CARAMEL_RENDEZVOUS: a file path that every process can read "
                             "(e.g. on a shared file system)")
    return FileRendezvous(place)


__all__ = ["Disagreement", "KINDS", "PeerFailed", "Rendezvous", "RunIdentity", "compare", "decode", "disagreements",
           "encode", "hello", "importable", "open_rendezvous", "select", "who"]
