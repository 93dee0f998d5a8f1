"""Helpers of the plan tests: random ISA-valid programs, random input images, store comparison
and a structural checker of plans."""

from __future__ import annotations

import random

import numpy as np

from caramel.parse import parse_stream
from caramel.errors import ExecutionError
from caramel.plan import ChipPlan, Kind, Plan
from caramel.plan.cost import comm_cost, task_cost
from caramel.plan.streams import Task
from caramel.program import BcuSlot, Instruction, Manifest, Mem, Opcode, Program, SReg, Stream, VReg
from tests.corpus import SHARED_PROGRAMS, corpus_names, load_corpus  # noqa: F401 (re-exported)

PROGRAMS = SHARED_PROGRAMS
LIMBS = (0, 1, 2, 3, 61, 62, 63)


def program_from_text(*streams: str, name: str = "text") -> Program:
    """A program from instruction texts, one string per chip (lines without the header; leading
    blanks and empty lines are dropped)."""
    parsed = tuple(
        parse_stream(
            f"Instruction Stream {c}:\n" + "".join(l.lstrip() + "\n" for l in text.split("\n") if l.strip()),
            f"<{name}>/instructions{c}",
            c,
        )
        for c, text in enumerate(streams)
    )
    return Program(name, f"<{name}>", parsed, Manifest(f"<{name}>", ()))


def corpus(limbs=(4, 10), chips=(1, 2, 4, 8)) -> list[str]:
    """Names of the corpus programs with these limb and chip counts (:func:`tests.corpus.corpus_names`:
    empty without the corpus)."""
    return corpus_names(limbs, chips)


def random_memory(program: Program, ctx, seed: int = 0) -> dict[Mem, np.ndarray]:
    """Uniform residues for every memory limb the program loads (0-d arrays for ``loas``)."""
    rng = np.random.default_rng(seed)
    mem: dict[Mem, np.ndarray] = {}
    for s in program.streams:
        for ins in s.instructions:
            if ins.op in (Opcode.LOAD, Opcode.EVG, Opcode.LOAS) and ins.srcs[0] not in mem:
                m = ins.srcs[0]
                q = ctx.q(m.limb)
                if ins.op == Opcode.LOAS:
                    mem[m] = np.array(rng.integers(0, q), dtype=np.uint32)
                else:
                    mem[m] = rng.integers(0, q, ctx.n, dtype=np.uint64).astype(np.uint32)
    return mem


def store_mismatches(want, have) -> list[str]:
    """Differences between two RunResults' per-chip stores (empty when bit-identical)."""
    problems = []
    if len(want.stores) != len(have.stores):
        return [f"chips: want {len(want.stores)}, have {len(have.stores)}"]
    for c, (w, h) in enumerate(zip(want.stores, have.stores)):
        if w.keys() != h.keys():
            problems.append(f"chip {c}: names differ: want {sorted(map(str, w))}, have {sorted(map(str, h))}")
            continue
        for m in w:
            if not np.array_equal(w[m], h[m]):
                bad = int(np.flatnonzero(w[m] != h[m])[0])
                problems.append(f"chip {c} {m}: first difference at {bad}: want {w[m][bad]}, have {h[m][bad]}")
    return problems


def check_plan(plan: Plan) -> None:
    """Structural rules of a plan: every buffer written once, every read after its write (or an
    input), dependencies point backwards, to lower levels, and match the buffers; kernels in level
    order; rows of one kernel consistent with its expression."""
    for chip in plan.chips:
        written = set(chip.inputs.values())
        if chip.zero_buffer >= 0:
            written.add(chip.zero_buffer)
        writer: dict[int, int] = {}
        last_level = -1
        for k, (kernel, deps) in enumerate(zip(chip.kernels, chip.deps)):
            assert kernel.level >= last_level, f"chip {chip.chip} kernel {k}: levels out of order"
            last_level = kernel.level
            assert all(d < k for d in deps), f"chip {chip.chip} kernel {k}: dependency on a later kernel"
            where = f"chip {chip.chip} kernel {k} ({kernel.kind.value})"
            assert all(chip.kernels[d].level < kernel.level for d in deps), f"{where}: same-level dependency"
            for b in kernel.reads():
                assert b in written, f"{where}: reads buffer {b} before it is written"
            want = sorted({writer[b] for b in kernel.reads() if b in writer})
            assert list(deps) == want, f"chip {chip.chip} kernel {k}: deps {deps}, want {want}"
            for b in kernel.writes():
                assert b not in written, f"chip {chip.chip} kernel {k}: buffer {b} written twice"
                written.add(b)
                writer[b] = k
            if kernel.kind is Kind.ELEMENTWISE:
                e = kernel.expr
                for r in kernel.rows:
                    # Plain operands are distinct limbs; a gathered one (an automorphism in the load) may
                    # read a limb that the row also reads plainly (x + rot(x)) or through another one.
                    assert len(r.ins) == e.n_vec and len(r.scalars) == e.n_scalar and len(r.gather) == len(e.gathered)
                    plain = [b for k, b in enumerate(r.ins) if k not in e.gathered]
                    assert len(set(plain)) == len(plain)
            if kernel.kind is Kind.COMM:
                assert not kernel.rows and kernel.comms
        for m, b in chip.stores.items():
            assert b in written, f"chip {chip.chip}: store {m} binds buffer {b}, never written"


