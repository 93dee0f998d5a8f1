"""Tests of caramel.parse: round trips on corpus lines, exact errors on malformed input, archives, the cache."""

from __future__ import annotations

import os
import shutil
import tarfile
import threading
from pathlib import Path

import pytest

import caramel.parse
from caramel.errors import ParseError
from caramel.parse import load_program, parse_instruction, parse_manifest
from caramel.program import BcuSlot, Instruction, Mem, Opcode, Section, SReg, VReg

from tests.conftest import SYNTAX_FORMS, SHARED_PROGRAMS, corpus, shared

CORPUS = corpus()
# Lark round trips are ~60 us a line: every line of these programs (all opcodes, 1-8 chips).
ROUND_TRIP = [p for p in CORPUS if "_4L_" in p.name or p.name in ("BootstrapLike_20L_2c", "BootstrapModRaise_10L_4c")]
ADD = SHARED_PROGRAMS / "Add_4L_2c"

needs_corpus = pytest.mark.skipif(not ADD.is_dir(), reason="shared corpus not found")


def copy_program(tmp_path: Path, name: str = "Add_4L_2c") -> Path:
    target = tmp_path / name
    shutil.copytree(shared(name), target)
    for f in target.iterdir():
        f.chmod(0o644)
    target.chmod(0o755)
    return target


