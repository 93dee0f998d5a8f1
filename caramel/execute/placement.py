"""Chips on devices: placement, per-device communication steps, packing, and per-device programs.

Chips map onto G <= K devices in contiguous blocks (:func:`placement`). A device runs its chips'
kernels merged by level; a communication among chips of ONE device is a local copy or a local
modular sum; otherwise the device-level collective (:class:`DeviceOp`) runs among the devices
involved, after local partial sums, and is followed by local copies and ``% q``
(:func:`device_comm_step`). The collectives themselves and their global order come from
:func:`caramel.plan.collectives.plan_collectives`.

A device's :class:`DeviceProgram` has one arena: the rows of each hosted chip (its own
:func:`~caramel.plan.assign_rows` map, shifted), then scratch rows for partial sums, one zero
row that is never written, and staging rows. The hosted chips' kernels run merged by plan level; at
each level the communication comes first, as one :class:`CommStep` (local sums, ONE group of
device collectives, ``% q`` and copies; the limbs that one root sends in the step travel as one
call through contiguous staging rows, :func:`pack`), then the level's kernels, chip by chip.
Each chip keeps its own kernel order, so its row reuse stays valid. One device hosting every
chip (G = 1) needs no collective at all: that is how a plan runs in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from caramel.errors import ExecutionError
from caramel.plan.collectives import Collective, CollectiveKind, plan_collectives
from caramel.plan.kernel import Kernel, Kind, Plan, ScalarSpec
from caramel.plan.plan import assign_rows


def placement(chips: int, devices: int) -> tuple[int, ...]:
    """The device of every chip: contiguous blocks, chip c on device c * G // K (G <= K)."""
    if devices < 1:
        raise ExecutionError(f"need at least one device, got {devices}")
    devices = min(devices, chips)
    return tuple(c * devices // chips for c in range(chips))


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
        if recv is not None:
            mods.append(ModRows((recv,), col.prime))
    ops.sort(key=lambda o: (len(o.group), o.group, o.sync))
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


def staging_rows(ops: Sequence[DeviceOp]) -> int:
    """Staging rows that :func:`pack` needs for one step (buckets of one use the rows in place)."""
    return sum(len(b) for b in pack(ops) if len(b) > 1)


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


def device_programs(plan: Plan, devices: int, primes: Sequence[int], *, reuse: str = "lifo",
                    keep_inputs: bool = False) -> list[DeviceProgram]:
    """The :class:`DeviceProgram` of each of min(G, K) devices (collectives checked first,
    :func:`~caramel.plan.collectives.plan_collectives`); ``reuse``, ``keep_inputs``: each chip's row
    assignment (:func:`~caramel.plan.assign_rows`; ``"fifo"`` or ``"none"`` for runs on several streams, inputs
    kept for replayed graphs)."""
    cols = plan_collectives(plan, primes if devices > 1 else None)  # (one device sums mod q: no uint32 limit)
    where = placement(len(plan.chips), devices)
    by_level: dict[int, list[Collective]] = {}
    for c in cols:
        by_level.setdefault(c.level, []).append(c)
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
        # Per level: the communication step first, then the hosted chips' kernels, chip by chip.
        order = sorted([((lv, 0, 0, 0), lv) for lv in comm_levels]
                       + [((key[0], 1) + key[1:], key[1:] + (k,)) for key, k in kernels], key=lambda e: e[0])
        steps, scratch, staging = [], 0, 0
        for _, item in order:
            if isinstance(item, int):
                step = device_comm_step(item, by_level[item], d, where)
                scratch = max(scratch, step.scratch)
                staging = max(staging, staging_rows(step.ops))
                steps.append(step)
            else:
                steps.append(item)
        out.append(DeviceProgram(d, hosted, rows_of, base + scratch + 1 + staging, base, base + scratch,
                                 base + scratch + 1, scalars, scalar_base, steps))
    return out


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
    shift = base - prog.scratch_base
    return replace(prog, rows_of=rows_of, n_rows=prog.n_rows + shift, scratch_base=base,
                   zero_row=prog.zero_row + shift, staging_base=prog.staging_base + shift)


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
    another to finish reading a row it would overwrite; docs/PERFORMANCE.md, session 18) when the largest
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
    "CommStep", "DeviceOp", "DeviceProgram", "LocalSum", "ModRows", "ZERO", "chip_rows", "device_comm_step",
    "device_groups", "device_programs", "gpu_device_programs", "pack", "placement", "relayout", "staging_rows",
]
