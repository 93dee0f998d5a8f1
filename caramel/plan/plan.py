"""The execution plan: a backend-neutral list of batched, fused kernels over limb buffers.

A :class:`Plan` has one :class:`ChipPlan` per chip. A chip plan is an ordered list of
:class:`Kernel` (a topological order of its kernel DAG, ``deps``) over *buffers*: one buffer is
one limb of N residues, named by an integer id. Every SSA value (:mod:`caramel.plan.dag`) lives
in a buffer; copies (``load``/``evg`` of a memory limb, ``mov``, ``bcw``, ``store``/``spill``
and the ``load`` that reads a spill back) share their source's buffer instead of being copied,
which is safe because a buffer is written once. A later engine maps buffer ids to the rows of
an arena (:func:`assign_rows`).

Rules:

* Every kernel has a :class:`Kind` and rows (:class:`Row`): row r works modulo the prime
  ``rows[r].prime`` (an index into the prime list), reads ``rows[r].ins`` and writes
  ``rows[r].outs`` (buffer ids). Rows of one kernel are independent: one launch.
* ``ELEMENTWISE``: a fused expression (:class:`Expr`) evaluated per residue; ``ins`` are its
  vector operands (each read once), ``scalars`` its scalar operands (indices into the chip's
  scalar table, :class:`ScalarSpec`), ``outs`` its outputs. Every operation of the expression
  reduces modulo q exactly as the reference does (``add``: (a + b) % q, ``sub``:
  (a + (q - b)) % q, ``mul``: a * b % q, ``neg``: (q - a) % q, in 64-bit arithmetic).
* ``NTT``/``INTT``: ins (a,), outs (A,). ``AUTOMORPHISM``: ``arg`` is the rotation step, or
  None for a conjugation (:meth:`Kernel.galois`). ``BASECONV``: ins are the unit's inputs in
  ``in_limbs`` order, outs one buffer per ``out_limbs`` entry (only the slots that are read),
  computed in the run's arithmetic mode. ``SUD_LIFT``: the register form of ``sud`` lifts the
  dropped limb from prime ``arg`` to the row's prime (mode-dependent). ``RSV``: ins (words...,
  rs), outs (words...), basis ``in_limbs``, the row's prime is the limb of rs. ``MOD``: ins (words...),
  outs (d,). ``COMM``: no rows; ``comms`` lists independent ``dis``/``rcv``/``joi`` that a
  backend may issue as one collective group (sends first, then receives).
* ``sud rD: rA, y | L`` becomes [``SUD_LIFT``] -> ``NTT`` -> the elementwise tail
  (rA - NTT(y)) * f, with f = q_t^-1 or P^-1 mod q_L (an immediate scalar), which fuses with
  the elementwise operations around it.
* ``pl1`` is an ``INTT`` into a new buffer (the unit's input); ``bcw`` aliases its source;
  ``bci`` and ``rsi`` produce no kernel (``rsi`` words alias the chip's zero buffer).
"""

from __future__ import annotations

import enum
import gc
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

import numpy as np

from caramel.program import BcuSlot, Mem, Opcode, Program
from caramel.plan import dag as _dag


class Kind(enum.Enum):
    """Kernel kinds; the value is the name used in reports."""

    COMM = "comm"
    ELEMENTWISE = "elementwise"
    NTT = "ntt"
    INTT = "intt"
    AUTOMORPHISM = "automorphism"
    BASECONV = "baseconv"
    SUD_LIFT = "sud_lift"
    RSV = "rsv"
    MOD = "mod"


class ExprOp(NamedTuple):
    """One operation of an :class:`Expr`: ``op`` in ``add``, ``sub``, ``mul``, ``neg`` applied to
    the values ``args``."""

    op: str
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Expr:
    """A tiny SSA program over ``n_vec`` vector and ``n_scalar`` scalar operands.

    Values 0..n_vec-1 are the vector operands, n_vec..n_vec+n_scalar-1 the scalar operands, then
    one value per entry of ``ops``; ``outputs`` are the values written (same layout as the CUDA
    ``FusedProgram``, so lowering is field by field).
    """

    n_vec: int
    n_scalar: int
    ops: tuple[ExprOp, ...]
    outputs: tuple[int, ...]

    def text(self) -> str:
        """e.g. ``v3s1: t4=mul(v0,v1) t5=add(t4,v2) -> t5``."""
        def name(v: int) -> str:
            if v < self.n_vec:
                return f"v{v}"
            if v < self.n_vec + self.n_scalar:
                return f"s{v - self.n_vec}"
            return f"t{v}"

        base = self.n_vec + self.n_scalar
        body = " ".join(f"t{base + i}={o.op}({','.join(map(name, o.args))})" for i, o in enumerate(self.ops))
        return f"v{self.n_vec}s{self.n_scalar}: {body} -> {','.join(map(name, self.outputs))}"


