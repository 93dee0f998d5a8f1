"""Typed, immutable model of a compiled Cinnamon program (ISA.md sections 1 and 2).

A :class:`Program` holds one :class:`Stream` of :class:`Instruction` per chip, the global manifest
(``program_inputs``) and the per-chip manifests (``inputs<p>``). Nothing here parses or executes;
:mod:`caramel.parse` builds these objects and :mod:`caramel.validate` checks them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterator, NamedTuple, Union


class Opcode(enum.Enum):
    """Every opcode of ISA.md 2.1; the value is the mnemonic as printed by the compiler."""

    LOAD = "load"
    EVG = "evg"
    LOAS = "loas"
    STORE = "store"
    SPILL = "spill"
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    MUP = "mup"
    ADS = "ads"
    SUS = "sus"
    MUS = "mus"
    NEG = "neg"
    MOV = "mov"
    CON = "con"
    INT = "int"
    ROT = "rot"
    NTT = "ntt"
    SUD = "sud"
    BCI = "bci"
    PL1 = "pl1"
    BCW = "bcw"
    RSI = "rsi"
    RSV = "rsv"
    MOD = "mod"
    DIS = "dis"
    RCV = "rcv"
    JOI = "joi"
    REC = "rec"
    SND = "snd"

    # Members are singletons and compare by identity, so an identity hash is consistent with equality; it is
    # computed in C, where Enum's hashes the name in a Python call (a dict keyed by opcode is read per instruction).
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"Opcode.{self.name}"


@dataclass(frozen=True, slots=True)
class OpInfo:
    """What ISA.md 2.1 says about one opcode's operands: the one home of these facts, read by
    :mod:`caramel.validate` (checks) and :mod:`caramel.plan.dag` (SSA renaming, resources).

    ``reads``: the kinds of ``Instruction.srcs`` in printed order: ``r`` vector register, ``s``
    scalar register, ``m`` memory name, ``rb`` vector register or base conversion slot, ``r*`` a
    list of vector registers; ``?`` marks an optional operand. ``writes``: the kind of ``dst``
    (``""``: none). ``group``: ``w`` writes the register group (``rsi``), ``rw`` reads and writes it
    (``rsv``). ``unit``: ``bci`` starts a conversion of its unit, ``in`` writes one input limb of it.
    ``limb``: where the limb it works on comes from when it has no base: ``src``/``dst`` (the memory
    operand), ``sync`` (``id & 0xFFFF``). ``frees``: whether its ``[X]`` reads end the registers
    (the reference keeps them for stores and unit writes). ``comm``: a communication (ISA.md 6).
    ``elementwise``: its operation in :data:`caramel.ring.modular.ELEMENTWISE`. ``supported``:
    ``rec``/``snd`` are parsed but refused.
    """

    reads: tuple[str, ...] = ()
    writes: str = ""
    group: str = ""
    unit: str = ""
    limb: str = "base"
    frees: bool = True
    elementwise: str | None = None
    comm: bool = False
    supported: bool = True


_R, _RR, _RS = ("r",), ("r", "r"), ("r", "s")

#: One entry per opcode (ISA.md 2.1, 4 and 6).
OPCODES: dict[Opcode, OpInfo] = {
    Opcode.LOAD: OpInfo(("m",), "r", limb="src"),
    Opcode.EVG: OpInfo(("m",), "r", limb="src"),
    Opcode.LOAS: OpInfo(("m",), "s", limb="src"),
    Opcode.STORE: OpInfo(_R, "m", limb="dst", frees=False),
    Opcode.SPILL: OpInfo(_R, "m", limb="dst", frees=False),
    Opcode.ADD: OpInfo(_RR, "r", elementwise="add"),
    Opcode.SUB: OpInfo(_RR, "r", elementwise="sub"),
    Opcode.MUL: OpInfo(_RR, "r", elementwise="mul"),
    Opcode.MUP: OpInfo(_RR, "r", elementwise="mul"),
    Opcode.ADS: OpInfo(_RS, "r", elementwise="add"),
    Opcode.SUS: OpInfo(_RS, "r", elementwise="sub"),
    Opcode.MUS: OpInfo(_RS, "r", elementwise="mul"),
    Opcode.NEG: OpInfo(_R, "r", elementwise="neg"),
    Opcode.MOV: OpInfo(_R, "r"),
    Opcode.CON: OpInfo(_R, "r"),
    Opcode.INT: OpInfo(_R, "r"),
    Opcode.ROT: OpInfo(_R, "r"),
    Opcode.NTT: OpInfo(("rb",), "r"),
    Opcode.SUD: OpInfo(("r", "rb"), "r"),
    Opcode.BCI: OpInfo(unit="bci"),
    Opcode.PL1: OpInfo(_R, unit="in", frees=False),
    Opcode.BCW: OpInfo(_R, unit="in", frees=False),
    Opcode.RSI: OpInfo(group="w"),
    Opcode.RSV: OpInfo(_R, group="rw"),
    Opcode.MOD: OpInfo(("r*",), "r"),
    Opcode.DIS: OpInfo(_R, limb="sync", comm=True),
    Opcode.RCV: OpInfo((), "r", limb="sync", comm=True),
    Opcode.JOI: OpInfo(("r?",), "r?", comm=True),
    Opcode.REC: OpInfo(("m",), "r", limb="src", supported=False),
    Opcode.SND: OpInfo(_R, "m", limb="dst", supported=False),
}
#: The elementwise operation (:data:`caramel.ring.modular.ELEMENTWISE`) of each arithmetic opcode.
ELEMENTWISE_OP = {op: i.elementwise for op, i in OPCODES.items() if i.elementwise}
#: Communication opcodes (ISA.md section 6).
COMMUNICATION = frozenset(op for op, i in OPCODES.items() if i.comm)
#: Opcodes that move a limb from memory into a register, and those that write a register to memory.
LOADS = frozenset({Opcode.LOAD, Opcode.EVG})
STORES = frozenset({Opcode.STORE, Opcode.SPILL})


@dataclass(frozen=True, slots=True)
class VReg:
    """Vector register ``r<index>``; ``dead`` is the ``[X]`` last-use mark of a read."""

    index: int
    dead: bool = False

    def __str__(self) -> str:
        return f"r{self.index}{'[X]' if self.dead else ''}"


@dataclass(frozen=True, slots=True)
class SReg:
    """Scalar register ``s<index>`` (one residue); ``dead`` as for :class:`VReg`."""

    index: int
    dead: bool = False

    def __str__(self) -> str:
        return f"s{self.index}{'[X]' if self.dead else ''}"


@dataclass(frozen=True, slots=True)
class BcuSlot:
    """Output slot ``b<unit>{<slot>}`` of a base conversion unit."""

    unit: int
    slot: int

    def __str__(self) -> str:
        return f"b{self.unit}{{{self.slot}}}"


@dataclass(frozen=True, slots=True)
class Mem:
    """Memory name ``<term>(<limb>)``, e.g. ``i1(4)``; ``term`` keeps its prefix letter."""

    term: str
    limb: int

    @property
    def prefix(self) -> str:
        return self.term[0]

    def __str__(self) -> str:
        return f"{self.term}({self.limb})"


Operand = Union[VReg, SReg, BcuSlot, Mem]


class Instruction(NamedTuple):
    """One instruction line (an immutable named tuple: cheap to build, compare and unpickle).

    ``dst`` is the written register (or the memory name of ``store``/``spill``); ``srcs`` the
    read operands in printed order. ``base`` is the ``| L`` limb index (``None`` where the syntax
    has none). Opcode-specific fields keep their defaults elsewhere: ``final`` (``{F}``), ``step``
    (``rot``), ``sync``/``size`` (``dis``/``rcv``/``joi``), ``unit`` (``bci``/``pl1``/``bcw``),
    ``out_limbs``/``in_limbs`` (``bci`` output and input lists; ``in_limbs`` is also the CRT
    basis of ``rsv``), ``group`` (the accumulator registers of ``rsi``/``rsv``; ``mod`` reads its
    group as ``srcs``). ``line`` is the 1-based line in the stream's file.
    """

    op: Opcode
    dst: VReg | SReg | Mem | None = None
    srcs: tuple[Operand, ...] = ()
    base: int | None = None
    line: int = 0
    final: bool = False
    step: int = 0
    sync: int = 0
    size: int = 0
    unit: int = -1
    out_limbs: tuple[int, ...] = ()
    in_limbs: tuple[int, ...] = ()
    group: tuple[VReg, ...] = ()

    def __reduce__(self):
        # Rebuild through the C-level tuple constructor: keeps cached loads of large programs fast.
        return (tuple.__new__, (Instruction, tuple(self)))

    @property
    def limb(self) -> int | None:
        """The limb the instruction works on: its base, or the low 16 bits of a sync id."""
        if self.base is not None:
            return self.base
        where = OPCODES[self.op].limb
        if where == "sync":
            return self.sync & 0xFFFF
        if where == "src":
            return self.srcs[0].limb  # type: ignore[union-attr]
        if where == "dst":
            return self.dst.limb  # type: ignore[union-attr]
        return None

    def text(self) -> str:
        """The instruction printed in the compiler's syntax (ISA.md 2.1)."""
        return format_instruction(self)


