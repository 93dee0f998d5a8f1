"""Text -> :class:`~caramel.program.Program`.

Sources: a compiled program folder (``instructions<p>``, ``inputs<p>``, ``program_inputs``), a
``.tar``/``.tar.gz``/``.tar.xz`` archive of one (``archive.tar.xz#member`` picks one program of an
archive that holds several), or a single ``instructions`` file. A program of an archive is parsed as soon as the
archive's read (a thread of its own; xz decompressed in large steps, without the GIL) has passed its files, while the
rest of the archive is read: the whole archive is still read and checked, and decides the files.

Two parsers give the same :class:`Program`:

* the **Lark path**, built from ``isa/cinnamon.lark``, the grammar of record; it produces every
  error message (file, line, column, what was expected);
* the **fast path**, which reads the fixed format directly (one regular expression per shape of
  instruction, run over all the lines of that shape at once, and the instructions built column by
  column) and falls back to the Lark path for any line it does not accept. Tests check that both give
  identical programs on every corpus file.

Loaded programs are cached under ``$CARAMEL_CACHE`` (default ``~/.cache/caramel``), keyed by the
SHA-256 of the files' contents and of caramel's parser and grammar, as plain typed arrays (never a
pickle) with an integrity digest; :mod:`caramel.cache` says what is checked before an entry is used.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import logging
import lzma
import os
import re
import tarfile
import threading
import time
from dataclasses import dataclass, field
from collections import defaultdict
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from pathlib import Path, PurePath
from typing import Callable, Iterator

from caramel.errors import Location, ParseError
from caramel.infiles import NotRegularFile, TooLarge, read_bounded, read_package_file
from caramel.program import (
    BcuSlot,
    EvalKeyId,
    Instruction,
    KeyType,
    Manifest,
    ManifestEntry,
    Mem,
    Opcode,
    Program,
    Section,
    SReg,
    Stream,
    Symbol,
    VReg,
)
from caramel.logs import progress as progress_bar

logger = logging.getLogger(__name__)


def _ascii(pattern: str):
    """A regular expression whose ``\\d`` and ``\\w`` are ASCII only, as the grammar's: Python's
    default ``\\d`` also matches other scripts' digits (``"r\\u0663"`` would read as register 3)."""
    return re.compile(pattern, re.ASCII)


GRAMMAR_PATH = Path(__file__).resolve().parent / "grammar" / "cinnamon.lark"
_PROGRAM_SECTIONS = (Section.CIPHERTEXT, Section.PLAINTEXT, Section.SCALAR, Section.OUTPUT, Section.EVALKEY)
_CHIP_SECTIONS = (Section.INPUT, Section.OUTPUT)
_MAX_INT = 1 << 62  # numbers above this are rejected: no limb, register or id is that large
#: The largest program file read (instructions or manifest). The corpus's largest file is 3.8 MB
#: (BootstrapLike_51L_1c/instructions0); a 64-limb bootstrap on one chip is within a few times that.
MAX_FILE_BYTES = 64 << 20
#: The most bytes of program files an archive may declare in all (several programs of up to 64 chips).
MAX_ARCHIVE_BYTES = 512 << 20


# ----------------------------------------------------------------------------------------------
# Lark path: the grammar of record
# ----------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def grammar():
    """The Lark LALR parser of ``isa/cinnamon.lark`` (start symbols ``instr``, ``header``, ``manifest_line``)."""
    from lark import Lark

    return Lark(
        read_package_file(GRAMMAR_PATH).decode(),
        parser="lalr",
        start=["instr", "header", "manifest_line"],
        maybe_placeholders=True,
    )


def _num(tok) -> int:
    if len(tok) > 20:  # also keeps int() below Python's 4300-digit conversion limit
        raise ValueError(f"number {tok[:20]}... ({len(tok)} characters) is out of range")
    value = int(tok)
    if abs(value) > _MAX_INT:
        raise ValueError(f"number {tok} is out of range")
    return value


def _num_at(tok: str, loc: Location) -> int:
    """:func:`_num` for manifests and headers: a :class:`ParseError` at ``loc`` when out of range."""
    try:
        return _num(tok)
    except ValueError as exc:
        raise ParseError(loc, str(exc)) from None


def _reg(tok, dead=None):
    cls = VReg if tok[0] == "r" else SReg
    return cls(_num(tok[1:]), dead is not None)


def _mem(tok) -> Mem:
    term, limb = tok[:-1].split("(")
    _num(term[1:])
    return Mem(term, _num(limb))


def _bout(tok) -> BcuSlot:
    unit, slot = tok[1:-1].split("{")
    return BcuSlot(_num(unit), _num(slot))


