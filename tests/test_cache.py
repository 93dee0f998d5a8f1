"""Tests of caramel.cache: exact round trips of the data-only encoding, corrupted, swapped and planted
entries (never loaded, never executed), folder and entry permissions, atomic writes."""

from __future__ import annotations

import io
import logging
import os
import pickle
import random
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

import caramel.cache as cache
import caramel.parse
from caramel.parse import load_program, read_source, source_digest
from caramel.program import Instruction

from tests.conftest import SHARED_PROGRAMS, corpus

from tests.conftest import SYNTAX_FORMS

ROUND_TRIP = corpus("*_4L_*c") + corpus("*_10L_*c") + corpus("BootstrapLike_20L_*c")
MUL = SHARED_PROGRAMS / "Mul_4L_2c"
ADD = SHARED_PROGRAMS / "Add_4L_2c"
needs_corpus = pytest.mark.skipif(not (MUL.is_dir() and ADD.is_dir()), reason="shared corpus not found")


pytestmark = pytest.mark.usefixtures("fresh_cache")  # (tests/conftest.py)


def entry_path(source) -> Path:
    return Path(os.environ["CARAMEL_CACHE"]) / f"{caramel.parse._cache_key(source_digest(read_source(source)))}.entry"


def meta_of(source) -> dict:
    return caramel.parse._cache_meta(source_digest(read_source(source)))


