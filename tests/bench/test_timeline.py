"""``bench/timeline.py`` on the cpu-plan backend at a small N, so that the GPU benchmark of the timeline model does
not rot: its files, their shape, and the model reading them back."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHARED_PROGRAMS

pytestmark = pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_4c").is_dir(), reason="Mul_4L_1c/2c/4c not in corpus")


@pytest.fixture
def family(tmp_path):
    for k in (1, 2, 4):
        (tmp_path / f"Mul_4L_{k}c").symlink_to(SHARED_PROGRAMS / f"Mul_4L_{k}c")
    return str(tmp_path / "Mul_4L")


def test_profile_predict_measure_on_simulated_devices(family, tmp_path):
    from bench.timeline import main
    from caramel.timeline import timeline_from_json

    out = tmp_path / "out"
    assert main(["--out", str(out), "--archive", family, "--chips", "1,2,4", "--n", "256", "--backend", "cpu-plan",
                 "--repeats", "1", "--steps", "profile,predict,measure"]) == 0
    for k in (1, 2, 4):
        data = json.loads((out / f"timeline_{k}c.json").read_text())
        assert data["chips"] == k and len(data["devices"]) == k
        tls = [timeline_from_json(d) for d in data["devices"]]
        assert all(d["floor_ms"] > 0 for d in data["devices"])
        assert sum(len(t.calls) for tl in tls for t in tl.tasks) > 0 or k == 1
    pred = json.loads((out / "predictions.json").read_text())
    assert "not measurements" in pred["note"]
    assert [p["gpus"] for p in pred["points"]] == [1, 2, 4]
    assert all(p["kind"] == "prediction" and p["predicted_ms"] >= p["compute_floor_ms"] > 0 for p in pred["points"])
    assert all("predicts no machine" in p["inputs"] for p in pred["points"])
    measured = json.loads((out / "measured.json").read_text())["points"]
    assert [(p["gpus"], p["kind"]) for p in measured] == [(1, "measurement"), (2, "measurement"), (4, "measurement")]
    assert len({p["digest"] for p in measured}) == 1  # the same outputs on 1, 2 and 4 devices
    assert all(p["predicted_ms"] == q["predicted_ms"] for p, q in zip(measured, pred["points"]))


def test_validate_and_compare_run_from_estimates(family):
    from bench.timeline import Record, compare, validate

    (row,) = validate(family, [Record("test", 2, 1, 1.0, floors_ms=(0.5, 0.4))])
    assert row["compute_floor_ms"] == pytest.approx(0.5) and row["predicted_ms"] >= 0.5
    assert row["error"] == pytest.approx(row["predicted_ms"] - 1.0)
    rows = compare(family, chips=(2,), streams=(3,), one_c=(1.0, (4, 0.9)))
    assert [(r["code"], r["streams"]) for r in rows] == [("before", 3), ("after", 3)]
    assert all(r["kind"] == "prediction" and r["predicted_ms"] > 0 for r in rows)
