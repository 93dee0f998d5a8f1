"""The rendezvous of a partitioned run on a Dask cluster (:mod:`caramel.cluster`): worker to worker.

Each rank has a :class:`Mailbox`, a Dask actor on its worker; a value for rank d is put into d's
mailbox straight from the sender's worker (Dask's worker-to-worker comms, no file, no scheduler
in between), and rank d takes it from its own. The client that started the run (or a failing
rank) aborts the mailboxes of the ranks still running: a rank waiting in :meth:`Mailbox.take`
stops at once with the reason, and one blocked elsewhere (an NCCL collective) through the hook
of :meth:`DaskRendezvous.on_abort`, which a thread calls when its mailbox is aborted.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Sequence

from caramel.errors import ExecutionError
from caramel.execute.rendezvous import Rendezvous

#: Seconds between two looks at this rank's mailbox for an abort (:meth:`DaskRendezvous.on_abort`).
WATCH = 0.5


class Mailbox:
    """Values sent to one rank, by (source rank, tag); a Dask actor (``client.submit(Mailbox,
    actor=True, workers=[...])``). Its methods are coroutines: they run on the worker's event loop,
    so a waiting :meth:`take` never blocks a :meth:`put`."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, str], Any] = {}
        self._arrived: dict[tuple[int, str], asyncio.Event] = {}
        self._aborted: str | None = None
        self._abort: asyncio.Event | None = None

    def _event(self, key) -> asyncio.Event:
        if key not in self._arrived:
            self._arrived[key] = asyncio.Event()
        return self._arrived[key]

    async def put(self, source: int, tag: str, value: Any) -> None:
        key = (source, tag)
        if key in self._items:
            raise ExecutionError(f"rank {source} sent {tag} twice")
        self._items[key] = value
        self._event(key).set()

    async def take(self, source: int, tag: str, timeout: float) -> Any:
        key = (source, tag)
        if key not in self._items and self._aborted is None:
            if self._abort is None:
                self._abort = asyncio.Event()
            waits = [asyncio.ensure_future(self._event(key).wait()), asyncio.ensure_future(self._abort.wait())]
            try:
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        if key not in self._items:
            if self._aborted is not None:
                raise ExecutionError(self._aborted)
            raise ExecutionError(f"waited {timeout:g} s for {tag} from rank {source}")
        self._arrived.pop(key, None)
        return self._items.pop(key)

    async def abort(self, reason: str) -> None:
        if self._aborted is None:
            self._aborted = reason
        if self._abort is None:
            self._abort = asyncio.Event()
        self._abort.set()

    async def aborted(self) -> str | None:
        return self._aborted


class DaskRendezvous(Rendezvous):
    """Rank ``rank`` of ``len(mailboxes)``: the Dask actors of every rank's :class:`Mailbox`."""

    def __init__(self, rank: int, mailboxes: Sequence, run_id: str | None = None):
        self.rank, self.world, self.run_id = rank, len(mailboxes), run_id
        self.mailboxes = list(mailboxes)
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def send(self, dest: int, tag: str, value: Any) -> None:
        self.mailboxes[dest].put(self.rank, tag, value).result()

    def receive(self, source: int, tag: str, timeout: float) -> Any:
        return self.mailboxes[self.rank].take(source, tag, timeout).result()

    def fail(self, reason: str) -> None:
        for r, box in enumerate(self.mailboxes):
            if r != self.rank:
                try:
                    box.abort(f"rank {self.rank} failed: {reason}").result(timeout=5)
                except Exception:  # noqa: BLE001 (best effort: that rank's worker may be gone too)
                    pass

    def on_abort(self, hook: Callable[[], None]) -> None:
        box = self.mailboxes[self.rank]

        def watch() -> None:
            while not self._stop.wait(WATCH):
                try:
                    if box.aborted().result(timeout=30) is not None:
                        hook()
                        return
                except Exception:  # noqa: BLE001 (the worker is going away: nothing left to abort)
                    return
        self._watcher = threading.Thread(target=watch, name=f"caramel-abort-watch-{self.rank}", daemon=True)
        self._watcher.start()

    def close(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(WATCH * 4)


__all__ = ["DaskRendezvous", "Mailbox", "WATCH"]
