"""The NCCL fabric: one GPU's collectives over NCCL communicators, and their creation.

Every communication step of a device is ONE ``ncclGroupStart``/``ncclGroupEnd`` holding its
broadcasts (``dis``/``rcv``) and uint32 SUM reduces (``joi``, followed by a ``% q`` kernel) in the
global order of :mod:`caramel.plan.collectives`. NVLink multicast stays off
(``NCCL_NVLS_ENABLE=0`` unless set). CuPy is imported lazily.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from caramel.execute.fabric import Fabric, RowOp
from caramel.plan.collectives import CollectiveKind


def nccl_environment() -> None:
    """Keep NVLink multicast (NVLS) off in NCCL unless the caller chose otherwise, and load CUDA
    modules eagerly (lazy loading during an NCCL kernel can deadlock; effective only before the
    process's first CUDA context)."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("CUDA_MODULE_LOADING", "EAGER")


class NcclFabric(Fabric):
    """One GPU's collectives over NCCL communicators: ``comms[group]`` is this GPU's
    communicator of that device group (its rank is its position in the group).

    ``payload_limit`` (class attribute, default None) caps every call at that many uint32: only
    for timing experiments that separate synchronisation from bandwidth; the results are then wrong."""

    payload_limit: int | None = None

    def __init__(self, device: int, comms: Mapping[tuple[int, ...], object]):
        self.device, self.comms = device, dict(comms)

    def group(self, backend, ops: Sequence[RowOp]) -> None:
        import cupy as cp
        from cupy.cuda import nccl

        stream = cp.cuda.get_current_stream().ptr
        arena = backend.arena
        n = arena.shape[1]
        base, width = arena.data.ptr, n * 4
        nccl.groupStart()
        try:
            for op in ops:
                comm = self.comms[op.group]
                root = op.group.index(op.root)
                count = n * op.rows if self.payload_limit is None else min(n * op.rows, self.payload_limit)
                if op.kind is CollectiveKind.BROADCAST:
                    ptr = base + (op.send if op.send >= 0 else op.recv) * width
                    comm.broadcast(ptr, ptr, count, nccl.NCCL_UINT32, root, stream)
                else:
                    send = base + op.send * width
                    recv = base + op.recv * width if op.recv >= 0 else send
                    comm.reduce(send, recv, count, nccl.NCCL_UINT32, nccl.NCCL_SUM, root, stream)
        finally:
            nccl.groupEnd()

    def close(self) -> None:
        for comm in self.comms.values():
            comm.destroy()
        self.comms.clear()


def nccl_communicators(groups: Sequence[tuple[int, ...]], device_ids: Sequence[int]) -> dict[int, dict]:
    """``{device: {group: communicator}}`` for one process driving ``device_ids`` (device index ->
    CUDA device id), one ``ncclCommInitAll`` per group."""
    out: dict[int, dict] = {d: {} for d in range(len(device_ids))}
    if not groups:
        return out
    from cupy.cuda import nccl

    nccl_environment()
    for g in groups:
        comms = nccl.NcclCommunicator.initAll([device_ids[d] for d in g])
        for d, comm in zip(g, comms):
            out[d][g] = comm
    return out


__all__ = ["NcclFabric", "nccl_communicators", "nccl_environment"]
