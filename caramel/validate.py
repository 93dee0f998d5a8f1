"""Static checks of a compiled program, with located errors collected and reported together.

:func:`check` returns every problem it finds (up to a limit) as :class:`~caramel.errors.LocatedError`
objects (``path:line:col: reason``); :func:`validate` raises :class:`~caramel.errors.ValidationError`
holding them. The rules (ISA.md sections 2, 4.4, 6 and 8):

* **Unsupported**: ``rec``/``snd`` are parsed but rejected (ISA.md decision 4).
* **Def-use** per stream: every vector register, scalar register and base conversion slot is written
  before it is read, and no register is read after its last use ``[X]`` unless it was rewritten.
  ``rsi`` initialises a register group, ``rsv`` and ``mod`` need a group that ``rsi`` initialised.
* **Memory**: every ``load``/``evg``/``loas`` names a ``term(limb)`` that the manifests provide
  (``program_inputs`` input sections, the chip's ``inputs<p>`` Input section) or that an earlier
  ``store``/``spill`` of the same stream wrote; every Output entry is stored by some chip or is an
  input term (ISA.md 8.6). Programs without any manifest (a single instruction file) skip this rule.
* **Base conversion units** (ISA.md 4.4): ``pl1``/``bcw`` only after a ``bci`` of their unit, on a
  limb of its input list, each input written once; a read ``bK{M}`` only once every input is
  written, with M in range, the read's base equal to the M-th output limb, each slot read once; a
  unit is re-``bci``'d only after every slot of the previous conversion was read; ``bci`` lists are
  strictly increasing and disjoint (an overlap is the limb collision of ISA.md 8.7).
* **Limbs**: every base, memory limb, list entry, sync limb and manifest limb is a prime index 0..63;
  the register form of ``sud`` drops a limb above its base (the tag of its second source).
* **Level + extension** (ISA.md 5.1, 8.7): a value at level l keyswitched with E extension primes uses
  data limbs 0..l-1 and extension limbs 64-E..63, so l + E <= 64 or the two collide. The exact l and E
  of every keyswitch are the ``level`` and ``E`` fields of its evaluation key symbol
  (``K:type:level:E:rot:...``, ISA.md 5.3): a key with level + E > 64 is reported, and so is a key term
  listing a limb outside the key's layout. (The collision's trace in the instruction stream, a ``bci``
  whose output and input lists overlap, is the BCU rule above; it also covers programs without a manifest.)
* **Rotation steps** (ISA.md 2.2, decisions 1 and 6): ``rot k`` acts as k mod N/2, and the compiler
  writes |k| < N/2 for the N it compiled for. Validation does not know N unless the caller passes ``n``;
  then |k| < n/2 is required, else only steps valid for no supported ring (|k| >= 32768 = 65536/2) are
  reported. The same bound applies to the step of rotation keys (type 1) in the manifests. Decision 6
  lets a program compiled for N = 65536 run at a smaller test N (steps act modulo the slot count), so
  pass ``n`` only to check a program against the ring it was compiled for.
* **Communication** (ISA.md 6), across streams: every ``dis`` id has one sender and size-1 receivers
  on distinct other chips; every ``joi`` id has ``size`` participants on distinct chips, exactly one
  with a destination, and a base equal to ``id & 0xFFFF``; sizes agree and fit the chip count; no id
  is used by both. Then the deterministic mailbox schedule of ISA.md 6 is simulated on the
  communication events alone (linear time) and a deadlock is reported with its cycle of chips.

Everything is one pass per stream over dicts keyed by ints, then a pass over communication events.
"""

from __future__ import annotations

import operator
import re
import sys
import types
from collections import deque
from typing import Callable, NamedTuple
from pathlib import PurePath

from caramel.errors import ArgumentError, LocatedError, Location, UnsupportedError, ValidationError
from caramel.parse import no_gc as _no_gc
from caramel.program import (
    COMMUNICATION, OPCODES, BcuSlot, Instruction, KeyType, Mem, Opcode, Program, Section, SReg, Stream, VReg,
)

#: Number of primes in the context (ISA.md decision 1): every limb index is in 0..LIMBS-1.
LIMBS = 64
#: Largest ring degree: every prime is 1 mod 2^17 = 2N (ISA.md decision 1, section 7 item 2).
MAX_N = 65536
#: Tag of a register that holds an ``rsi``/``rsv`` accumulator word rather than a limb.
_ACC = -1

_DIS, _RCV = Opcode.DIS, Opcode.RCV
_INPUT_SECTIONS = frozenset({Section.CIPHERTEXT, Section.PLAINTEXT, Section.SCALAR, Section.EVALKEY, Section.INPUT})


