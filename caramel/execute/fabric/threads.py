"""The in-process fabric: collectives among host threads with NCCL's semantics.

:class:`FakeNetwork` gives each device a :class:`FakeFabric`: broadcast; uint32 SUM reduce that
wraps; the k-th call on a communicator must be the same collective on every member, else an
error; a timeout turns a stall into a :class:`~caramel.errors.DeadlockError` naming the waiting
devices.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from caramel.errors import DeadlockError, ExecutionError
from caramel.execute.fabric import Fabric, RowOp, collective_result


@dataclass
class _Slot:
    ops: dict[int, RowOp] = field(default_factory=dict)
    data: dict[int, np.ndarray] = field(default_factory=dict)
    result: np.ndarray | None = None


class FakeNetwork:
    """In-process collectives among ``gpus`` host threads with NCCL's semantics (see the
    module docstring). ``log[d]`` records, per device, the ops of every group call."""

    def __init__(self, gpus: int, timeout: float = 60.0):
        self.gpus, self.timeout = gpus, timeout
        self.cond = threading.Condition()
        self.calls: dict[tuple[int, ...], list[int]] = {}  # group -> calls issued per device
        self.slots: dict[tuple[tuple[int, ...], int], _Slot] = {}
        self.log: list[list[list[RowOp]]] = [[] for _ in range(gpus)]
        self.failed: BaseException | None = None

    def fabric(self, device: int) -> "FakeFabric":
        return FakeFabric(self, device)

    def abort(self, why: BaseException | None = None) -> None:
        with self.cond:
            self.failed = self.failed or why or ExecutionError("aborted")
            self.cond.notify_all()


class FakeFabric(Fabric):
    def __init__(self, net: FakeNetwork, device: int):
        self.net, self.device = net, device

    def group(self, backend, ops: Sequence[RowOp]) -> None:
        net, d = self.net, self.device
        net.log[d].append(list(ops))
        posted = []
        with net.cond:
            for op in ops:  # post every contribution first (a group does not block in between)
                counts = net.calls.setdefault(op.group, [0] * net.gpus)
                key = (op.group, counts[d])
                counts[d] += 1
                slot = net.slots.setdefault(key, _Slot())
                other = next(iter(slot.ops.values()), None)
                if other is not None and (other.kind, other.root, other.sync, other.rows) != (
                        op.kind, op.root, op.sync, op.rows):
                    err = ExecutionError(
                        f"collective order mismatch on devices {op.group} at call {key[1]}: device {d} "
                        f"issued {op.kind.value} of id {op.sync} (root {op.root}, {op.rows} limbs), another "
                        f"issued {other.kind.value} of id {other.sync} (root {other.root}, {other.rows} limbs)")
                    net.abort(err)
                    raise err
                slot.ops[d] = op
                if op.send >= 0:
                    slot.data[d] = backend.read(np.arange(op.send, op.send + op.rows))
                if len(slot.ops) == len(op.group):
                    slot.result = collective_result(op, slot.data)
                    net.cond.notify_all()
                posted.append((key, op))
            for key, op in posted:
                if op.recv < 0:
                    continue
                slot = net.slots[key]
                ok = net.cond.wait_for(lambda: slot.result is not None or net.failed is not None, net.timeout)
                if net.failed is not None:
                    raise ExecutionError(f"device {d}: stopped, another device failed") from net.failed
                if not ok:
                    missing = sorted(set(op.group) - set(slot.ops))
                    err = DeadlockError(
                        f"device {d} waited {net.timeout:g} s for {op.kind.value} of id {op.sync} among "
                        f"devices {op.group}; device(s) {missing} never issued it")
                    net.abort(err)
                    raise err
                backend.write(np.arange(op.recv, op.recv + op.rows), slot.result)


__all__ = ["FakeFabric", "FakeNetwork"]
