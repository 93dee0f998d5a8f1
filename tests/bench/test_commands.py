"""Every entry point of ``python -m bench`` answers ``--help``, and those that run on the CPU run at a small N on the
NumPy plan engine (``--backend cpu-plan``) and write a record with no failed check: the laboratory cannot rot unseen.
GPU figures are the device's; here only the commands' plumbing, digests and checks are tested."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from bench.__main__ import COMMANDS
from tests.conftest import REPO


def bench(*args, cwd=REPO, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("OUT", None)
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=timeout)


def record(tmp_path, *args) -> dict:
    """Run a command with ``--json``; its record, after asserting exit status 0 and no failed check."""
    path = tmp_path / "record.json"
    r = bench(*args, "--json", str(path))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    doc = json.loads(path.read_text())
    assert doc["failures"] == [] and doc["figures"], doc
    assert doc["command"].startswith("python -m bench ") and doc["commit"] and doc["date"] and doc["device"]
    return doc


def whats(doc: dict) -> dict[str, object]:
    return {f["what"]: f["value"] for f in doc["figures"]}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help(name):
    r = bench(name, "--help")
    if (REPO / "bench" / f"{name}.py").exists():
        assert r.returncode == 0 and "usage: python -m bench" in r.stdout, r.stderr
    else:  # a command whose module another change brings
        assert r.returncode == 2 and f"bench {name}: not in this tree" in r.stderr


def test_the_list_and_an_unknown_command():
    r = bench()
    assert r.returncode == 2 and all(name in r.stdout for name in COMMANDS)
    r = bench("nosuch")
    assert r.returncode == 2 and "unknown command 'nosuch'" in r.stderr


def test_replay(tmp_path):
    doc = record(tmp_path, "replay", "--backend", "cpu-plan", "--program", "programs/MulRotate_4L_1c", "--n", "1024",
                 "--repeats", "1", "--unfused", "--plan", "", "--plan", "max_outputs=1")
    got = whats(doc)
    assert got["digest of plan engine, 4 streams [plan max_outputs=1] = reference"] == "ok"
    assert got["digest of eager unfused = reference"] == "ok" and "reference digest" in got
    timed = [f for f in doc["figures"] if f["unit"] == "ms"]
    assert len(timed) == 6 and all(f["value"] > 0 and f["min"] <= f["max"] for f in timed)


def test_kernels(tmp_path):
    doc = record(tmp_path, "kernels", "--backend", "cpu-plan", "--check-n", "1024", "--n", "1024", "--rows", "4",
                 "--ntt-rows", "4", "--epilogue-rows", "2", "--repeats", "1", "--conversions", "13x50x1",
                 "--epilogues", "2x13x2")
    got = whats(doc)
    assert got["every kernel at N=1024 = CPU reference, limb for limb"] == "ok"
    assert got["ntt R=4"] > 0 and got["epilogue 2x13x2 R=2 half NTT + epilogue"] > 0
    assert "conversion 13 -> 50, B=1, emulator" in got and "NTT with a baseconv load R=4" in got


def test_corpus(tmp_path):
    doc = record(tmp_path, "corpus", str(REPO / "programs"), "--backend", "cpu-plan", "--sizes", "1024",
                 "--pattern", "Mul_4L_*c", "--workers", "1")
    got = whats(doc)
    assert got["corpus exact: program runs"] == 3 and got["corpus exact: plan engine = CPU reference, limb for limb"] \
        == "ok"


def test_roofline_records_every_kernel(tmp_path):
    doc = record(tmp_path, "roofline", "--backend", "cpu-plan", "--program", "programs/MulRotate_4L_1c", "--n",
                 "1024", "--repeats", "1")
    assert whats(doc)["the variants' digests agree"] == "ok" and "kind total" in whats(doc)
    assert doc["kernels"] and {"index", "kind", "rows", "dur_ms"} <= set(doc["kernels"][0])


def test_multi_on_host_devices(tmp_path):
    doc = record(tmp_path, "multi", "--backend", "cpu-plan", "--parts", "checks,scaling", "--corpus",
                 str(REPO / "programs"), "--pattern", "Mul_4L_*c", "--family", "programs/Mul_4L", "--gpus", "1,2",
                 "--n", "1024", "--repeats", "1", "--workers", "1", "--out", str(tmp_path / "out"))
    got = whats(doc)
    assert got["multi-chip programs run"] == 4  # Mul_4L_2c and _4c, each on 1 and 2 devices (--gpus: at most 2)
    assert got["scaling Mul_4L_2c on 2 devices"] > 0 and (tmp_path / "out" / "scaling.txt").exists()
    assert bench("multi", "--backend", "cpu-plan", "--parts", "probe").returncode == 2  # NCCL needs GPUs


def test_client_on_the_cpu(tmp_path):
    doc = record(tmp_path, "client", "--backend", "cpu-plan", "--parts", "big,runs", "--program",
                 "programs/Mul_4L_1c", "--n", "1024", "--runs", "1")
    got = whats(doc)
    assert got["keys loaded on the host = generated keys"] == "ok" and got["every caramel run's digest agrees"] == "ok"
    assert got["caramel run, --keys 1: phases"] > 0


def test_cpu_parts(tmp_path):
    store = tmp_path / "digests.json"
    doc = record(tmp_path, "cpu", "load", "plan", "fusion", "accuracy", "client", "digests", "--program",
                 "programs/Mul_4L_2c", "--n", "1024", "--repeats", "1", "--modes", "exact", "--store", str(store))
    got = whats(doc)
    assert got["Mul_4L_2c cached"] > 0 and got["keys loaded = generated keys"] == "ok"
    assert got["Mul_4L_2c exact z: largest error"] > 10
    assert json.loads(store.read_text()) == {"Mul_4L_2c N=1024 exact": got["Mul_4L_2c N=1024 exact"]}
    doc = record(tmp_path, "cpu", "digests", "--program", "programs/Mul_4L_2c", "--n", "1024", "--store", str(store))
    assert whats(doc)["Mul_4L_2c N=1024 exact: the same as the stored one"] == "ok"


def test_all_runs_its_steps(tmp_path):
    out = tmp_path / "out"
    r = bench("all", "--backend", "cpu-plan", "--steps", "replay,kernels", "--program", "programs/Mul_4L_1c", "--n",
              "1024", "--out", str(out), "--replay-args", "--repeats 1 --streams 1", "--kernels-args",
              "--check-n 1024 --rows 4 --ntt-rows 4 --repeats 1 --only ntt,mod")
    assert r.returncode == 0, r.stdout[-3000:]
    assert "=== summary" in r.stdout and "replay     rc=0" in r.stdout and "kernels    rc=0" in r.stdout
    assert json.loads((out / "replay.json").read_text())["failures"] == []


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_ab_in_one_call(tmp_path):
    """``--base``: the same command on an earlier tree's caramel and on this one, in turn, with this tree's harness."""
    base = tmp_path / "repo"
    shutil.copytree(REPO / "caramel", base / "caramel", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "programs", base / "programs")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (("init", "-q"), ("add", "-A"), ("commit", "-qm", "base")):
        subprocess.run(["git", *args], cwd=base, check=True, capture_output=True, env=env)
    assert bench("ab", "prepare", "HEAD", cwd=base).returncode == 0
    path = tmp_path / "ab.json"
    r = bench("replay", "--backend", "cpu-plan", "--program", "programs/Mul_4L_1c", "--n", "1024", "--repeats", "1",
              "--streams", "1", "--base", str(base / ".ab"), "--rounds", "1", "--json", str(path))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    doc = json.loads(path.read_text())
    assert [run["label"] for run in doc["runs"]] == ["this tree #1", "base .ab #1"]
    rev = (base / ".ab" / ".rev").read_text().strip()
    assert doc["runs"][1]["commit"] == rev and doc["runs"][0]["commit"] != rev
    assert all(run["failures"] == [] for run in doc["runs"])
    assert f"| base .ab #1 ({rev}) |" in r.stdout


def test_draw(tmp_path):
    doc = record(tmp_path, "draw", "--program", "programs/MulRotate_4L_1c", "--n", "1024", "--client", "host",
                 "--instances", "2", "--workers", "1,2")
    got = whats(doc)
    assert got["wall per instance, one at a time"] > 0 and got["CPU per instance, one at a time (every thread)"] > 0
    assert got["instances per second, 1 threads at once"] > 0 and got["instances per second, 2 threads at once"] > 0