def _regs(regs) -> str:
    return ", ".join(str(r) for r in regs)


def _ints(values) -> str:
    return ",".join(str(v) for v in values)


def format_instruction(ins: Instruction) -> str:
    """Print ``ins`` exactly as the Cinnamon compiler does, so that ``parse(format(x)) == x``."""
    op, s = ins.op, ins.srcs
    base = "" if ins.base is None else f" | {ins.base}"
    name = op.value
    if op in (Opcode.LOAD, Opcode.EVG, Opcode.LOAS):
        return f"{name} {ins.dst}: {s[0]}{'{F}' if ins.final else ''}"
    if op in STORES:
        return f"{name} {s[0]}: {ins.dst}"
    if op == Opcode.ROT:
        return f"rot {ins.step} {ins.dst}: {s[0]}{base}"
    if op in (Opcode.PL1, Opcode.BCW):
        return f"{name} B{ins.unit}: {s[0]}{base}"
    if op == Opcode.BCI:
        return f"bci B{ins.unit}: [{_ints(ins.out_limbs)}], [{_ints(ins.in_limbs)}]"
    if op == Opcode.RSI:
        return f"rsi {{{_regs(ins.group)}}}"
    if op == Opcode.RSV:
        return f"rsv {{{_regs(ins.group)}}}: {s[0]}: [{_ints(ins.in_limbs)}]{base}"
    if op == Opcode.MOD:
        return f"mod {ins.dst}: {{{_regs(s)}}}{base}"
    if op == Opcode.DIS:
        return f"dis @ {ins.sync}:{ins.size} : {s[0]}"
    if op == Opcode.RCV:
        return f"rcv @ {ins.sync}:{ins.size} {ins.dst}: "
    if op == Opcode.JOI:
        dst = f"{ins.dst}" if ins.dst is not None else ""
        src = f"{s[0]}" if s else ""
        return f"joi @ {ins.sync}:{ins.size} {dst}: {src}{base}"
    if op in (Opcode.REC, Opcode.SND):
        reg, mem = (ins.dst, s[0]) if op == Opcode.REC else (s[0], ins.dst)
        return f"{name} {reg}: {mem}{base}"
    return f"{name} {ins.dst}: {_regs(s)}{base}"


