"""Program-level parallelism on the CPU (:mod:`caramel.batch`): a batch on simulated devices, in
processes, and the throughput profile; instance i equals a single run with seed S + i and key seed S.
A batch with a bad instance or interrupted keeps every instance that finished."""

from __future__ import annotations

import json

import pytest

from caramel.api import run_program
from caramel.batch import batch_layout, instance_line, key_mems, measure_throughput, run_batch
from caramel.cli import main
from caramel.errors import ArgumentError
from caramel.parse import load_program

from tests.conftest import REPO, caramel_cli

MUL2 = REPO / "programs" / "Mul_4L_2c"
ROT1 = REPO / "programs" / "MulRotate_4L_1c"  # 1 chip, with rotation keys (shared by the instances)
N = 1024
SEED = 5


@pytest.fixture(scope="module")
def mul2():
    return load_program(MUL2, progress=False)


@pytest.fixture(scope="module")
def rot1():
    return load_program(ROT1, progress=False)


def single_digest(program, seed: int, key_seed: int, backend: str = "cpu", check="auto") -> str:
    return run_program(program, n=N, backend=backend, seed=seed, key_seed=key_seed, check=check).digest


@pytest.mark.parametrize(("chips", "gpus", "want"), [
    (1, None, [()]),
    (1, 3, [(0,), (1,), (2,)]),
    (2, 4, [(0, 1), (2, 3)]),
    (2, 5, [(0, 1), (2, 3)]),
    (4, 2, [(0, 1)]),
    (2, 2, [(0, 1)]),
])
def test_layout(chips, gpus, want):
    assert batch_layout(chips, gpus) == want


def test_layout_refuses_no_devices():
    with pytest.raises(ArgumentError, match="at least one device"):
        batch_layout(1, 0)


@pytest.mark.parametrize(("fixture", "gpus", "slots", "per"), [("mul2", 2, 1, 2), ("mul2", 4, 2, 2), ("rot1", 2, 2, 1)])
def test_batch_on_simulated_devices_equals_single_runs(request, fixture, gpus, slots, per):
    program = request.getfixturevalue(fixture)
    result = run_batch(program, n=N, backend="cpu-plan", seed=SEED, batch=4, gpus=gpus)
    assert [r["instance"] for r in result.records] == [0, 1, 2, 3]
    assert [r["seed"] for r in result.records] == [SEED, SEED + 1, SEED + 2, SEED + 3]
    assert all(r["passed"] is True and r["checks"] for r in result.records)  # every instance checked
    digests = [r["digest"] for r in result.records]
    assert len(set(digests)) == 4  # distinct inputs per instance
    for i, digest in enumerate(digests):
        assert digest == single_digest(program, SEED + i, SEED), f"instance {i}"
    s = result.summary
    assert (s.instances, s.slots, s.devices_per_instance, s.passed) == (4, slots, per, True)
    assert s.per_second > 0 and s.wall_s > 0
    assert {"keys", "plan"} <= set(result.timings)
    assert all({"encrypt", "run", "replay", "digest", "check"} <= set(r["timings_s"]) for r in result.records)
    assert all(len(r["devices"]) == per for r in result.records)


