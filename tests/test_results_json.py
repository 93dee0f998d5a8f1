"""Results a program can read (:mod:`caramel.results`): ``caramel run --json`` and ``caramel profile
--json`` (also with ``--gpus ... --throughput``), strict JSON, atomic writes."""

from __future__ import annotations

import json
import math

import pytest

from caramel.api import run_program
from caramel.cli import main
from caramel.outfiles import OutputError
from caramel.parse import load_program
from caramel.results import (
    PHASES, Timings, check_record, document, environment, run_record, timings_line, write_json,
)

from tests.conftest import REPO, SHARED_PROGRAMS

MUL2 = REPO / "programs" / "Mul_4L_2c"
ROT1 = REPO / "programs" / "MulRotate_4L_1c"
N = 1024


def strict(path):
    """Parse ``path`` refusing NaN/Infinity (what strict JSON readers do)."""
    def refuse(token):
        raise ValueError(f"non-standard JSON number {token}")
    return json.loads(path.read_text(), parse_constant=refuse)


def test_run_json_has_every_field(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", str(MUL2), "--n", str(N), "--backend", "cpu-plan", "--seed", "3", "--key-seed", "4", "-q",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    doc = strict(out)
    assert doc["kind"] == "run" and doc["program"] == "Mul_4L_2c" and doc["n"] == N
    assert (doc["mode"], doc["backend"], doc["devices"], doc["seed"], doc["key_seed"]) == ("exact", "cpu-plan", 1, 3, 4)
    assert doc["digest"] in text and len(doc["digest"]) == 64
    assert doc["passed"] is True
    z = doc["checks"]["z"]
    assert z["verdict"] == "PASS" and z["precision_bits"] >= z["tolerance_bits"] and z["median_bits"] >= z["precision_bits"]
    assert set(doc["timings_s"]) == {"load", "keys", "encrypt", "plan", "run", "check"}
    assert all(v >= 0 for v in doc["timings_s"].values())
    env = doc["environment"]
    assert {"caramel", "python", "numpy", "cupy", "cuda", "nccl", "gpus"} <= set(env)
    line = [ln for ln in text.splitlines() if ln.startswith("time: ")]
    assert line and all(p in line[0] for p in ("load", "keys", "encrypt", "run", "check"))


def test_a_single_run_fuses_once_its_fused_plan_is_cached(fresh_cache, tmp_path, capsys):
    """``caramel run`` without ``--batch`` takes ``--fusion auto``: one kernel per instruction until a fused run has
    cached the fused plan, then fused; ``--fusion off`` is off; the reference has no plan. The run's line and JSON say
    which, and the digest is the same every time."""
    seen = []
    for extra in (["--backend", "cpu-plan"], ["--backend", "cpu-plan", "--fusion", "on"], ["--backend", "cpu-plan"],
                  ["--backend", "cpu-plan", "--fusion", "off"], ["--backend", "cpu"]):
        out = tmp_path / f"run{len(seen)}.json"
        assert main(["run", str(MUL2), "--n", str(N), "--no-check", "-q", "--json", str(out), *extra]) == 0
        doc, text = strict(out), capsys.readouterr().out
        seen.append((doc["fused"], "device(s), fused kernels: ran" in text,
                     "device(s), one kernel per instruction: ran" in text, doc["digest"]))
    assert [s[:3] for s in seen] == [(False, False, True), (True, True, False), (True, True, False),
                                     (False, False, True), (None, False, False)]
    assert len({s[3] for s in seen}) == 1


def test_json_of_a_failed_check_and_exit_code(tmp_path):
    """A check that fails still writes the record, verdict FAIL, and the command exits 1."""
    check = tmp_path / "wrong.toml"
    check.write_text((REPO / "programs" / "checks" / "Mul.toml").read_text().replace('formula = "x * y"',
                                                                                      'formula = "x * y + 1"'))
    out = tmp_path / "r.json"
    assert main(["run", str(MUL2), "--n", str(N), "--backend", "cpu", "-q", "--check", str(check), "--json",
                 str(out)]) == 1
    doc = strict(out)
    assert doc["passed"] is False and doc["checks"]["z"]["verdict"] == "FAIL"


def test_check_record_writes_infinities_as_strings():
    from caramel.ckks.check import CheckReport, OutputResult

    r = OutputResult("z", math.inf, math.inf, 0.0, 0.0, 10.0, True, 2.0**28, (0, 1))
    record = check_record(CheckReport("c", "exact", N, {}, {"z": r}))
    assert record["z"]["precision_bits"] == "inf" and record["z"]["max_error"] == 0.0
    assert check_record(None) == {}


def test_run_record_from_the_api():
    program = load_program(ROT1, progress=False)
    outcome = run_program(program, n=N, backend="cpu", seed=1)
    assert set(outcome.timings) == {"keys", "encrypt", "plan", "run", "check"}
    record = run_record(outcome, outcome.timings, gpus=1, seed=1, key_seed=1)
    assert record["digest"] == outcome.digest and record["checks"]["z"]["verdict"] == "PASS"
    doc = document("run", record, env={"caramel": "x"})
    assert doc["environment"] == {"caramel": "x"} and doc["caramel"] == 1


def test_timings_and_line_keep_phase_order():
    t = Timings()
    with t.phase("run"):
        pass
    t.add("keys", 1.5)
    t.add("load", 0.25)
    assert list(t.as_dict()) == ["load", "keys", "run"]
    assert timings_line({"run": 1.0, "load": 0.5}) == "time: load 0.50 s, run 1.00 s"
    assert PHASES[0] == "load" and PHASES[-1] == "check"


def test_environment_without_a_gpu_is_complete():
    env = environment(probe_gpu=False)
    assert env["numpy"] and env["caramel"] and env["cupy"] is None and env["gpus"] == []


def test_write_json_is_strict_atomic_and_refuses_links(tmp_path):
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json(tmp_path / "nan.json", {"x": math.nan})
    assert not (tmp_path / "nan.json").exists() and list(tmp_path.iterdir()) == []
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / "link.json").symlink_to(target)
    with pytest.raises(OutputError, match="symbolic link"):
        write_json(tmp_path / "link.json", {"a": 1})
    assert target.read_text() == "keep"
    path = write_json(tmp_path / "ok.json", {"a": (1, 2)})
    assert json.loads(path.read_text()) == {"a": [1, 2]}


