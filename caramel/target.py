"""What a backend tells the planner about the device that runs a plan: a :class:`Target`.

The plan is backend-neutral; the few facts of a device that it uses come from here, published by each backend
(``Backend.target``: the NumPy backend's :data:`NEUTRAL`, the CUDA backend's
:data:`caramel.backends.cuda.target.CUDA_TARGET`):

* the order in which a whole NTT or INTT finishes its rows (:attr:`Target.one_kernel`), which orders the rows of
  the kernels that read them (:func:`caramel.plan.order.recent_first`);
* the last-level cache and the copy bandwidth that ``caramel plan`` prices the plan's traffic with
  (:mod:`caramel.plan.cache_model`, :mod:`caramel.plan.report`);
* the kernel cost model that the stream schedule balances (:mod:`caramel.plan.cost`).

This module imports nothing of caramel, so that every layer can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Cost(NamedTuple):
    """One kernel family's estimated time, a line in its traffic: microseconds a launch, a limb of traffic and a row
    pass (NTT epilogues), at N = 65536 (:func:`caramel.plan.cost.estimate_us`)."""

    base_us: float
    per_limb_us: float
    per_pass_us: float = 0.0


@dataclass(frozen=True)
class Target:
    """A device as the planner sees it.

    ``one_kernel``: (forward, inverse) whether a whole transform finishes its rows in row order, as one kernel does;
    otherwise it runs as two kernels whose second pass takes the rows last-first, so it finishes them last-first.
    ``l2_bytes``: the last-level cache (0: none modelled); ``copy_gbs``: device copy bandwidth, bytes read plus
    written (0: unknown); ``costs``: kernel family -> :class:`Cost` (a family not listed costs as ``elementwise``,
    which must be listed)."""

    name: str
    one_kernel: tuple[bool, bool] = (True, True)
    l2_bytes: int = 0
    copy_gbs: float = 0.0
    costs: tuple[tuple[str, Cost], ...] = (("elementwise", Cost(0.0, 1.0)),)

    def __post_init__(self):
        if "elementwise" not in dict(self.costs):
            raise ValueError(f"target {self.name}: its costs need an 'elementwise' line")

    def cost(self, family: str) -> Cost:
        """The cost line of kernel ``family``."""
        costs = dict(self.costs)
        return costs.get(family, costs["elementwise"])

    def key(self) -> dict:
        """The target as JSON values (what a plan built for it depends on: the plan cache keys on it)."""
        return {"name": self.name, "one_kernel": list(self.one_kernel), "l2_bytes": self.l2_bytes,
                "copy_gbs": self.copy_gbs, "costs": [[f, list(c)] for f, c in self.costs]}


#: A backend that runs every kernel's rows in order and models no cache: each kernel costs its traffic in limbs.
NEUTRAL = Target("neutral")

__all__ = ["Cost", "NEUTRAL", "Target"]
