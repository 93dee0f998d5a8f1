"""The reference interpreter: runs a :class:`~caramel.program.Program` instruction by instruction.

This is the oracle every faster path is compared with. It follows ISA.md section 4 literally:

* per chip: vector registers ``r`` (each a limb tag plus N residues), scalar registers ``s``, two
  base conversion units, a private writable store over the shared read-only input image
  (ISA.md 8.5: ``{F}`` is ignored);
* every source operand is read before the destination is written; registers marked ``[X]`` are
  freed after their last read (this never changes a result, it bounds memory);
* ``dis``/``rcv``/``joi`` go through the deterministic mailbox of ISA.md section 6: chips run
  round-robin, each until it blocks on a ``rcv`` whose ``dis`` has not happened or on a ``joi``
  with a destination whose participants have not all arrived. When every unfinished chip is blocked
  the run stops with a :class:`~caramel.errors.DeadlockError` naming each chip's instruction.

All arithmetic comes from :mod:`caramel.ring`; the arithmetic mode (``exact``, ``textbook``,
``emulator``) decides base conversion and the ``sud`` lift (ISA.md decision 2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from caramel.errors import DeadlockError, ExecutionError, Location
from caramel.execute.memory import check_memory_image
from caramel.execute.result import RunResult
from caramel.program import ELEMENTWISE_OP, BcuSlot, Instruction, Mem, Opcode, Program, SReg, Stream, VReg
from caramel.ring import Context, Mode
from caramel.ring.modular import ELEMENTWISE, inv_mod

_U64 = np.uint64

#: The one-operand register forms: rD = f(rA) in limb ``base``.
_UNARY: dict[Opcode, Callable[[Context, Instruction, np.ndarray], np.ndarray]] = {
    Opcode.MOV: lambda ctx, ins, a: a,
    Opcode.ROT: lambda ctx, ins, a: ctx.automorphism(a, ctx.galois_element(ins.step)),
    Opcode.CON: lambda ctx, ins, a: ctx.automorphism(a, ctx.conjugation_element),
    Opcode.NTT: lambda ctx, ins, a: ctx.ntt(a, ins.base),
    Opcode.INT: lambda ctx, ins, a: ctx.intt(a, ins.base),
}


@dataclass(slots=True)
class Limb:
    """A register value: the prime index it belongs to (``tag``) and its N residues."""

    tag: int
    data: np.ndarray


@dataclass
class BcuState:
    """One base conversion unit between a ``bci`` and the reads of its output slots."""

    out_limbs: tuple[int, ...] = ()
    in_limbs: tuple[int, ...] = ()
    inputs: dict[int, np.ndarray] = field(default_factory=dict)
    outputs: np.ndarray | None = None  # (len(out_limbs), N), computed at the first read


@dataclass
class ChipState:
    """Everything one chip owns while it runs."""

    stream: Stream
    regs: dict[int, Limb] = field(default_factory=dict)
    sregs: dict[int, int] = field(default_factory=dict)
    bcus: list[BcuState] = field(default_factory=lambda: [BcuState(), BcuState()])
    store: dict[Mem, np.ndarray] = field(default_factory=dict)
    pc: int = 0
    joined: bool = False  # this chip already contributed to the joi it is waiting at

    @property
    def done(self) -> bool:
        return self.pc >= len(self.stream.instructions)


@dataclass
class _Mail:
    value: Limb
    count: int


@dataclass
class _Acc:
    total: np.ndarray | None = None
    count: int = 0


def _where(chip: ChipState, ins: Instruction) -> str:
    return f"{Location(chip.stream.path, ins.line)} ({ins.text()})"


class ReferenceInterpreter:
    """Runs a program on K simulated chips with the exact semantics of ISA.md section 4."""

    def __init__(self, program: Program, ctx: Context, mode: Mode | str = Mode.EXACT):
        self.program, self.ctx, self.mode = program, ctx, Mode(mode)
        self._q = [np.uint64(q) for q in ctx.primes]
        self._inv: dict[tuple[int, int], int] = {}

    # -------------------------------------------------------------------------------- helpers
    def _qinv(self, value: int, limb: int) -> int:
        key = (value, limb)
        got = self._inv.get(key)
        if got is None:
            got = self._inv[key] = inv_mod(value % self.ctx.q(limb), self.ctx.q(limb))
        return got

    def _read(self, chip: ChipState, op, ins: Instruction) -> Limb:
        if isinstance(op, VReg):
            got = chip.regs.get(op.index)
            if got is None:
                raise ExecutionError(f"{_where(chip, ins)}: register r{op.index} is read before it is written")
            return got
        if isinstance(op, BcuSlot):
            return Limb(ins.base, self._bcu_read(chip, op, ins))
        raise ExecutionError(f"{_where(chip, ins)}: unexpected operand {op}")

    def _scalar(self, chip: ChipState, op: SReg, ins: Instruction) -> int:
        got = chip.sregs.get(op.index)
        if got is None:
            raise ExecutionError(f"{_where(chip, ins)}: scalar register s{op.index} is read before it is written")
        return got

    def _load(self, chip: ChipState, mem: Mem, ins: Instruction) -> np.ndarray:
        got = chip.store[mem] if mem in chip.store else self.memory.get(mem)
        if got is None:
            raise ExecutionError(f"{_where(chip, ins)}: memory {mem} was never provided or stored")
        return got

    def _bcu_read(self, chip: ChipState, slot: BcuSlot, ins: Instruction) -> np.ndarray:
        unit = chip.bcus[slot.unit]
        if unit.outputs is None:
            missing = [l for l in unit.in_limbs if l not in unit.inputs]
            if missing or not unit.in_limbs:
                raise ExecutionError(f"{_where(chip, ins)}: B{slot.unit} is read before inputs {missing} are written")
            x = np.stack([unit.inputs[l] for l in unit.in_limbs])
            conv = self.ctx.base_converter(unit.in_limbs, unit.out_limbs)
            unit.outputs = conv.convert(x, self.mode)
        if slot.slot >= len(unit.out_limbs):
            raise ExecutionError(f"{_where(chip, ins)}: B{slot.unit} has no output slot {slot.slot}")
        return unit.outputs[slot.slot]

    # -------------------------------------------------------------------------------- one instruction
    def step(self, chip: ChipState, ins: Instruction) -> None:
        """Execute one non-communication instruction on ``chip``."""
        op = ins.op
        ctx = self.ctx
        L = ins.base
        if op in (Opcode.LOAD, Opcode.EVG):
            mem = ins.srcs[0]
            chip.regs[ins.dst.index] = Limb(mem.limb, self._load(chip, mem, ins))
            return
        if op == Opcode.LOAS:
            mem = ins.srcs[0]
            chip.sregs[ins.dst.index] = int(self._load(chip, mem, ins)) % ctx.q(mem.limb)
            return
        if op in (Opcode.STORE, Opcode.SPILL):
            chip.store[ins.dst] = self._read(chip, ins.srcs[0], ins).data
            return
        if op == Opcode.BCI:
            chip.bcus[ins.unit] = BcuState(ins.out_limbs, ins.in_limbs)
            return
        if op in (Opcode.PL1, Opcode.BCW):
            x = self._read(chip, ins.srcs[0], ins).data
            chip.bcus[ins.unit].inputs[L] = ctx.intt(x, L) if op == Opcode.PL1 else x
            return
        if op == Opcode.RSI:
            zero = np.zeros(ctx.n, dtype=np.uint32)
            for r in ins.group:
                chip.regs[r.index] = Limb(-1, zero)
            return
        if op == Opcode.RSV:
            words = np.stack([self._read(chip, r, ins).data for r in ins.group])
            rs = self._read(chip, ins.srcs[0], ins).data
            words = ctx.rsv_accumulate(words, rs, ins.in_limbs, L)
            for r, w in zip(ins.group, words):
                chip.regs[r.index] = Limb(-1, w)
            self._free(chip, ins)
            return
        if op in (Opcode.REC, Opcode.SND):
            raise ExecutionError(f"{_where(chip, ins)}: '{op.value}' is not supported (never emitted by the compiler)")

        q = self._q[L]
        name = ELEMENTWISE_OP.get(op)
        if name is not None:
            args = [self._read(chip, ins.srcs[0], ins).data.astype(_U64)]
            if op in (Opcode.ADS, Opcode.SUS, Opcode.MUS):
                args.append(_U64(self._scalar(chip, ins.srcs[1], ins) % int(q)))
            elif op != Opcode.NEG:
                args.append(self._read(chip, ins.srcs[1], ins).data.astype(_U64))
            out = ELEMENTWISE[name](q, *args)
        elif op in _UNARY:  # mov, rot, con, ntt, int
            out = _UNARY[op](ctx, ins, self._read(chip, ins.srcs[0], ins).data)
        elif op == Opcode.SUD:
            out = self._sud(chip, ins)
        elif op == Opcode.MOD:
            out = ctx.mod_reduce(np.stack([self._read(chip, r, ins).data for r in ins.srcs]), L)
        else:  # pragma: no cover - communication is handled by the scheduler
            raise ExecutionError(f"{_where(chip, ins)}: cannot execute {op.value} here")
        chip.regs[ins.dst.index] = Limb(L, np.asarray(out, dtype=np.uint32))
        self._free(chip, ins)

    def _sud(self, chip: ChipState, ins: Instruction) -> np.ndarray:
        """rD = (rA - NTT_{q_L}(y)) * f mod q_L (ISA.md 4.3): y is the lifted dropped limb with
        f = q_t^{-1}, or a BCU output with f = P^{-1}, P the product of the unit's input primes."""
        ctx, L = self.ctx, ins.base
        a = self._read(chip, ins.srcs[0], ins).data
        src = ins.srcs[1]
        if isinstance(src, BcuSlot):
            y = self._bcu_read(chip, src, ins)
            factor = self._qinv(math.prod(ctx.q(l) for l in chip.bcus[src.unit].in_limbs), L)
        else:
            rb = self._read(chip, src, ins)
            y = ctx.sud_lift(rb.data, rb.tag, L, self.mode)
            factor = self._qinv(ctx.q(rb.tag), L)
        q = self._q[L]
        diff = ELEMENTWISE["sub"](q, a.astype(_U64), ctx.ntt(y, L).astype(_U64))
        return ELEMENTWISE["mul"](q, diff, _U64(factor))

    @staticmethod
    def _free(chip: ChipState, ins: Instruction) -> None:
        dst = ins.dst.index if isinstance(ins.dst, VReg) else -1
        for s in ins.srcs:
            if isinstance(s, VReg) and s.dead and s.index != dst:
                chip.regs.pop(s.index, None)

    # -------------------------------------------------------------------------------- scheduler
    def run(self, memory: Mapping[Mem, np.ndarray], progress: Callable[[int, int], None] | None = None) -> RunResult:
        """Run every chip to completion over the read-only input image ``memory`` (checked first);
        ``progress(done, total)``, if given, is called after each instruction (instructions executed
        so far, of every chip's)."""
        check_memory_image(self.program, self.ctx, memory)
        total = sum(len(s.instructions) for s in self.program.streams)
        self.memory = memory
        chips = [ChipState(s) for s in self.program.streams]
        mail: dict[int, _Mail] = {}
        acc: dict[int, _Acc] = {}
        executed = 0
        while True:
            progressed = False
            for chip in chips:
                instrs = chip.stream.instructions
                while chip.pc < len(instrs):
                    ins = instrs[chip.pc]
                    if ins.op == Opcode.DIS:
                        value = self._read(chip, ins.srcs[0], ins)
                        if ins.sync in mail:
                            raise ExecutionError(f"{_where(chip, ins)}: sync id {ins.sync} is already in use")
                        mail[ins.sync] = _Mail(value, 1)
                        self._free(chip, ins)
                    elif ins.op == Opcode.RCV:
                        box = mail.get(ins.sync)
                        if box is None:
                            break
                        chip.regs[ins.dst.index] = box.value
                        box.count += 1
                        if box.count >= ins.size:
                            del mail[ins.sync]
                    elif ins.op == Opcode.JOI:
                        if not self._joi(chip, ins, acc):
                            break
                    else:
                        self.step(chip, ins)
                    chip.pc += 1
                    executed += 1
                    progressed = True
                    if progress is not None:
                        progress(executed, total)
            if all(ch.done for ch in chips):
                break
            if not progressed:
                waits = [f"chip {c} waits at {_where(ch, ch.stream.instructions[ch.pc])}"
                         for c, ch in enumerate(chips) if not ch.done]
                raise DeadlockError("deadlock: every unfinished chip is blocked:\n  " + "\n  ".join(waits))
        if mail:
            ids = ", ".join(str(i) for i in sorted(mail)[:8])
            raise ExecutionError(f"run finished with undelivered dis messages (sync ids {ids})")
        return RunResult.from_stores([ch.store for ch in chips], memory, executed)

    def _joi(self, chip: ChipState, ins: Instruction, acc: dict[int, _Acc]) -> bool:
        """Contribute once; a participant with a destination waits for all ``size`` contributions."""
        L = ins.base
        if not chip.joined:
            entry = acc.setdefault(ins.sync, _Acc())
            if ins.srcs:
                x = self._read(chip, ins.srcs[0], ins).data.astype(_U64)
                entry.total = x if entry.total is None else ELEMENTWISE["add"](self._q[L], entry.total, x)
                self._free(chip, ins)
            entry.count += 1
            chip.joined = True
        if ins.dst is None:
            chip.joined = False
            return True
        entry = acc[ins.sync]
        if entry.count < ins.size:
            return False
        total = entry.total if entry.total is not None else np.zeros(self.ctx.n, dtype=_U64)
        chip.regs[ins.dst.index] = Limb(L, total.astype(np.uint32))
        del acc[ins.sync]
        chip.joined = False
        return True


def run_reference(program: Program, ctx: Context, memory: Mapping[Mem, np.ndarray],
                  mode: Mode | str = Mode.EXACT, *, progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Run ``program`` on the CPU reference over the input image ``memory``; ``progress(done,
    total)``: see :meth:`ReferenceInterpreter.run`."""
    return ReferenceInterpreter(program, ctx, mode).run(memory, progress)