class Row(NamedTuple):
    """One independent instance of a kernel: prime index, input and output buffers, scalar
    table indices (ELEMENTWISE) and a per-row argument (see :class:`Kind` rules)."""

    prime: int
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    scalars: tuple[int, ...] = ()
    arg: int | None = None


class Comm(NamedTuple):
    """One communication: ``op`` (DIS, RCV, JOI), its sync id and group size, the buffer sent or
    contributed (``src``, -1 if none), the buffer received (``dst``, -1 if none), the prime."""

    op: Opcode
    sync: int
    size: int
    src: int
    dst: int
    prime: int


class ScalarSpec(NamedTuple):
    """An entry of a chip's scalar table, reduced modulo q_prime.

    With ``mem``: the loaded scalar, int(memory[mem]) mod q_{mem.limb} mod q_prime (``loas`` then
    a use at base ``prime``). Without: the immediate (prod_{l in limbs} q_l)^-1 mod q_prime (the
    factor of ``sud``: q_t^-1, or P^-1 for P the product of a base conversion's input primes).
    """

    mem: Mem | None
    limbs: tuple[int, ...]
    prime: int

    def value(self, primes, memory: Mapping[Mem, object]) -> int:
        q = primes[self.prime]
        if self.mem is not None:
            return int(memory[self.mem]) % primes[self.mem.limb] % q
        product = 1
        for l in self.limbs:
            product = product * primes[l] % q
        return pow(product, -1, q)


@dataclass(frozen=True, slots=True)
class Kernel:
    """One launch: ``kind``, ``rows`` (or ``comms`` for COMM), ``expr`` (ELEMENTWISE),
    ``in_limbs``/``out_limbs`` (BASECONV; ``in_limbs`` is the basis of RSV), its ``level`` in the
    whole-program DAG and the source ``lines`` of the instructions it executes."""

    kind: Kind
    rows: tuple[Row, ...] = ()
    expr: Expr | None = None
    in_limbs: tuple[int, ...] = ()
    out_limbs: tuple[int, ...] = ()
    comms: tuple[Comm, ...] = ()
    level: int = 0
    lines: tuple[int, ...] = ()

    def reads(self) -> list[int]:
        """Every buffer the kernel reads (with repeats across rows)."""
        if self.kind is Kind.COMM:
            return [c.src for c in self.comms if c.src >= 0]
        return [b for r in self.rows for b in r.ins]

    def writes(self) -> list[int]:
        """Every buffer the kernel writes."""
        if self.kind is Kind.COMM:
            return [c.dst for c in self.comms if c.dst >= 0]
        return [b for r in self.rows for b in r.outs]

    def galois(self, ctx) -> list[int]:
        """AUTOMORPHISM: the Galois element of every row for ``ctx`` (rotation or conjugation)."""
        return [ctx.conjugation_element if r.arg is None else ctx.galois_element(r.arg) for r in self.rows]

    @property
    def size(self) -> int:
        return len(self.comms) if self.kind is Kind.COMM else len(self.rows)


@dataclass(frozen=True)
class ChipPlan:
    """The plan of one chip: ``kernels`` in execution order, ``deps[k]`` the earlier kernels that
    kernel k reads from; ``inputs`` (memory limb -> buffer, filled from the input image before
    the run), ``zero_buffer`` (filled with zeros, -1 if unused), ``scalars`` (the scalar table),
    ``stores`` (memory name -> buffer holding it at the end: the chip's stores and spills)."""

    chip: int
    kernels: tuple[Kernel, ...]
    deps: tuple[tuple[int, ...], ...]
    n_buffers: int
    inputs: dict[Mem, int]
    zero_buffer: int
    scalars: tuple[ScalarSpec, ...]
    stores: dict[Mem, int]
    instructions: int