# ----------------------------------------------------------------------------------------------
# Problems: cheap records while scanning, LocatedError objects only for those reported
# ----------------------------------------------------------------------------------------------


class _Problems:
    """Collects problems as sortable records; columns are computed only for the reported ones."""

    def __init__(self):
        self.items: list[tuple] = []

    def add(self, rank: int, path: str, line: int, reason: str, ins: Instruction | None = None, where=None,
            cls=LocatedError) -> None:
        """Record ``reason`` at ``path:line``; ``where`` names the operand text that locates the column."""
        last = self.items[-1] if self.items else None
        if last is not None and last[1] == line and last[6] == reason and last[3] == path:
            return  # the same register read twice by one instruction: report it once
        self.items.append((rank, line, len(self.items), path, ins, where, reason, cls))

    def located(self, limit: int) -> tuple[list[LocatedError], bool]:
        self.items.sort(key=lambda t: (t[0], t[1], t[2]))
        out = []
        for _rank, line, _seq, path, ins, where, reason, cls in self.items[:limit]:
            out.append(cls(Location(path, line, _column(ins, where)), reason))
        return out, len(self.items) > limit


def _column(ins: Instruction | None, where) -> int:
    """1-based column of ``where`` in the printed instruction (1 when it cannot be located)."""
    if ins is None:
        return 1 if where is None else where
    text = ins.text()
    if where is None:
        return 1
    if where == "base":
        at = text.rfind(" | ")
        return at + 4 if at >= 0 else 1
    if where == "sync":
        at = text.find("@ ")
        return at + 3 if at >= 0 else 1
    if isinstance(where, VReg | SReg):
        # A read operand: skip the destination register (it precedes the first ": ").
        start = text.find(": ") + 2 if isinstance(ins.dst, VReg | SReg) else 0
        m = re.compile(rf"(?<!\w){'r' if isinstance(where, VReg) else 's'}{where.index}(?![\d(])").search(text, start)
        return m.start() + 1 if m else 1
    at = text.find(str(where))
    return at + 1 if at >= 0 else 1


def _name(path: str) -> str:
    return PurePath(path.rpartition("#")[2]).name or path


def _desc(ins: Instruction) -> str:
    return f"{ins.op.value} @ {ins.sync}"


def _step_problem(step: int, n: int | None) -> str | None:
    """Why rotation step ``step`` is out of range at ring degree ``n`` (None: any supported ring), or None.

    ISA.md 2.2 and decision 6: a step acts as ``step mod N/2`` (N/2 slots), and the compiler writes
    |step| < N/2 for the N it compiled for; N <= 65536 (decision 1), so |step| >= 32768 fits no ring.
    """
    half = (n if n is not None else MAX_N) // 2
    if -half < step < half:
        return None
    if n is None:
        return (f"is out of range for every supported ring: |step| must be below {half} (N/2 at the largest "
                f"N = {MAX_N}), i.e. -{half - 1}..{half - 1}")
    return f"is out of range for N = {n}: |step| must be below N/2 = {half}, i.e. -{half - 1}..{half - 1}"


# ----------------------------------------------------------------------------------------------
# One stream: def-use, memory, BCU discipline, limbs
# ----------------------------------------------------------------------------------------------


class _Bcu:
    """State of one base conversion unit since its last ``bci``."""

    __slots__ = ("line", "outs", "ins", "written", "read", "missing")

    def __init__(self, ins: Instruction):
        self.line = ins.line
        self.outs = ins.out_limbs
        self.ins = frozenset(ins.in_limbs)
        self.written: dict[int, int] = {}  # input limb -> line of its pl1/bcw
        self.read: dict[int, int] = {}  # slot -> line of its read
        self.missing = len(self.ins)  # inputs not yet written


def _bad_list(values: tuple[int, ...]) -> str | None:
    for a, b in zip(values, values[1:]):
        if a >= b:
            return "is not strictly increasing"
    for v in values:
        if not 0 <= v < LIMBS:
            return f"has limb {v} outside 0..{LIMBS - 1}"
    return None


class _Scan(NamedTuple):
    """What an opcode's check sees of one instruction's place in the scan of its stream:
    the instruction, where it is, how to report, and the scan's live state (vector register
    tags, base conversion units, the stream's communication list)."""

    ins: Instruction
    rank: int
    path: str
    add: Callable
    vdef: dict
    units: dict
    comm: list
    half: int
    n: int | None

    def report(self, message: str, what=None, cls=None) -> None:
        if cls is None:
            self.add(self.rank, self.path, self.ins.line, message, self.ins, what)
        else:
            self.add(self.rank, self.path, self.ins.line, message, self.ins, what, cls)


