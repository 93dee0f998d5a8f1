"""The load cache: a :class:`~caramel.program.Program` as plain typed arrays, stored safely.

Nothing in an entry can execute code when it is read: an entry is NumPy arrays of integers
(:func:`caramel.infiles.npz_arrays`: no pickles, each array's size checked from its header) and
one JSON header, never a pickle. An entry larger than :data:`MAX_ENTRY_BYTES` is not read.

**Entry format** (one file ``<key>.entry``)::

    b"CARAMEL-CACHE\\0"  (14 bytes, MAGIC)
    SHA-256 of everything after it  (32 bytes)
    an uncompressed .npz: "header" (uint8, UTF-8 JSON) and the instruction tables below

The header says what the entry is the cache of: ``format`` (:data:`FORMAT_VERSION`), ``caramel``
(the version), ``source`` (the SHA-256 of the program's files, :func:`source_digest`) and
``parser`` (the fingerprint of the parser and grammar), plus the program's name, paths and
manifests (JSON). An entry whose digest, magic, header or tables do not match is *rebuilt*,
never loaded: a truncated, bit-flipped or swapped entry (another program's entry under this
name) is detected by the digest or by the header's ``source``.

**Instruction tables.** Operands (registers, BCU slots, memory names) are listed once in
``opnd`` (rows ``kind, a, b, term``: kind 0 ``VReg(a, b)``, 1 ``SReg(a, b)``, 2
``BcuSlot(a, b)``, 3 ``Mem(terms[term], a)``); the last row of the decoded table is ``None``,
so index -1 means "no operand". Tuples of operands (``srcs``, ``group``) and tuples of ints
(``out_limbs``, ``in_limbs``) are listed once each as CSR tables (``otup_off``/``otup_val``,
``itup_off``/``itup_val``). Every instruction is one row of the column arrays ``op, dst, srcs,
base, line, final, step, sync, size, unit, out, in, group``; ``base`` indexes ``bases`` (a table of
the distinct values, where index -1 means ``None``). Each array has the narrowest integer dtype
that holds it.

**Trust.** The cache folder is created with mode 0700. A folder or entry owned by another user,
or writable by the group or others, is ignored (one warning per folder per process). Entries are
written to a temporary file created exclusively in the same folder (``mkstemp``: ``O_EXCL``, no
symlink followed), then renamed over the entry (a symlink planted there is replaced, not
followed); temporary files of killed writers (dead pid, or older than :data:`STALE_SECONDS`) are
removed. Entries are opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import logging
import os
import stat
import threading
import time
from collections import defaultdict
from itertools import chain, count, repeat
from pathlib import Path
from typing import Callable

import numpy as np

from caramel.infiles import NotRegularFile, npz_arrays, open_regular, parse_json, read_package_file
from caramel.outfiles import replace_atomically
from caramel.program import (
    BcuSlot, EvalKeyId, Instruction, KeyType, Manifest, ManifestEntry, Mem, Opcode, Program, Section, SReg, Stream,
    Symbol, VReg,
)

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAGIC = b"CARAMEL-CACHE\0"
SUFFIX = ".entry"
TEMP_PREFIX = ".caramel-tmp-"
STALE_SECONDS = 600.0
#: Largest cache entry read: twice the largest set of program files caramel parses
#: (:data:`caramel.parse.MAX_ARCHIVE_BYTES`); an entry encodes the program in fewer bytes than its text.
MAX_ENTRY_BYTES = 1 << 30
_DIGEST = 32
_OPCODES = tuple(Opcode)
_OPCODE_INDEX = {op: i for i, op in enumerate(_OPCODES)}
_SECTIONS = {s.value: s for s in Section}
_KIND = {VReg: 0, SReg: 1, BcuSlot: 2, Mem: 3}
_COLUMNS = ("op", "dst", "srcs", "base", "line", "final", "step", "sync", "size", "unit", "out", "in", "group")
_warned: set[tuple[str, str]] = set()


#: Programs returned by load_program, by id: (the program, its load-cache key); the most recent few
#: (:func:`remember`, used by the plan cache, :mod:`caramel.plan_cache`).
_KNOWN: dict[int, tuple[Program, str]] = {}
KNOWN_PROGRAMS = 4


def cache_dir() -> Path:
    """The cache folder: ``$CARAMEL_CACHE``, default ``~/.cache/caramel``."""
    return Path(os.environ.get("CARAMEL_CACHE") or Path.home() / ".cache" / "caramel")


def remember(program: Program, key: str) -> Program:
    """Record that ``program`` (this object) is the program of load-cache entry ``key``, for the most
    recent :data:`KNOWN_PROGRAMS` programs (held until then); returns ``program``."""
    _KNOWN.pop(id(program), None)
    _KNOWN[id(program)] = (program, key)
    while len(_KNOWN) > KNOWN_PROGRAMS:
        _KNOWN.pop(next(iter(_KNOWN)))
    return program


_deferred: dict[int, tuple[Program, Callable[[], None]]] = {}
_deferred_lock = threading.Lock()


def defer_entry(program: Program, write: Callable[[], None]) -> None:
    """Hold ``write`` (the load-cache entry of ``program``) until :func:`write_deferred`: a first run writes it while
    its kernels compile, not before its plan."""
    with _deferred_lock:
        _deferred[id(program)] = (program, write)


def write_deferred(program: Program) -> None:
    """Write the entry that :func:`defer_entry` holds for ``program``, once: a second caller returns when the first
    one's write is done (a command's last call waits for a thread's)."""
    with _deferred_lock:
        got = _deferred.get(id(program))
        if got is not None and got[0] is program:
            try:
                got[1]()
            finally:
                del _deferred[id(program)]


