"""What a run leaves behind, the same for every executor: :class:`RunResult`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from caramel.execute.timing import Timing
from caramel.program import Mem


@dataclass
class RunResult:
    """Each chip's private store, the memory seen by the host (the input image with every chip's
    stores laid over it), the instructions executed and, for a timed run, its :class:`Timing`."""

    stores: list[dict[Mem, np.ndarray]]
    memory: dict[Mem, np.ndarray]
    executed: int
    timing: Timing | None = None

    @classmethod
    def from_stores(cls, stores: list[dict[Mem, np.ndarray]], memory: Mapping[Mem, np.ndarray],
                    executed: int) -> "RunResult":
        """The result of chips whose private stores are ``stores``, over the input image ``memory``."""
        merged = dict(memory)
        for store in stores:
            merged.update(store)
        return cls(stores, merged, executed)

    def __repr__(self) -> str:  # short: the memory holds every limb of the run
        return f"RunResult({len(self.stores)} chip stores, {len(self.memory)} limbs in memory, {self.executed} executed)"


def merge_results(plan, memory: Mapping[Mem, np.ndarray],
                  per_device: Sequence[tuple[Sequence[int], Sequence[dict]]]) -> RunResult:
    """A :class:`RunResult` of ``plan`` from every device's (hosted chips, their stores); chips
    that no device reported (those of other processes) get empty stores."""
    stores: list[dict] = [{} for _ in plan.chips]
    for hosted, per_chip in per_device:
        for c, s in zip(hosted, per_chip):
            stores[c] = s
    return RunResult.from_stores(stores, memory, plan.instructions)


__all__ = ["RunResult", "merge_results"]
