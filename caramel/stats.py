"""Static statistics of a compiled program: per chip instruction mix, registers, limbs, traffic.

:func:`program_stats` counts, for every chip, the instructions by opcode, the limbs it touches, the
registers it uses, its communication and an estimate of its memory traffic; :func:`render_table`
prints them as one aligned plain-text table (opcodes as rows, chips as columns, plus a total).

Byte figures depend on N (residues per limb) and count 4 bytes per residue (ISA.md section 3):

* **communication**: the limbs a chip *receives*: one per ``rcv``, ``size - 1`` per ``joi`` with a
  destination. Summed over chips this is the traffic of the whole machine, a broadcast counted once
  per receiver. ``limbs_sent`` (one per ``dis``, one per source-carrying ``joi`` without a
  destination) is kept beside it.
* **memory traffic**: every instruction is one pass over its limb operands, each read and each write
  moving N * 4 bytes: register, memory and BCU-slot reads (``rsv``/``mod`` read every register of
  their group), register and memory writes, ``pl1``/``bcw`` writing a BCU input, ``rsi``/``rsv``
  writing their group. Scalar operands (one residue) are not counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from caramel.program import BcuSlot, Instruction, Mem, Opcode, Program, SReg, Stream, VReg
from caramel.errors import ArgumentError

#: Bytes per residue: residues are 32-bit words.
RESIDUE_BYTES = 4


@dataclass(frozen=True)
class ChipStats:
    """ChipStats holds the static figures of one chip's stream."""

    chip: int
    instructions: int
    opcodes: dict[str, int]  # mnemonic -> count, in Opcode order, only those present
    limbs: tuple[int, ...]  # distinct limbs the instructions work on (bases, sync limbs, memory limbs)
    vregs: int  # distinct vector registers
    vreg_span: int  # highest vector register index + 1 (the register file it needs)
    sregs: int  # distinct scalar registers
    dis: int
    rcv: int
    joi: int
    limbs_received: int
    limbs_sent: int
    comm_bytes: int  # limbs_received * N * 4
    limb_reads: int
    limb_writes: int
    traffic_bytes: int  # (limb_reads + limb_writes) * N * 4


@dataclass(frozen=True)
class ProgramStats:
    """ProgramStats holds the figures of every chip of a program at a given N."""

    name: str
    chips: int
    n: int
    per_chip: tuple[ChipStats, ...] = field(default=())

    @property
    def instructions(self) -> int:
        return sum(c.instructions for c in self.per_chip)

    def total(self, attribute: str) -> int:
        """The sum over chips of one integer field of :class:`ChipStats`."""
        return sum(getattr(c, attribute) for c in self.per_chip)

    def to_dict(self) -> dict:
        """A JSON-ready dict (lists for tuples), with a ``totals`` entry."""
        data = asdict(self)
        data["per_chip"] = [dict(c, limbs=list(c["limbs"])) for c in data["per_chip"]]
        totals = {name: self.total(name) for name in _SUMMED}
        opcodes: dict[str, int] = {}
        for c in self.per_chip:
            for name, count in c.opcodes.items():
                opcodes[name] = opcodes.get(name, 0) + count
        totals["opcodes"] = {op.value: opcodes[op.value] for op in Opcode if op.value in opcodes}
        totals["limbs"] = sorted({limb for c in self.per_chip for limb in c.limbs})
        data["totals"] = totals
        return data


_SUMMED = ("instructions", "dis", "rcv", "joi", "limbs_received", "limbs_sent", "comm_bytes", "limb_reads",
           "limb_writes", "traffic_bytes")