def program_key(program: Program) -> str | None:
    """The load-cache key that :func:`remember` recorded for this very object, or None."""
    got = _KNOWN.get(id(program))
    return got[1] if got is not None and got[0] is program else None


class CacheEntryError(Exception):
    """An entry that must not be loaded (internal: the caller rebuilds it)."""


# ----------------------------------------------------------------------------------------------
# Program <-> arrays
# ----------------------------------------------------------------------------------------------


def _narrow(values) -> np.ndarray:
    """``values`` as the narrowest signed integer array (int8 .. int64) that holds them."""
    a = np.asarray(values, dtype=np.int64)
    if a.size == 0:
        return a.astype(np.int8)
    lo, hi = int(a.min()), int(a.max())
    for dt in (np.int8, np.int16, np.int32):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            return a.astype(dt)
    return a


def numbering() -> defaultdict:
    """A dict that numbers each new key in the order first seen (0, 1, ...): ``ids[x]`` is x's number. Mapping
    ``ids.__getitem__`` over a column numbers it in one C loop (one hash an element)."""
    return defaultdict(count().__next__)


def _numbers(ids: dict, column) -> list[int]:
    return list(map(ids.__getitem__, column))


def _operand_row(x, terms: defaultdict) -> tuple[int, int, int, int]:
    """``x``'s row of the operand table (see the module docstring)."""
    kind = _KIND[type(x)]
    if kind == 3:
        return (3, x.limb, 0, terms[x.term])
    if kind == 2:
        return (2, x.unit, x.slot, -1)
    return (kind, x.index, int(x.dead), -1)


def _offsets(rows) -> np.ndarray:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(list(map(len, rows)))
    return _narrow(offsets)


