"""Tests of caramel.plan_cache: cached plans equal build_plan's (field types included); corrupted,
foreign, stale and planted entries are rebuilt, never used; folder and entry permissions."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest

import caramel.cache as cache
import caramel.plan_cache as pc
from caramel.parse import load_program
from caramel.plan import Kind, build_plan

from tests.conftest import corpus

EXAMPLES = Path(__file__).resolve().parents[1] / "programs"
PROGRAMS = sorted(p for p in EXAMPLES.iterdir() if p.is_dir() and p.name != "checks") + corpus("*_4L_2c")[:3]
MUL = EXAMPLES / "Mul_4L_2c"


pytestmark = pytest.mark.usefixtures("fresh_cache")  # (tests/conftest.py)


def same_types(a, b) -> bool:
    """Equal and of the same types, field by field, through tuples, dicts and dataclasses."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same_types(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_types(a[k], b[k]) for k in a)  # the same order too
    if dataclasses.is_dataclass(a):
        return all(same_types(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
                   if f.name != "timings")
    return a == b


def plans(path):
    """(build_plan's plan, the cached one on a miss, the cached one on a hit) of a loaded program."""
    program = load_program(path, progress=False)
    want = build_plan(program)
    return program, want, pc.cached_plan(program), pc.cached_plan(program)


def entries(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{pc.SUFFIX}"))


@pytest.mark.parametrize("path", PROGRAMS, ids=lambda p: p.name)
def test_cached_plan_equals_build_plan(fresh_cache, path):
    program, want, miss, hit = plans(path)
    assert same_types(miss, want) and same_types(hit, want) and hit.name == program.name
    assert "cache" in hit.timings and "cache" not in miss.timings
    assert len(entries(fresh_cache)) == 1
    unfused = pc.cached_plan(program, fuse=False)  # other options: another entry
    assert same_types(unfused, build_plan(program, fuse=False)) and len(entries(fresh_cache)) == 2
    assert same_types(pc.cached_plan(program, fuse=False), unfused)


def test_plan_cached_says_whether_cached_plan_would_read_an_entry(fresh_cache):
    """Per options and target: an entry of the fused plan says nothing of the unfused one; a program that the load
    cache does not know (built in Python) has no entry; a planted symlink in the entry's place is not one."""
    from caramel.backends.cuda.target import CUDA_TARGET

    program = load_program(MUL, progress=False)
    assert not pc.plan_cached(program)
    pc.cached_plan(program)
    assert pc.plan_cached(program) and not pc.plan_cached(program, fuse=False)
    assert not pc.plan_cached(program, target=CUDA_TARGET)
    pc.cached_plan(program, fuse=False)
    assert pc.plan_cached(program, fuse=False)
    assert not pc.plan_cached(dataclasses.replace(program))  # another object: not the load cache's
    entry = pc.entry_path(fresh_cache, pc._meta(pc.program_key(program), True, pc.MAX_INPUTS))
    assert entry.is_file()
    target = fresh_cache / "elsewhere"
    entry.rename(target)
    entry.symlink_to(target)
    assert not pc.plan_cached(program)


@pytest.mark.parametrize("hit", [False, True], ids=["miss", "hit"])
def test_built_sees_the_plan_before_its_entry_is_written(fresh_cache, hit):
    program = load_program(MUL, progress=False)
    if hit:
        pc.cached_plan(program)
    seen = []
    plan = pc.cached_plan(program, built=lambda p: seen.append((p, entries(fresh_cache))))
    assert len(seen) == 1 and seen[0][0] is plan
    assert seen[0][1] == (entries(fresh_cache) if hit else [])  # on a miss the entry comes after the hook
    assert len(entries(fresh_cache)) == 1


def test_fused_is_called_only_when_the_plan_is_built(fresh_cache):
    """``fused`` (build_plan's: the plan's elementwise programs, before it exists) is called on a miss, with the
    programs of the plan's elementwise kernels, and not on a hit (the plan is there at once)."""
    program = load_program(MUL, progress=False)
    seen = []
    plan = pc.cached_plan(program, fused=seen.append)
    assert seen == [{k.expr for c in plan.chips for k in c.kernels if k.kind is Kind.ELEMENTWISE}] and seen[0]
    pc.cached_plan(program, fused=seen.append)
    assert len(seen) == 1


def test_entry_and_folder_are_private(fresh_cache):
    plans(MUL)
    (entry,) = entries(fresh_cache)
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600 and stat.S_IMODE(fresh_cache.stat().st_mode) == 0o700
    assert entry.read_bytes().startswith(pc.MAGIC)


def test_programs_not_from_load_program_are_not_cached(fresh_cache):
    program = load_program(MUL, progress=False)
    changed = dataclasses.replace(program, name="changed")  # the same instructions, another object
    assert pc.program_key(changed) is None
    assert same_types(pc.cached_plan(changed), build_plan(changed)) and entries(fresh_cache) == []
    assert pc.cached_plan(program, cache=False) is not None and entries(fresh_cache) == []


def _rebuilt(monkeypatch, program) -> list[int]:
    calls: list[int] = []
    import caramel.plan

    real = caramel.plan.build_plan
    monkeypatch.setattr(caramel.plan, "build_plan", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "magic"])
def test_damaged_entries_are_rebuilt_and_rewritten(fresh_cache, monkeypatch, caplog, damage):
    program, want, _, _ = plans(MUL)
    (entry,) = entries(fresh_cache)
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "empty":
        data = bytearray()
    else:
        data[:4] = b"XXXX"
    entry.write_bytes(bytes(data))
    calls = _rebuilt(monkeypatch, program)
    with caplog.at_level(logging.INFO, logger="caramel.plan_cache"):
        got = pc.cached_plan(program)
    assert calls == [1] and same_types(got, want) and "rebuilding plan cache entry" in caplog.text
    assert same_types(pc.cached_plan(program), want) and calls == [1]  # the rewritten entry is used


def test_another_programs_entry_under_this_name_is_rebuilt(fresh_cache, monkeypatch):
    add = load_program(EXAMPLES / "Add_4L_1c", progress=False)
    mul = load_program(EXAMPLES / "Mul_4L_1c", progress=False)
    pc.cached_plan(add)
    (add_entry,) = entries(fresh_cache)
    pc.cached_plan(mul)
    (mul_entry,) = [e for e in entries(fresh_cache) if e != add_entry]
    mul_entry.write_bytes(add_entry.read_bytes())  # a valid entry, of another program
    calls = _rebuilt(monkeypatch, mul)
    assert same_types(pc.cached_plan(mul), build_plan(mul)) and calls == [1]


def test_another_planner_or_format_is_refused(fresh_cache, monkeypatch):
    program, want, _, _ = plans(MUL)
    (entry,) = entries(fresh_cache)
    data = entry.read_bytes()
    key = pc.program_key(program)
    for change in ({"planner": "0" * 64}, {"format": pc.FORMAT_VERSION + 1}, {"fuse": False}, {"caramel": "0"},
                   {"max_outputs": 1}):
        meta = {**pc._meta(key, True, pc.MAX_INPUTS), **change}
        with pytest.raises(pc.PlanEntryError, match="entry is for"):
            pc.from_bytes(data, meta, program.name)
    monkeypatch.setattr(pc, "planner_fingerprint", lambda: "f" * 64)  # a new planner: a new entry name
    assert same_types(pc.cached_plan(program), want) and len(entries(fresh_cache)) == 2


def _rewrite(data: bytes, change) -> bytes:
    """An entry with a valid digest whose tables ``change`` altered (what a bug or a forger makes)."""
    body = data[len(pc.MAGIC) + 32:]
    with np.load(io.BytesIO(body), allow_pickle=False) as f:
        arrays = {k: f[k] for k in f.files}
    change(arrays)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    import hashlib

    return pc.MAGIC + hashlib.sha256(buf.getvalue()).digest() + buf.getvalue()


@pytest.mark.parametrize("change", [
    lambda a: a["r_ins"].__setitem__(0, 10**6),  # a tuple index past the table
    lambda a: a["r_ins"].__setitem__(0, -1),  # negative: would wrap around in Python
    lambda a: a["k_expr"].__setitem__(0, -2),
    lambda a: a["k_kind"].__setitem__(0, 99),
    lambda a: a.__setitem__("k_rows", a["k_rows"] + 1),  # counts that do not add up
    lambda a: a.__setitem__("tup_off", a["tup_off"][:-1]),
    lambda a: a.pop("c_op"),
    lambda a: a["k_half"].__setitem__(0, 2),  # not a flag
    lambda a: a["k_half"].__setitem__(int(np.flatnonzero(a["k_kind"] != 2)[0]), 1),  # half, not an NTT
    lambda a: a["tup_off"].__setitem__(1, a["tup_off"][2] + 1),  # offsets that go back
    lambda a: a["r_gather"].__setitem__(0, int(np.flatnonzero(np.diff(a["tup_off"]) == 2)[0])),  # a gather, width 0
], ids=["past", "negative", "expr", "kind", "counts", "offsets", "missing", "half", "half-kind", "backwards",
        "gather"])
def test_inconsistent_tables_are_refused(fresh_cache, change):
    program, _, _, _ = plans(MUL)
    (entry,) = entries(fresh_cache)
    meta = pc._meta(pc.program_key(program), True, pc.MAX_INPUTS)
    pc.from_bytes(entry.read_bytes(), meta, program.name)  # the entry as written is fine
    with pytest.raises(pc.PlanEntryError):
        pc.from_bytes(_rewrite(entry.read_bytes(), change), meta, program.name)


def test_planted_pickle_is_refused(fresh_cache):
    program, _, _, _ = plans(MUL)
    (entry,) = entries(fresh_cache)
    meta = pc._meta(pc.program_key(program), True, pc.MAX_INPUTS)
    data = _rewrite(entry.read_bytes(), lambda a: a.__setitem__("k_level", np.array([object()], dtype=object)))
    with pytest.raises(pc.PlanEntryError, match="malformed"):
        pc.from_bytes(data, meta, program.name)


def test_planted_symlink_at_the_entry_is_not_followed(fresh_cache, tmp_path):
    program, want, _, _ = plans(MUL)
    (entry,) = entries(fresh_cache)
    victim = tmp_path / "victim"
    victim.write_bytes(entry.read_bytes())  # even a valid entry behind a link is not read
    entry.unlink()
    entry.symlink_to(victim)
    before = victim.read_bytes()
    assert same_types(pc.cached_plan(program), want)
    assert victim.read_bytes() == before and not entry.is_symlink() and entry.read_bytes().startswith(pc.MAGIC)


def test_folder_writable_by_others_is_ignored(fresh_cache, caplog):
    fresh_cache.mkdir(mode=0o700)
    program = load_program(MUL, cache=False, progress=False)
    program = pc.remember(program, "k" * 64)
    fresh_cache.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="caramel.cache"):
        assert same_types(pc.cached_plan(program), build_plan(program))
    assert entries(fresh_cache) == [] and "writable by the group or others" in caplog.text


