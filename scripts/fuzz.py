"""Mutation fuzzer for caramel's loader and validator (issue "Hardening").

Takes real programs of the shared corpus, applies one or more random mutations to their files
(opcodes, operands, lines, numbers, bytes, manifests), writes the mutant to a temporary folder, then
runs ``load_program(folder, cache=False)`` and ``validate(program)``.

Property: every mutant either loads and validates, or fails with a :class:`~caramel.errors.CaramelError`
whose message names the file (and a line, for errors located in a program file). Anything else is a
failure: another exception type, a message without its file, a case over the time bound, or a
``MemoryError`` under the address-space limit. Each failure is printed with its reproducer
(``--seed S --case N`` replays it and ``--keep DIR`` writes the mutant).

    PYTHONPATH=. python scripts/fuzz.py --cases 20000       # (or with caramel installed)
    PYTHONPATH=. python scripts/fuzz.py --seconds 600 --seed 7
    PYTHONPATH=. python scripts/fuzz.py --seed 7 --case 1234 --keep /tmp/mutant   # replay one case

``tests/test_fuzz.py`` imports this file (one copy of the machinery) for a bounded CI run.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from caramel.errors import CaramelError, LocatedError, ParseError, ValidationError
from caramel.parse import load_program
from caramel.validate import validate

#: Programs larger than this (bytes, all files) are left out: small ones give many more cases per second.
MAX_PROGRAM_BYTES = 64 * 1024
TIME_BOUND_S = 5.0

OPCODES = ("load", "evg", "loas", "store", "spill", "add", "sub", "mul", "mup", "ads", "sus", "mus", "neg",
           "mov", "con", "int", "rot", "ntt", "sud", "bci", "pl1", "bcw", "rsi", "rsv", "mod", "dis", "rcv",
           "joi", "rec", "snd")
HUGE = (10**30, 2**64, 2**63, 2**62, 2**62 + 1, 2**31, 2**32 - 1, 10**18, 10**19, 64, 65, 63, 0xFFFF, 0x10000,
        10**4000)
OPERANDS = ("r0", "r1", "r0[X]", "s0", "s1[X]", "b0{0}", "b1{99}", "i1(3)", "k0(0)", "t9(63)", "v7(64)", "B0",
            "B99", "[0,1]", "[1,0]", "[]", "{r0, r1}", "{}", "@", "| 3", ":", ",", "{F}", "[X]", "-1", "")
PROGRAM_FILE = re.compile(r"(instructions|inputs)\d+|program_inputs")


# ----------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------


def corpus_programs(root: Path, max_bytes: int = MAX_PROGRAM_BYTES) -> list[dict[str, bytes]]:
    """The files (name -> bytes) of every corpus program folder of at most ``max_bytes``."""
    out = []
    for folder in sorted(p for p in Path(root).glob("*") if p.is_dir()):
        files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and PROGRAM_FILE.fullmatch(p.name)}
        if files and any(n.startswith("instructions") for n in files) and sum(map(len, files.values())) <= max_bytes:
            out.append(files)
    return out


# ----------------------------------------------------------------------------------------------
# Mutations: each takes (rng, files) and changes files in place, returning a short description
# ----------------------------------------------------------------------------------------------


def _pick(rng: random.Random, files: dict[str, bytes], prefer: str | None = None) -> str:
    names = sorted(files)
    if prefer:
        chosen = [n for n in names if n.startswith(prefer)]
        names = chosen or names
    return rng.choice(names)


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _join(lines: list[bytes]) -> bytes:
    return b"\n".join(lines)


def _line_index(rng: random.Random, lines: list[bytes]) -> int:
    return rng.randrange(len(lines)) if lines else 0


def _numbers(line: bytes) -> list[re.Match]:
    return list(re.finditer(rb"\d+", line))


def _sub_number(line: bytes, rng: random.Random, value) -> bytes:
    nums = _numbers(line)
    if not nums:
        return line + b" " + str(value).encode()
    m = rng.choice(nums)
    return line[: m.start()] + str(value).encode() + line[m.end():]


def m_replace_opcode(rng, files):
    name = _pick(rng, files, "instructions")
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    op = rng.choice(OPCODES + ("xyz", "LOAD", "", "load load"))
    parts = lines[i].split(b" ", 1)
    lines[i] = op.encode() + (b" " + parts[1] if len(parts) > 1 else b"")
    files[name] = _join(lines)
    return f"{name}:{i + 1} opcode -> {op!r}"


def m_swap_operands(rng, files):
    name = _pick(rng, files, "instructions")
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    toks = re.split(rb"([ ,:{}\[\]|()@]+)", lines[i])
    words = [k for k in range(len(toks)) if k % 2 == 0 and toks[k]]
    if len(words) >= 2:
        a, b = rng.sample(words, 2)
        toks[a], toks[b] = toks[b], toks[a]
    lines[i] = b"".join(toks)
    files[name] = _join(lines)
    return f"{name}:{i + 1} swap operands"


def m_replace_operand(rng, files):
    name = _pick(rng, files, "instructions")
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    toks = re.split(rb"([ ,:|@]+)", lines[i])
    words = [k for k in range(len(toks)) if k % 2 == 0 and toks[k]]
    if words:
        k = rng.choice(words)
        toks[k] = rng.choice(OPERANDS).encode()
    lines[i] = b"".join(toks)
    files[name] = _join(lines)
    return f"{name}:{i + 1} replace operand"


def m_delete_line(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if lines:
        del lines[i]
    files[name] = _join(lines)
    return f"{name}:{i + 1} delete line"


def m_duplicate_line(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if lines:
        lines.insert(rng.randrange(len(lines) + 1), lines[i])
    files[name] = _join(lines)
    return f"{name}:{i + 1} duplicate line"


def m_duplicate_sync(rng, files):
    """Give a communication instruction the sync id of another one (or duplicate it on another chip)."""
    comm = [(n, k) for n in sorted(files) if n.startswith("instructions")
            for k, line in enumerate(_lines(files[n])) if re.match(rb"(dis|rcv|joi) @ ", line)]
    if len(comm) < 1:
        return m_duplicate_line(rng, files)
    (n1, k1), (n2, k2) = rng.choice(comm), rng.choice(comm)
    src = re.match(rb"\w+ @ (\d+):", _lines(files[n1])[k1]).group(1)
    lines = _lines(files[n2])
    lines[k2] = re.sub(rb"@ \d+:", b"@ " + src + b":", lines[k2], count=1)
    if rng.random() < 0.5:
        lines.insert(rng.randrange(1, len(lines) + 1), lines[k2])
    files[n2] = _join(lines)
    return f"{n2}:{k2 + 1} sync id -> {src.decode()} (from {n1}:{k1 + 1})"


def m_change_size(rng, files):
    comm = [(n, k) for n in sorted(files) if n.startswith("instructions")
            for k, line in enumerate(_lines(files[n])) if re.match(rb"(dis|rcv|joi) @ ", line)]
    if not comm:
        return m_number(rng, files)
    n, k = rng.choice(comm)
    size = rng.choice((0, 1, 2, 3, 7, 8, 9, 100, 2**40, 10**30))
    lines = _lines(files[n])
    lines[k] = re.sub(rb"@ (\d+):\d+", lambda m: b"@ " + m.group(1) + b":" + str(size).encode(), lines[k], count=1)
    files[n] = _join(lines)
    return f"{n}:{k + 1} size -> {size}"


def m_number(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    value = rng.choice((rng.randrange(0, 70), rng.randrange(0, 1 << 20), rng.choice(HUGE)))
    lines[i] = _sub_number(lines[i], rng, value)
    files[name] = _join(lines)
    return f"{name}:{i + 1} number -> {str(value)[:30]}"


def m_huge_number(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    value = rng.choice(HUGE)
    lines[i] = _sub_number(lines[i], rng, value)
    files[name] = _join(lines)
    return f"{name}:{i + 1} huge number -> {str(value)[:30]}"


def m_digit_run(rng, files):
    """Replace a number with a run of digits longer than Python's int/str conversion limit (4300)."""
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    n = rng.choice((19, 20, 40, 4300, 4301, 5000, 20000))
    nums = _numbers(lines[i])
    if nums:
        m = rng.choice(nums)
        lines[i] = lines[i][: m.start()] + b"9" * n + lines[i][m.end():]
    files[name] = _join(lines)
    return f"{name}:{i + 1} number -> {n} digits"


