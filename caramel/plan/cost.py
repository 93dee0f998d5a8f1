"""Estimated device time of a plan kernel: the cost that the stream schedule balances.

:func:`caramel.plan.streams.assign_streams` puts each task on the stream where it could start earliest by these
estimates, so they decide how a chip's independent branches share its streams. A kernel's time is modelled per
*family* (:func:`family`: its kind, with half NTTs and NTT epilogues apart) as a line in its traffic:

    t = base + per_limb * traffic * N / 65536 + per_pass * rows * F * N / 65536

``traffic`` in limbs (:meth:`~caramel.plan.kernel.Kernel.traffic`, each input read and each output written
once), ``base`` the launch and the latency of one block's chain, ``per_pass`` the row passes of an NTT epilogue
(F transformed operands a row: work beyond its traffic). The coefficients are the backend's
(:attr:`caramel.target.Target.costs`; the CUDA backend's are fitted on an H200,
:mod:`caramel.backends.cuda.target`). They rank kernels for the scheduler; they do not predict a run. :func:`fit`
refits them from measured times (a roofline's ``--json``) when the kernels change.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import numpy as np

from caramel.plan.kernel import Kernel
from caramel.target import NEUTRAL, Cost, Target

#: A communication step: microseconds per collective (a rough figure for one limb over NVLink, not fitted).
COMM_US = 10.0


def family(kernel: Kernel) -> str:
    """The family a kernel's time and its profile record go under: its :class:`~caramel.plan.kernel.Kind`'s name,
    but ``ntt-half`` for a half NTT (its first pass only on the GPU) and ``epilogue`` for an elementwise kernel with
    transformed operands (the second pass of those NTTs, then the program)."""
    if kernel.half:
        return "ntt-half"
    if kernel.expr is not None and kernel.expr.transformed:
        return "epilogue"
    return kernel.kind.value


def _row_passes(kernel: Kernel) -> int:
    """The row passes an NTT epilogue runs: F transformed operands a row (0 for other kernels)."""
    return len(kernel.rows) * len(kernel.expr.transformed) if kernel.expr is not None else 0


def estimate_us(kernel: Kernel, n: int = 65536, target: Target = NEUTRAL) -> float:
    """The estimated time of ``kernel`` on ``target`` at ring dimension ``n`` in microseconds (module docstring)."""
    c = target.cost(family(kernel))
    return c.base_us + (c.per_limb_us * kernel.traffic() + c.per_pass_us * _row_passes(kernel)) * n / 65536


def fit(samples: Iterable[tuple[Kernel, float]], n: int = 65536) -> dict[str, tuple[Cost, float]]:
    """Per family, the least-squares line (module docstring) through measured ``(kernel, microseconds)`` samples at
    ring dimension ``n`` and its R^2: (Cost at N = 65536, r2). The per-pass term only for ``epilogue``; a family
    with fewer samples than terms is left out."""
    by: dict[str, list[tuple[Kernel, float]]] = defaultdict(list)
    for kernel, us in samples:
        by[family(kernel)].append((kernel, us))
    out, scale = {}, n / 65536
    for name, group in sorted(by.items()):
        cols = [[1.0] * len(group), [k.traffic() * scale for k, _ in group]]
        if name == "epilogue":
            cols.append([_row_passes(k) * scale for k, _ in group])
        if len(group) < len(cols):
            continue
        a, y = np.array(cols, dtype=float).T, np.array([us for _, us in group], dtype=float)
        coef = np.linalg.lstsq(a, y, rcond=None)[0]
        spread = float(((y - y.mean()) ** 2).sum())
        r2 = 1.0 - float(((y - a @ coef) ** 2).sum()) / spread if spread > 0 else 1.0
        out[name] = (Cost(*(float(c) for c in coef)), r2)
    return out


def task_cost(kernel: Kernel, n: int = 65536, target: Target = NEUTRAL) -> int:
    """:func:`estimate_us` as a stream-schedule cost (:class:`~caramel.plan.streams.Task`): whole nanoseconds, at
    least 1."""
    return max(1, round(1000 * estimate_us(kernel, n, target)))


def comm_cost(collectives: int) -> int:
    """The stream-schedule cost of a communication step of ``collectives`` collectives (and its local copies)."""
    return max(1, round(1000 * COMM_US * (collectives + 1)))


__all__ = ["COMM_US", "Cost", "comm_cost", "estimate_us", "family", "fit", "task_cost"]
