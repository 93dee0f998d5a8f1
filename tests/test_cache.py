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
