"""Program-level parallelism on the CPU (:mod:`caramel.batch`): a batch on simulated devices, in
processes, and the throughput profile; instance i equals a single run with seed S + i and key seed S."""

from __future__ import annotations

import json

import pytest

from caramel.api import run_program
from caramel.batch import BatchError, batch_layout, instance_line, key_mems, measure_throughput, run_batch
from caramel.cli import main
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
    with pytest.raises(BatchError):
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
    assert all({"encrypt", "run", "check"} <= set(r["timings_s"]) for r in result.records)
    assert all(len(r["devices"]) == per for r in result.records)


@pytest.mark.parametrize(("gpus", "slots"), [(2, 1), (4, 2)])
def test_a_k_chip_slot_stays_resident_and_writes_its_key_rows_once(mul2, monkeypatch, gpus, slots):
    """A 2-chip program, batch of 4 on simulated devices: each slot keeps one set of device runs
    (ResidentHost); every row write of the NumPy devices is counted: a device's key rows are
    written once (its slot's first instance), its other input rows once per instance of the slot.
    Instance i's digest is a single run's with seed S + i."""
    from collections import Counter

    import numpy as np

    import caramel.batch as batch_mod
    from caramel.backends.numpy_backend import NumpyBackend
    from caramel.batch import ResidentHost

    writes: dict[int, Counter] = {}
    real_write, real_slots, made = NumpyBackend.write, batch_mod.slot_runners, []

    def counting(self, rows, data):
        writes.setdefault(id(self), Counter()).update(int(r) for r in np.asarray(rows).ravel())
        return real_write(self, rows, data)

    def slot_runners(*a, **k):
        made.extend(real_slots(*a, **k))
        return list(made)
    monkeypatch.setattr(NumpyBackend, "write", counting)
    monkeypatch.setattr(batch_mod, "slot_runners", slot_runners)
    result = run_batch(mul2, n=N, backend="cpu-plan", seed=SEED, batch=4, gpus=gpus)
    monkeypatch.undo()
    digests = [r["digest"] for r in result.records]
    assert digests == [single_digest(mul2, SEED + i, SEED) for i in range(4)] and len(set(digests)) == 4
    assert all(r["passed"] is True for r in result.records)
    assert len(made) == slots and all(isinstance(m, ResidentHost) for m in made)
    assert sum(m.instances for m in made) == 4
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


def test_reference_backend_runs_slots_as_threads(rot1):
    result = run_batch(rot1, n=N, backend="cpu", seed=SEED, batch=3, gpus=3)
    assert [r["digest"] for r in result.records] == [single_digest(rot1, SEED + i, SEED) for i in range(3)]


def test_an_error_in_one_instance_is_raised(mul2, monkeypatch):
    import caramel.api as api
    import caramel.ckks.check as check

    real = api.prepare_inputs  # where each instance's inputs are prepared
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise check.CheckError("boom")
        return real(*a, **k)
    monkeypatch.setattr(api, "prepare_inputs", failing)
    with pytest.raises(check.CheckError, match="boom"):
        run_batch(mul2, n=N, backend="cpu-plan", seed=SEED, batch=4, gpus=2)


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
    assert main(["profile", str(ROT1), "--n", "256", "--throughput", "-q"]) == 2
    assert "--throughput goes with --gpus" in capsys.readouterr().err


def test_throughput_on_simulated_devices(rot1):
    points = measure_throughput(rot1, [1, 2], n=N, backend="cpu-plan", rounds=1)
    assert [p.gpus for p in points] == [1, 2] and [p.instances for p in points] == [1, 2]
    assert points[0].speedup == pytest.approx(1.0) and all(p.per_second > 0 for p in points)
    assert points[1].efficiency == pytest.approx(points[1].speedup / 2)
    assert points[0].digest == single_digest(rot1, 0, 0, check=None)  # random inputs, no check file


class _FakeCupy:
    """Just enough of CuPy for the GPU slot logic: ``cuda.Device(d)`` as a per-thread current device."""

    def __init__(self):
        import threading
        import types

        current = self.current = threading.local()

        class Device:
            def __init__(self, d):
                self.d = d

            def __enter__(self):
                self.prev = getattr(current, "d", 0)
                current.d = self.d

            def __exit__(self, *exc):
                current.d = self.prev

        self.module = types.ModuleType("cupy")
        self.module.cuda = types.SimpleNamespace(Device=Device)

    def device(self) -> int:
        return getattr(self.current, "d", 0)


