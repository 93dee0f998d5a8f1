"""The rendezvous through a key-value store: torch's TCP store under torchrun (no shared file).

Any store with the methods of ``torch.distributed.Store`` that this uses (``set``, ``get``,
``check``, ``add``, ``delete_key``) works; :func:`torch_store_rendezvous` connects to torchrun's
(the agent's store at ``MASTER_ADDR:MASTER_PORT`` when ``TORCHELASTIC_USE_AGENT_STORE`` is true,
else one that rank 0 hosts there), under a prefix of the run and its restart.

* rank r claims its number (``add("claim<r>", 1)``): a second process with the same RANK gets 2
  and fails at once, telling the first (below);
* a value for rank d under tag t is the key ``m<src>-<d>.<t>`` (:func:`~caramel.execute.rendezvous.encode`'s
  bytes, never pickle), removed once read;
* a failing rank sets ``failed<r>`` to its reason and adds 1 to ``failures``: a rank waiting for a
  value looks at that counter every :data:`CHECK` seconds and stops, naming the rank and its reason.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Mapping

from caramel.errors import ExecutionError
from caramel.execute.rendezvous.base import Disagreement, Rendezvous, decode, encode

#: Seconds between two looks at the failure counter while waiting.
CHECK = 0.5
_POLL = 0.005


class StoreRendezvous(Rendezvous):
    """The store way for ``place`` over ``store`` (a store of this run alone: prefixed)."""

    def __init__(self, store, place):
        self.store = store
        self.rank, self.world, self.run_id = place.rank, place.world, place.run_id
        claims = int(store.add(f"claim{self.rank}", 1))
        if claims > 1:
            error = Disagreement(f"the ranks disagree: two processes are rank {self.rank} of {self.world} (this one "
                                 f"is number {claims} to claim it): every process needs its own RANK")
            self.fail(str(error))  # the first to claim it is waiting: tell it
            raise error

    def send(self, dest: int, tag: str, value: Any) -> None:
        self.store.set(f"m{self.rank}-{dest}.{tag}", encode(value))

    def receive(self, source: int, tag: str, timeout: float) -> Any:
        key = f"m{source}-{self.rank}.{tag}"
        deadline = time.monotonic() + timeout
        checked = 0.0
        while True:
            if self.store.check([key]):
                data = self.store.get(key)
                self.store.delete_key(key)
                return decode(bytes(data), f"{tag} from rank {source}")
            now = time.monotonic()
            if now - checked > CHECK:
                checked = now
                self._check_failures()
            if now > deadline:
                raise ExecutionError(f"waited {timeout:g} s for {tag} from rank {source} (store)")
            time.sleep(_POLL)

    def _check_failures(self) -> None:
        if int(self.store.add("failures", 0)) == 0:
            return
        for r in range(self.world):
            if r != self.rank and self.store.check([f"failed{r}"]):
                raise ExecutionError(f"rank {r} failed: {bytes(self.store.get(f'failed{r}')).decode(errors='replace')}")
        if self.store.check([f"failed{self.rank}"]):  # the other process that claimed this rank
            raise ExecutionError(f"another process at rank {self.rank} failed: "
                                 f"{bytes(self.store.get(f'failed{self.rank}')).decode(errors='replace')}")

    def fail(self, reason: str) -> None:
        try:
            self.store.set(f"failed{self.rank}", reason[:2000].encode())
            self.store.add("failures", 1)
        except Exception:  # noqa: BLE001 (best effort: the store may be gone with rank 0)
            pass


def torch_store_rendezvous(place, env: Mapping[str, str], timeout: float) -> StoreRendezvous:
    """torchrun's store (module docstring), prefixed with ``caramel/<run id>/<restart>/``."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise ExecutionError(f"the store rendezvous needs torch: {exc}") from None
    try:
        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
    except (KeyError, ValueError):
        raise ExecutionError("the store rendezvous needs MASTER_ADDR and MASTER_PORT (torchrun sets them)") from None
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    try:
        store = dist.TCPStore(host, port, is_master=place.rank == 0 and not agent,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False)
    except Exception as exc:  # noqa: BLE001 (torch raises RuntimeError or its own DistError subclasses)
        raise ExecutionError(f"cannot reach the TCP store at {host}:{port}: {exc}") from None
    prefix = f"caramel/{place.run_id or 'run'}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    return StoreRendezvous(dist.PrefixStore(prefix, store), place)


__all__ = ["StoreRendezvous", "torch_store_rendezvous"]
