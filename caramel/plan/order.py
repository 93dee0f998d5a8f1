"""Row order inside kernels: the rows whose inputs were written most recently go first.

A batched kernel's rows are independent, so their order is free; on a GPU it is the order in which the
limbs stream through memory (the blocks of a launch start roughly in row order). The previous kernels'
last-written limbs are the ones a cache of C bytes (a GPU's L2) still holds, and only until other
traffic evicts them: a consumer that reads its inputs oldest-first misses throughout (an LRU cache
scanned in the order it was filled), one that reads them newest-first hits on up to C bytes of them.

:func:`recent_first` orders every kernel's rows by the *write rank* of their inputs, most recent first: the rank of
a buffer is the position of its write in the plan's order of writes (kernel by kernel; within a kernel, row by row,
except whole NTT and INTT kernels that the target runs as two kernels, whose second pass takes the rows last-first,
so that they finish their rows in reverse order; :attr:`caramel.target.Target.one_kernel`). A row's key is the
highest rank among its inputs (-1 for inputs no kernel wrote: program inputs, keys); ties keep the plan's order.
Communication kernels keep their order (every chip must issue its collectives alike). Results do not depend on row
order: the plan computes the same values.
"""

from __future__ import annotations

from dataclasses import replace

from caramel.plan.kernel import ChipPlan, Kernel, Kind, Plan
from caramel.target import NEUTRAL, Target


def whole_transform(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a whole NTT or INTT: two passes over each row at N >= 8192 (a half NTT runs only the
    first; its readers run the second in their loads)."""
    return kernel.kind in (Kind.NTT, Kind.INTT) and not kernel.half


def one_kernel(kernel: Kernel, target: Target) -> bool:
    """Whether ``kernel`` is a whole transform that ``target`` runs as one kernel (:attr:`Target.one_kernel`)."""
    return whole_transform(kernel) and bool(target.one_kernel[kernel.kind is Kind.INTT])


def write_order(kernel: Kernel, target: Target) -> tuple:
    """The rows of ``kernel`` in the order it finishes writing them on ``target`` (see the module docstring): a whole
    NTT or INTT in two kernels last-first; one in one kernel, a half NTT (its first pass only) and every other kernel
    in row order."""
    return kernel.rows[::-1] if whole_transform(kernel) and not one_kernel(kernel, target) else kernel.rows


def recent_first_chip(chip: ChipPlan, target: Target) -> ChipPlan:
    """``chip`` with every non-communication kernel's rows sorted by the write rank of their inputs on ``target``,
    most recent first (stable)."""
    rank: dict[int, int] = {}  # buffer -> position of its latest write
    seq = 0
    kernels = []
    for kernel in chip.kernels:
        if kernel.kind is not Kind.COMM and len(kernel.rows) > 1:
            keys = [max([rank.get(b, -1) for b in row.ins], default=-1) for row in kernel.rows]
            order = sorted(range(len(keys)), key=keys.__getitem__, reverse=True)  # (stable: ties keep their order)
            if order != list(range(len(keys))):
                kernel = replace(kernel, rows=tuple(map(kernel.rows.__getitem__, order)))
        kernels.append(kernel)
        if kernel.kind is Kind.COMM:
            written = [c.dst for c in kernel.comms if c.dst >= 0]
        else:
            written = [b for row in write_order(kernel, target) for b in row.outs]
        rank.update(zip(written, range(seq, seq + len(written))))
        seq += len(written)
    return replace(chip, kernels=tuple(kernels))


def recent_first(plan: Plan, target: Target = NEUTRAL) -> Plan:
    """``plan`` with :func:`recent_first_chip` applied to every chip for ``target``, which it then records."""
    return replace(plan, chips=tuple(recent_first_chip(c, target) for c in plan.chips), target=target)


def for_target(plan: Plan, target: Target) -> Plan:
    """``plan`` with its rows ordered for ``target``: as it is when it was ordered for it or not ordered at all
    (``plan.target`` None: built with ``row_order="batch"``), else re-sorted by :func:`recent_first` (a plan built for
    another backend, e.g. the neutral one, run on this one)."""
    return plan if plan.target is None or plan.target == target else recent_first(plan, target)