def _tree_to_instruction(tree, line: int) -> Instruction:
    """Build an :class:`Instruction` from a Lark ``instr`` tree."""
    node = tree.children[0]
    kind = node.data
    ch = node.children

    def src(x):
        if x is None:
            return None
        if hasattr(x, "data"):  # vsrc / ssrc: the register, then DEAD if marked (``DEAD?`` has no placeholder)
            return _reg(x.children[0], x.children[1] if len(x.children) > 1 else None)
        if x.type == "BOUT":
            return _bout(x)
        return _reg(x)

    def base(x):
        return _num(x.children[0])

    def ints(x):
        return tuple(_num(t) for t in x.children)

    def group(x):
        return tuple(src(c) for c in x.children)

    if kind in ("load", "evg", "loas"):
        return Instruction(Opcode(kind), dst=_reg(ch[0]), srcs=(_mem(ch[1]),), final=len(ch) > 2, line=line)
    if kind in ("store", "spill"):
        return Instruction(Opcode(kind), dst=_mem(ch[1]), srcs=(src(ch[0]),), line=line)
    if kind in ("binop", "scalarop", "unop"):
        return Instruction(
            Opcode(ch[0].strip()), dst=_reg(ch[1]), srcs=tuple(src(c) for c in ch[2:-1]), base=base(ch[-1]), line=line
        )
    if kind == "rot":
        return Instruction(Opcode.ROT, dst=_reg(ch[1]), srcs=(src(ch[2]),), base=base(ch[3]), step=_num(ch[0]), line=line)
    if kind == "ntt":
        return Instruction(Opcode.NTT, dst=_reg(ch[0]), srcs=(src(ch[1]),), base=base(ch[2]), line=line)
    if kind == "sud":
        return Instruction(Opcode.SUD, dst=_reg(ch[0]), srcs=(src(ch[1]), src(ch[2])), base=base(ch[3]), line=line)
    if kind == "bci":
        return Instruction(Opcode.BCI, unit=_num(ch[0][1:]), out_limbs=ints(ch[1]), in_limbs=ints(ch[2]), line=line)
    if kind in ("pl1", "bcw"):
        return Instruction(Opcode(kind), unit=_num(ch[0][1:]), srcs=(src(ch[1]),), base=base(ch[2]), line=line)
    if kind == "rsi":
        return Instruction(Opcode.RSI, group=group(ch[0]), line=line)
    if kind == "rsv":
        return Instruction(
            Opcode.RSV, group=group(ch[0]), srcs=(src(ch[1]),), in_limbs=ints(ch[2]), base=base(ch[3]), line=line
        )
    if kind == "mod":
        return Instruction(Opcode.MOD, dst=_reg(ch[0]), srcs=group(ch[1]), base=base(ch[2]), line=line)
    if kind == "dis":
        return Instruction(Opcode.DIS, sync=_num(ch[0]), size=_num(ch[1]), srcs=(src(ch[2]),), line=line)
    if kind == "rcv":
        return Instruction(Opcode.RCV, sync=_num(ch[0]), size=_num(ch[1]), dst=_reg(ch[2]), line=line)
    if kind == "joi":
        dst = _reg(ch[2]) if ch[2] is not None else None
        srcs = (src(ch[3]),) if ch[3] is not None else ()
        return Instruction(Opcode.JOI, sync=_num(ch[0]), size=_num(ch[1]), dst=dst, srcs=srcs, base=base(ch[4]), line=line)
    if kind == "rec":
        return Instruction(Opcode.REC, dst=_reg(ch[0]), srcs=(_mem(ch[1]),), base=base(ch[2]), line=line)
    if kind == "snd":
        return Instruction(Opcode.SND, dst=_mem(ch[1]), srcs=(src(ch[0]),), base=base(ch[2]), line=line)
    raise AssertionError(kind)  # pragma: no cover - the grammar has no other alternative


_OPCODE_WORDS = frozenset(op.value for op in Opcode)


def _terminal_text(name: str) -> str:
    """A terminal as a reader knows it: the literal text of anonymous terminals (``', '``, not ``__ANON_1``)."""
    try:
        pattern = grammar().get_terminal(name).pattern
    except KeyError:
        return name
    return repr(pattern.value) if pattern.type == "str" else name


def _lark_error(exc, loc: Location, text: str) -> ParseError:
    """Turn a Lark exception into a :class:`ParseError` with a readable reason."""
    column = getattr(exc, "column", 0) or 0
    here = Location(loc.path, loc.line, column if isinstance(column, int) and column > 0 else 0)
    word = text.split(" ", 1)[0]
    if word not in _OPCODE_WORDS:
        return ParseError(Location(loc.path, loc.line, 1), f"unknown opcode {word[:40]!r} in {text[:80]!r}")
    names = getattr(exc, "expected", None) or getattr(exc, "allowed", None) or []
    expected = sorted(_terminal_text(name) for name in names)
    hint = f" (expected {', '.join(expected[:6])})" if expected else ""
    return ParseError(here, f"malformed {word} instruction {text[:80]!r}{hint}")


def parse_instruction(text: str, path: str = "<string>", line: int = 1) -> Instruction:
    """Parse one instruction line with the grammar of record (Lark path)."""
    from lark.exceptions import LarkError

    loc = Location(path, line)
    if not text:
        raise ParseError(loc, "empty line where an instruction was expected")
    try:
        tree = grammar().parse(text, start="instr")
    except LarkError as exc:
        raise _lark_error(exc, loc, text) from None
    try:
        return _tree_to_instruction(tree, line)
    except ValueError as exc:
        raise ParseError(loc, f"{exc} in {text[:80]!r}") from None


# ----------------------------------------------------------------------------------------------
# Fast path: per shape of instruction, one regular expression over all its lines
# ----------------------------------------------------------------------------------------------

_LONGEST_NUMBER = 18  # digits; a longer number fails the patterns below and goes to the Lark path, which reports it
_N = r"\d{1,%d}" % _LONGEST_NUMBER  # the patterns' only digits, each run separated from the next by a non-digit
_R = rf"r{_N}(?:\[X\])?"  # a vector register read (``[X]``: its last use)
_S = rf"s{_N}(?:\[X\])?"
_RB = rf"(?:{_R}|b{_N}\{{{_N}\}})"  # a vector register read or a base conversion slot
_MEM = rf"[ipskvt]{_N}\({_N}\)"
_INTS = rf"{_N}(?:,{_N})*"
_GROUP = rf"{_R}(?:, {_R})*"
_BASE = rf" \| ({_N})"