def _check_sud(c: _Scan) -> None:
    """``sud`` drops a limb above its base: the dropped register's limb must exceed the base."""
    b, base = c.ins.srcs[1], c.ins.base
    if type(b) is VReg:
        tag = c.vdef.get(b.index)
        if tag is not None and base is not None and tag <= base:
            what = "an rsv accumulator" if tag == _ACC else f"limb {tag}"
            c.report(f"sud drops r{b.index}, which holds {what}; the dropped limb must be above the base {base}", b)


def _check_bcu_write(c: _Scan) -> None:
    """``pl1``/``bcw`` write one input limb of their unit's last ``bci``, once."""
    op, unit, base = c.ins.op, c.ins.unit, c.ins.base
    u = c.units.get(unit)
    if u is None:
        c.report(f"{op.value} B{unit} before any bci B{unit}")
    elif base not in u.ins:
        limbs = ",".join(str(x) for x in sorted(u.ins))
        c.report(f"{op.value} B{unit} writes limb {base}, which is not an input of bci B{unit} at line {u.line} "
                 f"([{limbs}])", "base")
    else:
        first = u.written.get(base)
        if first is not None:
            c.report(f"{op.value} B{unit} writes input limb {base} twice (first at line {first})", "base")
        else:
            u.written[base] = c.ins.line
            u.missing -= 1


def _check_bci(c: _Scan) -> None:
    """``bci`` resets a unit whose slots were all read; its lists are valid and disjoint."""
    ins, unit = c.ins, c.ins.unit
    prev = c.units.get(unit)
    if prev is not None and len(prev.read) < len(prev.outs):
        unread = ",".join(str(m) for m in range(len(prev.outs)) if m not in prev.read)
        c.report(f"bci B{unit} resets the unit before every slot of bci B{unit} at line {prev.line} was read "
                 f"(unread slots {unread})")
    for what, values in (("output", ins.out_limbs), ("input", ins.in_limbs)):
        why = _bad_list(values)
        if why:
            c.report(f"bci B{unit} {what} list {why}")
    both = set(ins.out_limbs) & set(ins.in_limbs)
    if both:
        limbs = ",".join(str(x) for x in sorted(both))
        c.report(f"bci B{unit} output and input lists overlap on limb(s) {limbs}: limb index collision, "
                 f"level + extension > {LIMBS} (ISA.md 8.7)")
    if not 0 <= unit < 2:
        c.report(f"unit B{unit} does not exist (only B0 and B1)")
    c.units[unit] = _Bcu(ins)


def _check_rsv(c: _Scan) -> None:
    """``rsv``: a valid basis, one group register per basis limb, the base among them."""
    ins = c.ins
    why = _bad_list(ins.in_limbs)
    if why:
        c.report(f"rsv basis {why}")
    if len(ins.group) != len(ins.in_limbs):
        c.report(f"rsv group has {len(ins.group)} register(s) but its basis has {len(ins.in_limbs)} limb(s)")
    if ins.base not in ins.in_limbs:
        c.report(f"rsv base {ins.base} is not in its basis", "base")


def _check_mod(c: _Scan) -> None:
    """``mod`` reads registers that ``rsi`` initialised."""
    for g in c.ins.srcs:
        tag = c.vdef.get(g.index)
        if tag is not None and tag != _ACC:
            c.report(f"mod reads r{g.index}, which was not initialised by rsi", g)


def _check_comm(c: _Scan) -> None:
    """``dis``/``rcv``/``joi``: collected for the cross-stream checks; the sync id names a limb."""
    c.comm.append(c.ins)
    sync = c.ins.sync
    limb = sync & 0xFFFF
    if not 0 <= limb < LIMBS:
        c.report(f"sync id {sync} names limb {limb}, outside 0..{LIMBS - 1}", "sync")


def _check_unsupported(c: _Scan) -> None:
    """``rec``/``snd`` are refused (ISA.md 4.1)."""
    c.report(f"{c.ins.op.value} is not supported: the Cinnamon compiler never emits it and its meaning is "
             f"unspecified (ISA.md 4.1)", None, UnsupportedError)


def _check_rot(c: _Scan) -> None:
    """``rot`` steps lie strictly between -N/2 and N/2."""
    step = c.ins.step
    if not -c.half < step < c.half:
        c.report(f"rot step {step} {_step_problem(step, c.n)}", step)