# ---------------------------------------------------------------------------------------------- generator


class _Chip:
    def __init__(self, chip: int, rng: random.Random, canonical: bool):
        self.chip = chip
        self.rng = rng
        self.canonical = canonical  # every operand is a residue of the prime it is used with
        self.out: list[Instruction] = []
        self.regs: dict[int, int] = {}  # defined vector register -> tag
        self.words: set[int] = set()  # registers holding accumulator words
        self.groups: list[tuple[int, ...]] = []  # live rsi groups
        self.sregs: dict[int, int] = {}
        self.stored: dict[Mem, int] = {}

    def emit(self, op: Opcode, **kw) -> None:
        self.out.append(Instruction(op, line=len(self.out) + 2, **kw))

    def pick(self) -> int:
        return self.rng.choice(sorted(self.regs))

    def tagged(self, limb: int) -> int:
        """A register holding a value of limb ``limb`` (loaded if none); any register unless canonical."""
        if not self.canonical:
            return self.pick()
        have = sorted(r for r, t in self.regs.items() if t == limb)
        if have:
            return self.rng.choice(have)
        r = self.dst()
        self.emit(Opcode.LOAD, dst=VReg(r), srcs=(Mem("i1", limb),))
        self.write(r, limb, set())
        return r

    def another_base(self, tag: int) -> int:
        """The base of an operation on a value of limb ``tag``: now and then another (non-canonical)."""
        return tag if self.canonical or self.rng.random() < 0.85 else self.rng.choice(LIMBS)

    def dst(self) -> int:
        """A destination register: often a fresh one, sometimes one in use (false dependencies)."""
        used = sorted(set(self.regs) | self.words)
        if used and self.rng.random() < 0.35:
            r = self.rng.choice(used)
            if r in self.words:
                return max(used) + 1
            return r
        return max(used, default=-1) + 1

    def src(self, r: int, consumed: set[int]) -> VReg:
        """A read of r, marked dead ([X]) at random; the register is then no longer readable."""
        if r in consumed or self.rng.random() < 0.8:
            return VReg(r)
        consumed.add(r)
        return VReg(r, True)

    def write(self, r: int, tag: int, consumed: set[int]) -> None:
        for c in consumed:
            self.regs.pop(c, None)
        self.regs[r] = tag

    def load(self) -> None:
        rng = self.rng
        if self.stored and rng.random() < 0.3:
            m = rng.choice(sorted(self.stored, key=str))
        else:
            m = Mem(rng.choice(("i1", "i2", "k7")), rng.choice(LIMBS))
        r = self.dst()
        self.emit(rng.choice((Opcode.LOAD, Opcode.EVG)), dst=VReg(r), srcs=(m,), final=rng.random() < 0.2)
        self.write(r, m.limb, set())

    def step(self) -> None:
        """One random non-communication instruction (or a small block)."""
        rng = self.rng
        if len(self.regs) < 3:
            self.load()
            return
        roll = rng.random()
        consumed: set[int] = set()
        if roll < 0.12:
            self.load()
        elif roll < 0.45:
            op = rng.choice((Opcode.ADD, Opcode.SUB, Opcode.MUL, Opcode.MUP))
            a = self.pick()
            b = a if rng.random() < 0.1 else self.tagged(self.regs[a])
            base = self.another_base(self.regs[a])
            sa = self.src(a, consumed)
            sb = VReg(b) if b == a else self.src(b, consumed)
            r = self.dst()
            self.emit(op, dst=VReg(r), srcs=(sa, sb), base=base)
            self.write(r, base, consumed)
        elif roll < 0.55:
            a = self.pick()
            base = self.regs[a]
            if not self.sregs or rng.random() < 0.3:
                s = rng.randrange(3)
                self.emit(Opcode.LOAS, dst=SReg(s), srcs=(Mem("s3", rng.choice(LIMBS)),))
                self.sregs[s] = 1
            s = rng.choice(sorted(self.sregs))
            r = self.dst()
            op = rng.choice((Opcode.ADS, Opcode.SUS, Opcode.MUS))
            self.emit(op, dst=VReg(r), srcs=(self.src(a, consumed), SReg(s)), base=base)
            self.write(r, base, consumed)
        elif roll < 0.72:
            op = rng.choice((Opcode.NEG, Opcode.MOV, Opcode.NTT, Opcode.INT, Opcode.ROT, Opcode.CON))
            a = self.pick()
            base = self.another_base(self.regs[a])
            r = self.dst()
            step = rng.choice((-3, -1, 1, 2, 5, 1000)) if op == Opcode.ROT else 0
            self.emit(op, dst=VReg(r), srcs=(self.src(a, consumed),), base=base, step=step)
            self.write(r, base, consumed)
        elif roll < 0.8:
            a = self.pick()
            others = [x for x in self.regs if self.regs[x] != self.regs[a]]
            if not others:
                return
            b = rng.choice(sorted(others))
            base = self.regs[a]
            r = self.dst()
            self.emit(Opcode.SUD, dst=VReg(r), srcs=(self.src(a, consumed), self.src(b, consumed)), base=base)
            self.write(r, base, consumed)
        elif roll < 0.87:
            a = self.pick()
            m = Mem(f"v{rng.randrange(3)}", self.regs[a])
            self.emit(rng.choice((Opcode.STORE, Opcode.SPILL)), dst=m, srcs=(VReg(a),))
            self.stored[m] = a
        elif roll < 0.95:
            self.bcu()
        else:
            self.crt()

    def bcu(self) -> None:
        """bci, pl1/bcw of every input limb (other work in between), then reads of some slots."""
        rng = self.rng
        unit = rng.randrange(2)
        limbs = list(LIMBS)
        rng.shuffle(limbs)
        n_in = rng.randint(1, 3)
        ins, outs = sorted(limbs[:n_in]), sorted(limbs[n_in : n_in + rng.randint(1, 3)])
        self.emit(Opcode.BCI, unit=unit, out_limbs=tuple(outs), in_limbs=tuple(ins))
        for l in ins:
            if rng.random() < 0.3:
                self.step_simple()
            a = self.tagged(l)
            self.emit(rng.choice((Opcode.PL1, Opcode.BCW)), unit=unit, srcs=(VReg(a),), base=l)
        slots = list(range(len(outs)))
        rng.shuffle(slots)
        for m in slots[: rng.randint(1, len(slots))]:
            consumed: set[int] = set()
            r = self.dst()
            if rng.random() < 0.5:
                self.emit(Opcode.NTT, dst=VReg(r), srcs=(BcuSlot(unit, m),), base=outs[m])
            else:
                a = self.tagged(outs[m])
                self.emit(Opcode.SUD, dst=VReg(r), srcs=(self.src(a, consumed), BcuSlot(unit, m)), base=outs[m])
            self.write(r, outs[m], consumed)

    def step_simple(self) -> None:
        a = self.pick()
        r = self.dst()
        self.emit(Opcode.NEG, dst=VReg(r), srcs=(VReg(a),), base=self.regs[a])
        self.write(r, self.regs[a], set())

    def crt(self) -> None:
        """rsi, one rsv per basis limb, then mod into one or two limbs."""
        rng = self.rng
        basis = tuple(sorted(rng.sample(LIMBS, rng.randint(1, 3))))
        top = max(set(self.regs) | self.words, default=0) + 1
        group = tuple(VReg(top + k) for k in range(len(basis)))
        self.emit(Opcode.RSI, group=group)
        for r in group:
            self.words.add(r.index)
            self.regs.pop(r.index, None)
        for l in basis:
            a = self.tagged(l)
            self.emit(Opcode.RSV, group=group, srcs=(VReg(a),), in_limbs=basis, base=l)
        for _ in range(rng.randint(1, 2)):
            j = rng.choice(LIMBS)
            r = top + len(basis) + rng.randrange(2)
            self.emit(Opcode.MOD, dst=VReg(r), srcs=group, base=j)
            self.regs[r] = j
        self.groups.append(tuple(r.index for r in group))

    def finish(self) -> None:
        for r, tag in sorted(self.regs.items()):
            self.emit(Opcode.STORE, dst=Mem(f"v{100 + r}", tag), srcs=(VReg(r),))
        for g in self.groups:
            for k, r in enumerate(g):
                if r in self.words and r not in self.regs:
                    self.emit(Opcode.STORE, dst=Mem(f"w{r}", k), srcs=(VReg(r),))