#: Each shape of instruction line: its pattern (group 1 the mnemonic) and the :class:`_FastParser` method that
#: builds its instructions from the columns of the groups. A line goes to the shape of its first four characters
#: (:data:`_SHAPE_OF`), and the shape's pattern must match it whole.
_SHAPES = {
    "load": (rf"(load|evg) (r{_N}): ({_MEM})(\{{F\}})?", "_load"),
    "loas": (rf"(loas) (s{_N}): ({_MEM})(\{{F\}})?", "_load"),
    "store": (rf"(store|spill) ({_R}): ({_MEM})", "_store"),
    "binary": (rf"(add|sub|mul|mup) (r{_N}): ({_R}), ({_R}){_BASE}", "_binary"),
    "scalar": (rf"(ads|sus|mus) (r{_N}): ({_R}), ({_S}){_BASE}", "_binary"),
    "unary": (rf"(neg|mov|con|int) (r{_N}): ({_R}){_BASE}", "_unary"),
    "rot": (rf"(rot) (-?{_N}) (r{_N}): ({_R}){_BASE}", "_rot"),
    "ntt": (rf"(ntt) (r{_N}): ({_RB}){_BASE}", "_unary"),
    "sud": (rf"(sud) (r{_N}): ({_R}), ({_RB}){_BASE}", "_binary"),
    "bci": (rf"(bci) B({_N}): \[({_INTS})\], \[({_INTS})\]", "_bci"),
    "unit": (rf"(pl1|bcw) B({_N}): ({_R}){_BASE}", "_unit"),
    "rsi": (rf"(rsi) \{{({_GROUP})\}}", "_rsi"),
    "rsv": (rf"(rsv) \{{({_GROUP})\}}: ({_R}): \[({_INTS})\]{_BASE}", "_rsv"),
    "mod": (rf"(mod) (r{_N}): \{{({_GROUP})\}}{_BASE}", "_mod"),
    "dis": (rf"(dis) @ ({_N}):({_N}) : ({_R})", "_dis"),
    "rcv": (rf"(rcv) @ ({_N}):({_N}) (r{_N}): ", "_rcv"),
    "joi": (rf"(joi) @ ({_N}):({_N}) (r{_N})?: ({_R})?{_BASE}", "_joi"),
}
_SHAPE_OF = {
    "load": "load", "evg ": "load", "loas": "loas", "stor": "store", "spil": "store",
    "add ": "binary", "sub ": "binary", "mul ": "binary", "mup ": "binary",
    "ads ": "scalar", "sus ": "scalar", "mus ": "scalar",
    "neg ": "unary", "mov ": "unary", "con ": "unary", "int ": "unary",
    "rot ": "rot", "ntt ": "ntt", "sud ": "sud", "bci ": "bci", "pl1 ": "unit", "bcw ": "unit",
    "rsi ": "rsi", "rsv ": "rsv", "mod ": "mod", "dis ": "dis", "rcv ": "rcv", "joi ": "joi",
}  # fmt: skip
_HEAD = itemgetter(slice(4))  # a line's first four characters
#: Per shape, its pattern over lines joined by newlines (``findall``: one tuple of groups per whole line it
#: matches; no pattern can match a newline, so a line is matched whole or not at all) and over one line.
_FINDALL = {shape: re.compile(rf"^(?:{p})$", re.ASCII | re.MULTILINE).findall for shape, (p, _) in _SHAPES.items()}
_FULLMATCH = {shape: _ascii(p).fullmatch for shape, (p, _) in _SHAPES.items()}
_OPCODE = {op.value: op for op in Opcode}  # mnemonic -> opcode (a dict lookup: Opcode(text) costs a call)
_FIELDS = tuple((f, Instruction._field_defaults.get(f)) for f in Instruction._fields)  # (name, default)


def _instructions(**columns) -> Iterator[Instruction]:
    """Instructions built row by row from columns (iterables, in step) of their fields; a field not given
    has its default. Built as tuples (``tuple.__new__``): the named tuple's keyword constructor is a Python
    call an instruction."""
    return map(tuple.__new__, repeat(Instruction), zip(*(columns[f] if f in columns else repeat(d) for f, d in _FIELDS)))


class _Memo(dict):
    """``memo[key]`` is ``make(key)``, made once: a hit is one dict lookup (the parser's operands repeat)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(key)
        return value


def _operand(text: str):
    """The operand of ``r<i>``, ``s<i>`` (either with ``[X]``) or ``b<unit>{<slot>}``."""
    if text[0] == "b":
        return _bout(text)
    dead = text.endswith("[X]")
    return _reg(text[:-3] if dead else text, True if dead else None)


def _memory(text: str) -> Mem:
    """The memory name ``<term>(<limb>)`` of a line the fast path's pattern matched (at most 18 digits each)."""
    term, _, limb = text.partition("(")
    return Mem(term, int(limb[:-1]))


def _ints(text: str) -> tuple[int, ...]:
    return tuple(map(int, text.split(",")))


