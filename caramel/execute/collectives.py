"""Communication of a multi-chip plan as collectives, and their placement on devices.

A plan's ``COMM`` kernels hold each chip's ``dis``/``rcv``/``joi`` (ISA.md section 6). For a
collective library every communication id becomes ONE :class:`Collective` among its
participants:

* ``dis``/``rcv`` with id s: a BROADCAST of the sender's buffer (the root) to the n - 1 receivers;
* ``joi`` with id s: a REDUCE of the n contributions to the destination (the root): a uint32 SUM
  followed by ``% q_L``. The sum of n residues below q fits in 32 bits while n (q - 1) < 2^32,
  that is n <= 16 for 28-bit primes; larger groups are refused (:func:`check_reduce_size`).

Order. Every participant of a communication has the same plan level (:func:`caramel.plan.fusion.levels`
gives a ``rcv`` its ``dis``'s level and every ``joi`` participant its destination's level), and a
chip runs its levels in increasing order. So the *global order* (level, device group, id) is one
total order that every chip's own sequence of collectives follows: no chip can wait for a
collective that another member would issue only after one it is itself blocked on. A plan that
breaks this (participants at different levels, a missing participant) is refused before any
device work starts, and :func:`check_order` verifies per-rank sequences against one global order.

Placement. Chips map onto G <= K devices in contiguous blocks (:func:`placement`). A device runs
its chips' kernels merged by level; a communication among chips of ONE device is a local copy or
a local modular sum; otherwise the device-level collective (:class:`DeviceOp`) runs among the
devices involved, after local partial sums, and is followed by local copies and ``% q``
(:func:`device_comm_step`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from caramel.errors import ExecutionError
from caramel.plan.plan import Kind, Plan
from caramel.program import Opcode

U32_MAX = (1 << 32) - 1


class CollectiveKind(enum.Enum):
    BROADCAST = "broadcast"
    REDUCE = "reduce"


@dataclass(frozen=True)
class Collective:
    """One communication id as a collective over the chips ``members`` (sorted).

    ``root``: the sender (BROADCAST) or the destination (REDUCE). ``src``: (chip, buffer) sent or
    contributed (buffer -1: a sourceless ``joi``, contributing zero); ``dst``: (chip, buffer)
    received. ``prime``: index of q (the limb, ``id & 0xFFFF`` or the ``joi`` base). ``level``:
    the plan level shared by all participants; ``line``: (chip, source line) of one participant,
    for messages.
    """

    sync: int
    kind: CollectiveKind
    root: int
    members: tuple[int, ...]
    prime: int
    level: int
    src: tuple[tuple[int, int], ...]
    dst: tuple[tuple[int, int], ...]

    @property
    def key(self) -> tuple[int, int]:
        """Position in the global order (level, id)."""
        return (self.level, self.sync)


def check_reduce_size(n: int, q: int, what: str) -> None:
    """Refuse a uint32 SUM of ``n`` residues below ``q`` that could wrap (n (q - 1) >= 2^32)."""
    if n * (q - 1) > U32_MAX:
        raise ExecutionError(
            f"{what}: a uint32 sum over {n} chips of residues below q = {q} can overflow "
            f"(at most {U32_MAX // (q - 1)} participants for this prime)")


def plan_collectives(plan: Plan, primes: Sequence[int] | None = None) -> list[Collective]:
    """Every communication of ``plan`` as a :class:`Collective`, in the global order.

    Checks (all problems are reported together as an :class:`ExecutionError`): a ``dis`` id has
    exactly one sender and size - 1 distinct receivers, a ``joi`` id exactly size distinct
    participants of which one names a destination, all participants of an id share one level;
    with ``primes``, REDUCE groups are small enough for a uint32 sum (:func:`check_reduce_size`).
    """
    seen: dict[int, list[tuple[int, object, int]]] = {}
    for chip in plan.chips:
        for kernel in chip.kernels:
            if kernel.kind is Kind.COMM:
                for c in kernel.comms:
                    seen.setdefault(c.sync, []).append((chip.chip, c, kernel.level))
    out: list[Collective] = []
    problems: list[str] = []
    for sync, parts in seen.items():
        chips = [p[0] for p in parts]
        comms = [p[1] for p in parts]
        levels = {p[2] for p in parts}
        size = comms[0].size
        where = f"communication id {sync} ({sync >> 16}:{sync & 0xFFFF}, size {size})"
        if len(set(chips)) != len(chips):
            problems.append(f"{where}: chip(s) {sorted({c for c in chips if chips.count(c) > 1})} take part twice")
            continue
        if len(parts) != size or any(c.size != size for c in comms):
            problems.append(f"{where}: {len(parts)} participant(s) on chips {sorted(chips)}, expected {size}")
            continue
        if len(levels) != 1:
            problems.append(f"{where}: participants at different plan levels {sorted(levels)}; "
                            "no collective order exists")
            continue
        ops = {c.op for c in comms}
        if ops <= {Opcode.DIS, Opcode.RCV}:
            roots = [ch for ch, c in zip(chips, comms) if c.op == Opcode.DIS]
            if len(roots) != 1:
                problems.append(f"{where}: {len(roots)} dis for one id on chips {sorted(chips)}, expected 1")
                continue
            kind = CollectiveKind.BROADCAST
            src = tuple((ch, c.src) for ch, c in zip(chips, comms) if c.op == Opcode.DIS)
        elif ops == {Opcode.JOI}:
            roots = [ch for ch, c in zip(chips, comms) if c.dst >= 0]
            if len(roots) != 1:
                problems.append(f"{where}: {len(roots)} joi destinations on chips {sorted(roots)}, expected 1")
                continue
            kind = CollectiveKind.REDUCE
            src = tuple(sorted((ch, c.src) for ch, c in zip(chips, comms)))
            if primes is not None:
                try:
                    check_reduce_size(size, int(primes[comms[0].prime]), where)
                except ExecutionError as e:
                    problems.append(str(e))
                    continue
        else:
            problems.append(f"{where}: mixes {sorted(o.value for o in ops)}")
            continue
        dst = tuple(sorted((ch, c.dst) for ch, c in zip(chips, comms) if c.dst >= 0))
        out.append(Collective(sync, kind, roots[0], tuple(sorted(chips)), comms[0].prime, levels.pop(), src, dst))
    if problems:
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise ExecutionError("the plan's communication cannot run as collectives:\n  "
                             + "\n  ".join(problems[:20]) + more)
    out.sort(key=lambda c: c.key)
    return out


def check_order(sequences: Mapping[int, Sequence[object]], members: Mapping[object, Iterable[int]]) -> list[object]:
    """One global order of collectives consistent with every rank's own issue order, or an
    :class:`ExecutionError`.

    ``sequences[r]``: the collective ids rank r issues, in order; ``members[x]``: the ranks of
    collective x. Each rank must issue each of its collectives exactly once, and the union of the
    per-rank orders must be acyclic (otherwise two ranks wait on each other: the error names
    the cycle). Returns a topological order of all collectives.
    """
    import networkx as nx

    problems = []
    for x, ranks in members.items():
        for r in ranks:
            count = list(sequences.get(r, ())).count(x)
            if count != 1:
                problems.append(f"rank {r} issues collective {x} {count} times, expected once")
    for r, seq in sequences.items():
        for x in seq:
            if r not in set(members.get(x, ())):
                problems.append(f"rank {r} issues collective {x} but is not one of its members")
    if problems:
        raise ExecutionError("inconsistent collectives:\n  " + "\n  ".join(problems[:20]))
    g = nx.DiGraph()
    g.add_nodes_from(members)
    for r, seq in sequences.items():
        g.add_edges_from(zip(seq[:-1], seq[1:]), rank=r)
    try:
        return list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(g)
        text = ", ".join(f"{a} before {b} on rank {g.edges[a, b]['rank']}" for a, b in cycle)
        raise ExecutionError(f"no collective order is consistent with every rank: {text}") from None


def placement(chips: int, devices: int) -> tuple[int, ...]:
    """The device of every chip: contiguous blocks, chip c on device c * G // K (G <= K)."""
    if devices < 1:
        raise ExecutionError(f"need at least one device, got {devices}")
    devices = min(devices, chips)
    return tuple(c * devices // chips for c in range(chips))


# ---------------------------------------------------------------------------------------------- devices


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


__all__ = [
    "Collective", "CollectiveKind", "CommStep", "DeviceOp", "LocalSum", "ModRows", "check_order",
    "ZERO", "check_reduce_size", "device_comm_step", "pack", "placement", "plan_collectives",
    "staging_rows",
]