def random_program(seed: int, chips: int = 1, phases: int = 4, steps: int = 12, canonical: bool = False) -> Program:
    """A random program that respects the ISA rules (registers written before read, BCU
    discipline, rsv/mod on rsi groups, dis/rcv/joi pairing in one global order per phase).
    Unless ``canonical``, some operations use a value at another limb's prime (legal, and the
    reference reduces it; compiled programs never do this, and the GPU kernels assume they don't)."""
    rng = random.Random(seed)
    cs = [_Chip(c, random.Random(rng.random()), canonical) for c in range(chips)]
    sync_id = 1
    for _ in range(phases):
        for ch in cs:
            for _ in range(rng.randint(1, steps)):
                ch.step()
            while len(ch.regs) < 2:
                ch.load()
        if chips == 1:
            continue
        events = []
        for _ in range(rng.randint(1, 3)):
            limb = rng.choice(LIMBS)
            sync = (sync_id << 16) + limb
            sync_id += 1
            events.append((rng.choice(("dis", "joi")), sync, limb, rng.randrange(chips)))
        for ch in cs:  # sends first, then receives: the stream order cannot deadlock
            for kind, sync, limb, owner in events:
                if kind == "dis" and ch.chip == owner:
                    r = ch.tagged(limb) if canonical else ch.dst()
                    if not canonical:
                        ch.emit(Opcode.MOV, dst=VReg(r), srcs=(VReg(ch.pick()),), base=limb)
                        ch.write(r, limb, set())
                    ch.emit(Opcode.DIS, srcs=(VReg(r),), sync=sync, size=chips)
                elif kind == "joi" and ch.chip != owner:
                    src = () if rng.random() < 0.2 else (VReg(ch.tagged(limb)),)
                    ch.emit(Opcode.JOI, srcs=src, sync=sync, size=chips, base=limb)
            for kind, sync, limb, owner in events:
                if kind == "dis" and ch.chip != owner:
                    r = ch.dst()
                    ch.emit(Opcode.RCV, dst=VReg(r), sync=sync, size=chips)
                    ch.write(r, limb, set())
                elif kind == "joi" and ch.chip == owner:
                    src = () if rng.random() < 0.2 else (VReg(ch.tagged(limb)),)
                    r = ch.dst()
                    ch.emit(Opcode.JOI, dst=VReg(r), srcs=src, sync=sync, size=chips, base=limb)
                    ch.write(r, limb, set())
    for ch in cs:
        ch.finish()
    streams = tuple(Stream(ch.chip, f"<random {seed}>/instructions{ch.chip}", tuple(ch.out)) for ch in cs)
    return Program(f"random_{seed}_{chips}c", f"<random {seed}>", streams, Manifest("<random>", ()))


def chip_tasks(chip: ChipPlan, rows_of: np.ndarray, n: int = 65536) -> list[Task]:
    """The kernels of ``chip`` as tasks over the row map ``rows_of`` (``COMM`` kernels on stream 0), each costing its
    estimated time at ring dimension ``n`` (:mod:`caramel.plan.cost`): the oracle that a device's own tasks
    (:class:`caramel.execute.runner.DeviceRun`) are compared with."""
    out = []
    for k, kernel in enumerate(chip.kernels):
        reads = {int(rows_of[b]) for b in kernel.reads()}
        writes = {int(rows_of[b]) for b in kernel.writes()}
        if -1 in reads or -1 in writes:
            raise ExecutionError(f"kernel {k} ({kernel.kind.value}) accesses a buffer without an arena row")
        cost = comm_cost(kernel.size) if kernel.kind is Kind.COMM else task_cost(kernel, n)
        out.append(Task(frozenset(reads), frozenset(writes), tuple(chip.deps[k]), cost,
                        0 if kernel.kind is Kind.COMM else None,
                        f"kernel {k} ({kernel.kind.value}, lines {list(kernel.lines[:3])})"))
    return out