class _FastParser:
    """Parses lines of the fixed format, all the lines of one shape at once; declines (``None``) any line
    that its shape's pattern does not match whole. Operands, memory names and limb lists are made once
    per text and shared by the instructions that name them."""

    def __init__(self):
        self._ops = _Memo(_operand)
        self._mems = _Memo(_memory)
        self._ints = _Memo(_ints)

    def parse(self, lines: list[str], first: int) -> list[Instruction | None]:
        """The instructions of ``lines``, numbered from ``first``; None for each line declined."""
        by_shape = defaultdict(list)  # shape -> the indices of its lines, in order
        for k, shape in enumerate(map(_SHAPE_OF.get, map(_HEAD, lines))):
            by_shape[shape].append(k)
        by_shape.pop(None, None)
        out: list[Instruction | None] = [None] * len(lines)
        for shape, ks in by_shape.items():
            texts = list(map(lines.__getitem__, ks))
            found = _FINDALL[shape]("\n".join(texts))
            if len(found) != len(texts):  # some line does not match: match them one by one, keep those that do
                matches = list(map(_FULLMATCH[shape], texts))
                ks = [k for k, m in zip(ks, matches) if m is not None]
                found = [m.groups("") for m in matches if m is not None]
                if not found:
                    continue
            build = getattr(self, _SHAPES[shape][1])
            for k, ins in zip(ks, build(tuple(zip(*found)), map(first.__add__, ks))):
                out[k] = ins
        return out

    def ops(self, column) -> Iterator:
        return map(self._ops.__getitem__, column)

    def optional(self, column) -> Iterator:
        """Operands, None for an absent one (``""``)."""
        return (self._ops[t] if t else None for t in column)

    def groups(self, column) -> Iterator[tuple]:
        return (tuple(self.ops(t.split(", "))) for t in column)

    # One method per shape: (the columns of its pattern's groups, the line numbers) -> its instructions.

    def _load(self, g, line):  # load|evg|loas DST: MEM {F}?
        return _instructions(op=_opcodes(g[0]), dst=self.ops(g[1]), srcs=zip(map(self._mems.__getitem__, g[2])),
                             final=map(bool, g[3]), line=line)

    def _store(self, g, line):  # store|spill SRC: MEM
        return _instructions(op=_opcodes(g[0]), dst=map(self._mems.__getitem__, g[2]), srcs=zip(self.ops(g[1])),
                             line=line)

    def _binary(self, g, line):  # OP DST: SRC, SRC | BASE
        return _instructions(op=_opcodes(g[0]), dst=self.ops(g[1]), srcs=zip(self.ops(g[2]), self.ops(g[3])),
                             base=map(int, g[4]), line=line)

    def _unary(self, g, line):  # OP DST: SRC | BASE
        return _instructions(op=_opcodes(g[0]), dst=self.ops(g[1]), srcs=zip(self.ops(g[2])), base=map(int, g[3]),
                             line=line)

    def _rot(self, g, line):  # rot STEP DST: SRC | BASE
        return _instructions(op=_opcodes(g[0]), step=map(int, g[1]), dst=self.ops(g[2]), srcs=zip(self.ops(g[3])),
                             base=map(int, g[4]), line=line)

    def _bci(self, g, line):  # bci B<unit>: [OUT], [IN]
        ints = self._ints.__getitem__
        return _instructions(op=_opcodes(g[0]), unit=map(int, g[1]), out_limbs=map(ints, g[2]),
                             in_limbs=map(ints, g[3]), line=line)

    def _unit(self, g, line):  # pl1|bcw B<unit>: SRC | BASE
        return _instructions(op=_opcodes(g[0]), unit=map(int, g[1]), srcs=zip(self.ops(g[2])), base=map(int, g[3]),
                             line=line)

    def _rsi(self, g, line):  # rsi {GROUP}
        return _instructions(op=_opcodes(g[0]), group=self.groups(g[1]), line=line)

    def _rsv(self, g, line):  # rsv {GROUP}: SRC: [IN] | BASE
        return _instructions(op=_opcodes(g[0]), group=self.groups(g[1]), srcs=zip(self.ops(g[2])),
                             in_limbs=map(self._ints.__getitem__, g[3]), base=map(int, g[4]), line=line)

    def _mod(self, g, line):  # mod DST: {SRCS} | BASE
        return _instructions(op=_opcodes(g[0]), dst=self.ops(g[1]), srcs=self.groups(g[2]), base=map(int, g[3]),
                             line=line)

    def _dis(self, g, line):  # dis @ SYNC:SIZE : SRC
        return _instructions(op=_opcodes(g[0]), sync=map(int, g[1]), size=map(int, g[2]), srcs=zip(self.ops(g[3])),
                             line=line)

    def _rcv(self, g, line):  # rcv @ SYNC:SIZE DST:
        return _instructions(op=_opcodes(g[0]), sync=map(int, g[1]), size=map(int, g[2]), dst=self.ops(g[3]),
                             line=line)

    def _joi(self, g, line):  # joi @ SYNC:SIZE DST?: SRC? | BASE
        return _instructions(op=_opcodes(g[0]), sync=map(int, g[1]), size=map(int, g[2]), dst=self.optional(g[3]),
                             srcs=(() if x is None else (x,) for x in self.optional(g[4])), base=map(int, g[5]),
                             line=line)


def _opcodes(column) -> Iterator[Opcode]:
    return map(_OPCODE.__getitem__, column)


# ----------------------------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------------------------