def test_profile_json(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["profile", str(ROT1), "--n", "256", "--backend", "cpu-plan", "--repeats", "2", "-q", "--json",
                 str(out)]) == 0
    capsys.readouterr()
    doc = strict(out)
    assert doc["kind"] == "profile" and doc["program"] == "MulRotate_4L_1c" and doc["backend"] == "cpu-plan"
    assert [v["name"] for v in doc["variants"]] == ["eager", "graph", "graph+fusion"]
    assert {"eager", "graph", "graph+fusion"} <= set(doc["timings_s"]) and doc["kinds"]
    assert "environment" in doc


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_1c").is_dir(), reason="Mul_4L_1c not in the corpus")
def test_scaling_profile_with_throughput(tmp_path, capsys):
    family = tmp_path / "Mul_4L"
    for g in (1, 2):
        (tmp_path / f"Mul_4L_{g}c").symlink_to(SHARED_PROGRAMS / f"Mul_4L_{g}c")
    out, plot = tmp_path / "s.json", tmp_path / "s.png"
    code = main(["profile", str(family), "--gpus", "1,2", "--n", "256", "--backend", "cpu-plan", "--repeats", "1",
                 "--throughput", "-q", "--json", str(out), "--plot", str(plot)])
    text = capsys.readouterr().out
    assert code == 0 and "throughput" in text and "instances/s" in text
    doc = strict(out)
    assert doc["kind"] == "scaling" and doc["devices"] == [1, 2]
    assert [p["gpus"] for p in doc["throughput"]] == [1, 2]
    assert doc["throughput"][0]["speedup"] == pytest.approx(1.0)
    assert all(p["per_second"] > 0 and p["efficiency"] > 0 for p in doc["throughput"])
    assert [p["speedup"] for p in doc["points"]][0] == pytest.approx(1.0)
    assert plot.stat().st_size > 0