def test_entry_writable_by_others_is_not_read(fresh_cache, monkeypatch):
    program, want, _, _ = plans(MUL)
    (entry,) = entries(fresh_cache)
    entry.chmod(0o666)
    calls = _rebuilt(monkeypatch, program)
    assert same_types(pc.cached_plan(program), want) and calls == [1]
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600  # rewritten by a fresh private file


def test_remember_keeps_a_few_recent_programs():
    programs = [load_program(EXAMPLES / name, cache=False, progress=False) for name in ("Add_4L_1c", "Mul_4L_1c")]
    for i, p in enumerate(programs):
        pc.remember(p, f"key{i}")
    assert [pc.program_key(p) for p in programs] == ["key0", "key1"]
    for i in range(cache.KNOWN_PROGRAMS):
        pc.remember(load_program(EXAMPLES / "Add_4L_1c", cache=False, progress=False), f"other{i}")
    assert pc.program_key(programs[0]) is None  # forgotten: planned without the cache


def test_header_is_json_and_names_the_program_key(fresh_cache):
    program, _, _, _ = plans(MUL)
    (entry,) = entries(fresh_cache)
    with np.load(io.BytesIO(entry.read_bytes()[len(pc.MAGIC) + 32:]), allow_pickle=False) as f:
        header = json.loads(bytes(f["header"]).decode())
    assert header["program"] == pc.program_key(program) and header["planner"] == pc.planner_fingerprint()
    assert os.path.basename(entry) == pc.entry_path(fresh_cache, pc._meta(header["program"], True, pc.MAX_INPUTS)).name


