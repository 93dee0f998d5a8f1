"""Row order inside kernels: the rows whose inputs were written most recently go first.

A batched kernel's rows are independent, so their order is free; on a GPU it is the order in which the
limbs stream through memory (the blocks of a launch start roughly in row order). The previous kernels'
last-written limbs are the ones a cache of C bytes (a GPU's L2) still holds, and only until other
traffic evicts them: a consumer that reads its inputs oldest-first misses throughout (an LRU cache
scanned in the order it was filled), one that reads them newest-first hits on up to C bytes of them.

:func:`recent_first` orders every kernel's rows by the *write rank* of their inputs, most recent first: the rank of
a buffer is the position of its write in the plan's order of writes (kernel by kernel; within a kernel, row by row,
except NTT and INTT kernels that the CUDA backend runs as two kernels, whose second pass takes the rows last-first
(``caramel.backends.cuda.ntt.SECOND_REVERSED``), so that they finish their rows in reverse order; a transform in one
kernel (:data:`FUSED`, ``caramel.backends.cuda.ntt.FUSED``) finishes them in order). A
row's key is the highest rank among its inputs (-1 for inputs no kernel wrote: program inputs, keys); ties keep the
plan's order. Communication kernels keep their order (every chip must issue its collectives alike). Results do not
depend on row order: the plan computes the same values.
"""

from __future__ import annotations

from dataclasses import replace

from caramel.plan.kernel import ChipPlan, Kernel, Kind, Plan


#: Whether the CUDA backend runs a whole (forward, inverse) transform at N >= 8192 as one kernel
#: (``caramel.backends.cuda.ntt.FUSED``; a test keeps the two equal): one kernel finishes its rows in row order, two
#: kernels (the second taking the rows last-first, ``SECOND_REVERSED``) finish them last-first. Read at call time, so
#: that scripts can compare plans (``scripts/gpu_bench.py --ntt-set plan.FUSED=1/1``).
FUSED = (False, True)


def whole_transform(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a whole NTT or INTT: two passes over each row at N >= 8192 (a half NTT runs only the
    first; its readers run the second in their loads)."""
    return kernel.kind in (Kind.NTT, Kind.INTT) and not kernel.half


def one_kernel(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a whole transform that the CUDA backend runs as one kernel (:data:`FUSED`)."""
    return whole_transform(kernel) and bool(FUSED[kernel.kind is Kind.INTT])


def write_order(kernel: Kernel) -> tuple:
    """The rows of ``kernel`` in the order it finishes writing them (see the module docstring): a whole NTT or INTT in
    two kernels (:data:`FUSED`) last-first; one in one kernel, a half NTT (its first pass only) and every other
    kernel in row order."""
    return kernel.rows[::-1] if whole_transform(kernel) and not one_kernel(kernel) else kernel.rows


def recent_first_chip(chip: ChipPlan) -> ChipPlan:
    """``chip`` with every non-communication kernel's rows sorted by the write rank of their inputs,
    most recent first (stable)."""
    rank: dict[int, int] = {}  # buffer -> position of its latest write
    seq = 0
    kernels = []
    for kernel in chip.kernels:
        if kernel.kind is not Kind.COMM and len(kernel.rows) > 1:
            keys = [max((rank.get(b, -1) for b in row.ins), default=-1) for row in kernel.rows]
            order = sorted(range(len(keys)), key=lambda i: -keys[i])
            if order != list(range(len(keys))):
                kernel = replace(kernel, rows=tuple(kernel.rows[i] for i in order))
        kernels.append(kernel)
        if kernel.kind is Kind.COMM:
            written = [c.dst for c in kernel.comms if c.dst >= 0]
        else:
            written = [b for row in write_order(kernel) for b in row.outs]
        for b in written:
            rank[b] = seq
            seq += 1
    return replace(chip, kernels=tuple(kernels))


def recent_first(plan: Plan) -> Plan:
    """``plan`` with :func:`recent_first_chip` applied to every chip."""
    return replace(plan, chips=tuple(recent_first_chip(c) for c in plan.chips))
