"""The one check of an input memory image, before any executor runs (CPU or GPU).

An image maps :class:`~caramel.program.Mem` names to limbs: arrays of N unsigned residues below the
limb's prime (scalar entries: one residue, shape ``()`` or ``(1,)``). Every problem is collected and
reported together in one :class:`~caramel.errors.BindingError`. The reference checks a program's
image (:func:`check_memory_image`: every entry, and the first place each missing limb is loaded);
the plan executors check the limbs a plan reads (:func:`check_plan_memory`). This module imports
nothing from the plan: the oracle stays independent of it.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import numpy as np

from caramel.arrays import is_device_array
from caramel.errors import BindingError
from caramel.program import LOADS, STORES, Mem, Opcode, Program
from caramel.ring import Context

_LIMIT = 20
#: Types whose values an upload to a ``uint32`` arena keeps exactly (no wrap-around), so that the
#: range of the uploaded row is the range of the input (:func:`check_ranges`).
_DEVICE_EXACT = frozenset(np.dtype(t) for t in (np.uint8, np.uint16, np.uint32))


def check_image(ctx: Context, memory: Mapping[Mem, np.ndarray], needed: Mapping[Mem, str], scalars: set[Mem],
                checked: Iterable[Mem], defer: list[Mem] | None = None) -> None:
    """Raise :class:`BindingError` naming every limb of ``needed`` (name -> where it is first
    read, for the message) missing from ``memory`` and every limb of ``checked`` that is
    misshaped (vectors (N,), ``scalars`` () or (1,)), not of an integer type or out of range.
    ``defer``: a list that receives the vector limbs of ``checked`` whose type converts to the
    device's ``uint32`` exactly (:data:`_DEVICE_EXACT`), instead of scanning their residues here:
    the caller uploads them and must then call :func:`check_ranges`."""
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
        a = memory[mem]
        if not is_device_array(a):  # a row on the GPU (the GPU client's keys) stays there
            a = np.asarray(a)
        if a.dtype.kind not in "ui":
            problems.append(f"{mem}: dtype {a.dtype} is not an integer type")
            continue
        want = ((), (1,)) if mem in scalars else ((ctx.n,),)
        if a.shape not in want:
            problems.append(f"{mem}: shape {a.shape}, expected {want[0] if want[0] else '() (one residue)'} ")
            continue
        if defer is not None and a.dtype in _DEVICE_EXACT and a.ndim == 1:
            defer.append(mem)  # range checked after the upload (check_ranges)
            continue
        q = ctx.q(mem.limb)
        # unsigned: the minimum is >= 0, so one pass (the maximum) decides; both are named when it fails
        if a.size and ((a.dtype.kind == "i" and int(a.min()) < 0) or int(a.max()) >= q):
            problems.append(f"{mem}: residues must lie in [0, q_{mem.limb} = {q}), found {int(a.min())}..{int(a.max())}")
    if problems:
        raise BindingError("bad input memory image:\n  " + "\n  ".join(problems))


def check_memory_image(program: Program, ctx: Context, memory: Mapping[Mem, np.ndarray]) -> None:
    """Raise :class:`BindingError` naming every missing, misshaped or out-of-range input limb of
    ``program`` (every entry of ``memory`` is checked; a missing one with the first place where a
    chip loads it before storing it itself)."""
    needed: dict[Mem, str] = {}
    scalars = {ins.srcs[0] for s in program.streams for ins in s.instructions if ins.op == Opcode.LOAS}
    for stream in program.streams:
        stored: set[Mem] = set()
        for ins in stream.instructions:
            if ins.op in STORES:
                stored.add(ins.dst)
            elif ins.op in LOADS or ins.op == Opcode.LOAS:
                if ins.srcs[0] not in stored:
                    needed.setdefault(ins.srcs[0], f" (first loaded at {stream.path}:{ins.line})")
    check_image(ctx, memory, needed, scalars, memory)


def check_plan_memory(plan, ctx: Context, memory: Mapping[Mem, np.ndarray], kept: frozenset[Mem] = frozenset(),
                      *, defer_ranges: bool = False) -> list[Mem]:
    """The same check for the limbs that a :class:`~caramel.plan.Plan` reads (its chips'
    ``inputs`` and loaded ``scalars``), in name order. ``kept``: limbs that a resident run keeps
    from an image checked before (a batch's shared keys): present, not scanned again.
    ``defer_ranges``: the residues of the limbs that ``check_image`` defers are not scanned; they
    are returned (in name order) for the caller to upload and pass to :func:`check_ranges`."""
    scalars = {s.mem for c in plan.chips for s in c.scalars if s.mem is not None}
    needed = {m: "" for m in sorted({m for c in plan.chips for m in c.inputs} | scalars, key=str)}
    deferred: list[Mem] | None = [] if defer_ranges else None
    check_image(ctx, memory, needed, scalars, [m for m in needed if m in memory and m not in kept], deferred)
    return deferred or []


def check_ranges(ctx: Context, memory: Mapping[Mem, np.ndarray], mems: Sequence[Mem], maxima) -> None:
    """The range part of :func:`check_image` for limbs left to the caller (``defer``): ``maxima[i]``
    is the largest residue of ``mems[i]`` as uploaded (unsigned, so the smallest is >= 0). Raises
    the same :class:`BindingError` as the host check, naming every limb with a residue >= q."""
    maxima = np.asarray(maxima, dtype=np.int64).reshape(-1)
    if len(maxima) != len(mems):
        raise ValueError(f"{len(maxima)} maxima for {len(mems)} limbs")
    q = np.array([ctx.q(m.limb) for m in mems], dtype=np.int64)
    bad = [mems[i] for i in np.flatnonzero(maxima >= q)]
    if bad:
        check_image(ctx, memory, {}, set(), bad)  # the host scan of the bad limbs words the error
        raise BindingError("bad input memory image:\n  " + "\n  ".join(
            f"{m}: residues must lie in [0, q_{m.limb} = {ctx.q(m.limb)}) (not so on the device)" for m in bad))


__all__ = ["check_image", "check_memory_image", "check_plan_memory", "check_ranges"]