@dataclass(frozen=True)
class Plan:
    """The plan of a program: one :class:`ChipPlan` per chip, and the build ``timings`` (seconds
    per phase)."""

    name: str
    chips: tuple[ChipPlan, ...]
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def kernels(self) -> int:
        return sum(len(c.kernels) for c in self.chips)

    def __repr__(self) -> str:  # short: a plan holds every kernel of every chip
        return f"Plan({self.name!r}, {len(self.chips)} chips, {self.kernels} kernels)"

    @property
    def instructions(self) -> int:
        return sum(c.instructions for c in self.chips)

    def to_json(self) -> str:
        """JSON of the plan: per chip its kernels (kind, level, rows, expression, comms, lines, deps)."""
        def kernel(k: Kernel, deps) -> dict:
            out: dict = {"kind": k.kind.value, "level": k.level, "deps": list(deps), "lines": list(k.lines)}
            if k.rows:
                out["rows"] = [[r.prime, list(r.ins), list(r.outs), list(r.scalars), r.arg] for r in k.rows]
            if k.expr is not None:
                out["expr"] = k.expr.text()
            if k.in_limbs or k.out_limbs:
                out["in_limbs"], out["out_limbs"] = list(k.in_limbs), list(k.out_limbs)
            if k.comms:
                out["comms"] = [[c.op.value, c.sync, c.size, c.src, c.dst, c.prime] for c in k.comms]
            return out

        chips = [
            {
                "chip": c.chip,
                "buffers": c.n_buffers,
                "inputs": {str(m): b for m, b in c.inputs.items()},
                "stores": {str(m): b for m, b in c.stores.items()},
                "zero_buffer": c.zero_buffer,
                "scalars": [[str(s.mem) if s.mem else None, list(s.limbs), s.prime] for s in c.scalars],
                "kernels": [kernel(k, d) for k, d in zip(c.kernels, c.deps)],
            }
            for c in self.chips
        ]
        return json.dumps({"program": self.name, "timings": self.timings, "chips": chips}, separators=(",", ":"))


# ---------------------------------------------------------------------------------------------- lowering


class Op(NamedTuple):
    """One operation before fusion and batching (one row of a future kernel). ELEMENTWISE: ``arg``
    is the operation name; COMM: ``arg`` is the :class:`Comm`; BASECONV: ``arg`` is the
    :class:`~caramel.plan.dag.Conversion`. ``index`` is the source instruction's index."""

    kind: Kind
    prime: int
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    scalars: tuple[int, ...]
    arg: object
    index: int


_EW_NAME = {
    Opcode.ADD: "add", Opcode.SUB: "sub", Opcode.MUL: "mul", Opcode.MUP: "mul",
    Opcode.ADS: "add", Opcode.SUS: "sub", Opcode.MUS: "mul", Opcode.NEG: "neg",
}