@pytest.fixture
def fake_gpu(monkeypatch):
    """The GPU paths of caramel.batch and caramel.api.executor with CuPy faked: the 1-chip executor
    and MultiGpuRun are replaced by the plan engine / simulated devices, recording the CUDA devices
    each instance runs on."""
    import sys

    import caramel.api as api
    import caramel.execute.cuda_graph as gpu
    from caramel.execute.drive import run_on_devices, run_plan
    from caramel.plan import Plan, build_plan

    fake = _FakeCupy()
    seen: _Seen = _Seen()
    monkeypatch.setitem(sys.modules, "cupy", fake.module)
    monkeypatch.setattr(api, "gpu_available", lambda: True)

    def gpu_executor(program, ctx, mode, *, graph=True, streams=4):
        plan = program if isinstance(program, Plan) else build_plan(program)

        def run(memory):
            seen.append((fake.device(),))
            return run_plan(plan, ctx, memory, mode)
        return run

    class MultiGpuRun:
        """Resident on ``device_ids``: built once per slot, rebound for every later instance."""

        made: list["MultiGpuRun"] = []

        def __init__(self, plan, ctx, memory, mode, gpus=None, *, device_ids=None, streams=None, **kw):
            assert device_ids is not None and len(device_ids) == gpus
            self.plan, self.ctx, self.memory, self.mode, self.gpus = plan, ctx, memory, mode, gpus
            self.device_ids, self.rebinds, self.closed = tuple(device_ids), [], False
            MultiGpuRun.made.append(self)

        def rebind(self, memory, keep=frozenset()):
            self.rebinds.append(keep)
            self.memory = memory

        def replay(self, repeats=1):
            seen.append(self.device_ids)
            self.result_ = run_on_devices(self.plan, self.ctx, self.memory, self.mode, self.gpus)

        def result(self):
            return self.result_

        def close(self, failed=False):
            self.closed = True

    monkeypatch.setattr(gpu, "gpu_executor", gpu_executor)
    monkeypatch.setattr(gpu, "resident_executor",
                        lambda plan, ctx, mode, *, streams=4, keep=frozenset(): gpu_executor(plan, ctx, mode))
    monkeypatch.setattr(gpu, "MultiGpuRun", MultiGpuRun)
    seen.multi = MultiGpuRun.made
    return seen


class _Seen(list):
    """The CUDA devices of each instance (and ``multi``: the fake MultiGpuRuns made)."""


def test_batch_places_gpu_slots_on_their_devices_under_a_fake_cupy(fake_gpu, rot1, mul2):
    """Where the GPU batch puts its instances, with a fake CuPy (the work runs on the CPU plan
    engine; tests/execute/test_gpu.py and test_multi_gpu.py run the real thing on a GPU). 1-chip:
    one instance per device, each under cupy.cuda.Device(d); 2-chip on 4 GPUs: two instances at
    once on devices (0, 1) and (2, 3). Digests as the CPU's single runs."""
    result = run_batch(rot1, n=N, backend="gpu", seed=SEED, batch=4, gpus=3, device="cpu")  # fake CuPy: client on the host
    assert set(fake_gpu) <= {(0,), (1,), (2,)}
    # every instance ran under the CUDA device of its slot
    assert sorted(fake_gpu) == sorted(tuple(r["devices"]) for r in result.records)
    for r in result.records:
        assert tuple(r["devices"]) in {(0,), (1,), (2,)}
        assert r["digest"] == single_digest(rot1, SEED + r["instance"], SEED)
    assert len(fake_gpu) == 4
    fake_gpu.clear()
    result = run_batch(mul2, n=N, backend="gpu", seed=SEED, batch=4, gpus=4, device="cpu")
    assert set(fake_gpu) <= {(0, 1), (2, 3)} and len(fake_gpu) == 4
    assert sorted(fake_gpu) == sorted(tuple(r["devices"]) for r in result.records)
    assert all(tuple(r["devices"]) in {(0, 1), (2, 3)} for r in result.records)
    assert [r["digest"] for r in result.records] == [single_digest(mul2, SEED + i, SEED) for i in range(4)]
    # resident: one MultiGpuRun per slot, rebound (keys kept) for its later instances, closed at the end
    made = fake_gpu.multi
    assert sorted(m.device_ids for m in made) == [(0, 1), (2, 3)]
    assert sum(1 + len(m.rebinds) for m in made) == 4 and all(m.closed for m in made)
    assert all(keep == key_mems(mul2) and keep for m in made for keep in m.rebinds)


def test_batch_process_share_picks_local_rank_under_a_fake_cupy(fake_gpu, mul2, rot1):
    """Process mode on the GPU, with a fake CuPy (the work runs on the CPU): the rank's instances
    under its CUDA device LOCAL_RANK (a K-chip program with its chips merged there)."""
    for program, want in ((rot1, (3,)), (mul2, (3,))):
        fake_gpu.clear()
        result = run_batch(program, n=N, backend="gpu", seed=SEED, batch=4, gpus=1, devices=[3], indices=[1, 3],
                           device="cpu")
        assert set(fake_gpu) == {want} and [r["instance"] for r in result.records] == [1, 3]
        assert [r["digest"] for r in result.records] == [single_digest(program, SEED + i, SEED) for i in (1, 3)]


def test_key_seed_for():
    from caramel.api import key_seed_for

    assert key_seed_for(5, None) == 5 and key_seed_for(5, 11) == 11 and key_seed_for(5, 0) == 0


@pytest.mark.parametrize("extra", [[], ["--batch", "2", "--gpus", "2"]], ids=["run", "batch"])
def test_cli_json_dash_writes_the_record_alone_on_stdout(extra, mul2, capsys):
    """`run --json -`: stdout is the JSON record alone (parseable), the text goes to stderr."""
    code = main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--seed", str(SEED), "-q", "--json", "-",
                 *extra])
    out, err = capsys.readouterr()
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == ("batch" if extra else "run") and "environment" in doc
    assert "output digest" in err or "batch: 2 instances" in err
    want = single_digest(mul2, SEED, SEED)
    assert (doc["instances"][0]["digest"] if extra else doc["digest"]) == want
    assert "results:" not in out + err


def test_cli_profile_json_dash(capsys):
    code = main(["profile", str(ROT1), "--n", "256", "--backend", "cpu-plan", "--repeats", "1", "--warmup", "0", "-q",
                 "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 0
    doc = json.loads(out)
    assert doc["program"] == "MulRotate_4L_1c" and doc["variants"] and "eager" in err