@dataclass(frozen=True, slots=True)
class Stream:
    """The instruction stream of one chip, read from ``path`` (line 1 is the header)."""

    chip: int
    path: str
    instructions: tuple[Instruction, ...]

    def __len__(self) -> int:
        return len(self.instructions)

    def __iter__(self) -> Iterator[Instruction]:
        return iter(self.instructions)

    def __repr__(self) -> str:  # short: a stream holds up to 10^5 instructions
        return f"Stream(chip {self.chip}, {len(self.instructions)} instructions, {self.path!r})"


class Section(enum.Enum):
    """Manifest sections; the value is the header text without ``" Stream:"``."""

    CIPHERTEXT = "Ciphertext"
    PLAINTEXT = "Plaintext"
    SCALAR = "Scalar"
    OUTPUT = "Output"
    EVALKEY = "Evalkey"
    INPUT = "Input"  # per-chip manifests only


class KeyType(enum.IntEnum):
    """Evaluation key types (ISA.md 5.3, CC ``terms.h`` ``EvalKeyType``)."""

    RELIN = 0
    ROTATION = 1
    CONJUGATION = 2
    BOOTSTRAP = 3
    EPHEMERAL = 4
    BOOTSTRAP2 = 5


@dataclass(frozen=True, slots=True)
class EvalKeyId:
    """A logical evaluation key ``type:level:E:rot:[digit]`` (the emulator's key id)."""

    type: KeyType
    level: int
    ext: int
    rot: int
    digits: tuple[int, ...]

    def limbs(self) -> tuple[int, ...]:
        """Limbs of the key: ``0..level-1`` then the extension ``64-E..63`` (ISA.md 5.3)."""
        return tuple(range(self.level)) + tuple(range(64 - self.ext, 64))

    def __str__(self) -> str:
        return f"{int(self.type)}:{self.level}:{self.ext}:{self.rot}:[{_ints(self.digits)}]"


