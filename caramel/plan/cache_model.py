"""A model of a GPU's last-level cache under a plan: which limb reads an LRU cache of C limbs serves.

The plan's traffic model (:meth:`caramel.plan.kernel.Kernel.traffic`) charges every read and write to device
memory. A device's last-level cache (a GPU's L2: the target's ``l2_bytes``, :mod:`caramel.target`) serves the reads of limbs
written or read shortly before; this module counts them. Each chip's kernels run in plan order, one after the other; a
kernel is a sequence of whole-limb accesses, row by row in row order:

* a single-pass kernel reads each row's inputs, then writes its outputs;
* a forward NTT or inverse NTT at N >= 8192 is two passes (:mod:`caramel.backends.cuda.ntt`): the first reads
  each row's input and writes its output limb, the second reads and writes the output limb again. A transform
  that the target runs in two kernels (:attr:`caramel.target.Target.one_kernel`) runs the second over the rows in
  reverse order; in one kernel, each row's second pass follows its first, row by row (the kernel's lag of a few dozen
  limbs is left out), as :func:`caramel.plan.order.write_order` has it. A half NTT (``Kernel.half``) runs only the
  first (its reader runs the second in its load).

The cache is LRU over limbs with write-back: a read of a cached limb is a hit, else a miss that allocates it; a
write allocates the limb dirty; every access makes the limb the most recently used; an evicted dirty limb, and
every dirty limb at the end, costs one write to memory. Memory traffic = read misses + write-backs, in limbs.

This is a model, not a measurement: the blocks of a launch run about a wave (a few hundred tiles) at a time
rather than strictly in row order, concurrent streams interleave kernels, and L2 is neither fully associative
nor strictly LRU. It predicts directions and sizes of row-order changes before a GPU run
(docs/PERFORMANCE.md compares it with the measured ones).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, NamedTuple

from caramel.plan.kernel import ChipPlan, Kind, Plan, Row
from caramel.plan.order import one_kernel, whole_transform
from caramel.target import Target


class CacheTraffic(NamedTuple):
    """Limb accesses of a plan under the cache model: ``reads`` (all), ``hits`` (served by the cache), ``writes``
    (all) and ``writebacks`` (writes that reach memory)."""

    reads: int
    hits: int
    writes: int
    writebacks: int

    @property
    def memory(self) -> int:
        """Limbs moved to and from memory: read misses plus write-backs."""
        return self.reads - self.hits + self.writebacks

    def __add__(self, other: "CacheTraffic") -> "CacheTraffic":  # type: ignore[override]
        return CacheTraffic(*(a + b for a, b in zip(self, other)))


def accesses(chip: ChipPlan, target: Target) -> Iterator[tuple[bool, int]]:
    """The chip's limb accesses on ``target`` in model order: (is_write, buffer) (see the module docstring)."""
    for kernel in chip.kernels:
        if kernel.kind is Kind.COMM:
            yield from ((False, c.src) for c in kernel.comms if c.src >= 0)
            yield from ((True, c.dst) for c in kernel.comms if c.dst >= 0)
            continue
        two_pass = whole_transform(kernel)  # a half NTT's readers run its second pass
        fused = one_kernel(kernel, target)  # its second pass row by row, after each row's first
        for row in kernel.rows:
            yield from ((False, b) for b in row.ins)
            yield from ((True, b) for b in row.outs)
            if fused:
                yield from _second_pass(row)
        if two_pass and not fused:
            for row in kernel.rows[::-1]:
                yield from _second_pass(row)


def _second_pass(row: Row) -> Iterator[tuple[bool, int]]:
    """A transform's second pass over one row: it reads and writes the row's output limb again."""
    yield from ((False, b) for b in row.outs)
    yield from ((True, b) for b in row.outs)


def chip_traffic(chip: ChipPlan, capacity: int, target: Target) -> CacheTraffic:
    """:class:`CacheTraffic` of one chip's plan on ``target`` with an LRU cache of ``capacity`` limbs."""
    cache: OrderedDict[int, bool] = OrderedDict()  # buffer -> dirty, least recently used first
    reads = hits = writes = writebacks = 0
    for write, b in accesses(chip, target):
        if write:
            writes += 1
        else:
            reads += 1
        if b in cache:
            hits += not write
            cache[b] = cache[b] or write
            cache.move_to_end(b)
            continue
        cache[b] = write
        if len(cache) > capacity:
            writebacks += cache.popitem(last=False)[1]
    writebacks += sum(cache.values())
    return CacheTraffic(reads, hits, writes, writebacks)


def plan_traffic(plan: Plan, capacity: int, target: Target) -> CacheTraffic:
    """:func:`chip_traffic` summed over the chips of ``plan``."""
    total = CacheTraffic(0, 0, 0, 0)
    for chip in plan.chips:
        total = total + chip_traffic(chip, capacity, target)
    return total