#: The opcode-specific checks of :func:`_check_stream`, one handler per opcode that has any; what
#: every opcode reads and writes (the generic def-use rules) is :data:`caramel.program.OPCODES`.
_OPCODE_CHECKS: dict[Opcode, Callable[[_Scan], None]] = {
    Opcode.SUD: _check_sud, Opcode.PL1: _check_bcu_write, Opcode.BCW: _check_bcu_write, Opcode.BCI: _check_bci,
    Opcode.RSV: _check_rsv, Opcode.MOD: _check_mod, Opcode.ROT: _check_rot, **dict.fromkeys(COMMUNICATION, _check_comm),
    **{op: _check_unsupported for op, info in OPCODES.items() if not info.supported},
}


def _check_stream(stream: Stream, rank: int, provided: tuple[set, set] | None, problems: _Problems, comm: list,
                  own: set, n: int | None = None) -> None:
    """Scan one stream: def-use, memory, BCU, limbs.

    Appends the stream's communication instructions to ``comm`` and the (term, limb) names it stores
    or spills to ``own`` (a load is satisfied by a store earlier in the same stream).
    """
    path = stream.path
    add = problems.add
    vdef: dict[int, int] = {}  # live vector register -> tag
    vdead: dict[int, int] = {}  # register -> line of its last use [X] (not rewritten since)
    sdef: set[int] = set()
    sdead: dict[int, int] = {}
    units: dict[int, _Bcu] = {}
    check_mem = provided is not None
    common, extra = provided if provided is not None else (set(), set())
    half = (n if n is not None else MAX_N) // 2

    def bad_read(reg, line: int, ins: Instruction) -> None:
        if type(reg) is VReg:
            dead = vdead.get(reg.index)
            name = f"r{reg.index}"
        else:
            dead = sdead.get(reg.index)
            name = f"s{reg.index}"
        if dead is not None:
            add(rank, path, line, f"register {name} is read after its last use [X] at line {dead}", ins, reg)
        else:
            add(rank, path, line, f"register {name} is read before it is written", ins, reg)

    for ins in stream.instructions:
        op, dst, srcs, base, line, _final, step, sync, _size, unit, out_limbs, in_limbs, group = ins
        info = OPCODES[op]

        # ---- reads
        for s in srcs:
            t = type(s)
            if t is VReg:
                if s.index not in vdef:
                    bad_read(s, line, ins)
            elif t is SReg:
                if s.index not in sdef:
                    bad_read(s, line, ins)
            elif t is BcuSlot:
                u = units.get(s.unit)
                if u is None:
                    add(rank, path, line, f"b{s.unit}{{{s.slot}}} is read before any bci B{s.unit}", ins, s)
                elif s.slot >= len(u.outs):
                    add(rank, path, line, f"b{s.unit}{{{s.slot}}} is out of range: bci B{s.unit} at line {u.line} "
                        f"has {len(u.outs)} output limb(s)", ins, s)
                else:
                    if u.missing:
                        miss = ",".join(str(x) for x in sorted(u.ins - u.written.keys()))
                        add(rank, path, line, f"b{s.unit}{{{s.slot}}} is read before every input of bci B{s.unit} "
                            f"at line {u.line} is written (missing limbs [{miss}])", ins, s)
                    first = u.read.get(s.slot)
                    if first is not None:
                        add(rank, path, line, f"b{s.unit}{{{s.slot}}} is read twice (first read at line {first})",
                            ins, s)
                    else:
                        u.read[s.slot] = line
                    if base != u.outs[s.slot]:
                        add(rank, path, line, f"b{s.unit}{{{s.slot}}} holds limb {u.outs[s.slot]} (bci B{s.unit} at "
                            f"line {u.line}) but is read with base {base}", ins, "base")
            elif t is Mem:  # load, evg, loas (rec is refused by its handler)
                if not 0 <= s.limb < LIMBS:
                    add(rank, path, line, f"memory limb {s.limb} of {s} is outside 0..{LIMBS - 1}", ins, s)
                key = (s.term, s.limb)
                if check_mem and info.supported and key not in common and key not in own and key not in extra:
                    add(rank, path, line, f"{op.value} of {s}: no manifest entry provides it and no earlier "
                        f"store or spill of this stream wrote it", ins, s)
        if group and info.group == "rw":
            for g in group:
                tag = vdef.get(g.index)
                if tag is None:
                    bad_read(g, line, ins)
                elif tag != _ACC:
                    add(rank, path, line, f"rsv group register r{g.index} was not initialised by rsi", ins, g)

        # ---- limb index of the instruction
        if base is not None and not 0 <= base < LIMBS:
            add(rank, path, line, f"base {base} is outside 0..{LIMBS - 1}", ins, "base")

        # ---- opcode-specific checks (a table of handlers, below)
        handler = _OPCODE_CHECKS.get(op)
        if handler is not None:
            handler(_Scan(ins, rank, path, add, vdef, units, comm, half, n))

        # ---- last uses [X], then the destination (an instruction may overwrite a dying source)
        for s in srcs:
            if type(s) is VReg:
                if s.dead and s.index in vdef:
                    del vdef[s.index]
                    vdead[s.index] = line
            elif type(s) is SReg and s.dead and s.index in sdef:
                sdef.discard(s.index)
                sdead[s.index] = line
        for g in group:
            if g.dead and g.index in vdef:
                del vdef[g.index]
                vdead[g.index] = line

        if dst is not None:
            t = type(dst)
            if t is VReg:
                idx = dst.index
                vdef[idx] = base if base is not None else ins.limb  # load/evg: memory limb, rcv: sync limb
                if vdead:
                    vdead.pop(idx, None)
            elif t is SReg:
                sdef.add(dst.index)
                sdead.pop(dst.index, None)
            else:  # store / spill / snd
                if not 0 <= dst.limb < LIMBS:
                    add(rank, path, line, f"memory limb {dst.limb} of {dst} is outside 0..{LIMBS - 1}", ins, dst)
                own.add((dst.term, dst.limb))
        elif info.group == "w":
            for g in group:
                vdef[g.index] = _ACC
                vdead.pop(g.index, None)

    for unit, u in sorted(units.items()):
        if len(u.read) < len(u.outs):
            unread = ",".join(str(m) for m in range(len(u.outs)) if m not in u.read)
            add(rank, path, u.line, f"bci B{unit}: slot(s) {unread} are never read before the stream ends")