def _decode(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ParseError(Location(path, line, column), "not a text file (invalid UTF-8 byte)") from None


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


_PROGRESS_LINES = 16384  # lines parsed between progress updates


def _index(items: list, value, start: int) -> int:
    """The first index of ``value`` in ``items`` from ``start`` on, or -1."""
    try:
        return items.index(value, start)
    except ValueError:
        return -1


def parse_stream(
    data: bytes | str,
    path: str,
    chip: int,
    *,
    fast: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Stream:
    """Parse an ``instructions<chip>`` file: header line then one instruction per line."""
    text = _decode(data, path) if isinstance(data, bytes) else data
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise ParseError(Location(path, line), "not a text file (NUL byte)")
    lines = _lines(text)
    if not lines:
        raise ParseError(Location(path, 1), "empty instruction file (expected 'Instruction Stream <p>:')")
    header = lines[0]
    m = re.fullmatch(r"Instruction Stream (\d+):", header, re.ASCII)
    if m is None:
        raise ParseError(Location(path, 1), f"expected header 'Instruction Stream {chip}:', found {header[:60]!r}")
    if _num_at(m.group(1), Location(path, 1)) != chip:
        raise ParseError(Location(path, 1), f"header names stream {m.group(1)} but the file is stream {chip}")
    truncated = not text.endswith("\n")
    body = lines[1:]
    fastp = _FastParser() if fast else None
    out: list[Instruction | None] = []  # the fast path's instructions, None where it declines
    if progress is not None:
        progress(1)  # the header
    for start in range(0, len(body), _PROGRESS_LINES):
        chunk = body[start:start + _PROGRESS_LINES]
        out += fastp.parse(chunk, start + 2) if fastp is not None else [None] * len(chunk)
        if progress is not None:
            progress(len(chunk))
    k = -1
    while (k := _index(out, None, k + 1)) >= 0:  # the lines the fast path declined, in order: the Lark path
        i = k + 2
        try:
            out[k] = parse_instruction(body[k], path, i)
        except ParseError as exc:
            if truncated and i == len(lines):
                raise ParseError(exc.location, exc.reason + " (the file ends mid-line: truncated?)") from None
            raise
    return Stream(chip, path, tuple(out))


_ENTRY = _ascii(r"([ipskvt]\d+) \| (.*) \| \[(\d+(?:,\d+)*)\]")
_VALUE_SYMBOL = _ascii(r"([A-Za-z_][A-Za-z0-9_.]*):(c0|c1|p|s)")
_KEY_SYMBOL = _ascii(r"K:(\d+):(\d+):(\d+):(-?\d+):(c0|c1):\[(\d+(?:,\d+)*)\]")


_TOO_LONG = re.compile(r"\d{%d}" % (_LONGEST_NUMBER + 1))  # a run of more digits than the fast path reads


def _numbers_at(text: str, loc: Location) -> tuple[int, ...]:
    """The numbers of a comma-separated list of ASCII digits (:func:`_num_at` each, where one may be out of range)."""
    if not _TOO_LONG.search(text):
        return tuple(map(int, text.split(",")))
    return tuple(_num_at(x, loc) for x in text.split(","))


def _symbol(text: str, loc: Location) -> Symbol:
    m = _KEY_SYMBOL.fullmatch(text)
    if m:
        t, level, ext, rot, half, digits = m.groups()
        try:
            ktype = KeyType(_num_at(t, loc))
        except ValueError:
            raise ParseError(loc, f"unknown evaluation key type {t} in {text!r}") from None
        key = EvalKeyId(ktype, _num_at(level, loc), _num_at(ext, loc), _num_at(rot, loc),
                        _numbers_at(digits, loc))
        return Symbol(f"K:{key}", half, key)
    m = _VALUE_SYMBOL.fullmatch(text)
    if m:
        return Symbol(m.group(1), m.group(2))
    raise ParseError(loc, f"malformed symbol {text!r} (expected name:c0|c1|p|s or K:type:level:E:rot:c<h>:[digits])")


def parse_manifest(data: bytes | str, path: str, *, chip: bool = False) -> Manifest:
    """Parse ``program_inputs`` (``chip=False``: 5 sections) or ``inputs<p>`` (``chip=True``: 2 sections)."""
    text = _decode(data, path) if isinstance(data, bytes) else data
    expected = _CHIP_SECTIONS if chip else _PROGRAM_SECTIONS
    lines = _lines(text)
    entries: list[ManifestEntry] = []
    section_index, current = 0, None
    for i, line_text in enumerate(lines, start=1):
        loc = Location(path, i)
        if current is None:
            if section_index == len(expected):
                raise ParseError(loc, f"unexpected text after the last section: {line_text[:60]!r}")
            want = f"{expected[section_index].value} Stream:"
            if line_text != want:
                raise ParseError(loc, f"expected section header {want!r}, found {line_text[:60]!r}")
            current = expected[section_index]
            section_index += 1
            continue
        if line_text == ";":
            current = None
            continue
        m = _ENTRY.fullmatch(line_text)
        if m is None:
            _manifest_line_error(line_text, loc)
        term, symbol_text, limbs = m.groups()
        if current == Section.EVALKEY and term[0] != "k" or current != Section.EVALKEY and term[0] == "k" and current != Section.INPUT:
            raise ParseError(loc, f"term {term!r} does not belong in the {current.value} section")
        _num_at(term[1:], loc)
        limb_values = _numbers_at(limbs, loc)
        entries.append(ManifestEntry(current, term, _symbol(symbol_text, loc), limb_values, i))
    if current is not None or section_index != len(expected):
        missing = [s.value for s in expected[section_index:]]
        what = f"section {current.value!r} is not closed by ';'" if current is not None else f"missing sections {missing}"
        raise ParseError(Location(path, len(lines) + 1), f"manifest ends early: {what} (truncated?)")
    return Manifest(path, tuple(entries))


def _manifest_line_error(text: str, loc: Location):
    from lark.exceptions import LarkError

    try:
        grammar().parse(text, start="manifest_line")
    except LarkError as exc:
        col = getattr(exc, "column", 0)
        raise ParseError(Location(loc.path, loc.line, col if isinstance(col, int) and col > 0 else 0),
                         f"malformed manifest line {text[:80]!r}") from None
    raise ParseError(loc, f"malformed manifest line {text[:80]!r}")


# ----------------------------------------------------------------------------------------------
# Sources: folder, archive, single file; the cache
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Files:
    """The raw files of one program: name -> bytes, plus a display prefix for error paths."""

    name: str
    where: str
    files: dict[str, bytes]
    paths: dict[str, str] = field(default_factory=dict)  # display path of a file not at where/filename
    single: bool = False  # one instructions file given alone (no manifests expected)
    member: str | None = None  # the program's folder inside an archive (None: not from an archive)

    def path(self, filename: str) -> str:
        if filename in self.paths:
            return self.paths[filename]
        return f"{self.where}/{filename}" if self.where else filename


_INSTR = _ascii(r"instructions(\d+)")
_INPUTS = _ascii(r"inputs(\d+)")


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.0f} MiB"


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes: a device
    (``/dev/zero``), a FIFO, a socket or a folder is a :class:`ParseError` at once, never a hang
    (the file is opened non-blocking and checked with ``fstat`` before any read). ``limit``:
    default :data:`MAX_FILE_BYTES`."""
    limit = MAX_FILE_BYTES if limit is None else limit
    try:
        return read_bounded(path, limit)
    except TooLarge as exc:
        if not exc.grown:
            raise ParseError(Location(str(path)), f"file of {_mib(exc.size)} is far larger than any "
                                                  f"compiled program file (at most {_mib(limit)})") from None
        raise ParseError(Location(str(path)), f"file grew beyond {_mib(limit)} while read") from None
    except NotRegularFile as exc:
        raise ParseError(Location(str(path)), str(exc).removeprefix(f"{path}: ")) from None
    except OSError as exc:
        raise ParseError(Location(str(path)), f"cannot read: {exc.strerror}") from None


def _is_program_file(name: str) -> bool:
    return bool(_INSTR.fullmatch(name) or _INPUTS.fullmatch(name) or name == "program_inputs")


def _has_instructions(names) -> bool:
    """Whether file ``names`` hold an ``instructions<p>`` file (a compiled program's folder)."""
    return any(_INSTR.fullmatch(n) for n in names)


def _read_folder(path: Path) -> _Files:
    files = {p.name: read_regular(p) for p in sorted(path.iterdir()) if _is_program_file(p.name)}
    if not _has_instructions(files):
        raise ParseError(Location(str(path)), "no 'instructions<p>' files in this folder: not a compiled program")
    total = sum(map(len, files.values()))
    if total > MAX_ARCHIVE_BYTES:
        raise ParseError(Location(str(path)), f"program files of {_mib(total)} in all: far larger than any "
                                              f"compiled program (at most {_mib(MAX_ARCHIVE_BYTES)})")
    return _Files(path.name, str(path), files)


_XZ_MAGIC = b"\xfd7zXZ\x00"
_TAR_SLACK = 64 << 20  # what an archive decompresses to beyond its members' data at most: headers and padding


class _Unxz(io.RawIOBase):
    """The decompressed bytes of xz data ``data`` (one stream or several in a row), read forward only, decompressed
    :data:`STEP` bytes a call (the decompressor releases the GIL for each: another thread parses meanwhile, with few
    hand-overs of the GIL), and no further than ``limit`` bytes (an OSError beyond)."""

    STEP = 8 << 20

    def __init__(self, data: bytes, limit: int):
        self.decompressor, self.data, self.limit = lzma.LZMADecompressor(), data, limit
        self.chunk, self.at, self.out = b"", 0, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.at == len(self.chunk):
            if self.decompressor.eof:  # the next stream of a concatenated file, if any (as xz reads them)
                if not self.decompressor.unused_data:
                    return 0
                self.decompressor, self.data = lzma.LZMADecompressor(), self.decompressor.unused_data
            self.chunk, self.at, self.data = self.decompressor.decompress(self.data, max_length=self.STEP), 0, b""
            self.out += len(self.chunk)
            if self.out > self.limit:
                raise OSError(f"decompresses to more than {_mib(self.limit)}")
        n = min(len(buffer), len(self.chunk) - self.at)
        buffer[:n] = self.chunk[self.at:self.at + n]
        self.at += n
        return n


def _archive_members(path: Path, data: bytes | None) -> Iterator[tuple[str, str, bytes]]:
    """(folder, file name, bytes) of every program file of an archive, in its order; every member's declared size is
    checked at its header, before anything of it is decompressed (a member beyond :data:`MAX_FILE_BYTES`, or more
    than :data:`MAX_ARCHIVE_BYTES` declared in all, is refused), and a program file is read no further than its
    declared size. ``data``: the archive's bytes, already read (else the file is opened)."""
    def refuse(reason: str):
        raise ParseError(Location(str(path)), reason)

    try:
        if data is None:
            opened = tarfile.open(path)
        elif data.startswith(_XZ_MAGIC):  # read forward, decompressed in large steps (see _Unxz)
            opened = tarfile.open(fileobj=_Unxz(data, MAX_ARCHIVE_BYTES + _TAR_SLACK), mode="r|")
        else:
            opened = tarfile.open(fileobj=io.BytesIO(data))
        with opened as tar:
            declared = 0
            while (info := tar.next()) is not None:
                if not info.isfile():
                    continue
                if info.size > MAX_FILE_BYTES:
                    refuse(f"member {info.name[:80]!r} declares {_mib(info.size)}: far larger than any compiled "
                           f"program file (at most {_mib(MAX_FILE_BYTES)})")
                declared += info.size
                if declared > MAX_ARCHIVE_BYTES:
                    refuse(f"members declare more than {_mib(MAX_ARCHIVE_BYTES)} in all: far larger than any "
                           "set of compiled programs")
                folder, _, name = info.name.rpartition("/")
                if _is_program_file(name):
                    blob = tar.extractfile(info).read(info.size + 1)
                    if len(blob) != info.size:
                        refuse(f"member {info.name[:80]!r} holds {len(blob)} bytes, its header says {info.size}")
                    yield folder, name, blob
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ParseError(Location(str(path)), f"cannot read archive: {exc}") from None


def _matches(folder: str, member: str) -> bool:
    """Whether an archive's ``folder`` is the program named ``member`` (its path or its last part)."""
    return folder == member or folder.rpartition("/")[2] == member


def _program_of(path: Path, member: str | None, groups: dict[str, dict[str, bytes]]) -> _Files:
    """The :class:`_Files` of program ``member`` (None: the only one) among an archive's ``groups`` (folder -> its
    program files)."""
    groups = {k: v for k, v in groups.items() if _has_instructions(v)}
    if not groups:
        raise ParseError(Location(str(path)), "archive holds no compiled program (no 'instructions<p>' files)")
    if member is None:
        if len(groups) > 1:
            names = ", ".join(sorted(k.rpartition("/")[2] for k in groups))
            raise ParseError(Location(str(path)), f"archive holds several programs; pick one with '{path}#NAME' ({names})")
        folder = next(iter(groups))
    else:
        matches = [k for k in groups if _matches(k, member)]
        if len(matches) != 1:
            raise ParseError(Location(str(path)), f"archive has no program named {member!r}")
        folder = matches[0]
    return _archive_files(path, folder, groups[folder])


def _read_archive(path: Path, member: str | None, data: bytes | None = None) -> _Files:
    """The program files of an archive (:func:`_archive_members`, :func:`_program_of`)."""
    groups: dict[str, dict[str, bytes]] = {}
    for folder, name, blob in _archive_members(path, data):
        groups.setdefault(folder, {})[name] = blob
    return _program_of(path, member, groups)


class _ArchiveRead:
    """An archive read on a thread of its own (LZMA decompresses without the GIL): :meth:`first` gives program
    ``member``'s files as soon as the read has passed its folder (a program file of another folder follows), so that
    parsing them overlaps the rest of the read; :meth:`finish` waits for the whole read and gives what
    :func:`_read_archive` gives, or raises what it raises (a later member of that folder, or an error further on, is
    found there, as before)."""

    def __init__(self, path: Path, member: str, data: bytes | None):
        self.path, self.member = path, member
        self.groups: dict[str, dict[str, bytes]] = {}
        self.early: _Files | None = None
        self.error: BaseException | None = None
        self.passed = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(data,), name="caramel-archive", daemon=True)
        self.thread.start()

    def _read(self, data: bytes | None) -> None:
        last = None
        try:
            for folder, name, blob in _archive_members(self.path, data):
                if folder != last and last is not None and self.early is None and _matches(last, self.member):
                    files = self.groups[last]
                    if _has_instructions(files):
                        self.early = _archive_files(self.path, last, dict(files))
                        self.passed.set()
                self.groups.setdefault(folder, {})[name] = blob
                last = folder
        except BaseException as exc:  # noqa: BLE001 (finish raises it)
            self.error = exc
        finally:
            self.passed.set()

    def first(self) -> _Files | None:
        """The program's files once the read has passed its folder (None: it ended, or failed, before that)."""
        self.passed.wait()
        return self.early

    def finish(self) -> _Files:
        """The program's files from the whole archive (:func:`_read_archive`'s), or its error."""
        self.thread.join()
        if self.error is not None:
            raise self.error
        return _program_of(self.path, self.member, self.groups)


def _archive_files(path: Path, folder: str, files: dict[str, bytes]) -> _Files:
    """The :class:`_Files` of the program in ``folder`` of the archive at ``path``: its name (the
    folder's last part, or the archive's name before its first dot) and display paths."""
    name = folder.rpartition("/")[2] or path.name.split(".")[0]
    return _Files(name, f"{path}#{folder}" if folder else str(path), files, member=folder)


def _split_source(source: str | os.PathLike) -> tuple[str, str | None]:
    """(path, member) of a program source: ``a.tar.xz#NAME`` names member NAME of the archive
    ``a.tar.xz`` (when no file is named with the ``#`` itself)."""
    text = os.fspath(source)
    if "#" in text and not Path(text).exists():
        text, member = text.split("#", 1)
        return text, member
    return text, None


def program_files(source: str | os.PathLike) -> list[str]:
    """The paths of the files that loading ``source`` reads (a folder's program files, or the
    archive or single file), for refusing an output that would overwrite one; nothing is read."""
    text, _ = _split_source(source)
    path = Path(text)
    try:
        if path.is_dir():
            return [str(p) for p in sorted(path.iterdir()) if _is_program_file(p.name)]
    except OSError:
        return []
    return [text]


def read_source(source: str | os.PathLike) -> _Files:
    """Read the raw files of a program from a folder, an archive (``a.tar.xz#member``) or one file."""
    text, member = _split_source(source)
    path = Path(text)
    if not path.exists():
        raise ParseError(Location(text), "no such file or folder")
    if path.is_dir():
        return _read_folder(path)
    if not path.is_file():
        raise ParseError(Location(text), "not a regular file (a device, FIFO or socket)")
    if tarfile.is_tarfile(path):
        return _read_archive(path, member)
    m = _INSTR.fullmatch(path.name)
    chip = int(m.group(1)) if m else 0
    key = f"instructions{chip}"
    return _Files(path.name, str(path.parent), {key: read_regular(path)}, {key: str(path)}, single=True)


@lru_cache(maxsize=1)
def _parser_fingerprint() -> bytes:
    h = hashlib.sha256()
    for p in (Path(__file__), GRAMMAR_PATH, Path(__file__).with_name("program.py"), Path(__file__).with_name("cache.py")):
        h.update(read_package_file(p))
    return h.digest()


def source_digest(files: _Files) -> str:
    """SHA-256 of a program's files (names and contents): what a cache entry is the cache of."""
    h = hashlib.sha256()
    for name in sorted(files.files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files.files[name]).digest())
    return h.hexdigest()


