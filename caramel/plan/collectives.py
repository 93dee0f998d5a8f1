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
breaks this (participants at different levels, or any pairing rule of ISA.md 6, whose one home is
:func:`caramel.validate.check_pairing`) is refused with a :class:`~caramel.plan.dag.PlanError` before
any device work starts.
Where the collectives run (chips on devices) is :mod:`caramel.execute.placement`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence

from caramel.errors import ExecutionError, Location
from caramel.plan.dag import PlanError
from caramel.plan.kernel import Kind, Plan
from caramel.program import Instruction, Opcode, VReg
from caramel.validate import check_pairing


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
    the plan level shared by all participants.
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
    """Every communication of ``plan`` as a :class:`Collective`, in the global order. Raises
    :class:`PlanError` with every problem: the pairing rules of ISA.md 6 (:func:`caramel.validate.check_pairing`),
    all participants of an id at one plan level, and with ``primes``, REDUCE groups small enough for
    a uint32 sum (:func:`check_reduce_size`)."""
    parts: list[tuple[int, Instruction]] = []
    level: dict[tuple[int, Instruction], int] = {}
    for chip in plan.chips:
        for kernel in chip.kernels:
            if kernel.kind is Kind.COMM:
                for j, c in enumerate(kernel.comms):
                    line = kernel.lines[j] if j < len(kernel.lines) else 0
                    ins = Instruction(c.op, VReg(c.dst) if c.dst >= 0 else None, (VReg(c.src),) if c.src >= 0 else (),
                                      c.prime if c.op is Opcode.JOI else None, line, sync=c.sync, size=c.size)
                    parts.append((chip.chip, ins))
                    level[chip.chip, ins] = kernel.level
    pairing = check_pairing(parts, len(plan.chips), lambda c: f"chip {c}")
    problems = [f"chip {chip} line {ins.line}: {reason}" for chip, ins, reason, _ in pairing.problems]
    out: list[Collective] = []
    for sync in sorted({ins.sync for _, ins in parts} - pairing.bad):
        members = pairing.dis.get(sync, []) + pairing.rcv.get(sync, []) + pairing.joi.get(sync, [])
        size = members[0][1].size
        where = f"communication id {sync} ({sync >> 16}:{sync & 0xFFFF}, size {size})"
        levels = {level[m] for m in members}
        if len(levels) != 1:
            problems.append(f"{where}: participants at different plan levels {sorted(levels)}; "
                            "no collective order exists")
            continue
        chips = sorted(ch for ch, _ in members)
        dst = tuple(sorted((ch, ins.dst.index) for ch, ins in members if ins.dst is not None))
        if sync in pairing.dis:
            root, ins = pairing.dis[sync][0]
            kind, src, prime = CollectiveKind.BROADCAST, ((root, _src(ins)),), sync & 0xFFFF
        else:
            kind, root, prime = CollectiveKind.REDUCE, dst[0][0], members[0][1].base
            src = tuple(sorted((ch, _src(ins)) for ch, ins in members))
            if primes is not None:
                try:
                    check_reduce_size(size, int(primes[prime]), where)
                except ExecutionError as e:
                    problems.append(str(e))
                    continue
        out.append(Collective(sync, kind, root, tuple(chips), prime, levels.pop(), src, dst))
    if problems:
        more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
        raise PlanError(Location(plan.name), "the plan's communication cannot run as collectives:\n  "
                        + "\n  ".join(problems[:20]) + more)
    out.sort(key=lambda c: c.key)
    return out


def _src(ins: Instruction) -> int:
    """The buffer a participant sends or contributes (-1: a sourceless ``joi``)."""
    return ins.srcs[0].index if ins.srcs else -1


__all__ = ["Collective", "CollectiveKind", "check_reduce_size", "plan_collectives"]