# ----------------------------------------------------------------------------------------------
# Communication across streams: pairing, then the mailbox schedule
# ----------------------------------------------------------------------------------------------


def _check_communication(program: Program, comm: list[list[Instruction]], problems: _Problems) -> None:
    paths = [s.path for s in program.streams]
    pairing = check_pairing(((c, ins) for c, events in enumerate(comm) for ins in events), program.chips,
                            lambda c: _name(paths[c]))
    for chip, ins, reason, where in pairing.problems:
        problems.add(chip, paths[chip], ins.line, reason, ins, where)
    _check_schedule(program, comm, pairing.dis, pairing.joi, pairing.bad, problems)


_Parts = dict[int, list[tuple[int, Instruction]]]


class Pairing(NamedTuple):
    """The participants of every communication id by opcode (``dis``, ``rcv``, ``joi``: id ->
    [(chip, instruction)]), the ``problems`` found ((chip, instruction, reason, column anchor)),
    and the ids whose pairing is ``bad`` (no schedule or collective exists for them)."""

    dis: _Parts
    rcv: _Parts
    joi: _Parts
    problems: list[tuple[int, Instruction, str, object]]
    bad: set[int]


def check_pairing(parts, chips: int, name: Callable[[int], str]) -> Pairing:
    """The pairing rules of ISA.md 6, the one home of communication legality (:func:`validate`
    reports them located; :func:`caramel.plan.collectives.plan_collectives` checks a plan with them).

    ``parts``: every (chip, ``dis``/``rcv``/``joi`` instruction) in stream order; ``name(chip)``
    names a chip's file in messages. A ``dis`` id has one sender and size - 1 receivers on distinct
    other chips; a ``joi`` id has ``size`` participants on distinct chips, exactly one with a
    destination, and a base equal to ``id & 0xFFFF``; sizes agree and fit ``chips``; no id is used
    by both.
    """
    dis: _Parts = {}
    rcv: _Parts = {}
    joi: _Parts = {}
    for chip, ins in parts:
        table = dis if ins.op is _DIS else rcv if ins.op is _RCV else joi
        table.setdefault(ins.sync, []).append((chip, ins))
    out = Pairing(dis, rcv, joi, [], set())
    bad = out.bad

    def err(chip: int, ins: Instruction, reason: str, where="sync") -> None:
        out.problems.append((chip, ins, reason, where))

    def check_size(sync: int, parts: list[tuple[int, Instruction]]) -> int:
        size = parts[0][1].size
        for chip, ins in parts[1:]:
            if ins.size != size:
                c0, i0 = parts[0]
                err(chip, ins, f"{_desc(ins)} has size {ins.size} but {name(c0)}:{i0.line} gives size {size}")
                bad.add(sync)
        if size > chips or size < 1:
            err(parts[0][0], parts[0][1], f"{_desc(parts[0][1])} has size {size} but the program has {chips} chip(s)")
            bad.add(sync)
        return size

    for sync, senders in dis.items():
        chip0, ins0 = senders[0]
        for chip, ins in senders[1:]:
            err(chip, ins, f"dis @ {sync} has two senders: chip {chip0} ({name(chip0)}:{ins0.line}) and "
                f"chip {chip} ({name(chip)}:{ins.line})")
            bad.add(sync)
        if sync in joi:
            cj, ij = joi[sync][0]
            err(chip0, ins0, f"sync id {sync} is used by both dis and joi ({name(cj)}:{ij.line})")
            bad.add(sync)
        receivers = rcv.get(sync, [])
        size = check_size(sync, senders + receivers)
        seen: dict[int, Instruction] = {}
        for chip, ins in receivers:
            if chip == chip0:
                err(chip, ins, f"rcv @ {sync} is on the sending chip {chip0} ({name(chip0)}:{ins0.line})")
                bad.add(sync)
            elif chip in seen:
                err(chip, ins, f"rcv @ {sync} is received twice on chip {chip} (also at line {seen[chip].line})")
                bad.add(sync)
            else:
                seen[chip] = ins
        if len(seen) != size - 1:
            on = ", ".join(str(c) for c in seen) or "none"
            err(chip0, ins0, f"dis @ {sync}:{size} has {len(seen)} receiver(s) (chips {on}), expected {size - 1}")
            bad.add(sync)
    for sync, receivers in rcv.items():
        if sync not in dis:
            for chip, ins in receivers:
                err(chip, ins, f"rcv @ {sync} has no matching dis on any chip")
            bad.add(sync)
    for sync, parts in joi.items():
        size = check_size(sync, parts)
        limb = sync & 0xFFFF
        seen = {}
        dests = []
        for chip, ins in parts:
            if ins.base != limb:
                err(chip, ins, f"joi @ {sync} has base {ins.base} but its id names limb {limb}", "base")
            if chip in seen:
                err(chip, ins, f"joi @ {sync} has two participants on chip {chip} (also at line {seen[chip].line})")
                bad.add(sync)
            seen.setdefault(chip, ins)
            if ins.dst is not None:
                dests.append((chip, ins))
        if len(parts) != size:
            on = ", ".join(str(c) for c, _ in parts)
            err(parts[0][0], parts[0][1], f"joi @ {sync}:{size} has {len(parts)} participant(s) (chips {on}), "
                f"expected {size}")
            bad.add(sync)
        if len(dests) != 1:
            if dests:
                where = ", ".join(f"chip {c} ({name(c)}:{i.line})" for c, i in dests)
                err(dests[1][0], dests[1][1], f"joi @ {sync} has {len(dests)} destinations: {where}")
            else:
                err(parts[0][0], parts[0][1], f"joi @ {sync} has no participant with a destination register")
            bad.add(sync)
    return out