def same_types(a, b) -> bool:
    """Equal and of the same types field by field (``True == 1``, but a cached bool must stay a bool)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_types(x, y) for x, y in zip(a, b))
    if hasattr(a, "__slots__") and not isinstance(a, (int, str)):
        return all(same_types(getattr(a, s), getattr(b, s)) for s in a.__slots__)
    return a == b


@pytest.mark.parametrize("path", ROUND_TRIP, ids=lambda p: p.name)
def test_decoded_program_equals_the_parsed_one(path):
    program = load_program(path, cache=False, progress=False)
    meta = meta_of(path)
    decoded = cache.from_bytes(cache.to_bytes(program, meta), meta)
    assert decoded == program
    for s, t in zip(decoded.streams, program.streams):
        assert all(type(i) is Instruction for i in s.instructions)
        assert same_types(s.instructions[:200], t.instructions[:200])
    assert same_types(decoded.manifest.entries, program.manifest.entries)


def test_round_trip_of_every_syntax_form():
    from caramel.program import Program, Stream, Manifest

    forms = SYNTAX_FORMS
    ins = tuple(caramel.parse.parse_instruction(line, "x", i) for i, line in enumerate(forms, 1))
    program = Program("p", "/x", (Stream(0, "/x/instructions0", ins),), Manifest("/x/program_inputs", ()))
    meta = {"format": cache.FORMAT_VERSION}
    assert same_types(cache.from_bytes(cache.to_bytes(program, meta), meta).streams, program.streams)


@needs_corpus
def test_cached_load_equals_parse_and_folder_is_private(fresh_cache):
    first = load_program(MUL, progress=False)
    assert stat.S_IMODE(fresh_cache.stat().st_mode) == 0o700
    entries = list(fresh_cache.iterdir())
    assert [e.suffix for e in entries] == [".entry"]
    assert entries[0].read_bytes().startswith(cache.MAGIC)
    assert load_program(MUL, progress=False) == first == load_program(MUL, cache=False, progress=False)


@needs_corpus
def test_a_deferred_entry_is_written_once_when_asked(fresh_cache):
    """``defer_write``: no entry until ``write_deferred``, which writes it once (a second call writes nothing)."""
    program = load_program(MUL, progress=False, defer_write=True)
    assert list(fresh_cache.iterdir()) == []
    cache.write_deferred(program)
    (entry,) = fresh_cache.iterdir()
    assert cache.from_bytes(entry.read_bytes(), meta_of(MUL)) == program
    entry.unlink()
    cache.write_deferred(program)
    assert list(fresh_cache.iterdir()) == []  # once only


@needs_corpus
def test_flipped_and_truncated_entries_are_rebuilt_never_loaded(fresh_cache, caplog):
    want = load_program(MUL, cache=False, progress=False)
    load_program(MUL, progress=False)
    path = entry_path(MUL)
    good = path.read_bytes()
    rng = random.Random(12)
    for trial in range(60):
        data = bytearray(good)
        if trial % 2:
            data = data[:rng.randrange(len(data))]
        else:
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))
        with pytest.raises(cache.CacheEntryError):
            cache.from_bytes(bytes(data), meta_of(MUL))
        assert load_program(MUL, progress=False) == want
        assert path.read_bytes() == good  # rebuilt
    assert "Traceback" not in caplog.text


@needs_corpus
def test_swapped_entry_is_detected(fresh_cache):
    add = load_program(ADD, progress=False)
    mul = load_program(MUL, progress=False)
    assert add != mul
    shutil.copyfile(entry_path(ADD), entry_path(MUL))  # a valid digest, but another program's entry
    with pytest.raises(cache.CacheEntryError, match="source"):
        cache.from_bytes(entry_path(MUL).read_bytes(), meta_of(MUL))
    assert load_program(MUL, progress=False) == mul


def test_other_format_or_version_is_refused():
    from caramel.program import Manifest, Program

    program = Program("p", "/x", (), Manifest("/x/program_inputs", ()))
    data = cache.to_bytes(program, {"format": cache.FORMAT_VERSION, "caramel": "0.0.1"})
    with pytest.raises(cache.CacheEntryError, match="caramel"):
        cache.from_bytes(data, {"format": cache.FORMAT_VERSION, "caramel": "0.1.0"})


class _Plant:
    """Writes a file when unpickled."""

    def __init__(self, target: str):
        self.target = target

    def __reduce__(self):
        return (Path.write_text, (Path(self.target), "pwned"))


def _planted_pickle_entry(target: Path, meta: dict) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, header=np.frombuffer(b"{}", dtype=np.uint8), opnd=np.array([_Plant(str(target))], dtype=object))
    body = buf.getvalue()
    import hashlib

    return cache.MAGIC + hashlib.sha256(body).digest() + body


@needs_corpus
def test_planted_pickle_never_runs(fresh_cache, tmp_path):
    target = tmp_path / "pwned.txt"
    want = load_program(MUL, cache=False, progress=False)
    fresh_cache.mkdir(mode=0o700)
    path = entry_path(MUL)
    # An entry with a valid digest whose arrays hold a pickle, and a pickle under the old cache name.
    path.write_bytes(_planted_pickle_entry(target, meta_of(MUL)))
    path.with_suffix(".pickle").write_bytes(pickle.dumps(_Plant(str(target))))
    with pytest.raises(cache.CacheEntryError):
        cache.from_bytes(path.read_bytes(), meta_of(MUL))
    assert load_program(MUL, progress=False) == want
    assert not target.exists()
    # A pickle under the entry's own name.
    path.write_bytes(pickle.dumps(_Plant(str(target))))
    assert load_program(MUL, progress=False) == want
    assert not target.exists()


@needs_corpus
def test_folder_writable_by_others_is_ignored_with_one_warning(fresh_cache, caplog, monkeypatch):
    fresh_cache.mkdir(mode=0o700)
    fresh_cache.chmod(0o777)
    want = load_program(MUL, cache=False, progress=False)
    with caplog.at_level(logging.WARNING, logger="caramel.cache"):
        assert load_program(MUL, progress=False) == want
        assert load_program(MUL, progress=False) == want
    assert list(fresh_cache.iterdir()) == []  # neither read nor written
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "writable by the group or others" in warnings[0].getMessage()


@needs_corpus
def test_folder_or_entry_of_another_user_is_ignored(fresh_cache, caplog, monkeypatch):
    want = load_program(MUL, progress=False)
    path = entry_path(MUL)
    monkeypatch.setattr(cache.os, "getuid", lambda: os.stat(path).st_uid + 1)
    monkeypatch.setattr(caramel.parse, "build_program", lambda *a, **k: want)  # counts as a rebuild
    with caplog.at_level(logging.WARNING, logger="caramel.cache"):
        assert load_program(MUL, progress=False) == want
        assert load_program(MUL, progress=False) == want
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "another user" in warnings[0].getMessage()


@needs_corpus
def test_entry_writable_by_others_is_not_read(fresh_cache, caplog, monkeypatch):
    want = load_program(MUL, progress=False)
    path = entry_path(MUL)
    path.chmod(0o666)
    calls = []
    real = caramel.parse.build_program
    monkeypatch.setattr(caramel.parse, "build_program", lambda *a, **k: calls.append(1) or real(*a, **k))
    with caplog.at_level(logging.WARNING, logger="caramel.cache"):
        assert load_program(MUL, progress=False) == want
    assert calls == [1]
    assert "writable by the group or others" in caplog.text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # rewritten by a fresh private file


@needs_corpus
def test_planted_symlink_at_the_entry_is_not_followed(fresh_cache, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    fresh_cache.mkdir(mode=0o700)
    path = entry_path(MUL)
    path.symlink_to(victim)
    want = load_program(MUL, cache=False, progress=False)
    assert load_program(MUL, progress=False) == want
    assert victim.read_bytes() == b"keep me"
    assert not path.is_symlink() and path.read_bytes().startswith(cache.MAGIC)


@needs_corpus
def test_planted_symlink_at_the_temporary_path_is_not_followed(fresh_cache, tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    fresh_cache.mkdir(mode=0o700)
    planted = fresh_cache / f"{cache.TEMP_PREFIX}{os.getpid()}-guess.part"
    planted.symlink_to(victim)
    names = iter(["guess", "fresh"])
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: names)
    want = load_program(MUL, cache=False, progress=False)
    assert load_program(MUL, progress=False) == want
    assert victim.read_bytes() == b"keep me"
    assert entry_path(MUL).read_bytes().startswith(cache.MAGIC)


@needs_corpus
def test_fifo_at_the_entry_does_not_hang(fresh_cache):
    fresh_cache.mkdir(mode=0o700)
    os.mkfifo(entry_path(MUL))
    assert load_program(MUL, progress=False) == load_program(MUL, cache=False, progress=False)


def test_stale_temporary_files_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    old = tmp_path / f"{cache.TEMP_PREFIX}{os.getpid()}-old.part"
    mine = tmp_path / f"{cache.TEMP_PREFIX}{os.getpid()}-new.part"
    killed = tmp_path / f"{cache.TEMP_PREFIX}{dead_pid}-x.part"
    other = tmp_path / "unrelated.entry"
    for p in (old, mine, killed, other):
        p.write_bytes(b"x")
    os.utime(old, (1, 1))
    removed = cache.remove_stale_temps(tmp_path)
    assert sorted(removed) == sorted([old.name, killed.name])
    assert mine.exists() and other.exists()


# ----------------------------------------------------------------------------------------------
# Archives: keyed by the compressed bytes and the member, no decompression on a hit
# ----------------------------------------------------------------------------------------------


def _two_program_archive(path: Path, first: str = "Add_4L_2c", folder: str = "progs") -> Path:
    import tarfile

    with tarfile.open(path, "w:xz") as tar:
        tar.add(SHARED_PROGRAMS / first, arcname=f"{folder}/{first}")
        tar.add(MUL, arcname=f"{folder}/Mul_4L_2c")
    return path


def _no_decompression(monkeypatch) -> None:
    """No member of an archive is read from here on (``tarfile.is_tarfile`` reads one header)."""
    import tarfile

    def refuse(*a, **k):
        raise AssertionError("the archive was decompressed")

    monkeypatch.setattr(tarfile.TarFile, "extractfile", refuse)
    monkeypatch.setattr(caramel.parse, "_read_archive", refuse)


@needs_corpus
def test_archive_hit_decompresses_nothing_and_equals_the_parse(tmp_path, monkeypatch):
    archive = _two_program_archive(tmp_path / "two.tar.xz")
    source = f"{archive}#Mul_4L_2c"
    files = read_source(source)
    first = load_program(source)
    assert len(list(Path(os.environ["CARAMEL_CACHE"]).glob("*.entry"))) == 1
    _no_decompression(monkeypatch)
    again = load_program(source)
    parsed = caramel.parse.build_program(files)
    for got in (first, again):
        assert got.name == "Mul_4L_2c" and got.path == f"{archive}#progs/Mul_4L_2c"
        assert same_types(got.streams, parsed.streams) and got.manifest == parsed.manifest
        assert got.chip_manifests == parsed.chip_manifests
        assert got.streams[0].path == f"{archive}#progs/Mul_4L_2c/instructions0"


@needs_corpus
def test_archive_key_is_its_bytes_and_member(tmp_path, monkeypatch):
    archive = _two_program_archive(tmp_path / "two.tar.xz")
    add = load_program(f"{archive}#Add_4L_2c")
    mul = load_program(f"{archive}#Mul_4L_2c")
    assert add.name == "Add_4L_2c" and mul.name == "Mul_4L_2c"
    assert len(list(Path(os.environ["CARAMEL_CACHE"]).glob("*.entry"))) == 2
    # Other bytes at the same path: another key, so the entry of the old bytes is never used.
    _two_program_archive(archive, first="Add_4L_1c")
    assert load_program(f"{archive}#Add_4L_1c").name == "Add_4L_1c"
    assert load_program(f"{archive}#Mul_4L_2c").chips == 2
    assert len(list(Path(os.environ["CARAMEL_CACHE"]).glob("*.entry"))) == 4


@needs_corpus
def test_archive_moved_keeps_its_entry_with_the_new_paths(tmp_path, monkeypatch):
    archive = _two_program_archive(tmp_path / "two.tar.xz")
    load_program(f"{archive}#Mul_4L_2c")
    moved = tmp_path / "elsewhere" / "copy.tar.xz"
    moved.parent.mkdir()
    shutil.copy(archive, moved)
    _no_decompression(monkeypatch)
    got = load_program(f"{moved}#Mul_4L_2c")
    assert got.path == f"{moved}#progs/Mul_4L_2c"
    assert all(s.path.startswith(f"{moved}#progs/Mul_4L_2c/") for s in got.streams)
    assert got.manifest.path == f"{moved}#progs/Mul_4L_2c/program_inputs"


@needs_corpus
def test_archive_entry_without_its_folder_is_rebuilt(tmp_path, caplog):
    archive = _two_program_archive(tmp_path / "two.tar.xz")
    source = f"{archive}#Mul_4L_2c"
    want = load_program(source)
    (entry,) = Path(os.environ["CARAMEL_CACHE"]).glob("*.entry")
    digest = caramel.parse.archive_digest(archive.read_bytes(), "Mul_4L_2c")
    assert entry.stem == caramel.parse._cache_key(digest)
    entry.write_bytes(cache.to_bytes(want, caramel.parse._cache_meta(digest)))  # no "archive_folder"
    with caplog.at_level(logging.INFO, logger="caramel.parse"):
        got = load_program(source)
    assert "archive entry without its folder" in caplog.text
    assert got.path == want.path and same_types(got.streams, want.streams)
    assert cache.unseal(entry.read_bytes(), {}, cache.MAGIC, lambda a, h: h["archive_folder"]) == "progs/Mul_4L_2c"


@needs_corpus
def test_archive_member_errors_are_unchanged(tmp_path):
    archive = _two_program_archive(tmp_path / "two.tar.xz")
    with pytest.raises(caramel.errors.ParseError, match="no program named 'Nope'"):
        load_program(f"{archive}#Nope")
    with pytest.raises(caramel.errors.ParseError, match="holds several programs"):
        load_program(str(archive))
    assert not list(Path(os.environ["CARAMEL_CACHE"]).glob("*.entry"))


# ----------------------------------------------------------------------------------------------
# Validation markers (validate_once)
# ----------------------------------------------------------------------------------------------


def _counting_validator(fail: bool = False):
    calls = []

    def check(program):
        calls.append(program.name)
        if fail:
            raise caramel.errors.ValidationError(["bad"], False)

    return check, calls


def _markers() -> list[Path]:
    return list(Path(os.environ["CARAMEL_CACHE"]).glob(f"*{cache.VALID_SUFFIX}"))


@needs_corpus
def test_a_program_that_passed_is_validated_once():
    check, calls = _counting_validator()
    cache.validate_once(load_program(MUL), check)
    cache.validate_once(load_program(MUL), check)
    assert calls == ["Mul_4L_2c"]
    (marker,) = _markers()
    assert stat.S_IMODE(marker.stat().st_mode) == 0o600 and marker.read_bytes().startswith(cache.VALID_MAGIC)
    cache.validate_once(load_program(ADD), check)  # another program: its own marker
    assert calls == ["Mul_4L_2c", "Add_4L_2c"] and len(_markers()) == 2


@needs_corpus
def test_a_failure_is_never_recorded():
    check, calls = _counting_validator(fail=True)
    for _ in range(2):
        with pytest.raises(caramel.errors.ValidationError):
            cache.validate_once(load_program(MUL), check)
    assert len(calls) == 2 and not _markers()


@needs_corpus
def test_programs_not_from_load_program_are_always_validated():
    import dataclasses

    check, calls = _counting_validator()
    changed = dataclasses.replace(load_program(MUL), name="changed")
    cache.validate_once(changed, check)
    cache.validate_once(changed, check)
    assert calls == ["changed", "changed"] and not _markers()


@needs_corpus
@pytest.mark.parametrize("change", ["flip", "other validator", "other program's marker"])
def test_damaged_or_foreign_markers_are_not_trusted(monkeypatch, change):
    check, calls = _counting_validator()
    cache.validate_once(load_program(MUL), check)
    (marker,) = _markers()
    if change == "flip":
        data = bytearray(marker.read_bytes())
        data[-3] ^= 1
        marker.write_bytes(bytes(data))
    elif change == "other validator":
        monkeypatch.setattr(cache, "validator_fingerprint", lambda: "0" * 64)
    else:  # a pass of another program, renamed to this program's marker
        cache.validate_once(load_program(ADD), check)
        other = next(m for m in _markers() if m != marker)
        other.replace(marker)
    cache.validate_once(load_program(MUL), check)
    assert calls.count("Mul_4L_2c") == 2


# Every entry read is bounded: by its size before the read, by its arrays' headers before decoding.

REPO_MUL = Path(__file__).resolve().parents[1] / "programs" / "Mul_4L_2c"


def test_a_huge_entry_is_not_read(fresh_cache, caplog):
    """A 5 GiB sparse file at the entry's path (all of it memory if read) is passed over from its size."""
    fresh_cache.mkdir(mode=0o700)
    path = entry_path(REPO_MUL)
    with open(path, "wb") as f:
        f.truncate(5 << 30)
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="caramel.cache"):
        assert load_program(REPO_MUL, progress=False) == load_program(REPO_MUL, cache=False, progress=False)
    assert "more than any entry" in caplog.text


def test_an_entry_whose_arrays_declare_more_than_it_holds_is_rebuilt(fresh_cache):
    """A sealed entry (right digest) whose npz member declares 10^10 values: refused from the
    header (nothing allocated), the program parsed again."""
    from tests.test_infiles import declaring

    fresh_cache.mkdir(mode=0o700)
    body = declaring(io.BytesIO(), 10**10, "header.npy").getvalue()
    import hashlib

    entry_path(REPO_MUL).write_bytes(cache.MAGIC + hashlib.sha256(body).digest() + body)
    entry_path(REPO_MUL).chmod(0o600)
    with pytest.raises(cache.CacheEntryError, match="malformed entry: TooLarge"):
        cache.from_bytes(entry_path(REPO_MUL).read_bytes(), meta_of(REPO_MUL))
    assert load_program(REPO_MUL, progress=False) == load_program(REPO_MUL, cache=False, progress=False)