# ---------------------------------------------------------------------------------------------- schedules


def _schedule_tasks():
    """The tasks of a real 1-chip plan on one device (rows of its device program). Without sibling
    rows (``max_outputs=1``) its independent kernels stay apart, so the schedule has waits."""
    from caramel.execute.placement import gpu_device_programs
    from caramel.ring import Context
    from tests.plan.plan_helpers import chip_tasks

    plan = pc.cached_plan(load_program(EXAMPLES / "Mul_4L_1c"), max_outputs=1)
    prog = gpu_device_programs(plan, 1, Context(n=4096), 3)[0]
    return chip_tasks(plan.chips[0], prog.rows_of[0])


def _counting_build(tasks, streams=3):
    from caramel.plan.streams import assign_streams, check_schedule

    calls = []

    def build():
        calls.append(1)
        sch = assign_streams(tasks, streams)
        check_schedule(tasks, sch)
        return sch

    return build, calls


def test_schedule_is_built_once_then_read(fresh_cache):
    tasks = _schedule_tasks()
    build, calls = _counting_build(tasks)
    first = pc.cached_schedule(tasks, 3, 0, build)
    again = pc.cached_schedule(tasks, 3, 0, build)
    assert calls == [1] and again == first and same_types(again, first)
    (entry,) = fresh_cache.glob(f"*{pc.SCHEDULE_SUFFIX}")
    assert entry.stem == pc.tasks_digest(tasks, 3, 0) and stat.S_IMODE(entry.stat().st_mode) == 0o600


