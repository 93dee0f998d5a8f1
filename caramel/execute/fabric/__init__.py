"""The fabric: one device's end of the collective layer, behind one small interface.

:class:`Fabric` ``.group(backend, ops)`` issues the device collectives of one communication step
(:class:`RowOp` s, arena rows resolved) as one group on the backend's current stream. The
implementations, one file each: :mod:`~caramel.execute.fabric.threads` (host threads of one
process, NCCL's semantics on NumPy: the CPU twin that CI runs), :mod:`~caramel.execute.fabric.nccl`
(CUDA devices over NCCL) and, for process mode without GPUs, the file fabric of
:mod:`caramel.execute.distributed`. A run on one device needs no fabric at all.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from caramel.plan.collectives import CollectiveKind


@dataclass(frozen=True)
class RowOp:
    """A device collective with arena rows resolved: ``rows`` contiguous rows from ``send`` /
    ``recv`` (-1 where unused); ``sync`` is the first id it carries."""

    sync: int
    kind: CollectiveKind
    group: tuple[int, ...]
    root: int
    send: int
    recv: int
    rows: int = 1


class Fabric(abc.ABC):
    """One device's end of the collective layer (``device`` is its index among G)."""

    device: int

    @abc.abstractmethod
    def group(self, backend, ops: Sequence[RowOp]) -> None:
        """Issue ``ops`` (in order) as one group on the backend's current stream: BROADCAST from
        the root's ``send`` row into the others' ``recv`` rows; REDUCE: uint32 SUM of every
        member's ``send`` row into the root's ``recv`` row."""

    def close(self) -> None:
        """Release communicators."""


def collective_result(op: RowOp, sent: Mapping[int, np.ndarray]) -> np.ndarray:
    """What the receivers of ``op`` get from the rows each device sent (``sent[device]``): the
    root's rows (BROADCAST) or their uint32 SUM, wrapping like NCCL's (REDUCE)."""
    if op.kind is CollectiveKind.BROADCAST:
        return sent[op.root]
    return np.sum(np.stack(list(sent.values())), axis=0, dtype=np.uint32)


__all__ = ["Fabric", "RowOp", "collective_result"]