def _check_schedule(program, comm, dis, joi, bad: set[int], problems: _Problems) -> None:
    """Run the deterministic mailbox schedule (ISA.md 6) on communication events; report a deadlock cycle.

    Each chip runs until it blocks on a ``rcv`` whose ``dis`` has not happened or on a ``joi`` with a
    destination whose participants have not all arrived; completing an event wakes its waiter. Ids
    with broken pairing never block (they are reported as pairing errors). Linear in the events.
    """
    chips = program.chips
    pos = [0] * chips
    blocked: dict[int, Instruction] = {}
    sent: set[int] = set()
    arrived: dict[int, int] = {}
    rcv_waiters: dict[int, list[int]] = {}
    joi_waiter: dict[int, int] = {}
    ready = deque(range(chips))
    while ready:
        chip = ready.popleft()
        events = comm[chip]
        i, n = pos[chip], len(events)
        while i < n:
            ins = events[i]
            i += 1
            sync = ins.sync
            if sync in bad:
                continue
            op = ins.op
            if op is _DIS:
                sent.add(sync)
                for w in rcv_waiters.pop(sync, ()):
                    del blocked[w]
                    ready.append(w)
            elif op is _RCV:
                if sync not in sent:
                    rcv_waiters.setdefault(sync, []).append(chip)
                    blocked[chip] = ins
                    break
            else:
                count = arrived.get(sync, 0) + 1
                arrived[sync] = count
                if ins.dst is None:
                    if count >= ins.size and sync in joi_waiter:
                        w = joi_waiter.pop(sync)
                        del blocked[w]
                        ready.append(w)
                elif count < ins.size:
                    joi_waiter[sync] = chip
                    blocked[chip] = ins
                    break
        pos[chip] = i
    if not blocked:
        return

    paths = [s.path for s in program.streams]

    def waits_for(chip: int) -> int | None:
        ins = blocked[chip]
        if ins.op is _RCV:
            return dis[ins.sync][0][0]
        for c, part in joi[ins.sync]:
            if c != chip and not _passed(comm[c], pos[c], part):
                return c
        return None

    order: list[int] = []
    seen: dict[int, int] = {}
    chip: int | None = min(blocked)
    while chip is not None and chip in blocked and chip not in seen:
        seen[chip] = len(order)
        order.append(chip)
        chip = waits_for(chip)
    cycle = order[seen[chip]:] if chip in seen else order
    steps = []
    for k, c in enumerate(cycle):
        ins = blocked[c]
        nxt = cycle[(k + 1) % len(cycle)] if chip in seen else waits_for(c)
        target = f" for chip {nxt}" if nxt is not None else ""
        steps.append(f"waits at {_name(paths[c])}:{ins.line} ({_desc(ins)}){target}")
    first = cycle[0]
    reason = f"deadlock: chip {first} " + ", which ".join(steps)
    others = sorted(set(blocked) - set(cycle))
    if others:
        reason += f" (also blocked: chip{'s' if len(others) > 1 else ''} {', '.join(map(str, others))})"
    problems.add(first, paths[first], blocked[first].line, reason, blocked[first], "sync")