def _csr(rows) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) of integer rows: row i is ``values[offsets[i]:offsets[i + 1]]``."""
    return _offsets(rows), _narrow(list(chain.from_iterable(rows)))


def _manifest_json(m: Manifest) -> dict:
    def entry(e: ManifestEntry) -> list:
        k = e.symbol.key
        key = None if k is None else [int(k.type), k.level, k.ext, k.rot, list(k.digits)]
        return [e.section.value, e.term, e.symbol.name, e.symbol.part, key, list(e.limbs), e.line]

    return {"path": m.path, "entries": [entry(e) for e in m.entries]}


def _manifest_from(d: dict) -> Manifest:
    entries = []
    for section, term, name, part, key, limbs, line in d["entries"]:
        kid = None if key is None else EvalKeyId(KeyType(key[0]), key[1], key[2], key[3], tuple(key[4]))
        entries.append(ManifestEntry(_SECTIONS[section], term, Symbol(name, part, kid), tuple(limbs), line))
    return Manifest(d["path"], tuple(entries))


def encode(program: Program, meta: dict) -> dict[str, np.ndarray]:
    """``program`` as named integer arrays plus a JSON ``header`` (``meta`` merged into it). Column by column: an
    instruction is a named tuple, so ``zip(*instructions)`` gives the columns, and each table numbers its distinct
    values (:func:`numbering`) with None first, so that ``number - 1`` is -1 for None."""
    instructions = [ins for stream in program.streams for ins in stream.instructions]
    columns = tuple(zip(*instructions)) or ((),) * len(_COLUMNS)
    op, dst, srcs, base, line, final, step, sync, size, unit, out, in_, group = columns
    operands, otups, itups, bases, terms = numbering(), numbering(), numbering(), numbering(), numbering()
    operands[None], bases[None]  # number 0: -1 once shifted
    cols = {
        "op": _numbers(_OPCODE_INDEX, op),
        "dst": np.subtract(_numbers(operands, dst), 1),
        "srcs": _numbers(otups, srcs),
        "base": np.subtract(_numbers(bases, base), 1),
        "line": line, "final": final, "step": step, "sync": sync, "size": size, "unit": unit,
        "out": _numbers(itups, out),
        "in": _numbers(itups, in_),
        "group": _numbers(otups, group),
    }
    otup_values = np.subtract(_numbers(operands, chain.from_iterable(otups)), 1)
    operand_rows = [_operand_row(x, terms) for x in list(operands)[1:]]
    header = {
        **meta,
        "name": program.name,
        "path": program.path,
        "streams": [[s.chip, s.path] for s in program.streams],
        "lengths": [len(s.instructions) for s in program.streams],
        "terms": list(terms),
        "manifest": _manifest_json(program.manifest),
        "chip_manifests": [_manifest_json(m) for m in program.chip_manifests],
    }
    arrays = {f"c_{c}": _narrow(v) for c, v in cols.items()}
    arrays["bases"] = _narrow(list(bases)[1:])
    arrays["opnd"] = _narrow(operand_rows).reshape(len(operand_rows), 4)
    arrays["otup_off"], arrays["otup_val"] = _offsets(otups), _narrow(otup_values)
    arrays["itup_off"], arrays["itup_val"] = _csr(list(itups))
    arrays["header"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    return arrays


def _tuples(offsets: np.ndarray, values: list, table: list | None = None) -> list[tuple]:
    off = offsets.tolist()
    if table is not None:
        values = [table[v] for v in values]
    return [tuple(values[a:b]) for a, b in zip(off, off[1:])]


def decode(arrays, header: dict) -> Program:
    """The :class:`Program` of :func:`encode`'s arrays; raises on any inconsistency."""
    terms = header["terms"]
    operands: list = []
    for kind, a, b, term in arrays["opnd"].tolist():
        if kind == 0:
            operands.append(VReg(a, bool(b)))
        elif kind == 1:
            operands.append(SReg(a, bool(b)))
        elif kind == 2:
            operands.append(BcuSlot(a, b))
        elif kind == 3:
            operands.append(Mem(terms[term], a))
        else:
            raise CacheEntryError(f"unknown operand kind {kind}")
    operands.append(None)  # index -1
    otups = _tuples(arrays["otup_off"], arrays["otup_val"].tolist(), operands)
    itups = _tuples(arrays["itup_off"], arrays["itup_val"].tolist())
    bases = arrays["bases"].tolist() + [None]
    c = {name: arrays[f"c_{name}"] for name in _COLUMNS}
    n = len(c["op"])
    if any(len(v) != n for v in c.values()) or sum(header["lengths"]) != n:
        raise CacheEntryError("columns of different lengths")
    if n and (int(c["op"].min()) < 0 or int(c["dst"].min()) < -1 or int(c["base"].min()) < -1):
        raise CacheEntryError("negative index")
    columns = (
        map(_OPCODES.__getitem__, c["op"].tolist()),
        map(operands.__getitem__, c["dst"].tolist()),
        map(otups.__getitem__, c["srcs"].tolist()),
        map(bases.__getitem__, c["base"].tolist()),
        c["line"].tolist(),
        c["final"].astype(bool).tolist(),
        c["step"].tolist(),
        c["sync"].tolist(),
        c["size"].tolist(),
        c["unit"].tolist(),
        map(itups.__getitem__, c["out"].tolist()),
        map(itups.__getitem__, c["in"].tolist()),
        map(otups.__getitem__, c["group"].tolist()),
    )
    instructions = list(map(tuple.__new__, repeat(Instruction), zip(*columns)))
    streams, start = [], 0
    for (chip, path), length in zip(header["streams"], header["lengths"]):
        streams.append(Stream(chip, path, tuple(instructions[start:start + length])))
        start += length
    return Program(header["name"], header["path"], tuple(streams), _manifest_from(header["manifest"]),
                   tuple(_manifest_from(m) for m in header["chip_manifests"]))


