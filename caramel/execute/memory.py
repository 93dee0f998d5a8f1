"""The one check of an input memory image, before any executor runs (CPU or GPU).

An image maps :class:`~caramel.program.Mem` names to limbs: arrays of N unsigned residues below the
limb's prime (scalar entries: one residue, shape ``()`` or ``(1,)``). Every problem is collected and
reported together in one :class:`~caramel.errors.BindingError`. The reference checks a program's
image (:func:`check_memory_image`: every entry, and the first place each missing limb is loaded);
the plan executors check the limbs a plan reads (:func:`check_plan_memory`). This module imports
nothing from the plan: the oracle stays independent of it.
"""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from caramel.errors import BindingError
from caramel.program import Mem, Opcode, Program
from caramel.ring import Context

_LIMIT = 20


def loaded_names(program: Program) -> dict[Mem, tuple[str, int]]:
    """Every memory name a program loads before storing it itself, with the first place it does
    (file, line); scalars (``loas``) are marked by the opcode in the caller's check."""
    needed: dict[Mem, tuple[str, int]] = {}
    for stream in program.streams:
        stored: set[Mem] = set()
        for ins in stream.instructions:
            if ins.op in (Opcode.STORE, Opcode.SPILL):
                stored.add(ins.dst)
            elif ins.op in (Opcode.LOAD, Opcode.EVG, Opcode.LOAS):
                mem = ins.srcs[0]
                if mem not in stored and mem not in needed:
                    needed[mem] = (stream.path, ins.line)
    return needed


def check_image(ctx: Context, memory: Mapping[Mem, np.ndarray], needed: Mapping[Mem, str], scalars: set[Mem],
                checked: Iterable[Mem]) -> None:
    """Raise :class:`BindingError` naming every limb of ``needed`` (name -> where it is first
    read, for the message) missing from ``memory`` and every limb of ``checked`` that is
    misshaped (vectors (N,), ``scalars`` () or (1,)), not of an integer type or out of range."""
    problems: list[str] = []
    missing = [(mem, where) for mem, where in needed.items() if mem not in memory]
    if missing:
        shown = ", ".join(f"{mem}{where}" for mem, where in missing[:_LIMIT])
        more = f" and {len(missing) - _LIMIT} more" if len(missing) > _LIMIT else ""
        problems.append(f"{len(missing)} input limb(s) not provided: {shown}{more}")
    for mem in checked:
        if len(problems) > _LIMIT:
            break
        if not 0 <= mem.limb < len(ctx.primes):
            problems.append(f"{mem}: limb index outside the {len(ctx.primes)} primes")
            continue
        a = np.asarray(memory[mem])
        if a.dtype.kind not in "ui":
            problems.append(f"{mem}: dtype {a.dtype} is not an integer type")
            continue
        want = ((), (1,)) if mem in scalars else ((ctx.n,),)
        if a.shape not in want:
            problems.append(f"{mem}: shape {a.shape}, expected {want[0] if want[0] else '() (one residue)'} ")
            continue
        q = ctx.q(mem.limb)
        if a.size and (int(a.min()) < 0 or int(a.max()) >= q):
            problems.append(f"{mem}: residues must lie in [0, q_{mem.limb} = {q}), found {int(a.min())}..{int(a.max())}")
    if problems:
        raise BindingError("bad input memory image:\n  " + "\n  ".join(problems))


def check_memory_image(program: Program, ctx: Context, memory: Mapping[Mem, np.ndarray]) -> None:
    """Raise :class:`BindingError` naming every missing, misshaped or out-of-range input limb of
    ``program`` (every entry of ``memory`` is checked)."""
    needed = {mem: f" (first loaded at {path}:{line})" for mem, (path, line) in loaded_names(program).items()}
    scalars = {ins.srcs[0] for s in program.streams for ins in s.instructions if ins.op == Opcode.LOAS}
    check_image(ctx, memory, needed, scalars, memory)


def check_plan_memory(plan, ctx: Context, memory: Mapping[Mem, np.ndarray], kept: frozenset[Mem] = frozenset()) -> None:
    """The same check for the limbs that a :class:`~caramel.plan.Plan` reads (its chips'
    ``inputs`` and loaded ``scalars``), in name order. ``kept``: limbs that a resident run keeps
    from an image checked before and does not read from this one (a batch's shared keys): they
    must be present, and their contents are not scanned again."""
    scalars = {s.mem for c in plan.chips for s in c.scalars if s.mem is not None}
    needed = {m: "" for m in sorted({m for c in plan.chips for m in c.inputs} | scalars, key=str)}
    check_image(ctx, memory, needed, scalars, [m for m in needed if m in memory and m not in kept])


__all__ = ["check_image", "check_memory_image", "check_plan_memory", "loaded_names"]