def _passed(events: list[Instruction], pos: int, part: Instruction) -> bool:
    """Whether a chip whose next event index is ``pos`` has already executed ``part``."""
    for k in range(pos):
        if events[k] is part:
            return True
    return False


# ----------------------------------------------------------------------------------------------
# Manifests and the public entry points
# ----------------------------------------------------------------------------------------------


def _names(entries) -> set[tuple[str, int]]:
    return {(e.term, limb) for e in entries if e.section in _INPUT_SECTIONS for limb in e.limbs}


def _provided(program: Program) -> tuple[set, list[set]] | None:
    """The (term, limb) names the manifests provide: the global inputs, and per chip the extra names of
    its own Input section; ``None`` for a program without any manifest (the memory rule is skipped)."""
    if not program.manifest.entries and not program.chip_manifests:
        return None
    common = _names(program.manifest.entries)
    extra = [_names(m.entries) - common for m in program.chip_manifests]
    extra += [set() for _ in range(program.chips - len(extra))]
    return common, extra


def _check_manifests(program: Program, problems: _Problems, n: int | None) -> None:
    """Limbs of every manifest entry, and the evaluation keys named by their symbols.

    ISA.md 5.1 and 8.7: a keyswitch at level l with E extension primes needs l + E <= 64, else its
    data limbs 0..l-1 and extension limbs 64-E..63 are the same prime indices (the compiler does not
    detect it). The key symbol ``K:type:level:E:...`` states l and E of its keyswitch exactly, so this
    is the spec's rule itself, evaluated once per key. A key term may only list the key's limbs
    (ISA.md 5.3); a rotation key's step obeys the same range as ``rot`` (:func:`_step_problem`).
    """
    add = problems.add
    seen: set = set()
    manifests = [(program.chips, program.manifest)]
    manifests += [(program.chips + 1 + chip, m) for chip, m in enumerate(program.chip_manifests)]
    for rank, manifest in manifests:
        path = manifest.path
        for e in manifest.entries:
            bad = [limb for limb in e.limbs if not 0 <= limb < LIMBS]
            if bad:
                add(rank, path, e.line, f"{e.term} ({e.symbol}) lists limb(s) {','.join(map(str, bad))} outside "
                    f"0..{LIMBS - 1}", None, 1)
            key = e.symbol.key
            if key is None:
                continue
            level, ext = key.level, key.ext
            collides = level + ext > LIMBS
            data, extension = _span(0, level - 1), _span(LIMBS - ext, LIMBS - 1)
            if key not in seen:
                seen.add(key)
                if collides:
                    both = _span(max(LIMBS - ext, 0), min(level, LIMBS) - 1)
                    add(rank, path, e.line, f"evaluation key {key}: level {level} + extension {ext} = {level + ext} "
                        f"> {LIMBS}: its data limbs {data} and extension limbs {extension} collide on limb(s) {both} "
                        f"(ISA.md 5.1, 8.7)", None, 1)
                if key.type == KeyType.ROTATION:
                    why = _step_problem(key.rot, n)
                    if why:
                        add(rank, path, e.line, f"rotation key {key}: step {key.rot} {why}", None, 1)
            if not collides:
                layout = set(key.limbs())
                off = [limb for limb in e.limbs if 0 <= limb < LIMBS and limb not in layout]
                if off:
                    add(rank, path, e.line, f"{e.term} lists limb(s) {','.join(map(str, off))}, which evaluation "
                        f"key {key} does not have (data limbs {data}, extension limbs {extension}; ISA.md 5.3)",
                        None, 1)