def test_other_tasks_or_streams_get_their_own_schedule(fresh_cache):
    tasks = _schedule_tasks()
    build, calls = _counting_build(tasks)
    pc.cached_schedule(tasks, 3, 0, build)
    moved = [dataclasses.replace(tasks[0], reads=tasks[0].reads | {10_000})] + tasks[1:]
    assert pc.tasks_digest(moved, 3, 0) != pc.tasks_digest(tasks, 3, 0)
    assert pc.tasks_digest(tasks, 2, 0) != pc.tasks_digest(tasks, 3, 0)
    assert pc.tasks_digest(tasks, 3, 1) != pc.tasks_digest(tasks, 3, 0)
    renamed = [dataclasses.replace(t, name="x") for t in tasks]  # names are not part of a schedule
    assert pc.tasks_digest(renamed, 3, 0) == pc.tasks_digest(tasks, 3, 0)
    build2, calls2 = _counting_build(moved)
    pc.cached_schedule(moved, 3, 0, build2)
    assert calls2 == [1]


@pytest.mark.parametrize("damage", ["flip", "truncate", "bad index", "short table", "other header"])
def test_damaged_schedule_entries_are_rebuilt(fresh_cache, caplog, damage):
    tasks = _schedule_tasks()
    build, calls = _counting_build(tasks)
    want = pc.cached_schedule(tasks, 3, 0, build)
    (entry,) = fresh_cache.glob(f"*{pc.SCHEDULE_SUFFIX}")
    data = bytearray(entry.read_bytes())
    arrays = pc._schedule_arrays(want, entry.stem)
    if damage == "flip":
        data[len(data) // 2] ^= 0x10
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "bad index":
        arrays["wait_val"] = arrays["wait_val"] + len(tasks)
        data = cache.seal(pc.SCHEDULE_MAGIC, arrays)
    elif damage == "short table":
        arrays["stream"] = arrays["stream"][:-1]
        data = cache.seal(pc.SCHEDULE_MAGIC, arrays)
    else:
        arrays["header"] = np.frombuffer(json.dumps({"tasks": "0" * 64, "n_streams": 3, "n_events": 0}).encode(),
                                         dtype=np.uint8)
        data = cache.seal(pc.SCHEDULE_MAGIC, arrays)
    entry.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="caramel.plan_cache"):
        got = pc.cached_schedule(tasks, 3, 0, build)
    assert got == want and calls == [1, 1]
    assert "rebuilding schedule cache entry" in caplog.text


def test_schedule_cache_off(fresh_cache):
    tasks = _schedule_tasks()
    build, calls = _counting_build(tasks)
    pc.cached_schedule(tasks, 3, 0, build, cache=False)
    pc.cached_schedule(tasks, 3, 0, build, cache=False)
    assert calls == [1, 1] and not list(fresh_cache.glob(f"*{pc.SCHEDULE_SUFFIX}"))