@pytest.mark.parametrize(("gpus", "slots"), [(2, 1), (4, 2)])
def test_a_k_chip_slot_stays_resident_and_writes_its_key_rows_once(mul2, monkeypatch, gpus, slots):
    """A 2-chip program, batch of 4 on simulated devices: each slot keeps one set of device runs
    (ResidentHost); every row write of the NumPy devices is counted: a device's key rows are
    written once (its slot's first instance), its other input rows once per instance of the slot.
    Instance i's digest is a single run's with seed S + i."""
    from collections import Counter

    import numpy as np

    from caramel.backends.numpy_backend import NumpyBackend
    from caramel.execute import pipeline
    from caramel.execute.pipeline import ResidentHost

    writes: dict[int, Counter] = {}
    real_write, real_init, made = NumpyBackend.write, ResidentHost.__init__, []

    def counting(self, rows, data):
        writes.setdefault(id(self), Counter()).update(int(r) for r in np.asarray(rows).ravel())
        return real_write(self, rows, data)

    def init(self, *a, **k):
        real_init(self, *a, **k)
        made.append(self)
    monkeypatch.setattr(NumpyBackend, "write", counting)
    monkeypatch.setattr(pipeline.ResidentHost, "__init__", init)
    result = run_batch(mul2, n=N, backend="cpu-plan", seed=SEED, batch=4, gpus=gpus)
    monkeypatch.undo()
    digests = [r["digest"] for r in result.records]
    assert digests == [single_digest(mul2, SEED + i, SEED) for i in range(4)] and len(set(digests)) == 4
    assert all(r["passed"] is True for r in result.records)
    assert len(made) == slots and sum(m.instances for m in made) == 4
    keep = key_mems(mul2)
    for slot in made:
        assert len(slot.runs) == 2  # one device per chip
        for run in slot.runs:
            counts = writes[id(run.backend)]
            key_rows = [int(r) for r, m in zip(run.init_rows, run.input_mems) if m in keep]
            other = [int(r) for r, m in zip(run.init_rows, run.input_mems) if m is not None and m not in keep]
            assert key_rows and other
            assert {counts[r] for r in key_rows} == {1}, "a key row was written again"
            assert {counts[r] for r in other} == {slot.instances}


def test_a_one_device_lane_writes_only_the_instance_rows(rot1, monkeypatch):
    """cpu-plan on one device (HostRowLane): the template (keys, the shared input x) is written once,
    each instance writes y's rows and nothing else; instance i equals a single run with x shared."""
    from collections import Counter

    import numpy as np

    from caramel.backends.numpy_backend import NumpyBackend
    from caramel.ckks.bind import requirements
    from caramel.execute import pipeline

    writes, lanes = Counter(), []
    real_write, real_init = NumpyBackend.write, pipeline.HostRowLane.__init__

    def counting(self, rows, data):
        writes.update(int(r) for r in np.asarray(rows).ravel())
        return real_write(self, rows, data)

    def init(self, *a, **k):
        real_init(self, *a, **k)
        lanes.append(self)
    monkeypatch.setattr(NumpyBackend, "write", counting)
    monkeypatch.setattr(pipeline.HostRowLane, "__init__", init)
    result = run_batch(rot1, n=N, backend="cpu-plan", seed=SEED, batch=3, shared="x")
    monkeypatch.undo()
    (lane,) = lanes
    rows = dict(zip(lane.run.input_mems, lane.run.init_rows))
    fed = {int(r) for r in lane.layout.rows}
    terms = requirements(rot1).terms
    assert {terms[m.term].name for m in lane.layout.mems} == {"y"}  # x is shared: not an instance row
    assert fed and {writes[r] for r in fed} == {1 + 3}  # the template's zeros, then once per instance
    assert {writes[int(r)] for m, r in rows.items() if m is not None and int(r) not in fed} == {1}
    assert result.shared == ("x",)
    for r in result.records:
        assert r["digest"] == run_program(rot1, n=N, backend="cpu", seed=SEED + r["instance"], key_seed=SEED,
                                          shared="x").digest


def test_keys_are_shared_and_key_seed_is_separate(rot1):
    """--key-seed K: the instances' keys come from K, their inputs from S + i."""
    result = run_batch(rot1, n=N, backend="cpu-plan", seed=SEED, key_seed=11, batch=2)
    assert [r["digest"] for r in result.records] == [single_digest(rot1, SEED + i, 11) for i in range(2)]
    assert result.records[0]["digest"] != single_digest(rot1, SEED, SEED)


def test_indices_select_a_share(mul2):
    full = run_batch(mul2, n=N, backend="cpu-plan", seed=SEED, batch=4)
    part = run_batch(mul2, n=N, backend="cpu-plan", seed=SEED, batch=4, indices=[1, 3])
    assert [r["instance"] for r in part.records] == [1, 3]
    assert [r["digest"] for r in part.records] == [full.records[1]["digest"], full.records[3]["digest"]]