def archive_digest(data: bytes, member: str | None) -> str:
    """What a cache entry of the program ``member`` of the archive whose (compressed) bytes are
    ``data`` is the cache of: SHA-256 of a tag, the archive's SHA-256 and the member as given. The
    bytes fix everything decompressed from them, so a hit needs no decompression; a tag keeps
    these apart from :func:`source_digest`'s."""
    tag = json.dumps(["archive", hashlib.sha256(data).hexdigest(), member])
    return hashlib.sha256(tag.encode()).hexdigest()


def _archive_bytes(source: str | os.PathLike) -> tuple[Path, str | None, bytes] | None:
    """(path, member, bytes) when ``source`` names a tar archive (a regular file of at most
    :data:`MAX_ARCHIVE_BYTES`), else None (the caller reads it with :func:`read_source`)."""
    text, member = _split_source(source)
    path = Path(text)
    try:
        if not path.is_file() or not tarfile.is_tarfile(path):
            return None
        if path.stat().st_size > MAX_ARCHIVE_BYTES:
            return None
    except OSError:
        return None
    return path, member, read_regular(path, MAX_ARCHIVE_BYTES)


def _cache_key(source: str) -> str:
    """The entry name of a program whose files have :func:`source_digest` ``source``."""
    return hashlib.sha256(_parser_fingerprint() + source.encode()).hexdigest()


