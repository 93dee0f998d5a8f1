"""Collectives between processes as point-to-point messages: the CPU backend's fabric over any
:class:`~caramel.execute.rendezvous.Rendezvous` (a file, MPI, a TCP store, Dask's worker-to-worker
comms), with NCCL's semantics (:class:`~caramel.execute.fabric.threads.FakeNetwork`'s).

The k-th call on a device group carries the tag ``g<group>.c<k>`` (every member issues the same
calls in the same order). A BROADCAST: the root sends its rows to every other member, which
receives them into its ``recv`` rows; a REDUCE: every member but the root sends its rows to the
root, which sums them with its own (uint32, wrapping) into its ``recv`` rows. Within one group
every send is posted before the first receive, as NCCL's group calls do not block in between.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from caramel.execute.fabric import Fabric, RowOp, collective_result
from caramel.plan.collectives import CollectiveKind


class MessageFabric(Fabric):
    """One process's device ``device`` of a run whose collectives travel as messages through
    ``send(dest, tag, rows)`` and ``receive(source, tag, timeout)`` (module docstring)."""

    def __init__(self, device: int, send: Callable[[int, str, Any], None],
                 receive: Callable[[int, str, float], Any], timeout: float):
        self.device, self.send, self.receive, self.timeout = device, send, receive, timeout
        self.calls: dict[tuple[int, ...], int] = {}

    def group(self, backend, ops: Sequence[RowOp]) -> None:
        posted = []
        for op in ops:
            k = self.calls.get(op.group, 0)
            self.calls[op.group] = k + 1
            tag = f"g{'-'.join(map(str, op.group))}.c{k}"
            mine = None
            if op.send >= 0:
                mine = backend.read(np.arange(op.send, op.send + op.rows))
            elif op.kind is CollectiveKind.BROADCAST and self.device == op.root:
                mine = backend.read(np.arange(op.recv, op.recv + op.rows))  # NCCL broadcasts the root's rows in place
            if op.kind is CollectiveKind.BROADCAST:
                if self.device == op.root:
                    for member in op.group:
                        if member != op.root:
                            self.send(member, tag, mine)
            elif self.device != op.root:
                self.send(op.root, tag, mine)
            posted.append((op, tag, mine))
        for op, tag, mine in posted:
            if op.recv < 0 or (op.kind is CollectiveKind.REDUCE and self.device != op.root):
                continue  # only the root receives a reduce
            if op.kind is CollectiveKind.BROADCAST:
                rows = mine if self.device == op.root else self.receive(op.root, tag, self.timeout)
                sent = {op.root: rows}
            else:
                sent = {m: (mine if m == self.device else self.receive(m, tag, self.timeout)) for m in op.group}
                sent = {m: v for m, v in sent.items() if v is not None}  # a sourceless member adds zero
            backend.write(np.arange(op.recv, op.recv + op.rows), collective_result(op, sent))


__all__ = ["MessageFabric"]