def seal(magic: bytes, arrays: dict) -> bytes:
    """An entry's bytes: ``magic``, the SHA-256 of the body, the body (an uncompressed npz of ``arrays``)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    body = buf.getvalue()
    return magic + hashlib.sha256(body).digest() + body


def unseal(data: bytes, meta: dict, magic: bytes, decode, error: type[Exception] = None):
    """``decode(arrays, header)`` of an entry sealed by :func:`seal` with ``magic``; ``error``
    (default :class:`CacheEntryError`) if its magic, digest or header (every key of ``meta``) does
    not match, or its tables are inconsistent (whatever ``decode`` raises)."""
    error = error or CacheEntryError
    head = len(magic) + _DIGEST
    if len(data) < head or not data.startswith(magic):
        raise error(f"not a caramel entry ({magic[:-1].decode()})")
    body = memoryview(data)[head:]
    if hashlib.sha256(body).digest() != data[len(magic):head]:
        raise error("integrity digest mismatch (truncated or corrupted)")
    try:
        arrays = npz_arrays(io.BytesIO(body), max_bytes=len(body))  # seal writes it uncompressed
        header = parse_json(bytes(arrays["header"]))
        for key, want in meta.items():
            if header.get(key) != want:
                raise error(f"entry is for {key} {header.get(key)!r}, not {want!r}")
        return decode(arrays, header)
    except CacheEntryError:
        raise
    except Exception as exc:  # any malformed table: the entry is rebuilt, whatever the cause
        raise error(f"malformed entry: {type(exc).__name__}: {exc}") from None


def to_bytes(program: Program, meta: dict) -> bytes:
    """A load-cache entry's bytes (:func:`seal` with :data:`MAGIC`)."""
    return seal(MAGIC, encode(program, meta))


def from_bytes(data: bytes, meta: dict) -> Program:
    """The :class:`Program` of a load-cache entry (:func:`unseal`)."""
    return unseal(data, meta, MAGIC, decode)


# ----------------------------------------------------------------------------------------------
# The folder: ownership, permissions, atomic writes
# ----------------------------------------------------------------------------------------------


def _warn_once(where: Path, reason: str) -> None:
    key = (str(where), reason)
    if key not in _warned:
        _warned.add(key)
        logger.warning("caramel: ignoring the load cache %s: %s", where, reason)


def _untrusted(st: os.stat_result) -> str | None:
    """Why a file or folder with status ``st`` must not be trusted, or None."""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by the group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def _usable(path: Path, st: os.stat_result, is_kind, not_kind: str) -> bool:
    """Whether ``path`` (``st``: its status) is of the kind ``is_kind`` (``stat.S_ISDIR``/``S_ISREG``)
    and trusted (:func:`_untrusted`); if not, with one warning (``not_kind`` or the reason)."""
    why = not_kind if not is_kind(st.st_mode) else _untrusted(st)
    if why:
        _warn_once(path, why)
        return False
    return True


def trusted_folder(folder: Path, create: bool) -> bool:
    """True when ``folder`` is ours and nobody else can write it (created 0700 when ``create``)."""
    try:
        if create:
            folder.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(folder, 0o700)
            except FileExistsError:
                pass
        st = os.stat(folder)
    except OSError:
        return False
    return _usable(folder, st, stat.S_ISDIR, "not a folder")


