"""Dependency DAGs of a compiled program: SSA renaming, per-chip graphs and the whole-program graph.

Nodes are instructions, named ``(chip, index)`` with ``index`` the 0-based position in the chip's
stream (``line`` = index + 2). An edge u -> v means that v must run after u. Resources
(ISA.md sections 4 and 6):

* vector registers ``rN`` and scalar registers ``sN``;
* base conversion units: ``bci BK`` writes the unit's group, ``pl1``/``bcw`` write one input limb
  of it, and the first read of a slot ``bK{M}`` converts (reads every input, writes every output,
  as the reference does); later reads read that conversion;
* memory names: ``store``/``spill`` write a name of the chip's private store, ``load``/``evg``/
  ``loas`` read it (or the read-only input image when the chip never stored that name).

Two graphs, both built in linear time (one last writer per resource, never a scan back):

* :func:`resource_graph`: read-after-write (``raw``), write-after-read (``war``) and
  write-after-write (``waw``) edges on the resources as named in the program;
* :func:`ssa` renames every write into a new immutable *SSA value*, which leaves only the true
  (``raw``) edges: :meth:`ChipSSA.graph`. Values are what the plan works on: a value that is a
  copy of another one (``load``/``evg`` of a memory limb, ``mov``, ``bcw``, ``store``/``spill``
  and the ``load`` that reads it back) shares its *buffer* (one limb of N residues) instead of
  being copied.

:func:`program_graph` joins the per-chip graphs with cross-chip edges: every ``dis`` to each
``rcv`` of its sync id, and every ``joi`` participant to the participant that names a destination
(``dep="comm"``). :func:`to_dot` exports a graph for Graphviz (small programs; JSON: ``caramel plan
--dag-json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING, Callable, Iterable

from caramel.errors import Location, LocatedError
from caramel.program import OPCODES, BcuSlot, Instruction, Mem, Opcode, Program, SReg, Stream, VReg
from caramel.plan.streams import RAW, WAR, WAW, orderings
from caramel.validate import check_pairing

if TYPE_CHECKING:  # networkx is imported where a graph is built: a run from a cached plan never needs it
    import networkx as nx

_DEP = {RAW: "raw", WAW: "waw", WAR: "war"}

#: Kinds of SSA values.
VECTOR, SCALAR, GROUP = 0, 1, 2


class PlanError(LocatedError):
    """A program the planner cannot turn into a plan (a value read before it is written, ...)."""


@dataclass
class Conversion:
    """One base conversion: the group of a ``bci`` converted at its first slot read (``at``);
    ``inputs``: the input values in ``in_limbs`` order; ``slots``: each slot that is read -> its
    output value (slots never read are not computed by the plan)."""

    unit: int
    at: int
    in_limbs: tuple[int, ...]
    out_limbs: tuple[int, ...]
    inputs: tuple[int, ...]
    slots: dict[int, int] = field(default_factory=dict)


@dataclass
class _Group:
    value: int
    in_limbs: tuple[int, ...] = ()
    out_limbs: tuple[int, ...] = ()
    inputs: dict[int, int] = field(default_factory=dict)
    conversion: Conversion | None = None


@dataclass
class ChipSSA:
    """One chip's stream in SSA form.

    Per instruction i: ``uses[i]`` and ``defs[i]``, the values it reads and writes, positionally:

    ========================  =============================  =====================================
    instruction               uses                           defs
    ========================  =============================  =====================================
    load, evg                 (memory value,)                (v,): same buffer, tag = limb
    loas                      (memory scalar,)               (scalar,)
    store, spill              (v,)                           (memory value,): same buffer
    add, sub, mul, mup        (a, b)                         (d,)
    ads, sus, mus             (a, scalar)                    (d,)
    neg, int, rot, con, ntt   (a,)                           (d,)
    ntt from a slot           (slot value,) [+ conv]         (d,)
    mov                       (a,)                           (d,): same buffer, tag = base
    sud                       (a, b or slot value) [+ conv]  (d,)
    bci                       ()                             (group,)
    pl1                       (a, group)                     (x,): x = INTT(a), a new buffer
    bcw                       (a, group)                     (x,): same buffer as a
    rsi                       ()                             (words...): the chip's zero buffer
    rsv                       (words..., rs)                 (words...)
    mod                       (words...)                     (d,)
    dis / rcv / joi           (v,) / () / (v,) or ()         () / (d,) / (d,) or ()
    ========================  =============================  =====================================

    [+ conv]: the instruction that first reads a slot of a group also uses the group and its input
    values (``conversions[i]`` describes that conversion). Per value v: ``kind[v]`` (VECTOR,
    SCALAR, GROUP), ``tag[v]`` (its limb, -1 for accumulator words), ``buf[v]`` (buffer id of a
    vector value, else -1) and ``producer[v]`` (the defining instruction, -1 for inputs).
    """

    chip: int
    stream: Stream
    uses: list[tuple[int, ...]]
    defs: list[tuple[int, ...]]
    kind: list[int]
    tag: list[int]
    buf: list[int]
    producer: list[int]
    n_buffers: int
    inputs: dict[Mem, int]  # vector memory limb read from the input image -> value
    scalar_inputs: dict[Mem, int]  # scalar memory read by loas -> value
    stores: dict[Mem, int]  # memory name -> value it holds at the end (stores and spills)
    conversions: dict[int, Conversion]
    zero_buffer: int  # buffer of the zeros written by rsi, -1 when the stream has no rsi

    def edges(self) -> Iterable[tuple[int, int, int]]:
        """Every read-after-write edge (producer index, reader index, value) of the stream."""
        producer = self.producer
        for i, used in enumerate(self.uses):
            for v in used:
                p = producer[v]
                if 0 <= p < i:  # (p == i: the slot that the converting read itself produced)
                    yield p, i, v

    def graph(self) -> nx.DiGraph:
        """The renamed dependency graph: nodes (chip, index), ``raw`` edges with their ``value``."""
        c = self.chip
        import networkx as nx

        g = nx.DiGraph()
        g.add_nodes_from((c, i) for i in range(len(self.uses)))
        g.add_edges_from(((c, p), (c, i), {"dep": "raw", "value": v}) for p, i, v in self.edges())
        return g


def _error(stream: Stream, ins: Instruction, reason: str) -> PlanError:
    return PlanError(Location(stream.path, ins.line), f"{reason} ({ins.text()})")


class _Renamer:
    """The state of :func:`ssa` over one stream: every SSA value's kind, tag (limb), buffer and
    producing instruction; the live registers, memory names, base conversion groups and the
    buffer counter. The per-opcode rules are the handlers of :data:`_SSA_RULES`."""

    def __init__(self, stream: Stream):
        self.stream = stream
        self.values: list[tuple[int, int, int, int]] = []  # (kind, tag, buffer, producer) of every value
        self.n_buffers = 0
        self.regs: dict[int, int] = {}
        self.sregs: dict[int, int] = {}
        self.memory: dict[Mem, int] = {}
        self.inputs: dict[Mem, int] = {}
        self.scalar_inputs: dict[Mem, int] = {}
        self.groups: dict[int, _Group] = {}
        self.conversions: dict[int, Conversion] = {}
        self.zero = -1

    def value(self, k: int, t: int, b: int, p: int) -> int:
        """A new SSA value of kind ``k``, tag ``t``, in buffer ``b``, made by instruction ``p``."""
        self.values.append((k, t, b, p))
        return len(self.values) - 1

    def fresh(self, t: int, p: int) -> int:
        """A new vector value in a buffer of its own."""
        v = self.value(VECTOR, t, self.n_buffers, p)
        self.n_buffers += 1
        return v

    def read(self, op, ins: Instruction) -> int:
        got = self.regs.get(op.index)
        if got is None:
            raise self.unwritten(op, ins)
        return got

    def unwritten(self, op, ins: Instruction) -> PlanError:
        """The error of reading vector register ``op`` before it is written."""
        return _error(self.stream, ins, f"register r{op.index} is read before it is written")

    def operand(self, op, ins: Instruction, i: int, extra: list[int]) -> int:
        """The value a source operand reads: a vector or scalar register, or a slot (:meth:`slot`)."""
        if type(op) is SReg:
            got = self.sregs.get(op.index)
            if got is None:
                raise _error(self.stream, ins, f"scalar register s{op.index} is read before it is written")
            return got
        return self.slot(op, ins, i, extra) if type(op) is BcuSlot else self.read(op, ins)

    def group(self, unit: int) -> _Group:
        g = self.groups.get(unit)
        if g is None:
            g = self.groups[unit] = _Group(self.value(GROUP, -1, -1, -1))
        return g

    def slot(self, s: BcuSlot, ins: Instruction, i: int, extra: list[int]) -> int:
        """The value of output slot ``s`` of its unit's conversion (made at its first read, which
        also reads the group and every input limb: ``extra``)."""
        g = self.groups.get(s.unit)
        if g is None or g.conversion is None:
            missing = [] if g is None else [l for l in g.in_limbs if l not in g.inputs]
            if g is None or missing or not g.in_limbs:
                raise _error(self.stream, ins, f"B{s.unit} is read before inputs {missing} are written")
            g.conversion = self.conversions[i] = Conversion(
                s.unit, i, g.in_limbs, g.out_limbs, tuple(g.inputs[l] for l in g.in_limbs)
            )
            extra.append(g.value)
            extra.extend(g.conversion.inputs)
        conv = g.conversion
        if s.slot >= len(conv.out_limbs):
            raise _error(self.stream, ins, f"B{s.unit} has no output slot {s.slot}")
        got = conv.slots.get(s.slot)
        if got is None:
            got = conv.slots[s.slot] = self.value(VECTOR, ins.base, self.n_buffers, conv.at)
            self.n_buffers += 1
        return got


_Uses = tuple[tuple[int, ...], tuple[int, ...]]  # (values read, values defined) of one instruction


def _ssa_load(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    """``load``/``evg``: an alias of the value stored under that name, or of a program input."""
    m = ins.srcs[0]
    src = r.memory.get(m)
    if src is None:
        src = r.inputs.get(m)
        if src is None:
            src = r.inputs[m] = r.fresh(m.limb, -1)
    return (src,), (r.value(VECTOR, m.limb, r.values[src][2], i),)


def _ssa_mov(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    a = r.read(ins.srcs[0], ins)
    return (a,), (r.value(VECTOR, ins.base, r.values[a][2], i),)


def _ssa_store(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    a = r.read(ins.srcs[0], ins)
    _, tag, buf, _ = r.values[a]
    d = r.value(VECTOR, tag, buf, i)
    r.memory[ins.dst] = d
    return (a,), (d,)


def _ssa_loas(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    m = ins.srcs[0]
    if m in r.memory:
        raise _error(r.stream, ins, f"loas reads {m}, which this chip stored as a vector")
    src = r.scalar_inputs.get(m)
    if src is None:
        src = r.scalar_inputs[m] = r.value(SCALAR, m.limb, -1, -1)
    d = r.value(SCALAR, m.limb, -1, i)
    r.sregs[ins.dst.index] = d
    return (src,), (d,)


def _ssa_bci(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    g = r.groups[ins.unit] = _Group(r.value(GROUP, -1, -1, i), ins.in_limbs, ins.out_limbs)
    return (), (g.value,)


def _ssa_bcu_write(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    """``pl1`` (a new limb) or ``bcw`` (in place) writes one input of its unit's group."""
    a = r.read(ins.srcs[0], ins)
    g = r.group(ins.unit)
    d = r.fresh(ins.base, i) if ins.op is Opcode.PL1 else r.value(VECTOR, ins.base, r.values[a][2], i)
    g.inputs[ins.base] = d
    return (a, g.value), (d,)