@dataclass(frozen=True, slots=True)
class Symbol:
    """What a memory term means to the host.

    ``name:part`` with part ``c0``/``c1`` (ciphertext component), ``p`` (plaintext) or ``s``
    (scalar); for evaluation keys ``name`` is the key id text, ``part`` the half ``c0``/``c1``
    and ``key`` the parsed id.
    """

    name: str
    part: str
    key: EvalKeyId | None = None

    def __str__(self) -> str:
        if self.key is not None:
            k = self.key
            return f"K:{int(k.type)}:{k.level}:{k.ext}:{k.rot}:{self.part}:[{_ints(k.digits)}]"
        return f"{self.name}:{self.part}"


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """``<term> | <symbol> | [<limbs>]`` in section ``section`` at ``line`` of its file."""

    section: Section
    term: str
    symbol: Symbol
    limbs: tuple[int, ...]
    line: int = 0


@dataclass(frozen=True, slots=True)
class Manifest:
    """A parsed manifest file: ``program_inputs`` (5 sections) or ``inputs<p>`` (2 sections)."""

    path: str
    entries: tuple[ManifestEntry, ...]

    def section(self, section: Section) -> tuple[ManifestEntry, ...]:
        return tuple(e for e in self.entries if e.section == section)

    @property
    def inputs(self) -> tuple[ManifestEntry, ...]:
        """Every entry that provides data to the program (all sections but ``Output``)."""
        return tuple(e for e in self.entries if e.section != Section.OUTPUT)

    @property
    def outputs(self) -> tuple[ManifestEntry, ...]:
        return self.section(Section.OUTPUT)

    def __repr__(self) -> str:  # short: a manifest may list thousands of limbs
        return f"Manifest({self.path!r}, {len(self.entries)} entries)"


@dataclass(frozen=True, slots=True)
class Program:
    """A compiled program: ``streams[p]`` runs on chip p; ``manifest`` is ``program_inputs``."""

    name: str
    path: str
    streams: tuple[Stream, ...]
    manifest: Manifest
    chip_manifests: tuple[Manifest, ...] = field(default=())

    @property
    def chips(self) -> int:
        return len(self.streams)

    def __repr__(self) -> str:  # short: the full dataclass repr of a large program is megabytes
        return (f"Program({self.name!r}, {len(self.streams)} chip{'s' if len(self.streams) != 1 else ''}, "
                f"{sum(len(s) for s in self.streams)} instructions, path={self.path!r})")

    @property
    def instruction_count(self) -> int:
        return sum(len(s) for s in self.streams)