def _cache_meta(source: str) -> dict:
    """What an entry must say it is the cache of (:mod:`caramel.cache`)."""
    from caramel import cache
    from caramel.version import __version__

    return {"format": cache.FORMAT_VERSION, "caramel": __version__, "source": source,
            "parser": _parser_fingerprint().hex()}


def build_program(files: _Files, *, fast: bool = True, progress: bool | None = None) -> Program:
    """Parse the raw files of one program into a :class:`Program` (no cache)."""
    chips = sorted(int(m.group(1)) for k in files.files if (m := _INSTR.fullmatch(k)))
    if chips != list(range(len(chips))):
        raise ParseError(Location(files.where), f"instruction files must be numbered 0..K-1, found {chips}")
    total = sum(files.files[f"instructions{c}"].count(b"\n") for c in chips)
    streams = []
    with progress_bar(total=total, desc="parse", unit="lines", enabled=progress) as bar:
        for c in chips:
            name = f"instructions{c}"
            streams.append(parse_stream(files.files[name], files.path(name), c, fast=fast, progress=bar.update))
    manifest = Manifest(files.path("program_inputs"), ())
    if "program_inputs" in files.files:
        manifest = parse_manifest(files.files["program_inputs"], files.path("program_inputs"))
    elif not files.single:
        raise ParseError(Location(files.where), "no 'program_inputs' file: a compiled program folder has one "
                                                "(the inputs, outputs and keys of the program)")
    extra = sorted(int(m.group(1)) for k in files.files if (m := _INPUTS.fullmatch(k)) and int(m.group(1)) >= len(chips))
    if extra:
        raise ParseError(Location(files.path(f"inputs{extra[0]}"), 1),
                         f"names chip {extra[0]}, but the program has {len(chips)} chip(s) (instructions0.."
                         f"instructions{len(chips) - 1})")
    chip_manifests = tuple(
        parse_manifest(files.files[f"inputs{c}"], files.path(f"inputs{c}"), chip=True)
        for c in chips
        if f"inputs{c}" in files.files
    )
    for m in chip_manifests:
        _check_agreement(manifest, m)
    return Program(files.name, files.where, tuple(streams), manifest, chip_manifests)


