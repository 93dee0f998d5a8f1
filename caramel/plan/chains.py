"""Kernel order: batched transforms split into chains around the base conversions they feed or read.

The batching of :mod:`caramel.plan.fusion` puts every row of one level and kind into one kernel. Around a key
switch this gives, e.g., one INTT of 153 rows, four conversion kernels (each converting 3 inputs of its own
primes), then one NTT of 615 rows: between a limb's write and its read lie hundreds of other limbs, more than a
GPU's L2 (50 MB, about 190 limbs at N = 65536) holds, so every conversion input and output goes to memory and
back. :func:`conversion_chains` cuts such transforms into one piece per conversion kernel and moves each piece
beside it:

* a forward NTT whose rows read limbs last written by several kernels, all conversions, becomes one kernel per
  producer (the rows whose latest-written input it wrote), each placed right after its producer;
* an INTT whose output limbs are first read by several kernels, all conversions, becomes one kernel per such
  consumer, each placed right before it.

The example becomes four chains INTT(~38) -> conversion -> NTT(~153), each of about 40 MiB: what one kernel
writes, the next reads from L2 (:mod:`caramel.plan.cache_model` predicts -2.6 GiB of the 36.2 GiB it models
for BootstrapLike_51L_1c). Smaller transforms run a little slower on their own, and independent chains spread
over streams (:mod:`caramel.plan.streams`); docs/PERFORMANCE.md has what a GPU measured.

Only kernels are moved and split: every row keeps its buffers, so the plan computes the same values. Plan
buffers are written once (SSA), so a piece only has to stay after the writers of its inputs and before the
readers of its outputs, which these placements keep: an NTT piece moves up to its last input's writer, an INTT
piece down to its outputs' first reader. Conversions themselves never move; communication kernels keep their
order. A piece takes its conversion's level, so that kernels stay in level order (devices run the kernels of
their chips merged by level, :mod:`caramel.execute.placement`): an NTT piece then depends on a kernel of its own
level, which runs before it (a level's kernels run in plan order, after the level's communication, which reads
nothing the pieces write).
"""

from __future__ import annotations

from dataclasses import replace

from caramel.plan.kernel import ChipPlan, Kernel, Kind, Plan

#: The transform kinds split after their producers, and before their consumers.
AFTER_PRODUCERS = frozenset({Kind.NTT})
BEFORE_CONSUMERS = frozenset({Kind.INTT})


def kernel_deps(kernels: tuple[Kernel, ...]) -> tuple[tuple[int, ...], ...]:
    """For each kernel, the earlier kernels that last wrote a buffer it reads (``ChipPlan.deps``)."""
    writer: dict[int, int] = {}
    deps = []
    for k, kernel in enumerate(kernels):
        deps.append(tuple(sorted({writer[b] for b in kernel.reads() if b in writer})))
        for b in kernel.writes():
            writer[b] = k
    return tuple(deps)


def _pieces(kernel: Kernel, anchor_of_row, level_of) -> dict[int, Kernel] | None:
    """``kernel`` cut by the anchor kernel of each row (rows keep their order), each piece at its anchor's level,
    or None when the rows have one anchor or some row has none."""
    groups: dict[int, list] = {}
    for row in kernel.rows:
        anchor = anchor_of_row(row)
        if anchor is None:
            return None
        groups.setdefault(anchor, []).append(row)
    if len(groups) < 2:
        return None
    return {a: replace(kernel, rows=tuple(rows), level=level_of(a)) for a, rows in groups.items()}


def conversion_chains_chip(chip: ChipPlan, kinds=AFTER_PRODUCERS | BEFORE_CONSUMERS) -> ChipPlan:
    """``chip`` with its transforms of ``kinds`` split and moved beside the conversions they feed or read (module
    docstring)."""
    kernels = chip.kernels
    writer: dict[int, int] = {}  # buffer -> kernel that wrote it
    first_reader: dict[int, int] = {}  # buffer -> first kernel that reads it
    for k, kernel in enumerate(kernels):
        for b in kernel.reads():
            first_reader.setdefault(b, k)
        for b in kernel.writes():
            writer[b] = k
    is_conversion = [kernel.kind is Kind.BASECONV for kernel in kernels]

    def level_of(k: int) -> int:
        return kernels[k].level

    def producer(row):
        k = max((writer.get(b, -1) for b in row.ins), default=-1)
        return k if k >= 0 and is_conversion[k] else None

    def consumer(row):
        k = min((first_reader.get(b, -1) for b in row.outs), default=-1)
        return k if k >= 0 and is_conversion[k] else None

    # Sort key of each kernel: (position of its anchor, side, original index); side -1 before, 0 itself, 1 after.
    placed: list[tuple[tuple[int, int, int], Kernel]] = []
    for k, kernel in enumerate(kernels):
        pieces = None
        if kernel.kind not in kinds:
            pass
        elif kernel.kind in AFTER_PRODUCERS and len(kernel.rows) > 1:
            pieces = _pieces(kernel, producer, level_of)
            side = 1
        elif kernel.kind in BEFORE_CONSUMERS and len(kernel.rows) > 1:
            pieces = _pieces(kernel, consumer, level_of)
            side = -1
        if pieces is None:
            placed.append(((k, 0, k), kernel))
        else:
            placed.extend(((anchor, side, k), piece) for anchor, piece in pieces.items())
    placed.sort(key=lambda kp: kp[0])
    out = tuple(kernel for _, kernel in placed)
    if len(out) == len(kernels):
        return chip
    return replace(chip, kernels=out, deps=kernel_deps(out))


def conversion_chains(plan: Plan, kinds=AFTER_PRODUCERS | BEFORE_CONSUMERS) -> Plan:
    """``plan`` with :func:`conversion_chains_chip` applied to every chip."""
    return replace(plan, chips=tuple(conversion_chains_chip(c, kinds) for c in plan.chips))