def lower(chip: _dag.ChipSSA) -> tuple[list[Op], list[ScalarSpec], int]:
    """The operations of one chip in program order, its scalar table and its buffer count."""
    ops: list[Op] = []
    scalars: dict[ScalarSpec, int] = {}
    buf, tag, producer = chip.buf, chip.tag, chip.producer
    scalar_mem = {v: m for m, v in chip.scalar_inputs.items()}
    n_buffers = chip.n_buffers
    E, NTT = Kind.ELEMENTWISE, Kind.NTT

    def scalar(spec: ScalarSpec) -> int:
        got = scalars.get(spec)
        if got is None:
            got = scalars[spec] = len(scalars)
        return got

    for i, ins in enumerate(chip.stream.instructions):
        op = ins.op
        u, d = chip.uses[i], chip.defs[i]
        L = ins.base
        name = _EW_NAME.get(op)
        if name is not None:
            if op in (Opcode.ADS, Opcode.SUS, Opcode.MUS):
                mem = scalar_mem[chip.uses[producer[u[1]]][0]]
                ops.append(Op(E, L, (buf[u[0]],), (buf[d[0]],), (scalar(ScalarSpec(mem, (), L)),), name, i))
            else:
                ops.append(Op(E, L, tuple(buf[v] for v in u), (buf[d[0]],), (), name, i))
            continue
        conv = chip.conversions.get(i)
        if conv is not None:
            outs = tuple(buf[conv.slots[s]] for s in sorted(conv.slots))
            ops.append(Op(Kind.BASECONV, -1, tuple(buf[v] for v in conv.inputs), outs, (), conv, i))
        if op == Opcode.NTT:
            ops.append(Op(NTT, L, (buf[u[0]],), (buf[d[0]],), (), None, i))
        elif op in (Opcode.INT, Opcode.PL1):
            ops.append(Op(Kind.INTT, L, (buf[u[0]],), (buf[d[0]],), (), None, i))
        elif op in (Opcode.ROT, Opcode.CON):
            step = ins.step if op == Opcode.ROT else None
            ops.append(Op(Kind.AUTOMORPHISM, L, (buf[u[0]],), (buf[d[0]],), (), step, i))
        elif op == Opcode.SUD:
            y = u[1]
            if isinstance(ins.srcs[1], BcuSlot):
                factor = ScalarSpec(None, chip.conversions[producer[y]].in_limbs, L)
                lifted = buf[y]
            else:
                factor = ScalarSpec(None, (tag[y],), L)
                lifted, n_buffers = n_buffers, n_buffers + 1
                ops.append(Op(Kind.SUD_LIFT, L, (buf[y],), (lifted,), (), tag[y], i))
            big_y, diff, n_buffers = n_buffers, n_buffers + 1, n_buffers + 2
            ops.append(Op(NTT, L, (lifted,), (big_y,), (), None, i))
            ops.append(Op(E, L, (buf[u[0]], big_y), (diff,), (), "sub", i))
            ops.append(Op(E, L, (diff,), (buf[d[0]],), (scalar(factor),), "mul", i))
        elif op == Opcode.RSV:
            ops.append(Op(Kind.RSV, L, tuple(buf[v] for v in u), tuple(buf[v] for v in d), (), ins.in_limbs, i))
        elif op == Opcode.MOD:
            ops.append(Op(Kind.MOD, L, tuple(buf[v] for v in u), (buf[d[0]],), (), None, i))
        elif op == Opcode.DIS:
            c = Comm(op, ins.sync, ins.size, buf[u[0]], -1, ins.sync & 0xFFFF)
            ops.append(Op(Kind.COMM, c.prime, (c.src,), (), (), c, i))
        elif op == Opcode.RCV:
            c = Comm(op, ins.sync, ins.size, -1, buf[d[0]], ins.sync & 0xFFFF)
            ops.append(Op(Kind.COMM, c.prime, (), (c.dst,), (), c, i))
        elif op == Opcode.JOI:
            c = Comm(op, ins.sync, ins.size, buf[u[0]] if u else -1, buf[d[0]] if d else -1, L)
            ops.append(Op(Kind.COMM, L, (c.src,) if u else (), (c.dst,) if d else (), (), c, i))
    return ops, list(scalars), n_buffers


def fix_received_tags(chips: list[_dag.ChipSSA]) -> None:
    """Give every ``rcv`` value the tag of the value its ``dis`` sent (the reference copies the
    sender's tag; only the register form of ``sud`` looks at it)."""
    sent: dict[int, tuple[int, int]] = {}
    received: list[tuple[int, int, int]] = []
    for c, chip in enumerate(chips):
        for i, ins in enumerate(chip.stream.instructions):
            if ins.op == Opcode.DIS:
                sent[ins.sync] = (c, chip.uses[i][0])
            elif ins.op == Opcode.RCV:
                received.append((c, chip.defs[i][0], ins.sync))
    rcv_sync = {(c, v): s for c, v, s in received}

    def resolve(c: int, v: int, depth: int = 0) -> int:
        s = rcv_sync.get((c, v))
        if s is None or s not in sent or depth > len(chips):
            return chips[c].tag[v]
        return resolve(*sent[s], depth + 1)

    for c, v, s in received:
        if s in sent:
            chips[c].tag[v] = resolve(*sent[s])


# ---------------------------------------------------------------------------------------------- build