def _ssa_rsi(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    if r.zero < 0:
        r.zero, r.n_buffers = r.n_buffers, r.n_buffers + 1
    return (), tuple(r.value(VECTOR, -1, r.zero, i) for _ in ins.group)


def _ssa_rsv(r: _Renamer, i: int, ins: Instruction) -> _Uses:
    u = tuple(r.read(g, ins) for g in ins.group) + (r.read(ins.srcs[0], ins),)
    d = tuple(r.value(VECTOR, -1, r.n_buffers + k, i) for k in range(len(ins.group)))
    r.n_buffers += len(ins.group)
    return u, d


#: How each opcode renames: (values read, values defined) of one instruction. The plain forms
#: (every operand a register or slot, at most one new limb written) follow the opcode table alone and have the
#: rule None: :func:`ssa` renames them inline (most instructions: no call per instruction); ``rec``/``snd``, never
#: emitted by the compiler, have no rule.
_SSA_RULES: dict[Opcode, Callable[[_Renamer, int, Instruction], _Uses] | None] = {
    **{op: None for op, i in OPCODES.items()
       if i.supported and "m" not in i.reads and i.writes != "m" and not i.unit and not i.group},
    Opcode.LOAD: _ssa_load, Opcode.EVG: _ssa_load, Opcode.MOV: _ssa_mov,
    Opcode.STORE: _ssa_store, Opcode.SPILL: _ssa_store, Opcode.LOAS: _ssa_loas,
    Opcode.BCI: _ssa_bci, Opcode.PL1: _ssa_bcu_write, Opcode.BCW: _ssa_bcu_write, Opcode.RSI: _ssa_rsi,
    Opcode.RSV: _ssa_rsv,
}
#: Per opcode with a rule: (rule, whether its [X] reads free registers, whether it writes a register group), one
#: lookup per instruction.
_SSA_STEPS = {op: (rule, OPCODES[op].frees, bool(OPCODES[op].group)) for op, rule in _SSA_RULES.items()}


def ssa(stream: Stream) -> ChipSSA:
    """Rename ``stream`` into SSA values (see :class:`ChipSSA`); raises :class:`PlanError` where the
    reference would fail (a register or unit input read before it is written, a bad slot)."""
    r = _Renamer(stream)
    regs, values = r.regs, r.values
    steps = _SSA_STEPS
    uses: list[tuple[int, ...]] = []
    defs: list[tuple[int, ...]] = []
    add_use, add_def = uses.append, defs.append
    for i, ins in enumerate(stream.instructions):
        step = steps.get(ins.op)
        if step is None:
            raise _error(stream, ins, f"'{ins.op.value}' is not supported (never emitted by the compiler)")
        rule, frees, group = step
        dst = ins.dst
        if rule is None:
            # A plain form: every operand read (a slot's first read also reads its conversion's group and inputs:
            # ``extra``), one new limb written where there is a destination (its limb: the base, or the sync id's for
            # ``rcv``).
            u = []
            extra: list[int] = []
            for s in ins.srcs:
                if type(s) is VReg:  # (most operands: read inline)
                    v = regs.get(s.index)
                    if v is None:
                        raise r.unwritten(s, ins)
                    u.append(v)
                else:
                    u.append(r.operand(s, ins, i, extra))
            if extra:
                u += extra
            u = tuple(u)
            d = () if dst is None else (r.fresh(ins.limb, i),)
        else:
            u, d = rule(r, i, ins)
        # Registers read with [X] are freed (as in the reference), then the destination is written.
        if frees:
            for s in ins.srcs:
                if type(s) is VReg and s.dead and (type(dst) is not VReg or s.index != dst.index):
                    regs.pop(s.index, None)
        if group:
            for reg, v in zip(ins.group, d):
                regs[reg.index] = v
        elif d and type(dst) is VReg:
            regs[dst.index] = d[0]
        add_use(u)
        add_def(d)
    kind, tag, buf, producer = (list(map(itemgetter(k), values)) for k in range(4))
    return ChipSSA(stream.chip, stream, uses, defs, kind, tag, buf, producer, r.n_buffers,
                   r.inputs, r.scalar_inputs, dict(r.memory), r.conversions, r.zero)


def program_ssa(program: Program) -> list[ChipSSA]:
    """:func:`ssa` of every stream of ``program``."""
    return [ssa(s) for s in program.streams]


def comm_edges(program: Program) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Cross-chip edges: (chip, index) of each ``dis`` to each ``rcv`` of its sync id, and of each
    ``joi`` participant to the participant with a destination. Raises :class:`PlanError` at the
    first broken pairing rule (:func:`caramel.validate.check_pairing`, their one home)."""
    node = {(s.chip, ins): (s.chip, i) for s in program.streams for i, ins in enumerate(s.instructions)
            if OPCODES[ins.op].comm}
    pairing = check_pairing(node, program.chips, lambda c: program.streams[c].path)
    if pairing.problems:
        chip, ins, reason, _ = pairing.problems[0]
        raise _error(program.streams[chip], ins, reason)
    edges = [(node[d[0]], node[r]) for sync, d in pairing.dis.items() for r in pairing.rcv.get(sync, ())]
    for parts in pairing.joi.values():
        dst = next(node[p] for p in parts if p[1].dst is not None)
        edges.extend((node[p], dst) for p in parts if node[p] != dst)
    return edges


def program_graph(program: Program, chips: list[ChipSSA] | None = None) -> nx.DiGraph:
    """The whole-program graph: every chip's renamed graph plus the cross-chip ``comm`` edges."""
    chips = program_ssa(program) if chips is None else chips
    import networkx as nx

    g = nx.DiGraph()
    for chip in chips:
        g.update(chip.graph())
    g.add_edges_from(comm_edges(program), dep="comm")
    return g


def _resources(ins: Instruction, bcu_inputs: dict[int, tuple[int, ...]], converted: set[int]):
    """(reads, writes): the resources an instruction reads and writes, as hashable names."""
    op, srcs = ins.op, ins.srcs
    reads: list = []
    writes: list = []
    for s in srcs:
        if isinstance(s, VReg):
            reads.append(f"r{s.index}")
        elif isinstance(s, SReg):
            reads.append(f"s{s.index}")
        elif isinstance(s, Mem):
            reads.append(str(s))
        elif isinstance(s, BcuSlot):
            if s.unit not in converted:  # the first read converts: reads every input
                converted.add(s.unit)
                reads.append(f"B{s.unit}")
                reads.extend(f"B{s.unit}.in{l}" for l in bcu_inputs.get(s.unit, ()))
                writes.append(f"b{s.unit}")
            else:
                reads.append(f"b{s.unit}")
    info = OPCODES[op]
    if info.unit == "bci":
        writes.append(f"B{ins.unit}")
        bcu_inputs[ins.unit] = ins.in_limbs
        converted.discard(ins.unit)
    elif info.unit == "in":
        reads.append(f"B{ins.unit}")
        writes.append(f"B{ins.unit}.in{ins.base}")
    elif info.group:
        if "r" in info.group:
            reads.extend(f"r{r.index}" for r in ins.group)
        writes.extend(f"r{r.index}" for r in ins.group)
    elif ins.dst is not None:
        d = ins.dst
        writes.append(str(d) if isinstance(d, Mem) else f"{'s' if isinstance(d, SReg) else 'r'}{d.index}")
    return reads, writes


def resource_graph(stream: Stream) -> nx.DiGraph:
    """The dependency graph before renaming: ``raw``, ``war`` and ``waw`` edges with the ``res``
    (resource name) they come from; where one pair has several, the first found (``raw`` before
    ``waw`` before ``war``) labels the edge. The orderings are those of the stream schedules
    (:func:`caramel.plan.streams.orderings`, linear), on resource names instead of arena rows."""
    c = stream.chip
    bcu_inputs: dict[int, tuple[int, ...]] = {}
    converted: set[int] = set()
    edges: dict[tuple[int, int], tuple[str, str]] = {}
    accesses = [(*_resources(ins, bcu_inputs, converted), ()) for ins in stream.instructions]
    for j, k, kind, r in orderings(accesses):
        edges.setdefault((j, k), (_DEP[kind], r))
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from((c, i) for i in range(len(stream.instructions)))
    g.add_edges_from(((c, u), (c, v), {"dep": d, "res": r}) for (u, v), (d, r) in edges.items())
    return g


# ---------------------------------------------------------------------------------------------- export


def to_dot(graph: nx.DiGraph, program: Program, max_nodes: int = 2000) -> str:
    """Graphviz text of ``graph``: one cluster per chip, nodes labelled with their instruction,
    ``comm`` edges dashed. Refuses graphs above ``max_nodes`` nodes (DOT is for small programs)."""
    if graph.number_of_nodes() > max_nodes:
        raise ValueError(f"{graph.number_of_nodes()} nodes: too many for DOT (limit {max_nodes}); use JSON")
    lines = ["digraph caramel {", '  node [shape=box, fontname="monospace", fontsize=10];']
    by_chip: dict[int, list] = {}
    for n in graph.nodes:
        by_chip.setdefault(n[0], []).append(n)
    for c, nodes in sorted(by_chip.items()):
        lines.append(f'  subgraph cluster_{c} {{ label="chip {c}";')
        for n in sorted(nodes):
            text = program.streams[c].instructions[n[1]].text().replace('"', r"\"")
            lines.append(f'    "{c}:{n[1]}" [label="{n[1]}: {text}"];')
        lines.append("  }")
    for u, v, data in graph.edges(data=True):
        dep = data.get("dep", "raw")
        style = {"comm": "dashed", "war": "dotted", "waw": "bold"}.get(dep, "solid")
        res = data.get("res", "")
        label = f' label="{dep} {res}"' if dep != "raw" or res else ""
        lines.append(f'  "{u[0]}:{u[1]}" -> "{v[0]}:{v[1]}" [style={style}{label}];')
    lines.append("}")
    return "\n".join(lines) + "\n"