def _span(first: int, last: int) -> str:
    return f"{first}..{last}" if first < last else str(first) if first == last else "none"


def _check(program: Program, limit: int, n: int | None = None) -> tuple[list[LocatedError], bool]:
    if not isinstance(program, Program):
        raise ArgumentError(f"validate needs a Program (from caramel.load_program), got {type(program).__name__}")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise ArgumentError(f"limit must be an integer, got {limit!r}")
    if limit < 1:
        raise ArgumentError(f"limit must be at least 1, got {limit}")
    if n is not None:
        try:
            ok = not isinstance(n, bool) and 2 <= operator.index(n) <= MAX_N and not n & (n - 1)
        except TypeError:
            ok = False
        if not ok:
            raise ArgumentError(f"n must be a power of two up to {MAX_N} (the ring degree N), got {n!r}")
        n = operator.index(n)
    with _no_gc():
        return _check_all(program, limit, n)


def _check_all(program: Program, limit: int, n: int | None = None) -> tuple[list[LocatedError], bool]:
    problems = _Problems()
    provided = _provided(program)
    comm: list[list[Instruction]] = []
    stored_by: list[set[tuple[str, int]]] = []
    for chip, stream in enumerate(program.streams):
        events: list[Instruction] = []
        own: set[tuple[str, int]] = set()
        names = (provided[0], provided[1][chip]) if provided else None
        _check_stream(stream, chip, names, problems, events, own, n)
        comm.append(events)
        stored_by.append(own)
    _check_manifests(program, problems, n)
    stored = set().union(*stored_by)
    if program.chips > 1 or any(comm):
        _check_communication(program, comm, problems)
    if provided is not None:
        inputs = provided[0]
        rank = program.chips
        for entry in program.manifest.outputs:
            missing = [limb for limb in entry.limbs
                       if (entry.term, limb) not in stored and (entry.term, limb) not in inputs]
            if missing:
                limbs = ",".join(map(str, missing))
                problems.add(rank, program.manifest.path, entry.line,
                             f"output {entry.term} ({entry.symbol}) limb(s) [{limbs}] are never stored by any chip "
                             f"and are not an input", None, 1)
        for chip, manifest in enumerate(program.chip_manifests):
            own = stored_by[chip] if chip < len(stored_by) else set()
            for entry in manifest.outputs:
                missing = [limb for limb in entry.limbs if (entry.term, limb) not in own
                           and (entry.term, limb) not in inputs]
                if missing:
                    limbs = ",".join(map(str, missing))
                    problems.add(rank + 1 + chip, manifest.path, entry.line,
                                 f"output {entry.term} ({entry.symbol}) limb(s) [{limbs}] are never stored by chip "
                                 f"{chip}", None, 1)
    return problems.located(limit)


def check(program: Program, limit: int = 50, *, n: int | None = None) -> list[LocatedError]:
    """Every static problem of ``program`` (at most ``limit``), sorted by file and line.

    ``n``: the ring degree N the program was compiled for, when known; rotation steps must then lie
    within N/2 (else within 32768, the bound of the largest ring).
    """
    return _check(program, limit, n)[0]


def validate(program: Program, *, limit: int = 50, n: int | None = None) -> None:
    """Raise :class:`~caramel.errors.ValidationError` with every problem found (at most ``limit``);
    ``n`` as for :func:`check`."""
    problems, truncated = _check(program, limit, n)
    if problems:
        raise ValidationError(problems, truncated)


class _CallableModule(types.ModuleType):
    """``caramel.validate`` is this module, and calling it is :func:`validate`: so both
    ``caramel.validate(program)`` and ``caramel.validate.validate(program, n=N)`` work, whichever
    was imported first."""

    def __call__(self, program: Program, *, limit: int = 50, n: int | None = None) -> None:
        validate(program, limit=limit, n=n)


sys.modules[__name__].__class__ = _CallableModule
