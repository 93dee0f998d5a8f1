"""The rendezvous of a partitioned run on a Dask cluster (:mod:`caramel.cluster`): worker to worker.

Every worker runs caramel's plugin (:class:`caramel.cluster.CaramelPlugin`), which keeps a
:class:`PostOffice`: one :class:`Mailbox` per rank of a run on that worker, and two handlers on
the worker's server (:meth:`PostOffice.install`): :data:`PUT` (a value for a rank) and
:data:`ABORT` (a rank of the run failed). A rank sends a value straight to the worker of the
rank it is for, over Dask's comms (the worker's ``rpc`` pool, NumPy arrays as frames: no file,
no scheduler in between), and waits for its own values on its own mailbox (a thread condition,
no network). The client that started the run, or a failing rank, aborts the mailboxes of the
ranks still running: a rank waiting for a value stops at once with the reason, and one blocked
elsewhere (an NCCL collective) through the hooks of :meth:`DaskRendezvous.on_abort`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Sequence

from caramel.errors import ExecutionError
from caramel.execute.rendezvous.base import PeerFailed, Rendezvous

#: The names of the worker handlers (:meth:`PostOffice.install`).
PUT, ABORT = "caramel_put", "caramel_abort"
#: Seconds between two looks at this rank's abort while a send is on its way.
WATCH = 0.5
#: Runs whose mailboxes closed, remembered so that a late value does not open them again.
REMEMBERED = 1024


class Mailbox:
    """The values sent to one rank of one run, by (source rank, tag); thread-safe."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, str], Any] = {}
        self._cond = threading.Condition()
        self.aborted: tuple[int | None, str] | None = None  # (the rank that failed or None: the client, why)
        self._hooks: list[Callable[[], None]] = []

    def put(self, source: int, tag: str, value: Any) -> None:
        with self._cond:
            if (source, tag) in self._items:
                raise ExecutionError(f"rank {source} sent {tag} twice")
            self._items[(source, tag)] = value
            self._cond.notify_all()

    def take(self, source: int, tag: str, timeout: float) -> Any:
        key = (source, tag)
        with self._cond:
            self._cond.wait_for(lambda: key in self._items or self.aborted is not None, timeout)
            if key in self._items:
                return self._items.pop(key)
            self.raise_aborted()
        raise ExecutionError(f"waited {timeout:g} s for {tag} from rank {source}")

    def raise_aborted(self) -> None:
        if self.aborted is not None:
            rank, reason = self.aborted
            raise ExecutionError(reason) if rank is None else PeerFailed(rank, reason)

    def abort(self, rank: int | None, reason: str) -> None:
        with self._cond:
            if self.aborted is not None:
                return
            self.aborted = (rank, reason)
            self._cond.notify_all()
            hooks = list(self._hooks)
        for hook in hooks:  # each in a thread: a hook (an NCCL abort) must not hold the worker's event loop
            threading.Thread(target=hook, name="caramel-abort-hook", daemon=True).start()

    def on_abort(self, hook: Callable[[], None]) -> None:
        with self._cond:
            self._hooks.append(hook)
            late = self.aborted is not None
        if late:
            threading.Thread(target=hook, name="caramel-abort-hook", daemon=True).start()


class PostOffice:
    """The mailboxes of the ranks on one worker, by (run token, rank)."""

    def __init__(self) -> None:
        self._boxes: dict[tuple[str, int], Mailbox] = {}
        self._closed: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._lock = threading.Lock()

    def install(self, worker) -> None:
        """Add the :data:`PUT` and :data:`ABORT` handlers to ``worker``'s server."""
        worker.handlers[PUT] = self.handle_put
        worker.handlers[ABORT] = self.handle_abort

    def box(self, token: str, rank: int) -> Mailbox | None:
        """The mailbox of ``rank`` of run ``token`` (made on first use); None once the run closed here."""
        with self._lock:
            if (token, rank) in self._closed:
                return None
            return self._boxes.setdefault((token, rank), Mailbox())

    def close(self, token: str, rank: int) -> None:
        with self._lock:
            self._boxes.pop((token, rank), None)
            self._closed[(token, rank)] = None
            while len(self._closed) > REMEMBERED:
                self._closed.popitem(last=False)

    async def handle_put(self, token: str, rank: int, source: int, tag: str, value: Any = None) -> str:
        box = self.box(token, rank)
        if box is not None:  # a value for a run that ended here is dropped
            box.put(source, tag, value)
        return "OK"

    async def handle_abort(self, token: str, rank: int, origin: int | None, reason: str) -> str:
        box = self.box(token, rank)
        if box is not None:
            box.abort(origin, reason)
        return "OK"


class DaskRendezvous(Rendezvous):
    """Rank ``rank`` of ``len(addresses)`` ranks of run ``token``, rank r on the worker at
    ``addresses[r]``; this task's ``worker`` and its :class:`PostOffice` ``office``."""

    def __init__(self, rank: int, addresses: Sequence[str], token: str, worker, office: PostOffice,
                 timeout: float = 300.0):
        self.rank, self.world, self.run_id, self.timeout = rank, len(addresses), token, timeout
        self.addresses, self.worker, self.office = list(addresses), worker, office
        box = office.box(token, rank)
        if box is None:
            raise ExecutionError(f"run {token} has ended on this worker")
        self.box = box

    def _call(self, dest: int, op: str, **msg):
        """Start handler ``op`` on rank ``dest``'s worker (from this task's thread): a concurrent future."""
        async def call():
            return await getattr(self.worker.rpc(self.addresses[dest]), op)(**msg)
        return asyncio.run_coroutine_threadsafe(call(), self.worker.loop.asyncio_loop)

    def send(self, dest: int, tag: str, value: Any) -> None:
        """Deliver ``value`` to rank ``dest``'s worker; while it is on its way, look every
        :data:`WATCH` seconds whether this rank was aborted (a lost worker may never answer)."""
        from distributed.protocol import to_serialize

        done = self._call(dest, PUT, token=self.run_id, rank=dest, source=self.rank, tag=tag, value=to_serialize(value))
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                done.result(timeout=WATCH)
                return
            except TimeoutError:
                pass
            except ExecutionError:
                raise
            except Exception as exc:  # noqa: BLE001 (Dask's errors for a worker that went away vary)
                raise ExecutionError(f"cannot reach rank {dest} at {self.addresses[dest]}: {type(exc).__name__}: "
                                     f"{exc} (its worker lost?)") from None
            self.box.raise_aborted()
            if time.monotonic() > deadline:
                done.cancel()
                raise ExecutionError(f"waited {self.timeout:g} s to send {tag} to rank {dest} at "
                                     f"{self.addresses[dest]}")

    def receive(self, source: int, tag: str, timeout: float) -> Any:
        return self.box.take(source, tag, timeout)

    def fail(self, reason: str, origin: int | None = None) -> None:
        """Abort every other rank's mailbox (not the one whose failure this passes on), waiting at
        most a few seconds for their workers."""
        calls = [self._call(r, ABORT, token=self.run_id, rank=r, origin=self.rank if origin is None else origin,
                            reason=reason) for r in range(self.world) if r not in (self.rank, origin)]
        deadline = time.monotonic() + 5
        for call in calls:
            try:
                call.result(timeout=max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 (best effort: that rank's worker may be gone too)
                call.cancel()

    def on_abort(self, hook: Callable[[], None]) -> None:
        self.box.on_abort(hook)

    def close(self) -> None:
        self.office.close(self.run_id, self.rank)


__all__ = ["ABORT", "DaskRendezvous", "Mailbox", "PUT", "PostOffice", "WATCH"]