def replace(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data, f"{old!r} not in {path}"
    path.write_bytes(data.replace(old, new, 1))


def load_error(source) -> ParseError:
    with pytest.raises(ParseError) as info:
        load_program(source, cache=False)
    return info.value


# ------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_text_reproduces_every_corpus_line(path):
    program = load_program(path)
    for stream in program.streams:
        lines = Path(stream.path).read_text().split("\n")
        for ins in stream.instructions:
            assert ins.text() == lines[ins.line - 1], f"{stream.path}:{ins.line}"


@pytest.mark.parametrize("path", ROUND_TRIP, ids=lambda p: p.name)
def test_parse_of_text_round_trips(path):
    program = load_program(path)
    for stream in program.streams:
        for ins in stream.instructions:
            assert parse_instruction(ins.text(), stream.path, ins.line) == ins, f"{stream.path}:{ins.line}"


def test_round_trip_of_every_syntax_form():
    forms = SYNTAX_FORMS
    for text in forms:
        ins = parse_instruction(text)
        assert ins.text() == text
        assert parse_instruction(ins.text()) == ins


def test_lark_path_reads_unmarked_registers_and_loads_without_final():
    assert parse_instruction("pl1 B0: r2 | 4", line=7) == Instruction(
        Opcode.PL1, srcs=(VReg(2),), unit=0, base=4, line=7
    )
    assert parse_instruction("load r1: i2(3)") == Instruction(Opcode.LOAD, dst=VReg(1), srcs=(Mem("i2", 3),), line=1)
    assert parse_instruction("sud r1: r2, b1{0} | 0").srcs == (VReg(2), BcuSlot(1, 0))
    assert parse_instruction("mus r1: r2, s3[X] | 0").srcs == (VReg(2), SReg(3, True))


# ------------------------------------------------------------------------------------ malformed instruction files


@needs_corpus
def test_corrupted_opcode(tmp_path):
    d = copy_program(tmp_path)
    replace(d / "instructions0", b"add r5: r3[X], r4 | 0", b"adx r5: r3[X], r4 | 0")
    err = load_error(d)
    assert str(err) == f"{d}/instructions0:7:1: unknown opcode 'adx' in 'adx r5: r3[X], r4 | 0'"
    assert (err.location.path, err.location.line) == (f"{d}/instructions0", 7)


@needs_corpus
def test_missing_operand(tmp_path):
    d = copy_program(tmp_path)
    replace(d / "instructions0", b"add r5: r3[X], r4 | 0", b"add r5: r3[X] | 0")
    assert str(load_error(d)) == (
        f"{d}/instructions0:7:14: malformed add instruction 'add r5: r3[X] | 0' (expected ', ')"
    )


@needs_corpus
def test_truncated_file(tmp_path):
    d = copy_program(tmp_path)
    data = (d / "instructions1").read_bytes()
    (d / "instructions1").write_bytes(data[:-5])  # "store r15[X]: v8(1)\n" -> "store r15[X]: v"
    assert str(load_error(d)) == (
        f"{d}/instructions1:21:15: malformed store instruction 'store r15[X]: v' (expected MEM) "
        "(the file ends mid-line: truncated?)"
    )


@needs_corpus
def test_empty_file(tmp_path):
    d = copy_program(tmp_path)
    (d / "instructions1").write_bytes(b"")
    assert str(load_error(d)) == f"{d}/instructions1:1: empty instruction file (expected 'Instruction Stream <p>:')"


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    err = load_error(tmp_path / "empty")
    assert str(err) == f"{tmp_path}/empty: no 'instructions<p>' files in this folder: not a compiled program"


def test_missing_path(tmp_path):
    assert str(load_error(tmp_path / "nope")) == f"{tmp_path}/nope: no such file or folder"


@needs_corpus
def test_binary_junk_invalid_utf8(tmp_path):
    d = copy_program(tmp_path)
    replace(d / "instructions0", b"add r5", b"add \xff5")
    assert str(load_error(d)) == f"{d}/instructions0:7:5: not a text file (invalid UTF-8 byte)"


@needs_corpus
def test_binary_junk_nul_bytes(tmp_path):
    d = copy_program(tmp_path)
    replace(d / "instructions0", b"add r5", b"add \x005")
    assert str(load_error(d)) == f"{d}/instructions0:7: not a text file (NUL byte)"


def test_binary_file(tmp_path):
    f = tmp_path / "instructions0"
    f.write_bytes(bytes(range(256)) * 4)  # byte 0x80 is column 118 of line 2 (after the 0x0a at offset 10)
    assert str(load_error(f)) == f"{f}:2:118: not a text file (invalid UTF-8 byte)"


@needs_corpus
def test_wrong_header(tmp_path):
    d = copy_program(tmp_path)
    replace(d / "instructions1", b"Instruction Stream 1:", b"Instruction stream 1:")
    assert str(load_error(d)) == (
        f"{d}/instructions1:1: expected header 'Instruction Stream 1:', found 'Instruction stream 1:'"
    )


@needs_corpus
def test_header_names_another_stream(tmp_path):
    d = copy_program(tmp_path)
    replace(d / "instructions1", b"Instruction Stream 1:", b"Instruction Stream 0:")
    assert str(load_error(d)) == f"{d}/instructions1:1: header names stream 0 but the file is stream 1"


@needs_corpus
def test_stream_numbers_must_be_contiguous(tmp_path):
    d = copy_program(tmp_path)
    (d / "instructions1").rename(d / "instructions3")
    assert str(load_error(d)) == f"{d}: instruction files must be numbered 0..K-1, found [0, 3]"


def test_single_file_errors_name_the_file(tmp_path):
    f = tmp_path / "relin.isa"
    f.write_text("Instruction Stream 0:\nload r0: i1(0)\nneg r1: r0 |\n")
    err = load_error(f)
    assert (err.location.path, err.location.line, err.location.column) == (str(f), 3, 11)


# ------------------------------------------------------------------------------------ manifests


@needs_corpus
@pytest.mark.parametrize(
    "file, old, new, message",
    [
        ("program_inputs", b"Plaintext Stream:", b"Plaintext:",
         "program_inputs:7: expected section header 'Plaintext Stream:', found 'Plaintext:'"),
        ("program_inputs", b"i2 | x:c1 | [0,1,2,3]", b"i2 | x:c1 | [0,1,2,3",
         "program_inputs:3:20: malformed manifest line 'i2 | x:c1 | [0,1,2,3'"),
        ("program_inputs", b"i2 | x:c1 |", b"i2 | x:c7 |",
         "program_inputs:3: malformed symbol 'x:c7' (expected name:c0|c1|p|s or K:type:level:E:rot:c<h>:[digits])"),
        ("program_inputs", b"i2 | x:c1 |", b"k2 | x:c1 |",
         "program_inputs:3: term 'k2' does not belong in the Ciphertext section"),
        ("program_inputs", b"Evalkey Stream:\n;\n", b"Evalkey Stream:\n",
         "program_inputs:16: manifest ends early: section 'Evalkey' is not closed by ';' (truncated?)"),
        ("program_inputs", b"Evalkey Stream:\n;\n", b"Evalkey Stream:\n;\nMore Stream:\n",
         "program_inputs:17: unexpected text after the last section: 'More Stream:'"),
        ("inputs1", b"Output Stream:", b"Outputs Stream:",
         "inputs1:7: expected section header 'Output Stream:', found 'Outputs Stream:'"),
    ],
    ids=["section-header", "unclosed-list", "symbol", "key-term", "truncated", "trailing", "chip-manifest"],
)  # fmt: skip
def test_manifest_errors(tmp_path, file, old, new, message):
    d = copy_program(tmp_path)
    replace(d / file, old, new)
    assert str(load_error(d)) == f"{d}/{message}"


def test_manifest_entries_and_key_symbols():
    text = (
        "Ciphertext Stream:\ni1 | x:c0 | [0,1]\n;\nPlaintext Stream:\n;\nScalar Stream:\ns3 | a:s | [0]\n;\n"
        "Output Stream:\nv4 | z:c1 | [0,1]\n;\nEvalkey Stream:\nk5 | K:1:2:2:-3:c1:[0,1] | [0,1,62,63]\n;\n"
    )
    m = parse_manifest(text, "program_inputs")
    assert [(e.section, e.term, e.limbs, e.line) for e in m.entries] == [
        (Section.CIPHERTEXT, "i1", (0, 1), 2),
        (Section.SCALAR, "s3", (0,), 7),
        (Section.OUTPUT, "v4", (0, 1), 10),
        (Section.EVALKEY, "k5", (0, 1, 62, 63), 13),
    ]
    key = m.entries[-1].symbol
    assert str(key) == "K:1:2:2:-3:c1:[0,1]" and key.key.rot == -3 and key.key.limbs() == (0, 1, 62, 63)


# ------------------------------------------------------------------------------------ archives


@needs_corpus
def test_archive_with_several_programs_needs_a_member(tmp_path):
    archive = tmp_path / "two.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        tar.add(SHARED_PROGRAMS / "Add_4L_2c", arcname="Add_4L_2c")
        tar.add(SHARED_PROGRAMS / "Add_4L_1c", arcname="Add_4L_1c")
    assert str(load_error(archive)) == (
        f"{archive}: archive holds several programs; pick one with '{archive}#NAME' (Add_4L_1c, Add_4L_2c)"
    )
    assert str(load_error(f"{archive}#Nope")) == f"{archive}: archive has no program named 'Nope'"
    program = load_program(f"{archive}#Add_4L_2c", cache=False)
    assert program.name == "Add_4L_2c" and program.chips == 2
    assert program.streams[1].path == f"{archive}#Add_4L_2c/instructions1"
    folder = load_program(SHARED_PROGRAMS / "Add_4L_2c", cache=False)
    assert [s.instructions for s in program.streams] == [s.instructions for s in folder.streams]


def _streams(program):
    """What a program is, whatever path it was read from: its streams' instructions and its manifest's entries."""
    return [s.instructions for s in program.streams], program.manifest.entries


@needs_corpus
def test_a_program_split_across_an_archive_is_read_whole(tmp_path, fresh_cache):
    """A program whose files are not together in the archive (another program's between them) is built from all of
    them: the files before the other program's (read early, without the manifests) are not the program."""
    archive = tmp_path / "split.tar.xz"
    first, rest = ["instructions0", "instructions1"], ["program_inputs", "inputs0", "inputs1"]
    with tarfile.open(archive, "w:xz") as tar:
        for name in first:
            tar.add(shared("Add_4L_2c") / name, arcname=f"Add_4L_2c/{name}")
        tar.add(shared("Mul_4L_1c"), arcname="Mul_4L_1c")
        for name in rest:
            tar.add(shared("Add_4L_2c") / name, arcname=f"Add_4L_2c/{name}")
    for cache in (False, True):
        program = load_program(f"{archive}#Add_4L_2c", cache=cache)
        assert _streams(program) == _streams(load_program(shared("Add_4L_2c"), cache=False))


@needs_corpus
def test_an_archive_error_past_the_program_comes_first(tmp_path):
    """A read error after the program's files (a member shorter than its header says) is the load's error, as when
    the whole archive was read before parsing; so it is when the program itself has a bad line."""
    archive = tmp_path / "cut.tar"
    bad = tmp_path / "Bad_4L_1c"
    shutil.copytree(shared("Add_4L_1c"), bad)
    os.chmod(bad / "instructions0", 0o644)
    (bad / "instructions0").write_text("frobnicate r1: r2\n")
    for name, folder in (("Add_4L_1c", shared("Add_4L_1c")), ("Bad_4L_1c", bad)):
        with tarfile.open(archive, "w") as tar:
            tar.add(folder, arcname=name)
            tar.add(shared("Mul_4L_1c"), arcname="Mul_4L_1c")
        with tarfile.open(archive) as tar:
            last = tar.getmembers()[-1]  # a file of Mul_4L_1c: cut in its middle
        archive.write_bytes(archive.read_bytes()[: last.offset_data + last.size // 2])
        err = load_error(f"{archive}#{name}")
        assert "cannot read archive" in str(err) or "bytes, its header says" in str(err), str(err)


@needs_corpus
def test_a_program_is_built_while_the_rest_of_the_archive_is_read(tmp_path, monkeypatch):
    """The archive's read (a thread of its own) gives the program's files once it has passed them, and the program
    is built while the read goes on: here the read waits, after the next program's first file, until the build has
    begun."""
    building = threading.Event()
    files = {p.name: p.read_bytes() for p in shared("Add_4L_1c").iterdir()}

    def members(path, data):
        yield from (("Add_4L_1c", name, blob) for name, blob in files.items())
        yield "Mul_4L_1c", "instructions0", (shared("Mul_4L_1c") / "instructions0").read_bytes()
        assert building.wait(10)
        yield "Mul_4L_1c", "program_inputs", (shared("Mul_4L_1c") / "program_inputs").read_bytes()

    def build(f):
        building.set()
        return caramel.parse.build_program(f)

    monkeypatch.setattr(caramel.parse, "_archive_members", members)
    got, program = caramel.parse._load_archive(tmp_path / "any.tar", "Add_4L_1c", None, build)
    assert got.files == files and _streams(program) == _streams(load_program(shared("Add_4L_1c"), cache=False))


def test_corrupt_archive(tmp_path):
    archive = tmp_path / "bad.tar"
    archive.write_bytes(b"\0" * 512 + b"junk" * 100)
    err = load_error(archive)
    assert str(err).startswith(f"{archive}")


# ------------------------------------------------------------------------------------ the cache


@needs_corpus
def test_cache_hit_and_miss(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CARAMEL_CACHE", str(cache))
    d = copy_program(tmp_path)
    first = load_program(d)
    assert len(list(cache.glob("*.entry"))) == 1

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed although the cache holds this program")

    monkeypatch.setattr(caramel.parse, "build_program", no_parse)
    assert load_program(d) == first  # a hit: nothing is parsed

    replace(d / "instructions1", b"add r5: r3[X], r4 | 1", b"sub r5: r3[X], r4 | 1")
    with pytest.raises(AssertionError, match="parsed although"):
        load_program(d)  # the changed file misses the cache
    monkeypatch.undo()
    monkeypatch.setenv("CARAMEL_CACHE", str(cache))
    changed = load_program(d)
    assert changed != first and changed.streams[1].instructions[5].op is Opcode.SUB
    assert len(list(cache.glob("*.entry"))) == 2


@needs_corpus
def test_cache_hit_keeps_the_paths_of_the_loaded_copy(tmp_path, monkeypatch):
    monkeypatch.setenv("CARAMEL_CACHE", str(tmp_path / "cache"))
    a = copy_program(tmp_path / "a")
    b = copy_program(tmp_path / "b")
    first, second = load_program(a), load_program(b)
    assert [s.instructions for s in first.streams] == [s.instructions for s in second.streams]
    assert second.path == str(b) and second.streams[1].path == f"{b}/instructions1"
    assert second.manifest.path == f"{b}/program_inputs" and second.chip_manifests[0].path == f"{b}/inputs0"


@needs_corpus
def test_unwritable_cache_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("CARAMEL_CACHE", str(blocker / "cache"))
    assert load_program(copy_program(tmp_path)).chips == 2


# ----------------------------------------------------------------------------------------------
# Bounded resources: archive members, non-regular files
# ----------------------------------------------------------------------------------------------


def _bomb(path: Path, declared: int, written: int = 1 << 20) -> Path:
    """A .tar.xz whose one member declares ``declared`` bytes (of zeros) but holds only ``written``."""
    import lzma

    info = tarfile.TarInfo("Bomb_4L_1c/instructions0")
    info.size = declared
    with lzma.open(path, "wb") as f:
        f.write(info.tobuf(format=tarfile.GNU_FORMAT))
        f.write(bytes(written))
    return path


def test_archive_member_beyond_any_program_is_refused_at_its_header(tmp_path):
    bomb = _bomb(tmp_path / "bomb.tar.xz", 10 << 30)
    assert bomb.stat().st_size < 200_000
    with pytest.raises(ParseError, match="declares 10240 MiB: far larger than any compiled program file"):
        load_program(f"{bomb}#Bomb_4L_1c", cache=False)


def test_archive_members_beyond_the_total_are_refused(tmp_path, monkeypatch):
    archive = tmp_path / "two.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(shared("Add_4L_2c"), arcname="Add_4L_2c")
        tar.add(shared("Mul_4L_2c"), arcname="Mul_4L_2c")
    monkeypatch.setattr(caramel.parse, "MAX_ARCHIVE_BYTES", 4000)
    with pytest.raises(ParseError, match="members declare more than"):
        load_program(f"{archive}#Add_4L_2c", cache=False)


def test_an_xz_archive_decompresses_no_further_than_its_bound():
    """An xz archive is read forward in large steps (whole, here, and a second stream after the first, as xz reads
    them) and never decompressed beyond its bound (the programs' bound and the headers' slack): 3 MiB of zeros
    against a bound of 1 MiB are refused, not held."""
    import lzma

    data = lzma.compress(bytes(3 << 20))
    reader = caramel.parse._Unxz(data, 4 << 20)
    assert reader.read() == bytes(3 << 20)
    assert caramel.parse._Unxz(data + lzma.compress(b"next"), 4 << 20).read() == bytes(3 << 20) + b"next"
    with pytest.raises(OSError, match="more than 1 MiB"):
        caramel.parse._Unxz(data, 1 << 20).read()


def test_member_shorter_than_declared_is_an_error(tmp_path):
    bomb = _bomb(tmp_path / "short.tar.xz", 5000, written=100)
    with pytest.raises(ParseError, match="cannot read archive|holds 100 bytes"):
        load_program(bomb, cache=False)


def test_oversized_program_file_is_refused(tmp_path, monkeypatch):
    d = copy_program(tmp_path)
    monkeypatch.setattr(caramel.parse, "MAX_FILE_BYTES", 100)
    with pytest.raises(ParseError, match="far larger than any compiled program file"):
        load_program(d, cache=False)


@pytest.mark.parametrize("make", ["fifo", "folder", "dev"])
def test_non_regular_program_files_fail_at_once(tmp_path, make):
    d = copy_program(tmp_path)
    target = d / "inputs1"
    target.unlink()
    if make == "fifo":
        os.mkfifo(target)
    elif make == "folder":
        target.mkdir()
    else:
        target.symlink_to("/dev/zero")
    with pytest.raises(ParseError, match="inputs1: (not a regular file|is a folder)"):
        load_program(d, cache=False)


@pytest.mark.parametrize("source", ["/dev/zero", "fifo"])
def test_non_regular_program_source_fails_at_once(tmp_path, source):
    if source == "fifo":
        source = str(tmp_path / "instructions0")
        os.mkfifo(source)
    with pytest.raises(ParseError, match="not a regular file"):
        load_program(source, cache=False)


@pytest.mark.parametrize("line", ["load r\u0663: i1(0){F}", "add r1: r0, r\u0661 | 0", "load r1: i1(\u0660){F}",
                                  "rot \u0663 r1: r0 | 0", "ntt r1: r0 | \u0663"])
def test_digits_of_other_scripts_are_refused_on_both_paths(tmp_path, line):
    """The fast path's regular expressions matched any script's digits (Python's \\d), the grammar
    only ASCII: 'load r\u0663' was read as register 3 and validated."""
    with pytest.raises(ParseError, match="malformed"):
        parse_instruction(line)
    f = tmp_path / "instructions0"
    f.write_text(f"Instruction Stream 0:\n{line}\n", encoding="utf-8")
    with pytest.raises(ParseError, match=r"instructions0:2"):
        load_program(f, cache=False)
