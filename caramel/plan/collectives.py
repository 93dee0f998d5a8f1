"""Communication of a multi-chip plan as collectives in one global order, and its legality.

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
Where the collectives run (chips on devices) is :mod:`caramel.execute.placement`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from caramel.errors import ExecutionError
from caramel.plan.kernel import Kind, Plan
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



__all__ = ["Collective", "CollectiveKind", "check_order", "check_reduce_size", "plan_collectives"]
