"""The CUDA backend's :class:`~caramel.target.Target`: what the planner needs to know of its kernels and device.

* One kernel or two: the forward NTT runs as two kernels, the second taking the rows last-first
  (:mod:`caramel.backends.cuda.ntt.transform`); the inverse as one kernel (:mod:`caramel.backends.cuda.ntt.fused`).
* The L2 of an H100 or H200 (50 MiB) and the device-to-device copy bandwidth measured on one H200 (4202 GB/s,
  bytes read plus written).
* The kernel costs: a least-squares fit of the one-stream kernel times of BootstrapLike_51L_1c on one H200 at
  N = 65536 (R^2 0.98 to 0.999 per family; :func:`caramel.plan.cost.fit` refits them from a roofline's measured
  times when the kernels change). They rank kernels for the stream scheduler; they do not predict a run.
"""

from __future__ import annotations

from types import MappingProxyType

from caramel.target import Cost, Target

#: Kernel family (:func:`caramel.plan.cost.family`) -> its line.
COSTS = MappingProxyType({
    "elementwise": Cost(1.36, 0.068),
    "epilogue": Cost(9.15, 0.062, 0.097),
    "ntt": Cost(10.67, 0.157),
    "ntt-half": Cost(5.87, 0.080),
    "intt": Cost(10.49, 0.168),
    "baseconv": Cost(5.31, 0.104),
    "automorphism": Cost(1.87, 0.070),
})

CUDA_TARGET = Target("cuda", one_kernel=(False, True), l2_bytes=50 * 2**20, copy_gbs=4202.0,
                     costs=tuple(COSTS.items()))

__all__ = ["COSTS", "CUDA_TARGET"]
