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
* ``ELEMENTWISE`` with ``gathered`` operands (:func:`caramel.plan.fusion.fuse_automorphisms`):
  operand k of row r reads ``ins[k]`` through the automorphism ``Row.gather`` names (rotation
  step or conjugation), out[j] = in[perm_g(j)], instead of the limb an ``AUTOMORPHISM`` row wrote.
* ``NTT`` with a ``prologue`` (:class:`~caramel.plan.kernel.Prologue`, fusion across NTT
  boundaries): its rows read the producer's inputs (a lift's y, a ``mod``'s words, a conversion's
  inputs) and its load computes the limb that the producer would have written.
* ``pl1`` is an ``INTT`` into a new buffer (the unit's input); ``bcw`` aliases its source;
  ``bci`` and ``rsi`` produce no kernel (``rsi`` words alias the chip's zero buffer).
"""

from __future__ import annotations

import time
from collections import deque
from itertools import chain
from typing import Callable

import numpy as np

from caramel.errors import ArgumentError
from caramel.expr import Expr
from caramel.plan import dag as _dag
from caramel.plan import fusion
from caramel.plan.kernel import ChipPlan, Comm, Kind, Op, Plan, ScalarSpec
from caramel.plan.order import recent_first
from caramel.parse import no_gc
from caramel.program import COMMUNICATION, ELEMENTWISE_OP, BcuSlot, Opcode, Program
from caramel.target import NEUTRAL, Target

# ---------------------------------------------------------------------------------------------- lowering

#: The one-operand forms that lower to one kernel of their own kind.
_UNARY = {Opcode.NTT: Kind.NTT, Opcode.INT: Kind.INTT, Opcode.PL1: Kind.INTT, Opcode.ROT: Kind.AUTOMORPHISM,
          Opcode.CON: Kind.AUTOMORPHISM}
#: The elementwise forms with a scalar operand (a loaded scalar: an entry of the scalar table).
_SCALAR_FORMS = frozenset({Opcode.ADS, Opcode.SUS, Opcode.MUS})
#: The forms that never become a kernel: copies (their values share their source's buffer: aliases), the scalar
#: loads and the starts of base conversions and accumulators.
ALIASES = frozenset({Opcode.LOAD, Opcode.EVG, Opcode.LOAS, Opcode.STORE, Opcode.SPILL, Opcode.MOV, Opcode.BCI,
                     Opcode.BCW, Opcode.RSI})


def lower(chip: _dag.ChipSSA) -> tuple[list[Op], list[ScalarSpec], int]:
    """The operations of one chip in program order, its scalar table and its buffer count."""
    ops: list[Op] = []
    add = ops.append
    scalars: dict[ScalarSpec, int] = {}
    buf, tag, producer = chip.buf, chip.tag, chip.producer
    bufs = buf.__getitem__  # (tuple(map(bufs, values)): the buffers of values)
    conversions = chip.conversions
    scalar_mem = {v: m for m, v in chip.scalar_inputs.items()}
    n_buffers = chip.n_buffers
    # (Members bound once: an enum's class attribute is a slow lookup. ``new(Op, fields)`` builds an Op from all its
    # fields without the Python-level ``Op.__new__``: one call fewer per operation.)
    E, NTT, SUD_LIFT, BASECONV = Kind.ELEMENTWISE, Kind.NTT, Kind.SUD_LIFT, Kind.BASECONV
    ROT, SUD, RSV, MOD, JOI = Opcode.ROT, Opcode.SUD, Opcode.RSV, Opcode.MOD, Opcode.JOI
    new = tuple.__new__
    elementwise, unaries = ELEMENTWISE_OP.get, _UNARY.get

    def scalar(spec: ScalarSpec) -> int:  # its index in the chip's scalar table
        return scalars.setdefault(spec, len(scalars))

    for i, (ins, u, d) in enumerate(zip(chip.stream.instructions, chip.uses, chip.defs)):
        op = ins.op
        L = ins.base
        name = elementwise(op)
        if name is not None:
            if op in _SCALAR_FORMS:
                mem = scalar_mem[chip.uses[producer[u[1]]][0]]
                add(new(Op, (E, L, (buf[u[0]],), (buf[d[0]],), (scalar(ScalarSpec(mem, (), L)),), name, i)))
            else:
                add(new(Op, (E, L, tuple(map(bufs, u)), (buf[d[0]],), (), name, i)))
            continue
        if op in ALIASES:  # (no kernel, no conversion: those are read by ntt and sud only)
            continue
        conv = conversions.get(i)
        if conv is not None:
            outs = tuple(buf[conv.slots[s]] for s in sorted(conv.slots))
            add(new(Op, (BASECONV, -1, tuple(map(bufs, conv.inputs)), outs, (), conv, i)))
        unary = unaries(op)
        if unary is not None:  # arg: the rotation step (None for a conjugation)
            add(new(Op, (unary, L, (buf[u[0]],), (buf[d[0]],), (), ins.step if op is ROT else None, i)))
        elif op is SUD:
            y = u[1]
            if isinstance(ins.srcs[1], BcuSlot):
                factor = ScalarSpec(None, conversions[producer[y]].in_limbs, L)
                lifted = buf[y]
            else:
                factor = ScalarSpec(None, (tag[y],), L)
                lifted, n_buffers = n_buffers, n_buffers + 1
                add(new(Op, (SUD_LIFT, L, (buf[y],), (lifted,), (), tag[y], i)))
            big_y, diff, n_buffers = n_buffers, n_buffers + 1, n_buffers + 2
            add(new(Op, (NTT, L, (lifted,), (big_y,), (), None, i)))
            add(new(Op, (E, L, (buf[u[0]], big_y), (diff,), (), "sub", i)))
            add(new(Op, (E, L, (diff,), (buf[d[0]],), (scalar(factor),), "mul", i)))
        elif op is RSV:
            add(Op(Kind.RSV, L, tuple(map(bufs, u)), tuple(map(bufs, d)), (), ins.in_limbs, i))
        elif op is MOD:
            add(Op(Kind.MOD, L, tuple(map(bufs, u)), (buf[d[0]],), (), None, i))
        elif op in COMMUNICATION:  # the limb: the sync id's, or the joi's base
            c = Comm(op, ins.sync, ins.size, buf[u[0]] if u else -1, buf[d[0]] if d else -1,
                     L if op is JOI else ins.sync & 0xFFFF)
            add(Op(Kind.COMM, c.prime, (c.src,) if u else (), (c.dst,) if d else (), (), c, i))
    return ops, list(scalars), n_buffers


def fix_received_tags(chips: list[_dag.ChipSSA]) -> None:
    """Give every ``rcv`` value the tag of the value its ``dis`` sent (the reference copies the
    sender's tag; only the register form of ``sud`` looks at it)."""
    sent: dict[int, tuple[int, int]] = {}
    received: list[tuple[int, int, int]] = []
    DIS, RCV = Opcode.DIS, Opcode.RCV
    for c, chip in enumerate(chips):
        for ins, u, d in zip(chip.stream.instructions, chip.uses, chip.defs):
            if ins.op is DIS:
                sent[ins.sync] = (c, u[0])
            elif ins.op is RCV:
                received.append((c, d[0], ins.sync))
    rcv_sync = {(c, v): s for c, v, s in received}
    # (A loop, not a recursive closure: a closure that calls itself is a reference cycle, which would keep every
    # chip's SSA alive until the next collection and make that collection traverse it.)
    for c, v, s in received:
        if s not in sent:
            continue
        src, value = sent[s]
        for _ in range(len(chips) + 1):  # follow a value received and sent on, at most once round the chips
            up = rcv_sync.get((src, value))
            if up is None or up not in sent:
                break
            src, value = sent[up]
        chips[c].tag[v] = chips[src].tag[value]


# ---------------------------------------------------------------------------------------------- build


#: ``build_plan``'s row orders: "recent" (:func:`caramel.plan.order.recent_first`), "batch" (the order of batching).
ROW_ORDERS = ("recent", "batch")


def build_plan(program: Program, *, fuse: bool = True, max_inputs: int = fusion.MAX_INPUTS, fuse_ntt=True,
               max_outputs: int = fusion.MAX_OUTPUTS, fuse_automorphism: bool = True, row_order: str = "recent",
               fuse_epilogue: bool = True, target: Target = NEUTRAL,
               fused: Callable[[frozenset[Expr]], None] | None = None) -> Plan:
    """Plan ``program``: SSA renaming, lowering, dead-code removal, elementwise fusion (trees of
    at most ``max_inputs`` vector inputs; ``fuse=False`` keeps one operation per kernel row),
    fusion across NTT boundaries (:func:`caramel.plan.fusion.fuse_ntt_loads`, with ``fuse`` only:
    ``fuse_ntt`` True for the default loads, False for none, ``"all"`` or the kinds, see
    :func:`~caramel.plan.fusion.ntt_load_kinds`), levels over the whole program, sibling trees
    that share inputs merged into rows of at most ``max_outputs`` outputs and ``max_inputs``
    inputs (:func:`~caramel.plan.fusion.merge_siblings`, with ``fuse`` only; 1: no merging),
    automorphisms computed in their elementwise consumers' loads
    (:func:`~caramel.plan.fusion.fuse_automorphisms`, with ``fuse`` and ``fuse_automorphism`` only),
    NTT epilogues (:func:`~caramel.plan.fusion.fuse_ntt_epilogues`, with ``fuse`` and ``fuse_epilogue`` only),
    batching (:mod:`caramel.plan.fusion`) and the rows of every kernel ordered by ``row_order``: ``"recent"``,
    most recently written inputs first on ``target`` (the backend's :class:`~caramel.target.Target`, which the plan
    records; :func:`caramel.plan.order.recent_first`: the faster replay, docs/PERFORMANCE.md), or ``"batch"``, as
    batched. ``fused`` is called once fusion has fixed the programs of the plan's elementwise kernels, before batching
    and ordering, with the set of them (a first run queues their compiles there).
    The cyclic garbage collector is paused meanwhile (:func:`caramel.parse.no_gc`)."""
    loads = fusion.ntt_load_kinds(fuse_ntt) if fuse else frozenset()
    if max_inputs < 1 or max_outputs < 1:
        raise ArgumentError(f"max_inputs and max_outputs must be at least 1, not {max_inputs}, {max_outputs}")
    if row_order not in ROW_ORDERS:
        raise ArgumentError(f"row_order must be one of {', '.join(ROW_ORDERS)}, not {row_order!r}")
    with no_gc():
        plan = _build(program, fuse, max_inputs, loads, max_outputs if fuse else 1, bool(fuse and fuse_automorphism),
                      bool(fuse and fuse_epilogue), fused)
        if row_order == "recent":
            t0 = time.perf_counter()
            plan = recent_first(plan, target)
            plan.timings["order"] = time.perf_counter() - t0
            plan.timings["total"] += plan.timings["order"]
        return plan


def _build(program: Program, fuse: bool, max_inputs: int, loads: frozenset = frozenset(),
           max_outputs: int = 1, automorphisms: bool = False, epilogues: bool = False, fused=None) -> Plan:
    marks = [time.perf_counter()]  # after each phase: ssa, lower, fuse, batch
    chips = _dag.program_ssa(program)
    fix_received_tags(chips)
    marks.append(time.perf_counter())
    lowered = [lower(c) for c in chips]
    marks.append(time.perf_counter())
    units, pins = [], []
    for c, (ops, _, n) in zip(chips, lowered):
        pinned = {c.buf[v] for v in c.stores.values()}
        pins.append(pinned)
        us = fusion.fuse(ops, pinned, n, enable=fuse, max_inputs=max_inputs)
        units.append(fusion.fuse_ntt_loads(us, pinned, loads) if loads else us)
    marks.append(time.perf_counter())
    levels = fusion.levels(units, [c.stream for c in chips])
    if max_outputs > 1:
        for c, (us, lv) in enumerate(zip(units, levels)):
            units[c], levels[c] = fusion.merge_siblings(us, lv, max_inputs, max_outputs)
    if automorphisms:
        for c, (us, lv) in enumerate(zip(units, levels)):
            units[c], levels[c] = fusion.fuse_automorphisms(us, lv, pins[c])
    if epilogues:
        units = [fusion.fuse_ntt_epilogues(us, pinned) for us, pinned in zip(units, pins)]
    if fused is not None:  # an ELEMENTWISE unit's batching key is its program
        fused(frozenset(u.key for us in units for u in us if u.kind is Kind.ELEMENTWISE))
    kernels = [
        fusion.batch(u, lv, [ins.line for ins in c.stream.instructions]) for u, lv, c in zip(units, levels, chips)
    ]
    marks.append(time.perf_counter())
    timings = {name: b - a for name, a, b in zip(("ssa", "lower", "fuse", "batch"), marks, marks[1:])}
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


#: The row reuse orders of :func:`assign_rows`.
REUSE = ("lifo", "fifo", "none")


def assign_rows(chip: ChipPlan, *, reuse: str = "lifo", keep_inputs: bool = False) -> tuple[np.ndarray, int]:
    """Map buffers to arena rows for running ``chip.kernels`` in order: (row per buffer, -1 for
    buffers never used; number of rows). Inputs and the zero buffer get rows first; a kernel's
    outputs get free rows before its inputs' rows are released (outputs never share a row with
    an input of the same kernel); a row is released after the last kernel that reads it, except
    the rows of stored buffers, which live to the end. ``reuse``: a new buffer takes the row freed
    last (``"lifo"``, default) or the one freed longest ago (``"fifo"``: the same row count, fewer
    reuse orderings between concurrent kernels, :mod:`caramel.plan.streams`), or a row of its own
    (``"none"``: no reuse orderings at all, only the data dependencies; a row for every input and every
    buffer written). ``keep_inputs``:
    the rows of inputs and the zero buffer are never released either, so that a replayed run (a
    CUDA graph) finds its inputs in place (more rows)."""
    if reuse not in REUSE:
        raise ValueError(f"reuse must be one of {', '.join(map(repr, REUSE))}, not {reuse!r}")
    # (Python lists while assigning: an element of a NumPy array costs a scalar object each read and write)
    rows = [-1] * chip.n_buffers
    count = 0
    start = list(chip.inputs.values()) + ([chip.zero_buffer] if chip.zero_buffer >= 0 else [])
    if reuse == "none":  # no row is released: rows in the order of first use
        for b in chain(start, (b for kernel in chip.kernels for b in kernel.writes())):
            if rows[b] < 0:
                rows[b] = count
                count += 1
        return np.array(rows, dtype=np.int64), count
    last = [-1] * chip.n_buffers
    for k, kernel in enumerate(chip.kernels):
        for b in kernel.reads():
            last[b] = k
    pinned = set(chip.stores.values())
    if keep_inputs:
        pinned |= set(chip.inputs.values()) | ({chip.zero_buffer} if chip.zero_buffer >= 0 else set())
    for b in pinned:
        last[b] = len(chip.kernels)
    free: deque[int] = deque()
    pop = free.pop if reuse == "lifo" else free.popleft

    def take() -> int:
        nonlocal count
        if free:
            return pop()
        count += 1
        return count - 1

    for b in start:
        if rows[b] < 0:
            rows[b] = take()
    dying: dict[int, list[int]] = {}
    for b, k in enumerate(last):
        if k >= 0:
            dying.setdefault(k, []).append(b)
    for k, kernel in enumerate(chip.kernels):
        for b in kernel.writes():
            if rows[b] < 0:
                rows[b] = take()
            if last[b] < 0:  # written, never read: release after this kernel
                dying.setdefault(k, []).append(b)
        for b in dying.pop(k, ()):
            free.append(rows[b])
    return np.array(rows, dtype=np.int64), count