def build_plan(program: Program, *, fuse: bool = True, max_inputs: int = 16) -> Plan:
    """Plan ``program``: SSA renaming, lowering, dead-code removal, elementwise fusion (trees of
    at most ``max_inputs`` vector inputs; ``fuse=False`` keeps one operation per kernel row),
    levels over the whole program and batching (:mod:`caramel.plan.fusion`). The cyclic garbage
    collector is paused meanwhile (planning allocates many small acyclic objects)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _build(program, fuse, max_inputs)
    finally:
        if enabled:
            gc.enable()


def _build(program: Program, fuse: bool, max_inputs: int) -> Plan:
    from caramel.plan import fusion  # (fusion builds on this module's types)

    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    chips = _dag.program_ssa(program)
    fix_received_tags(chips)
    timings["ssa"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    lowered = [lower(c) for c in chips]
    timings["lower"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    units = [
        fusion.fuse(ops, {c.buf[v] for v in c.stores.values()}, n, enable=fuse, max_inputs=max_inputs)
        for c, (ops, _, n) in zip(chips, lowered)
    ]
    timings["fuse"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    levels = fusion.levels(units, [c.stream for c in chips])
    kernels = [
        fusion.batch(u, lv, [ins.line for ins in c.stream.instructions]) for u, lv, c in zip(units, levels, chips)
    ]
    timings["batch"] = time.perf_counter() - t0
    plans = []
    for chip, (ops, scalars, n_buffers), (ks, deps), us in zip(chips, lowered, kernels, units):
        stores = {m: chip.buf[v] for m, v in chip.stores.items()}
        used = {b for u in us for b in u.ins} | set(stores.values())
        plans.append(
            ChipPlan(
                chip=chip.chip,
                kernels=ks,
                deps=deps,
                n_buffers=n_buffers,
                inputs={m: chip.buf[v] for m, v in chip.inputs.items() if chip.buf[v] in used},
                zero_buffer=chip.zero_buffer if chip.zero_buffer in used else -1,
                scalars=tuple(scalars),
                stores=stores,
                instructions=len(chip.stream.instructions),
            )
        )
    timings["total"] = sum(timings.values())
    return Plan(program.name, tuple(plans), timings)


# ---------------------------------------------------------------------------------------------- rows


def assign_rows(chip: ChipPlan, *, reuse: str = "lifo", keep_inputs: bool = False) -> tuple[np.ndarray, int]:
    """Map buffers to arena rows for running ``chip.kernels`` in order: (row per buffer, -1 for
    buffers never used; number of rows). Inputs and the zero buffer get rows first; a kernel's
    outputs get free rows before its inputs' rows are released (outputs never share a row with
    an input of the same kernel); a row is released after the last kernel that reads it, except
    the rows of stored buffers, which live to the end. ``reuse``: which free row a new buffer
    takes, ``"lifo"`` the one freed last (default), ``"fifo"`` the one freed longest ago; the
    row count is the same (the peak of live buffers). (For concurrent execution of independent
    kernels an engine must also respect the reuse order: the reader before the next writer;
    :mod:`caramel.plan.streams` derives those orderings, fewer with ``"fifo"``.)
    ``keep_inputs``: the rows of inputs and the zero buffer are never released either, so no
    kernel writes them: a replayed run (a CUDA graph) finds its inputs in place and needs no
    restore (more rows: inputs that die early no longer lend their rows).)"""
    rows = np.full(chip.n_buffers, -1, dtype=np.int64)
    last = np.full(chip.n_buffers, -1, dtype=np.int64)
    for k, kernel in enumerate(chip.kernels):
        for b in kernel.reads():
            last[b] = k
    pinned = set(chip.stores.values())
    if keep_inputs:
        pinned |= set(chip.inputs.values()) | ({chip.zero_buffer} if chip.zero_buffer >= 0 else set())
    for b in pinned:
        last[b] = len(chip.kernels)
    if reuse not in ("lifo", "fifo"):
        raise ValueError(f"reuse must be 'lifo' or 'fifo', not {reuse!r}")
    free: deque[int] = deque()
    pop = free.pop if reuse == "lifo" else free.popleft
    count = 0

    def take() -> int:
        nonlocal count
        if free:
            return pop()
        count += 1
        return count - 1

    start = list(chip.inputs.values()) + ([chip.zero_buffer] if chip.zero_buffer >= 0 else [])
    for b in start:
        if rows[b] < 0:
            rows[b] = take()
    dying: dict[int, list[int]] = {}
    for b in np.flatnonzero(last >= 0):
        dying.setdefault(int(last[b]), []).append(int(b))
    for k, kernel in enumerate(chip.kernels):
        for b in kernel.writes():
            if rows[b] < 0:
                rows[b] = take()
            if last[b] < 0:  # written, never read: release after this kernel
                dying.setdefault(k, []).append(b)
        for b in dying.pop(k, ()):
            free.append(int(rows[b]))
    return rows, count