def _check_agreement(program_inputs: Manifest, chip: Manifest) -> None:
    """Every entry of a chip manifest (``inputs<p>``) whose term ``program_inputs`` also lists must
    agree with it: the same symbol, both outputs or both inputs, and limbs among the global ones."""
    known: dict[str, list[ManifestEntry]] = {}
    for e in program_inputs.entries:
        known.setdefault(e.term, []).append(e)
    for e in chip.entries:
        same = known.get(e.term)
        if not same:
            continue
        g = same[0]
        where = Location(chip.path, e.line)
        if e.symbol != g.symbol:
            raise ParseError(where, f"{e.term} is {e.symbol} here but {g.symbol} in {program_inputs.path}:{g.line}")
        if (e.section == Section.OUTPUT) != (g.section == Section.OUTPUT):
            raise ParseError(where, f"{e.term} is in the {e.section.value} section here but in the "
                                    f"{g.section.value} section of {program_inputs.path}:{g.line}")
        limbs = set().union(*(x.limbs for x in same))
        beyond = sorted(set(e.limbs) - limbs)
        if beyond:
            raise ParseError(where, f"{e.term} lists limb(s) {','.join(map(str, beyond))} that "
                                    f"{program_inputs.path}:{g.line} does not have")


def _relocate(program: Program, files: _Files) -> Program:
    """``program`` with the name and file paths of ``files``.

    The cache is keyed by content, so identical files at another place (a copied folder, or
    ``Mul_4L_1c`` and ``MulRescale_4L_1c``, which the compiler writes identically) share an entry;
    the paths that error messages name must still be those of the files actually loaded.
    """
    if program.name == files.name and program.path == files.where:
        return program
    streams = tuple(Stream(s.chip, files.path(f"instructions{s.chip}"), s.instructions) for s in program.streams)
    manifest = Manifest(files.path("program_inputs"), program.manifest.entries)
    chip_manifests = tuple(Manifest(files.path(PurePath(m.path).name), m.entries) for m in program.chip_manifests)
    return Program(files.name, files.where, streams, manifest, chip_manifests)


@contextlib.contextmanager
def no_gc():
    """Pause the cyclic garbage collector while building or scanning hundreds of thousands of
    acyclic objects (collections over them would dominate the run time)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _load_archive(path: Path, member: str | None, data: bytes, build: Callable[[_Files], Program]
                  ) -> tuple[_Files, Program]:
    """(files, ``build(files)``) of program ``member`` of an archive (``build`` pauses the garbage collector itself,
    :func:`no_gc`): built from its files as soon as the read has passed them (:class:`_ArchiveRead`), while the rest
    of the archive is read; built again only where the whole archive gives other files. An error of the archive comes
    before one of the program's."""
    if member is None:  # the only program: known only at the end
        files = _read_archive(path, member, data)
        return files, build(files)
    reading = _ArchiveRead(path, member, data)
    early, program, failed = reading.first(), None, None
    if early is not None:
        try:
            program = build(early)
        except ParseError as exc:
            failed = exc
    files = reading.finish()
    if early is None or files.files != early.files or files.member != early.member:
        return files, build(files)
    if failed is not None:
        raise failed
    return files, program


def load_program(
    source: str | os.PathLike,
    *,
    cache: bool = True,
    fast: bool = True,
    progress: bool | None = None,
    defer_write: bool = False,
) -> Program:
    """Load a compiled program (folder, archive or single file), from the cache when possible (a program parsed is
    written there, at once, or with ``defer_write`` when :func:`caramel.cache.write_deferred` says).

    Raises :class:`~caramel.errors.ParseError` naming the file, line and column of the first
    malformed line. Validation is separate: :func:`caramel.validate.validate`.
    """
    def build(files: _Files) -> Program:
        with no_gc():
            return build_program(files, fast=fast, progress=progress)

    archive = _archive_bytes(source)
    if not cache:
        if archive is not None:
            return _load_archive(*archive, build)[1]
        return build(read_source(source))
    from caramel import cache as store

    files = read_source(source) if archive is None else None
    folder = store.cache_dir()
    usable = store.trusted_folder(folder, create=True)
    # An archive's entry is keyed by its compressed bytes (a hit decompresses nothing) and says which
    # folder of the archive the program is ("archive_folder"), for its display paths.
    source = source_digest(files) if archive is None else archive_digest(archive[2], archive[1])
    cache_file = folder / f"{_cache_key(source)}{store.SUFFIX}"
    meta = _cache_meta(source)
    t0 = time.perf_counter()
    data = store.read_entry(cache_file) if usable else None
    if data is not None:
        try:
            with no_gc():
                program, member = store.unseal(data, meta, store.MAGIC, _decode_entry)
                if archive is not None:
                    if not isinstance(member, str):
                        raise store.CacheEntryError("archive entry without its folder")
                    files = _archive_files(archive[0], member, {})
                program = store.remember(_relocate(program, files), cache_file.stem)
            logger.debug("cold path: load of %s from the load cache %.2f s", program.name, time.perf_counter() - t0)
            return program
        except store.CacheEntryError as exc:
            logger.info("rebuilding cache entry %s: %s", cache_file, exc)
    if archive is not None:
        files, program = _load_archive(*archive, build)
        meta = {**meta, "archive_folder": files.member}
    else:
        program = build(files)
    logger.debug("cold path: parse of %s (%d instructions) %.2f s", program.name, program.instruction_count,
                 time.perf_counter() - t0)
    if usable:
        def write() -> None:
            t2 = time.perf_counter()
            with no_gc():
                store.write_entry(cache_file, store.to_bytes(program, meta))  # a read-only cache is not an error
            logger.debug("cold path: load cache entry of %s written %.2f s", program.name, time.perf_counter() - t2)

        if defer_write:
            store.defer_entry(program, write)
        else:
            write()
    return store.remember(program, cache_file.stem)  # the plan cache's key (caramel.plan_cache)


def _decode_entry(arrays, header: dict):
    """(program, the entry's ``archive_folder`` or None) of a load-cache entry's tables."""
    from caramel import cache as store

    return store.decode(arrays, header), header.get("archive_folder")
