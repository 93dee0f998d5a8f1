"""Chips on devices: placement, per-device communication steps, packing, and per-device programs.

Chips map onto G <= K devices in contiguous blocks (:func:`placement`). A device runs its chips'
kernels merged by level; a communication among chips of ONE device is a local copy or a local
modular sum; otherwise the device-level collective (:class:`DeviceOp`) runs among the devices
involved, after local partial sums, and is followed by local copies and ``% q`` of a sum of two
contributions or more (one arrives as it was sent, as the reference copies it; :func:`device_comm_step`).
The collectives themselves and their global order come from
:func:`caramel.plan.collectives.plan_collectives`.

A device's :class:`DeviceProgram` has one arena: the rows of each hosted chip (its own
:func:`~caramel.plan.assign_rows` map, shifted), then scratch rows for partial sums, one zero
row that is never written, and staging rows. The hosted chips' kernels run merged by plan level; at
each level the communication comes first, in *parts* (:func:`comm_parts`: by the kernels that first
read what the collectives bring, so that a kernel waits for the part it reads, not for the whole level),
each one :class:`CommStep` (local sums, ONE group of device collectives, ``% q`` and copies; the limbs
that one root sends in the step travel as one call over contiguous rows, :func:`pack`), then the level's
kernels, chip by chip. With a row for every buffer (``reuse="none"``) the rows are laid out so that the
limbs of each such call lie in contiguous rows in the call's order (:func:`contiguous_rows`) and the call
uses them in place; otherwise (or where a buffer takes part in two calls) it goes through staging rows,
gathered and scattered by a copy kernel each (:func:`staging_rows`). Each chip keeps its own kernel order,
so its row reuse stays valid. One device hosting every chip (G = 1) needs no collective at all: that is
how a plan runs in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.plan.collectives import Collective, CollectiveKind, plan_collectives
from caramel.plan.kernel import Kernel, Kind, Plan, ScalarSpec
from caramel.plan.plan import assign_rows


def placement(chips: int, gpus: int) -> tuple[int, ...]:
    """The device of every chip: contiguous blocks, chip c on device c * G // K (G <= K)."""
    if gpus < 1:
        raise ExecutionError(f"need at least one device, got {gpus}")
    gpus = min(gpus, chips)
    return tuple(c * gpus // chips for c in range(chips))


@dataclass(frozen=True)
class DeviceOp:
    """A collective among devices: ``group`` (sorted device indices; one communicator per group),
    ``root`` (a device of the group), ``kind``; ``send``/``recv``: row references on this device
    (see :func:`device_comm_step`), None where unused. BROADCAST: the root sends ``send`` (and
    receives nothing), the others receive into ``recv``. REDUCE: every device sends ``send``
    (its local partial sum, or the zero row when it contributes nothing), the root sums into
    ``recv``; ``prime`` is q's index. ``sync`` names the communication."""

    sync: int
    kind: CollectiveKind
    group: tuple[int, ...]
    root: int
    send: tuple[int, int] | None
    recv: tuple[int, int] | None
    prime: int


@dataclass(frozen=True)
class LocalSum:
    """On this device: ``out`` = (sum of ``ins``) mod q_prime (row references); one input: a copy."""

    ins: tuple[tuple[int, int], ...]
    out: tuple[int, int]
    prime: int


@dataclass(frozen=True)
class ModRows:
    """On this device: every (chip, buffer) of ``rows`` (a uint32 SUM) is reduced mod q_prime."""

    rows: tuple[tuple[int, int], ...]
    prime: int


@dataclass(frozen=True)
class CommStep:
    """One device's communication at one level: ``before`` (local sums and copies), ``ops`` (one
    group of device collectives, in the global order), ``after`` (``% q`` of reduce results,
    then copies of received limbs to the device's other receivers). ``scratch``: rows needed."""

    level: int
    before: tuple[LocalSum, ...]
    ops: tuple[DeviceOp, ...]
    after: tuple[ModRows | LocalSum, ...]
    scratch: int


ZERO = (-2, 0)  # the row ref of a device's zero row (never written)


def device_comm_step(level: int, collectives: Sequence[Collective], device: int, where: Sequence[int]) -> CommStep:
    """The :class:`CommStep` of ``device`` for the ``collectives`` of one level (those without a
    member on ``device`` are skipped); ``where[chip]`` is the chip's device. Row references are
    (chip, buffer), (-1, k) for scratch row k, or :data:`ZERO` for the device's zero row."""
    before: list[LocalSum] = []
    ops: list[DeviceOp] = []
    mods: list[ModRows] = []
    copies: list[LocalSum] = []
    scratch = 0
    for col in collectives:
        mine = [c for c in col.members if where[c] == device]
        if not mine:
            continue
        group = tuple(sorted({where[c] for c in col.members}))
        root_dev = where[col.root]
        dst = dict(col.dst)
        if col.kind is CollectiveKind.BROADCAST:
            src = col.src[0]
            receivers = [(c, dst[c]) for c in mine if c in dst]
            if device == root_dev:
                if len(group) > 1:
                    ops.append(DeviceOp(col.sync, col.kind, group, root_dev, src, None, col.prime))
                copies += [LocalSum((src,), r, col.prime) for r in receivers]
            else:
                first, rest = receivers[0], receivers[1:]
                ops.append(DeviceOp(col.sync, col.kind, group, root_dev, None, first, col.prime))
                copies += [LocalSum((first,), r, col.prime) for r in rest]
            continue
        contributions = tuple(s for s in col.src if where[s[0]] == device and s[1] >= 0)
        if len(group) == 1:
            before.append(LocalSum(contributions or (ZERO,), (col.root, dst[col.root]), col.prime))
            continue
        if len(contributions) > 1:
            partial = (-1, scratch)
            scratch += 1
            before.append(LocalSum(contributions, partial, col.prime))
        else:
            partial = contributions[0] if contributions else ZERO
        recv = (col.root, dst[col.root]) if device == root_dev else None
        ops.append(DeviceOp(col.sync, col.kind, group, root_dev, partial, recv, col.prime))
        if recv is not None and sum(b >= 0 for _, b in col.src) > 1:
            # A sum of two limbs or more is reduced mod q; a single contribution (the others sourceless) arrives
            # as it was sent, as the reference's joi copies its first contribution.
            mods.append(ModRows((recv,), col.prime))
    ops.sort(key=lambda o: (len(o.group), o.group, o.sync))
    # Scratch rows renumbered in the order of the calls (pack): the partial sums of one call are contiguous.
    order = [o.send for b in pack(ops) for o in b if o.send is not None and o.send[0] == -1]
    renum = {ref: (-1, k) for k, ref in enumerate(order)}
    if renum:
        ops = [replace(o, send=renum.get(o.send, o.send)) for o in ops]
        before = [replace(a, out=renum.get(a.out, a.out)) for a in before]
    return CommStep(level, tuple(before), tuple(ops), tuple(mods) + tuple(copies), scratch)


def pack(ops: Sequence[DeviceOp]) -> list[list[DeviceOp]]:
    """The device collectives of one step in buckets of the same (group, kind, root), in an order
    every member computes alike (by group, kind, root; ids ascending inside): each bucket of more
    than one becomes ONE collective over contiguous staging rows (an all-gather-like broadcast
    from one root, or one reduce of many limbs), instead of one NCCL call per limb."""
    buckets: dict[tuple, list[DeviceOp]] = {}
    for o in ops:
        buckets.setdefault((len(o.group), o.group, o.kind.value, o.root), []).append(o)
    return [sorted(b, key=lambda o: o.sync) for _, b in sorted(buckets.items())]


def bucket_sides(bucket: Sequence[DeviceOp], row) -> tuple[list[int] | None, list[int] | None]:
    """The arena rows (``row(ref)``) that one call of :func:`pack` sends and receives on this device, in the call's
    order; None for a side the device has no part in (every op of a bucket has the same sides)."""
    sends = [row(o.send) for o in bucket if o.send is not None]
    recvs = [row(o.recv) for o in bucket if o.recv is not None]
    return (sends or None), (recvs or None)


def in_place(rows: Sequence[int] | None) -> bool:
    """Whether a call can use ``rows`` directly: none (that side unused), or consecutive ascending rows."""
    return rows is None or list(rows) == list(range(rows[0], rows[0] + len(rows)))


def staging_rows(ops: Sequence[DeviceOp], row=None) -> int:
    """Staging rows that the calls of :func:`pack` need for one step: a call of one limb uses its rows in place,
    and so does a call whose sent and received rows are each contiguous in its order (``row``: ref -> arena row;
    None: as if none were)."""
    need = 0
    for b in pack(ops):
        if len(b) > 1 and (row is None or not all(in_place(side) for side in bucket_sides(b, row))):
            need += len(b)
    return need


def contiguous_rows(rows_of: dict[int, np.ndarray], base: int, steps) -> dict[int, np.ndarray]:
    """``rows_of`` (each hosted chip's row of every buffer, rows 0..base-1 a buffer each) renumbered so that the
    limbs of each call of :func:`pack` of more than one limb lie in contiguous rows in the call's order, on each
    side (sent, received): the calls in program order each take the next rows for their buffers when none of them
    has a row yet (a buffer in two calls keeps the first; the later call goes through staging rows); every other
    buffer follows in its old order. A permutation of the rows: the same row count."""
    new: dict[int, int] = {}  # old row -> new row
    for step in steps:
        if isinstance(step, CommStep):
            for b in pack(step.ops):
                if len(b) < 2:
                    continue
                for side in bucket_sides(b, lambda ref: int(rows_of[ref[0]][ref[1]]) if ref[0] >= 0 else -1):
                    if side is None or min(side) < 0 or len(set(side)) < len(side) or any(r in new for r in side):
                        continue
                    for r in side:
                        new[r] = len(new)
    for r in [r for r in range(base) if r not in new]:
        new[r] = len(new)
    perm = np.array([new[r] for r in range(base)], dtype=np.int64)
    return {c: np.where(r >= 0, perm[np.maximum(r, 0)], -1) for c, r in rows_of.items()}


@dataclass
class DeviceProgram:
    """What one device runs (see the module docstring)."""

    device: int
    chips: tuple[int, ...]
    rows_of: dict[int, np.ndarray]
    n_rows: int
    scratch_base: int
    zero_row: int
    staging_base: int
    scalars: list[ScalarSpec]
    scalar_base: dict[int, int]
    steps: list[tuple[int, int, Kernel] | CommStep]  # (chip, kernel index, kernel) or a communication step

    def row(self, ref: tuple[int, int]) -> int:
        """The arena row of a row reference: (chip, buffer), (-1, scratch k) or ZERO."""
        chip, b = ref
        if ref == ZERO:
            return self.zero_row
        if chip < 0:
            return self.scratch_base + b
        return int(self.rows_of[chip][b])


#: A level's collectives go in parts of at least this many limbs (:func:`comm_parts`): fewer, larger parts cost
#: fewer group calls (about 10 us each on H200s), smaller ones let more kernels start early. Chosen with the timeline
#: model (:mod:`caramel.timeline`) on BootstrapLike_51L_2c/_4c (docs/MULTI_GPU.md).
MIN_PART_LIMBS = 32


def comm_parts(plan: Plan, collectives: Sequence[Collective],
               min_limbs: int = MIN_PART_LIMBS) -> dict[int, list[tuple[Collective, ...]]]:
    """The collectives of each level in parts, each issued as its own communication step (one group call), so that
    a kernel waits only for the part that brings what it reads. A collective's key is the level of the earliest
    kernel that first reads one of its destinations, then per destination (chip, buffer) the index of the first
    kernel of that chip to read it (never read: after every kernel); parts are the collectives of one key, in key
    order, a part of fewer than ``min_limbs`` limbs joined to the next (the last one to the part before). A
    function of the plan alone: every device and every process issues the same parts in the same order. The
    collectives of one level never depend on each other, so any order of them is free of deadlocks."""
    first: list[dict[int, int]] = []
    for chip in plan.chips:
        reader: dict[int, int] = {}
        for j, k in enumerate(chip.kernels):
            if k.kind is not Kind.COMM:
                for b in k.reads():
                    reader.setdefault(b, j)
        first.append(reader)
    by_level: dict[int, dict[tuple, list[Collective]]] = {}
    for col in collectives:
        readers = tuple(sorted((ch, first[ch].get(b, len(plan.chips[ch].kernels))) for ch, b in col.dst))
        level = min((plan.chips[ch].kernels[j].level for ch, j in readers if j < len(plan.chips[ch].kernels)),
                    default=col.level)
        by_level.setdefault(col.level, {}).setdefault((level, readers), []).append(col)
    out: dict[int, list[tuple[Collective, ...]]] = {}
    for level, keyed in by_level.items():
        parts: list[list[Collective]] = []
        for _, cols in sorted(keyed.items()):
            if parts and len(parts[-1]) < min_limbs:
                parts[-1] += cols
            else:
                parts.append(list(cols))
        if len(parts) > 1 and len(parts[-1]) < min_limbs:
            last = parts.pop()
            parts[-1] += last
        out[level] = [tuple(sorted(p, key=lambda c: c.key)) for p in parts]
    return out


def device_programs(plan: Plan, gpus: int, primes: Sequence[int], *, reuse: str = "lifo",
                    keep_inputs: bool = False, part_limbs: int = MIN_PART_LIMBS,
                    lay_out: bool = True) -> list[DeviceProgram]:
    """The :class:`DeviceProgram` of each of min(G, K) devices (collectives checked first,
    :func:`~caramel.plan.collectives.plan_collectives`); ``reuse``, ``keep_inputs``: each chip's row
    assignment (:func:`~caramel.plan.assign_rows`; ``"fifo"`` or ``"none"`` for runs on several streams, inputs
    kept for replayed graphs; with ``"none"`` and ``lay_out``, the rows laid out for the calls,
    :func:`contiguous_rows`); ``part_limbs``: the least size of a communication part (:func:`comm_parts`; a very
    large one: a level's communication in one step). The timeline model compares the layouts and parts with them."""
    cols = plan_collectives(plan, primes if gpus > 1 else None)  # (one device sums mod q: no uint32 limit)
    where = placement(len(plan.chips), gpus)
    parts = comm_parts(plan, cols, part_limbs)
    out = []
    for d in range(max(where) + 1):
        hosted = tuple(c for c, w in enumerate(where) if w == d)
        rows_of, base = chip_rows(plan, hosted, reuse, keep_inputs)
        scalars, scalar_base = [], {}
        kernels: list[tuple[tuple[int, int, int], Kernel]] = []  # ((level, chip, index), kernel)
        comm_levels: set[int] = set()
        for c in hosted:
            chip = plan.chips[c]
            scalar_base[c] = len(scalars)
            scalars += chip.scalars
            for j, k in enumerate(chip.kernels):
                if k.kind is Kind.COMM:
                    comm_levels.add(k.level)
                else:
                    kernels.append(((k.level, c, j), k))
        # Per level: the communication parts first, then the hosted chips' kernels, chip by chip.
        order = sorted([((lv, 0, i, 0), (lv, i)) for lv in comm_levels for i in range(len(parts[lv]))]
                       + [((key[0], 1) + key[1:], key[1:] + (k,)) for key, k in kernels], key=lambda e: e[0])
        steps: list = []
        for _, item in order:
            if len(item) == 2:
                step = device_comm_step(item[0], parts[item[0]][item[1]], d, where)
                if step.ops or step.before or step.after:
                    steps.append(step)
            else:
                steps.append(item)
        if reuse == "none" and lay_out:
            rows_of = contiguous_rows(rows_of, base, steps)
        out.append(_assemble(d, hosted, rows_of, base, scalars, scalar_base, steps))
    return out


def _assemble(device: int, hosted: tuple[int, ...], rows_of: dict[int, np.ndarray], base: int, scalars, scalar_base,
              steps) -> DeviceProgram:
    """The :class:`DeviceProgram` with its arena: the chips' ``base`` rows, then the scratch, zero and staging rows
    that ``steps`` need with these rows."""
    comm = [s for s in steps if isinstance(s, CommStep)]
    scratch = max((s.scratch for s in comm), default=0)

    def row(ref: tuple[int, int]) -> int:  # as DeviceProgram.row
        return base + scratch if ref == ZERO else base + ref[1] if ref[0] < 0 else int(rows_of[ref[0]][ref[1]])

    staging = max((staging_rows(s.ops, row) for s in comm), default=0)
    return DeviceProgram(device, hosted, rows_of, base + scratch + 1 + staging, base, base + scratch,
                         base + scratch + 1, scalars, scalar_base, steps)


def chip_rows(plan: Plan, hosted: Sequence[int], reuse: str, keep_inputs: bool) -> tuple[dict[int, np.ndarray], int]:
    """(rows_of, rows) of the chips ``hosted`` on one device: each chip's :func:`~caramel.plan.assign_rows` map
    (-1: no row), shifted past the chips before it, and the rows they take together."""
    rows_of, base = {}, 0
    for c in hosted:
        r, count = assign_rows(plan.chips[c], reuse=reuse, keep_inputs=keep_inputs)
        rows_of[c] = np.where(r >= 0, r + base, -1)
        base += count
    return rows_of, base


def relayout(prog: DeviceProgram, plan: Plan, reuse: str, keep_inputs: bool = False) -> DeviceProgram:
    """``prog`` with its chips' rows assigned anew (``reuse``, ``keep_inputs`` as :func:`device_programs`): the
    same steps, the scratch, zero and staging rows after the new chip rows."""
    rows_of, base = chip_rows(plan, prog.chips, reuse, keep_inputs)
    if reuse == "none":
        rows_of = contiguous_rows(rows_of, base, prog.steps)
    return _assemble(prog.device, prog.chips, rows_of, base, prog.scalars, prog.scalar_base, prog.steps)


def device_groups(progs: Sequence[DeviceProgram]) -> list[tuple[int, ...]]:
    """Every device group that a device collective uses, in the fixed order in which every
    device creates its communicators (by size, then devices)."""
    groups = {o.group for p in progs for s in p.steps if isinstance(s, CommStep) for o in s.ops}
    return sorted(groups, key=lambda g: (len(g), g))


#: With several streams, a GPU run gives every buffer its own row when the largest device's arena then takes at
#: most this share of the device memory free (:func:`gpu_device_programs`).
ARENA_SHARE = 0.5


def gpu_device_programs(plan: Plan, gpus: int, ctx, streams: int, *, reuse: str | None = None,
                        free_bytes: int | None = None) -> list[DeviceProgram]:
    """The device programs as the GPUs run them (collectives checked first): inputs in rows that
    no kernel overwrites, so replays need no restore. ``reuse`` (:func:`~caramel.plan.assign_rows`; None: by
    the streams): with one stream rows are reused last-in first-out (the fewest rows); with several, every
    buffer has a row of its own (``"none"``: the streams wait only for the data dependencies, no kernel for
    another to finish reading a row it would overwrite) when the largest
    device's arena then takes at most :data:`ARENA_SHARE` of ``free_bytes`` (the device memory free; None:
    unknown, no limit), else rows are reused first-in first-out (the same rows as one stream, fewer hazards
    between streams)."""
    if int(streams) < 1:
        raise ValueError(f"streams must be at least 1, got {streams}")
    if reuse is not None or int(streams) == 1:
        return device_programs(plan, gpus, ctx.primes, reuse=reuse or "lifo", keep_inputs=True)
    progs = device_programs(plan, gpus, ctx.primes, reuse="none", keep_inputs=True)
    if free_bytes is None or max(p.n_rows for p in progs) * 4 * ctx.n <= ARENA_SHARE * free_bytes:
        return progs
    return [relayout(p, plan, "fifo", keep_inputs=True) for p in progs]  # (the collectives are checked once)


__all__ = [
    "CommStep", "DeviceOp", "DeviceProgram", "LocalSum", "MIN_PART_LIMBS", "ModRows", "ZERO", "bucket_sides",
    "chip_rows", "comm_parts", "contiguous_rows", "device_comm_step", "device_groups", "device_programs",
    "gpu_device_programs", "in_place", "pack", "placement", "relayout", "staging_rows",
]
