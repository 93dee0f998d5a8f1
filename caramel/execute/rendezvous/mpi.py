"""The rendezvous through MPI (mpi4py) under mpirun, mpiexec or srun: no shared file.

The ranks are MPI_COMM_WORLD's (checked against the launcher's variables); the hellos, NCCL ids
and results travel as MPI messages on a communicator of caramel's own (a duplicate of
COMM_WORLD), pickled within the job. A receive polls (``improbe``) so that it can time out.
:meth:`MpiRendezvous.fail` prints the reason and aborts the whole job (``MPI_Abort``): the
other ranks may be blocked in a receive or a collective that nothing else would end. MPI is
finalized at :meth:`~MpiRendezvous.close` when this rendezvous initialised it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from caramel.errors import ExecutionError
from caramel.execute.rendezvous.base import Disagreement, Rendezvous, RunIdentity, disagreements, hello

#: The exit status of a job that :meth:`MpiRendezvous.fail` aborts (caramel's "error" status).
ABORT_STATUS = 2
_POLL = 0.002


class MpiRendezvous(Rendezvous):
    """The MPI way for ``place`` (its rank and world must be MPI_COMM_WORLD's)."""

    def __init__(self, place, comm=None):
        owned = "mpi4py.MPI" not in sys.modules
        try:
            from mpi4py import MPI
        except ImportError as exc:
            raise ExecutionError(f"the MPI rendezvous needs mpi4py (pip install mpi4py): {exc}") from None
        self.mpi = MPI
        self._owned = owned and comm is None
        world = comm if comm is not None else MPI.COMM_WORLD
        if (world.Get_rank(), world.Get_size()) != (place.rank, place.world):
            raise ExecutionError(f"MPI says rank {world.Get_rank()} of {world.Get_size()}, the launcher's variables "
                                 f"rank {place.rank} of {place.world}: is mpi4py's MPI the launcher's? (under srun: "
                                 "srun --mpi=pmix or pmi2; or set CARAMEL_RENDEZVOUS_BACKEND=file and "
                                 "CARAMEL_RENDEZVOUS)")
        self.comm = world.Dup()
        self.rank, self.world, self.run_id = place.rank, place.world, place.run_id
        self._pending: list = []  # sends not known to be complete (isend: two ranks may send to each other at once)

    def meet(self, identity: RunIdentity | None, timeout: float) -> None:
        hellos = self.comm.allgather(hello(self.rank, self.world, self.run_id, identity))
        problem = disagreements(hellos)
        if problem is not None:
            raise Disagreement(f"the ranks disagree: {problem}")
        self.run_id = hellos[0]["run_id"] or hellos[0]["token"]

    def send(self, dest: int, tag: str, value: Any) -> None:
        self._pending.append(self.comm.isend((tag, value), dest=dest, tag=0))
        self._complete()

    def _complete(self) -> None:
        self._pending = [r for r in self._pending if not r.Test()]

    def receive(self, source: int, tag: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            message = self.comm.improbe(source=source, tag=0)
            if message is not None:
                got, value = message.recv()
                if got != tag:
                    raise ExecutionError(f"rank {source} sent {got}, rank {self.rank} expected {tag}: the ranks run "
                                         "different steps")
                return value
            self._complete()
            if time.monotonic() > deadline:
                raise ExecutionError(f"waited {timeout:g} s for {tag} from rank {source} (MPI)")
            time.sleep(_POLL)

    def broadcast(self, tag: str, value: Any, timeout: float, root: int = 0) -> Any:
        return self.comm.bcast(value, root=root)

    def gather(self, tag: str, value: Any, timeout: float, root: int = 0) -> list | None:
        return self.comm.gather(value, root=root)

    def allgather(self, tag: str, value: Any, timeout: float) -> list:
        return self.comm.allgather(value)

    def fail(self, reason: str) -> None:
        print(f"caramel: error: rank {self.rank}: {reason}", file=sys.stderr, flush=True)
        self.comm.Abort(ABORT_STATUS)

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is None:
            return
        for request in self._pending:  # every value sent is delivered before this end goes
            request.wait()
        self._pending = []
        if self._owned and not self.mpi.Is_finalized():
            self.mpi.Finalize()


__all__ = ["ABORT_STATUS", "MpiRendezvous"]