def read_entry(path: Path) -> bytes | None:
    """The bytes of the entry at ``path``, or None when absent, unreadable, a symlink, not a
    regular file, larger than :data:`MAX_ENTRY_BYTES`, or not trusted (then with one warning)."""
    try:
        with open_regular(path, follow=False) as (f, st):
            why = _untrusted(st) or (f"{st.st_size} bytes, more than any entry ({MAX_ENTRY_BYTES >> 20} MiB)"
                                     if st.st_size > MAX_ENTRY_BYTES else None)
            if not why:
                data = f.read(MAX_ENTRY_BYTES + 1)
                if len(data) <= MAX_ENTRY_BYTES:
                    return data
                why = "grew while read"
        _warn_once(path, why)
    except NotRegularFile:
        _warn_once(path, "not a regular file")
    except OSError as exc:
        if exc.errno not in (errno.ENOENT,):
            _warn_once(path, f"cannot open it ({exc.strerror})")
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, another user's
    return True


def remove_stale_temps(folder: Path, now: float | None = None) -> list[str]:
    """Remove our temporary files in ``folder`` whose writer is dead or that are older than
    :data:`STALE_SECONDS`; the names removed."""
    now = time.time() if now is None else now
    removed = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(TEMP_PREFIX)]
    except OSError:
        return removed
    for name in names:
        path = folder / name
        try:
            st = os.lstat(path)
            pid = int(name[len(TEMP_PREFIX):].split("-", 1)[0])
        except (OSError, ValueError):
            continue
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            continue
        if (pid != os.getpid() and not _pid_alive(pid)) or now - st.st_mtime > STALE_SECONDS:
            try:
                os.unlink(path)
                removed.append(name)
            except OSError:
                pass
    return removed


#: Magic and suffix of a validation marker (:func:`validate_once`).
VALID_MAGIC = b"CARAMEL-VALID\0"
VALID_SUFFIX = ".valid"


def validator_fingerprint() -> str:
    """SHA-256 of the validator's source (``caramel/validate.py``, ``caramel/program.py``)."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for name in ("validate.py", "program.py"):
        h.update(name.encode() + b"\0" + hashlib.sha256(read_package_file(root / name)).digest())
    return h.hexdigest()


def validate_once(program: Program, validate) -> None:
    """``validate(program)`` (which raises for an invalid program), skipped when a marker in the cache
    folder says that this program passed this validator before: a program that
    :func:`caramel.parse.load_program` returned (its load-cache key, :func:`program_key`, covers its
    files and the parser) and the same :func:`validator_fingerprint` and caramel version. Only a pass
    is recorded (a sealed entry ``<digest>.valid`` holding just that header, the load cache's trust:
    :func:`read_entry`, :func:`write_entry`); a failure is found again, with its messages, each time."""
    from caramel.version import __version__

    key = program_key(program)
    if key is None:
        validate(program)
        return
    meta = {"program": key, "validator": validator_fingerprint(), "caramel": __version__}
    folder = cache_dir()
    usable = trusted_folder(folder, create=True)
    path = folder / (hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest() + VALID_SUFFIX)
    data = read_entry(path) if usable else None
    if data is not None:
        try:
            unseal(data, meta, VALID_MAGIC, lambda arrays, header: None)
            return
        except CacheEntryError as exc:
            logger.info("ignoring validation marker %s: %s", path, exc)
    validate(program)
    if usable:
        write_entry(path, seal(VALID_MAGIC, {"header": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)}))


def write_entry(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` atomically (:func:`caramel.outfiles.replace_atomically`: a fresh
    temporary file of mode 0600 named for :func:`remove_stale_temps`, then ``os.replace``). False
    when the folder cannot be written."""
    folder = path.parent
    remove_stale_temps(folder)
    try:
        replace_atomically(path, data, mode=0o600, prefix=f"{TEMP_PREFIX}{os.getpid()}-", suffix=".part")
        return True
    except OSError:
        return False