def chip_stats(stream: Stream, n: int) -> ChipStats:
    """Figures of one stream at ring dimension ``n`` (see the module docstring for what is counted)."""
    counts: dict[Opcode, int] = {}
    limbs: set[int] = set()
    vregs: set[int] = set()
    sregs: set[int] = set()
    received = sent = reads = writes = 0
    for ins in stream.instructions:
        op, dst, srcs, base, _line, _f, _s, sync, size, _u, _o, _i, group = ins
        counts[op] = counts.get(op, 0) + 1
        if base is not None:
            limbs.add(base)
        for s in srcs:
            t = type(s)
            if t is VReg:
                vregs.add(s.index)
                reads += 1
            elif t is SReg:
                sregs.add(s.index)
            elif t is Mem:
                limbs.add(s.limb)
                if op is not Opcode.LOAS:  # a scalar load moves one residue, not a limb
                    reads += 1
            elif t is BcuSlot:
                reads += 1
        if dst is not None:
            t = type(dst)
            if t is VReg:
                vregs.add(dst.index)
                writes += 1
            elif t is SReg:
                sregs.add(dst.index)
            elif t is Mem:
                limbs.add(dst.limb)
                writes += 1
        if group:
            vregs.update(g.index for g in group)
            writes += len(group)  # rsi zeroes its group, rsv updates it
            if op is Opcode.RSV:
                reads += len(group)
        if op is Opcode.PL1 or op is Opcode.BCW:
            writes += 1
        elif op is Opcode.DIS:
            limbs.add(sync & 0xFFFF)
            sent += 1
        elif op is Opcode.RCV:
            limbs.add(sync & 0xFFFF)
            received += 1
        elif op is Opcode.JOI:
            if dst is not None:
                received += max(size - 1, 0)
            elif srcs:
                sent += 1
    limb_bytes = n * RESIDUE_BYTES
    return ChipStats(
        chip=stream.chip,
        instructions=len(stream.instructions),
        opcodes={op.value: counts[op] for op in Opcode if op in counts},
        limbs=tuple(sorted(limbs)),
        vregs=len(vregs),
        vreg_span=max(vregs) + 1 if vregs else 0,
        sregs=len(sregs),
        dis=counts.get(Opcode.DIS, 0),
        rcv=counts.get(Opcode.RCV, 0),
        joi=counts.get(Opcode.JOI, 0),
        limbs_received=received,
        limbs_sent=sent,
        comm_bytes=received * limb_bytes,
        limb_reads=reads,
        limb_writes=writes,
        traffic_bytes=(reads + writes) * limb_bytes,
    )


def instruction_limbs(ins: Instruction) -> int:
    """Limb operands of one instruction in the per-instruction traffic model (module docstring):
    ``caramel stats`` and ``caramel plan`` both count traffic with it."""
    op = ins.op
    n = sum(1 for s in ins.srcs if isinstance(s, (VReg, BcuSlot)) or (isinstance(s, Mem) and op != Opcode.LOAS))
    if isinstance(ins.dst, (VReg, Mem)):
        n += 1
    if op in (Opcode.PL1, Opcode.BCW):
        n += 1
    elif op == Opcode.RSV:
        n += 2 * len(ins.group)
    elif op == Opcode.RSI:
        n += len(ins.group)
    return n


def program_stats(program: Program, n: int = 65536) -> ProgramStats:
    """Per-chip figures of ``program`` at ring dimension ``n`` (default 65536, the Cinnamon target)."""
    if n < 1:
        raise ArgumentError(f"N must be positive, got {n}")
    return ProgramStats(program.name, program.chips, n, tuple(chip_stats(s, n) for s in program.streams))


def format_bytes(value: int) -> str:
    """``1536`` -> ``'1.5 KiB'``: binary units, three significant figures."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError  # pragma: no cover


def render_table(stats: ProgramStats) -> str:
    """The figures as an aligned plain-text table: one row per opcode and figure, one column per chip."""
    chips = stats.per_chip
    header = ["", *(f"chip {c.chip}" for c in chips), "total"]
    rows: list[list[str]] = []

    def row(label: str, values: list, total) -> None:
        rows.append([label, *(str(v) for v in values), str(total)])

    present = [op.value for op in Opcode if any(op.value in c.opcodes for c in chips)]
    for name in present:
        values = [c.opcodes.get(name, 0) for c in chips]
        row(name, values, sum(values))
    rule = len(rows)
    row("instructions", [c.instructions for c in chips], stats.instructions)
    all_limbs = {limb for c in chips for limb in c.limbs}
    row("limbs touched", [len(c.limbs) for c in chips], len(all_limbs))
    row("vector registers", [c.vregs for c in chips], max((c.vregs for c in chips), default=0))
    row("register span", [c.vreg_span for c in chips], max((c.vreg_span for c in chips), default=0))
    row("scalar registers", [c.sregs for c in chips], max((c.sregs for c in chips), default=0))
    row("limbs received", [c.limbs_received for c in chips], stats.total("limbs_received"))
    row("limbs sent", [c.limbs_sent for c in chips], stats.total("limbs_sent"))
    rows.append(["comm bytes", *(format_bytes(c.comm_bytes) for c in chips), format_bytes(stats.total("comm_bytes"))])
    rows.append(["memory traffic", *(format_bytes(c.traffic_bytes) for c in chips),
                 format_bytes(stats.total("traffic_bytes"))])

    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:]))]).rstrip()

    title = f"{stats.name}: {stats.instructions} instructions on {stats.chips} chip(s), N = {stats.n}"
    sep = "  ".join("-" * w for w in widths)
    out = [title, "", line(header), sep]
    out += [line(r) for r in rows[:rule]]
    out.append(sep)
    out += [line(r) for r in rows[rule:]]
    out.append("")
    out.append("register figures: the total column is the largest chip; bytes: 4 per residue, "
               "comm = limbs received, memory = one pass over every limb operand")
    return "\n".join(out)