def test_started_is_called_once_before_the_first_instance(rot1, monkeypatch):
    """``started`` (where process mode's ranks meet) runs after the setup and before any submission."""
    from caramel.executor import Executor

    seen = []
    submit = Executor.submit
    monkeypatch.setattr(Executor, "submit", lambda self, *a, **k: (seen.append("submit"), submit(self, *a, **k))[1])
    result = run_batch(rot1, n=N, backend="cpu-plan", seed=SEED, batch=2, started=lambda: seen.append("started"))
    assert seen == ["started", "submit", "submit"] and len(result.records) == 2


def test_reference_backend_runs_slots_as_threads(rot1):
    result = run_batch(rot1, n=N, backend="cpu", seed=SEED, batch=3, gpus=3)
    assert [r["digest"] for r in result.records] == [single_digest(rot1, SEED + i, SEED) for i in range(3)]


def test_an_instance_with_a_bad_input_fails_alone(mul2):
    """Stacked user inputs where instance 1's x does not fit its modulus: instance 1 fails (named, with
    the reason), the three others finish with their outputs and their single runs' digests."""
    import numpy as np

    rng = np.random.default_rng(1)
    x, y = rng.uniform(-1, 1, (4, N // 2)), rng.uniform(-1, 1, (4, N // 2))
    x[1, 3] = 1e30
    result = run_batch(mul2, n=N, backend="cpu-plan", seed=SEED, batch=4, inputs={"x": x, "y": y}, outputs=True)
    assert list(result.failed) == [1] and "does not fit" in result.failed[1]
    assert [r["instance"] for r in result.records] == [0, 2, 3] and not result.passed
    for inst in result.instances:
        single = run_program(mul2, n=N, backend="cpu", seed=SEED + inst.index, key_seed=SEED,
                             inputs={"x": x[inst.index], "y": y[inst.index]})
        assert inst.digest == single.digest and inst.outputs["z"].shape == (N // 2,)


def _interrupt_after(monkeypatch, finished: int):
    """Make run_batch's wait for its instances raise KeyboardInterrupt (a Ctrl-C) once ``finished``
    instances are done; until then the preparation of any later instance waits (so that some are
    still to start when the interrupt comes)."""
    import concurrent.futures as cf
    import threading

    import caramel.executor as executor_mod

    real, seen, go = cf.wait, set(), threading.Event()
    real_draw = executor_mod.draw_inputs

    def wait(fs, timeout=None, return_when=cf.ALL_COMPLETED):
        done, pending = real(fs, timeout, return_when)
        seen.update(done)
        if len(seen) >= finished:
            go.set()
            raise KeyboardInterrupt
        return done, pending

    calls, lock = [], threading.Lock()

    def draw(plan, secrets, rng, names, supplied=None):
        with lock:
            calls.append(1)
            later = len(calls) > finished
        if later:
            go.wait(60)
        return real_draw(plan, secrets, rng, names, supplied)
    monkeypatch.setattr(cf, "wait", wait)
    monkeypatch.setattr(executor_mod, "draw_inputs", draw)


def test_an_interrupted_batch_keeps_what_finished(rot1, monkeypatch):
    """Ctrl-C while a batch of 6 runs (one instance prepared at a time): the instances that finished
    (and those started, which finish) are returned with their outputs; the others are cancelled."""
    _interrupt_after(monkeypatch, 2)
    result = run_batch(rot1, n=N, backend="cpu-plan", seed=SEED, batch=6, outputs=True, workers=1)
    monkeypatch.undo()
    done = [x.index for x in result.instances]
    assert result.interrupted and not result.passed and not result.failed
    assert 2 <= len(done) < 6 and done[:2] == [0, 1]
    for x in result.instances:
        assert x.digest == single_digest(rot1, SEED + x.index, SEED) and x.outputs["z"].shape == (N // 2,)


def test_cli_interrupted_batch_prints_and_saves_what_finished(tmp_path, rot1, monkeypatch, capsys):
    import numpy as np

    _interrupt_after(monkeypatch, 2)
    monkeypatch.setattr("caramel.cores.available", lambda: 2)  # one instance prepared at a time, as on a small machine
    out = tmp_path / "o.npz"
    code = main(["run", str(ROT1), "--n", str(N), "--backend", "cpu-plan", "--batch", "6", "--seed", str(SEED), "-q",
                 "--save-outputs", str(out)])
    monkeypatch.undo()
    text = capsys.readouterr()
    assert code == 130 and "caramel: interrupted:" in text.err and "instance(s) finished" in text.err
    lines = [line for line in text.out.splitlines() if line.startswith("instance ")]
    assert 2 <= len(lines) < 6
    with np.load(out) as data:
        assert data["z"].shape[-1] == N // 2 and (data["z"].ndim == 1 or data["z"].shape[0] == len(lines))


def test_cli_batch_with_a_bad_instance_exits_2_and_keeps_the_others(tmp_path, mul2, capsys):
    import numpy as np

    rng = np.random.default_rng(2)
    x, y = rng.uniform(-1, 1, (3, N // 2)), rng.uniform(-1, 1, (3, N // 2))
    x[2, 0] = 1e30
    np.savez(tmp_path / "in.npz", x=x, y=y)
    out, record = tmp_path / "o.npz", tmp_path / "r.json"
    code = main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--batch", "3", "-q", "--inputs",
                 str(tmp_path / "in.npz"), "--save-outputs", str(out), "--json", str(record)])
    text = capsys.readouterr()
    assert code == 2 and "instance 2: FAILED: CheckError" in text.out and "1 instance(s) failed" in text.err
    assert sum(line.startswith("instance ") and "PASS" in line for line in text.out.splitlines()) == 2
    with np.load(out) as data:
        assert data["z"].shape == (2, N // 2)
    doc = json.loads(record.read_text())
    assert [f["instance"] for f in doc["failed"]] == [2] and len(doc["instances"]) == 2


def test_instance_line_names_verdicts_and_digest(mul2):
    record = run_batch(mul2, n=N, backend="cpu-plan", seed=SEED, batch=1).records[0]
    line = instance_line(record)
    assert line.startswith("instance 0 (seed 5") and "PASS z" in line and record["digest"] in line


def test_cli_batch_prints_one_line_per_instance_and_a_summary(tmp_path, mul2, capsys):
    out = tmp_path / "r.json"
    code = main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--batch", "4", "--gpus", "2", "--seed",
                 str(SEED), "-q", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    lines = [line for line in text.splitlines() if line.startswith("instance ")]
    assert len(lines) == 4 and all("PASS" in line for line in lines)
    assert "batch: 4 instances" in text and "instances/s" in text and "time: load" in text
    doc = json.loads(out.read_text())
    assert doc["kind"] == "batch" and doc["batch"] == 4 and len(doc["instances"]) == 4
    assert doc["summary"]["passed"] is True and "environment" in doc
    assert doc["instances"][2]["digest"] == single_digest(mul2, SEED + 2, SEED)


def test_cli_single_run_with_key_seed_matches_the_batch(mul2, capsys):
    assert main(["run", str(MUL2), "--n", str(N), "--backend", "cpu", "--seed", str(SEED + 3), "--key-seed", str(SEED),
                 "-q"]) == 0
    text = capsys.readouterr().out
    assert f"output digest (sha256): {single_digest(mul2, SEED + 3, SEED)}" in text
    assert "time: load" in text and "keys" in text


@pytest.mark.parametrize("program", [MUL2, ROT1])
def test_batch_in_two_processes(program, tmp_path):
    """`caramel launch --nproc 2 -- run ... --batch 4`: each process its share (i % 2), rank 0 prints all."""
    loaded = load_program(program, progress=False)
    out, record = tmp_path / "o.npz", tmp_path / "r.json"
    have = caramel_cli("launch", "--nproc", "2", "--", "run", str(program), "--n", str(N), "--backend", "cpu-plan",
                       "--batch", "4", "--seed", str(SEED), "-q", "--save-outputs", str(out), "--json", str(record),
                       env={"CARAMEL_PROGRESS": "0"})
    assert have.returncode == 0, have.stderr[-3000:]
    lines = [line for line in have.stdout.splitlines() if line.startswith("instance ")]
    assert len(lines) == 4 and all("PASS" in line for line in lines)
    assert "in 2 processes" in have.stdout
    assert all("rank 1" in lines[i] for i in (1, 3)) and not any("rank" in lines[i] for i in (0, 2))
    for i, line in enumerate(lines):
        assert line.endswith(single_digest(loaded, SEED + i, SEED)), line
    import numpy as np

    local = run_batch(loaded, n=N, backend="cpu-plan", seed=SEED, batch=4, outputs=True)
    with np.load(out) as data:
        assert data["z"].shape == (4, N // 2)  # gathered in instance order
        assert all(np.array_equal(data["z"][i], x.outputs["z"]) for i, x in enumerate(local.instances))
    doc = json.loads(record.read_text())
    assert [r["instance"] for r in doc["instances"]] == [0, 1, 2, 3] and [r["rank"] for r in doc["instances"]] == [0, 1, 0, 1]
    assert doc["summary"]["processes"] == 2 and doc["summary"]["passed"] is True
    assert doc["devices"] == 2  # one device per rank, counted once


def test_batch_in_two_processes_reads_the_key_store(tmp_path):
    """`caramel launch --nproc 2 -- run ... --batch 4 --keys DIR`: each rank reads the store; the digests are the
    one-process batch's with the same store (and its key seed's single runs)."""
    keys, record = tmp_path / "keys", tmp_path / "r.json"
    assert main(["keys", str(ROT1), "--n", str(N), "--seed", "11", "--out", str(keys), "-q"]) == 0
    have = caramel_cli("launch", "--nproc", "2", "--", "run", str(ROT1), "--n", str(N), "--backend", "cpu-plan",
                       "--batch", "4", "--seed", str(SEED), "--keys", str(keys), "-q", "--json", str(record),
                       env={"CARAMEL_PROGRESS": "0"})
    assert have.returncode == 0, have.stderr[-3000:]
    doc = json.loads(record.read_text())
    assert doc["key_seed"] == 11 and doc["summary"]["processes"] == 2
    local = run_batch(load_program(ROT1, progress=False), n=N, backend="cpu-plan", seed=SEED, key_seed=11, batch=4)
    assert [r["digest"] for r in doc["instances"]] == [r["digest"] for r in local.records]
    assert doc["instances"][1]["digest"] == single_digest(load_program(ROT1, progress=False), SEED + 1, 11)


def test_keys_without_batch_in_process_mode_are_refused(tmp_path, capsys):
    assert main(["keys", str(MUL2), "--n", str(N), "--out", str(tmp_path / "k"), "-q"]) == 0
    code = main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--distributed", "--keys",
                 str(tmp_path / "k"), "-q"])
    assert code == 2 and "--keys goes with --batch in process mode" in capsys.readouterr().err


def test_batch_in_process_mode_removes_its_files(tmp_path):
    """Ranks started as torchrun would start them (RANK, WORLD_SIZE, a rendezvous path that no
    launcher removes): once rank 0 has gathered the records and outputs, none of the run's files is
    left beside the rendezvous path."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "PYTHONPATH": str(REPO), "WORLD_SIZE": "2", "CARAMEL_PROGRESS": "0",
           "CARAMEL_RENDEZVOUS": str(tmp_path / "rdv.json"), "CARAMEL_RUN_ID": "batch-files"}
    out = tmp_path / "saved" / "o.npz"
    out.parent.mkdir()
    ranks = [subprocess.Popen([sys.executable, "-m", "caramel.cli", "run", str(MUL2), "--n", str(N), "--backend",
                               "cpu-plan", "--batch", "2", "--distributed", "-q", "--save-outputs", str(out)],
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(2)]
    done = [rank.communicate(timeout=300) for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], done
    assert out.exists() and [p.name for p in tmp_path.iterdir()] == ["saved"]


def test_batch_of_one_process_mode_without_launcher_is_refused(capsys):
    code = main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--batch", "2", "--distributed", "-q"])
    assert code == 2 and "--distributed needs" in capsys.readouterr().err


def test_user_data_options_need_batch_in_process_mode(capsys):
    code = main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--distributed", "--json", "x.json", "-q"])
    assert code == 2 and "go with --batch in process mode" in capsys.readouterr().err


def test_throughput_on_simulated_devices(rot1):
    points = measure_throughput(rot1, [1, 2], n=N, backend="cpu-plan", rounds=1)
    assert [p.gpus for p in points] == [1, 2] and [p.instances for p in points] == [1, 2]
    assert points[0].speedup == pytest.approx(1.0) and all(p.per_second > 0 for p in points)
    assert points[1].efficiency == pytest.approx(points[1].speedup / 2)
    assert points[0].digest == single_digest(rot1, 0, 0, check=None)  # random inputs, no check file


def test_cli_shared_batch_equals_single_runs_with_shared(rot1, capsys):
    """`caramel run --batch 3 --shared x`: instance i's digest is that of `caramel run --seed S+i --key-seed S
    --shared x`; the header names the shared input."""
    assert main(["run", str(ROT1), "--n", str(N), "--backend", "cpu-plan", "--batch", "3", "--seed", str(SEED),
                 "--shared", "x", "-q"]) == 0
    text = capsys.readouterr().out
    assert "shared x)" in text
    lines = [line for line in text.splitlines() if line.startswith("instance ")]
    for i, line in enumerate(lines):
        assert main(["run", str(ROT1), "--n", str(N), "--backend", "cpu", "--seed", str(SEED + i), "--key-seed",
                     str(SEED), "--shared", "x", "-q"]) == 0
        single = capsys.readouterr().out
        digest = next(s.split()[-1] for s in single.splitlines() if s.startswith("output digest"))
        assert line.endswith(digest) and "PASS" in line
    assert main(["run", str(ROT1), "--n", str(N), "--backend", "cpu-plan", "--batch", "2", "--shared", "w", "-q"]) == 2
    assert "'w' names no input" in capsys.readouterr().err


def test_shared_without_batch_in_process_mode_is_refused(capsys):
    code = main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--distributed", "--shared", "x", "-q"])
    assert code == 2 and "--shared goes with --batch in process mode" in capsys.readouterr().err


def test_throughput_without_one_device_has_no_speedup(rot1):
    (point,) = measure_throughput(rot1, [2], n=N, backend="cpu-plan", rounds=1)
    assert point.per_second > 0 and point.speedup is None and point.efficiency is None


@pytest.mark.parametrize(("extra", "fuse"), [([], True), (["--fusion", "off"], False)])
def test_a_batch_fuses_unless_told_otherwise(fresh_cache, monkeypatch, capsys, extra, fuse):
    """``caramel run --batch`` replays the fused plan by default, even on a fresh cache (``--fusion on``: the batch
    repays the fused kernels' compile); ``--fusion off`` is one kernel per instruction."""
    import caramel.plan_cache as plan_cache

    asked, real = [], plan_cache.cached_plan

    def spy(*args, **kwargs):
        asked.append(kwargs.get("fuse", True))
        return real(*args, **kwargs)

    monkeypatch.setattr(plan_cache, "cached_plan", spy)
    assert main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--batch", "2", "--no-check", "-q",
                 *extra]) == 0
    assert asked == [fuse]
    capsys.readouterr()