def m_negative_number(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    nums = _numbers(lines[i])
    if nums:
        m = rng.choice(nums)
        lines[i] = lines[i][: m.start()] + b"-" + lines[i][m.start():]
    files[name] = _join(lines)
    return f"{name}:{i + 1} negate a number"


def m_random_bytes(rng, files):
    name = _pick(rng, files)
    data = bytearray(files[name])
    n = rng.randrange(1, 9)
    for _ in range(n):
        pos = rng.randrange(len(data) + 1)
        data[pos:pos + rng.randrange(0, 2)] = bytes([rng.randrange(256)])
    files[name] = bytes(data)
    return f"{name}: {n} random byte(s)"


def m_random_ascii(rng, files):
    name = _pick(rng, files)
    data = bytearray(files[name])
    n = rng.randrange(1, 6)
    alphabet = b"0123456789 ,:;|@{}[]()rsbBXFikpvt-\n\t\r#"
    for _ in range(n):
        pos = rng.randrange(len(data) + 1)
        data[pos:pos + rng.randrange(0, 2)] = bytes([rng.choice(alphabet)])
    files[name] = bytes(data)
    return f"{name}: {n} random ascii char(s)"


def m_non_utf8(rng, files):
    name = _pick(rng, files)
    data = files[name]
    pos = rng.randrange(len(data) + 1)
    bad = rng.choice((b"\xff", b"\xc3", b"\xe2\x82", b"\x80", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"))
    files[name] = data[:pos] + bad + data[pos:]
    return f"{name}@{pos}: non-UTF-8 {bad!r}"


def m_nul(rng, files):
    name = _pick(rng, files)
    data = files[name]
    pos = rng.randrange(len(data) + 1)
    files[name] = data[:pos] + b"\x00" + data[pos:]
    return f"{name}@{pos}: NUL byte"


def m_unicode(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    junk = rng.choice(("\u00a0", "\u2028", "\u0660", "\uff11", "\U0001f600", "\r", "\x0b", "\x85", "\ufeff", "ß"))
    pos = rng.randrange(len(lines[i]) + 1)
    lines[i] = lines[i][:pos] + junk.encode() + lines[i][pos:]
    files[name] = _join(lines)
    return f"{name}:{i + 1} unicode {junk!r}"


def m_truncate(rng, files):
    name = _pick(rng, files)
    data = files[name]
    pos = rng.randrange(len(data) + 1)
    files[name] = data[:pos]
    return f"{name}: truncate at byte {pos} of {len(data)}"


def m_empty_file(rng, files):
    name = _pick(rng, files)
    files[name] = rng.choice((b"", b"\n", b"\n\n", b" "))
    return f"{name}: emptied"


def m_delete_file(rng, files):
    name = _pick(rng, files)
    del files[name]
    if not files:
        files["instructions0"] = b""
    return f"delete {name}"


def m_rename_file(rng, files):
    name = _pick(rng, files)
    new = rng.choice(("instructions", "inputs")) + str(rng.choice((0, 1, 2, 3, 7, 8, 9, 10, 99)))
    files[new] = files.pop(name)
    return f"rename {name} -> {new}"


def m_shuffle(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    if rng.random() < 0.5:
        body = lines[1:]
        rng.shuffle(body)
        lines = lines[:1] + body
    else:
        rng.shuffle(lines)
    files[name] = _join(lines)
    return f"{name}: shuffle lines"


def m_swap_adjacent(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    if len(lines) >= 2:
        i = rng.randrange(len(lines) - 1)
        lines[i], lines[i + 1] = lines[i + 1], lines[i]
        files[name] = _join(lines)
        return f"{name}:{i + 1} swap with next line"
    return f"{name}: too short to swap"


def m_cross_file_line(rng, files):
    """Copy a line of one file into another (instruction into manifest and vice versa)."""
    a, b = _pick(rng, files), _pick(rng, files)
    la, lb = _lines(files[a]), _lines(files[b])
    if not la:
        return f"{a}: empty"
    k = _line_index(rng, la)
    lb.insert(rng.randrange(len(lb) + 1), la[k])
    files[b] = _join(lb)
    return f"copy {a}:{k + 1} into {b}"


def m_manifest(rng, files):
    names = [n for n in sorted(files) if not n.startswith("instructions")]
    if not names:
        return m_random_ascii(rng, files)
    name = rng.choice(names)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    choice = rng.randrange(9)
    line = lines[i]
    if choice == 0:
        lines[i] = line.replace(b" | ", b"|", 1)
    elif choice == 1:
        lines[i] = re.sub(rb"\[[\d,]*\]", rng.choice((b"[]", b"[1,1]", b"[3,1]", b"[64]", b"[99999999999999999999]",
                                                      b"[-1]", b"[0,,1]")), line, count=1)
    elif choice == 2:
        lines[i] = rng.choice((b"K:9:0:0:0:c0:[0]", b"K:0:0:0:0:c2:[0]", b"x:c3", b"1x:c0", b"K:0:1:2:-99999999999:c1:[1]",
                               b"K:99999999999999999999999:0:0:0:c0:[0]", b"K:0:0:0:0:c0:[]", b"x.y:p", b":s"))
        lines[i] = (b"k1 | " if rng.random() < 0.5 else b"i1 | ") + lines[i] + b" | [0,1]"
    elif choice == 3:
        lines[i] = rng.choice((b"Input Stream:", b"Output Stream:", b"Ciphertext Stream:", b"Plaintext Stream:",
                               b"Scalar Stream:", b"Evalkey Stream:", b";", b"Bogus Stream:", b";;", b""))
    elif choice == 4:
        lines[i] = re.sub(rb"^[a-z]", rng.choice((b"k", b"i", b"v", b"x", b"K", b"")), line, count=1)
    elif choice == 5:
        lines.insert(i, b";")
    elif choice == 6:
        lines[i] = line.replace(b":", b"", 1)
    elif choice == 7:
        lines[i] = line + rng.choice((b" ", b" | x", b"|", b" ;"))
    else:
        lines[i] = re.sub(rb"[A-Za-z_][\w.]*:(c0|c1|p|s)", rng.choice((b"y:c0", b"K:0:1:2:3:c0:[1,2]", b"z z:p")),
                          line, count=1)
    files[name] = _join(lines)
    return f"{name}:{i + 1} manifest mutation {choice}"


def m_header(rng, files):
    name = _pick(rng, files, "instructions")
    lines = _lines(files[name])
    if lines:
        lines[0] = rng.choice((b"Instruction Stream 0:", b"Instruction Stream 1:", b"Instruction Stream 99999999999999999999999:",
                               b"Instruction Stream -1:", b"Instruction Stream :", b"Instruction Stream 0", b"",
                               b"Instruction Stream \xd9\xa1:", b"Instruction Stream 00:"))
    files[name] = _join(lines)
    return f"{name}:1 header mutation"


def m_long_line(rng, files):
    name = _pick(rng, files)
    lines = _lines(files[name])
    i = _line_index(rng, lines)
    if not lines:
        return f"{name}: empty"
    what = rng.choice((b"r1, ", b"0,", b"{", b"[", b"9", b"a"))
    lines[i] = lines[i] + what * rng.choice((100, 1000, 20000))
    files[name] = _join(lines)
    return f"{name}:{i + 1} long line of {what!r}"


MUTATIONS = [
    m_replace_opcode, m_swap_operands, m_replace_operand, m_delete_line, m_duplicate_line, m_duplicate_sync,
    m_change_size, m_number, m_huge_number, m_digit_run, m_negative_number, m_random_bytes, m_random_ascii, m_non_utf8, m_nul,
    m_unicode, m_truncate, m_empty_file, m_delete_file, m_rename_file, m_shuffle, m_swap_adjacent,
    m_cross_file_line, m_manifest, m_header, m_long_line,
]


# ----------------------------------------------------------------------------------------------
# One case
# ----------------------------------------------------------------------------------------------


@dataclass
class Case:
    """A mutant: its seed and case number (the reproducer), the mutations applied, the files."""

    seed: int
    index: int
    program: int
    mutations: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)

    def reproducer(self) -> str:
        return (f"python scripts/fuzz.py --seed {self.seed} --case {self.index} --keep /tmp/mutant  "
                f"# program #{self.program}: {'; '.join(self.mutations)}")


def make_case(programs: list[dict[str, bytes]], seed: int, index: int) -> Case:
    """The ``index``-th mutant of run ``seed``: deterministic, so any case can be replayed alone."""
    rng = random.Random(f"{seed}:{index}")
    k = rng.randrange(len(programs))
    case = Case(seed, index, k, files=dict(programs[k]))
    for _ in range(1 + int(rng.expovariate(1.0))):
        mutation = rng.choice(MUTATIONS)
        case.mutations.append(f"{mutation.__name__}({mutation(rng, case.files)})")
    return case


class _Timeout(BaseException):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _message_problem(err: LocatedError, folder: str) -> str | None:
    """Why ``err`` does not locate its problem well enough, or None."""
    loc = err.location
    text = str(err)
    if not loc.path or loc.path not in text:
        return f"message does not name a file: {text[:200]!r}"
    if not loc.path.startswith(folder):
        return f"names {loc.path!r}, not a file of the mutant folder: {text[:200]!r}"
    name = Path(loc.path).name
    if PROGRAM_FILE.fullmatch(name):
        if loc.line < 1:
            return f"error in {name} without a line: {text[:200]!r}"
    elif loc.path != folder:
        return f"names {loc.path!r}, neither the folder nor a program file: {text[:200]!r}"
    return None


def run_case(case: Case, workdir: Path, time_bound: float = TIME_BOUND_S) -> tuple[str, str]:
    """Write, load and validate one mutant. Returns (outcome, detail); outcome is one of
    ``valid``, ``parse``, ``validation``, ``failure``."""
    folder = workdir / f"case{case.index}"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, data in case.files.items():
        (folder / name).write_bytes(data)
    fs = str(folder)
    use_alarm = hasattr(signal, "SIGALRM")
    old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None
    if use_alarm:
        signal.setitimer(signal.ITIMER_REAL, time_bound * 2)
    start = time.perf_counter()
    try:
        try:
            program = load_program(folder, cache=False)
            stage = "validate"
            validate(program)
            outcome, detail = "valid", ""
        except ParseError as err:
            bad = _message_problem(err, fs)
            outcome, detail = ("failure", bad) if bad else ("parse", str(err))
        except ValidationError as err:
            bad = None
            if not err.problems:
                bad = "ValidationError with no problems"
            for p in err.problems:
                if not isinstance(p, LocatedError):
                    bad = f"problem is not a LocatedError: {p!r}"
                else:
                    bad = bad or _message_problem(p, fs)
            outcome, detail = ("failure", bad) if bad else ("validation", str(err).split("\n")[1][:200])
        except LocatedError as err:
            bad = _message_problem(err, fs)
            outcome, detail = ("failure", bad) if bad else ("parse", str(err))
        except CaramelError as err:
            outcome, detail = ("failure", f"{type(err).__name__} without a location: {err}"[:300]) \
                if fs not in str(err) else ("parse", str(err))
        except _Timeout:
            raise
        except MemoryError:
            outcome, detail = "failure", "MemoryError"
        except RecursionError:
            outcome, detail = "failure", "RecursionError"
        except Exception as err:  # noqa: BLE001 - the property under test
            import traceback

            tb = traceback.extract_tb(err.__traceback__)[-1]
            outcome, detail = "failure", f"{type(err).__name__}: {str(err)[:200]} at {tb.filename}:{tb.lineno}"
    except _Timeout:
        outcome, detail = "failure", f"timeout: over {time_bound * 2:.0f} s"
    finally:
        if use_alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
    elapsed = time.perf_counter() - start
    if outcome != "failure" and elapsed > time_bound:
        outcome, detail = "failure", f"slow: {elapsed:.1f} s (bound {time_bound} s)"
    shutil.rmtree(folder, ignore_errors=True)
    return outcome, detail


@dataclass
class Summary:
    cases: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {"valid": 0, "parse": 0, "validation": 0, "failure": 0})
    failures: list[tuple[Case, str]] = field(default_factory=list)
    seconds: float = 0.0

    def text(self) -> str:
        o = self.outcomes
        return (f"{self.cases} cases in {self.seconds:.1f} s: loaded+valid {o['valid']}, parse error {o['parse']}, "
                f"validation error {o['validation']}, failures {o['failure']}")


def fuzz(programs: list[dict[str, bytes]], *, seed: int, cases: int | None = None, seconds: float | None = None,
         workdir: Path | None = None, time_bound: float = TIME_BOUND_S, verbose: bool = False,
         start: int = 0) -> Summary:
    """Run cases ``start, start+1, ...`` until ``cases`` are done or ``seconds`` have passed."""
    if not programs:
        raise ValueError("no corpus programs to mutate")
    summary = Summary()
    t0 = time.perf_counter()
    own = workdir is None
    work = Path(tempfile.mkdtemp(prefix="caramel-fuzz-")) if own else Path(workdir)
    try:
        index = start
        while (cases is None or summary.cases < cases) and (seconds is None or time.perf_counter() - t0 < seconds):
            case = make_case(programs, seed, index)
            outcome, detail = run_case(case, work, time_bound)
            summary.cases += 1
            summary.outcomes[outcome] += 1
            if outcome == "failure":
                summary.failures.append((case, detail))
                print(f"FAILURE case {index}: {detail}\n  reproduce: {case.reproducer()}", flush=True)
            elif verbose:
                print(f"case {index} {outcome}: {detail[:160]}")
            index += 1
    finally:
        if own:
            shutil.rmtree(work, ignore_errors=True)
    summary.seconds = time.perf_counter() - t0
    return summary


def main(argv=None) -> int:
    # the compiled corpus beside the checkout, where the tests find it
    shared = Path(os.environ.get("CARAMEL_SHARED_PROGRAMS",
                                 Path(__file__).resolve().parents[2] / "shared" / "programs"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=None, help="number of cases (default 1000 unless --seconds)")
    ap.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--case", type=int, default=None, help="replay this one case of --seed")
    ap.add_argument("--keep", type=Path, default=None, help="with --case: write the mutant into this folder")
    ap.add_argument("--corpus", type=Path, default=shared)
    ap.add_argument("--max-bytes", type=int, default=MAX_PROGRAM_BYTES, help="largest corpus program to mutate")
    ap.add_argument("--time-bound", type=float, default=TIME_BOUND_S, help="seconds one case may take")
    ap.add_argument("--memory-gb", type=float, default=4.0, help="address-space limit (MemoryError is a failure)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)

    try:
        import resource

        limit = int(args.memory_gb * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    except (ImportError, ValueError, OSError):
        pass
    programs = corpus_programs(args.corpus, args.max_bytes)
    if not programs:
        print(f"no corpus programs under {args.corpus}", file=sys.stderr)
        return 2
    if args.case is not None:
        case = make_case(programs, args.seed, args.case)
        print(case.reproducer())
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for name, data in case.files.items():
                (args.keep / name).write_bytes(data)
            print(f"mutant written to {args.keep}")
        outcome, detail = run_case(case, Path(tempfile.mkdtemp(prefix="caramel-fuzz-")), args.time_bound)
        print(f"{outcome}: {detail}")
        return 1 if outcome == "failure" else 0
    cases = args.cases if args.cases is not None or args.seconds is not None else 1000
    print(f"fuzzing {len(programs)} corpus programs (<= {args.max_bytes} bytes), seed {args.seed}", flush=True)
    summary = fuzz(programs, seed=args.seed, cases=cases, seconds=args.seconds, time_bound=args.time_bound,
                   verbose=args.verbose)
    print(summary.text())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
