"""Tests of ``caramel.scaling`` (``caramel profile FAMILY --gpus ...``) on simulated devices, and on a GPU (skipped
without one) each device's floor and timeline."""

from __future__ import annotations

from pathlib import Path

import pytest

from caramel.api import run_program
from caramel.parse import load_program
from caramel.scaling import profile_scaling

from tests.conftest import SHARED_PROGRAMS

REPO_PROGRAMS = Path(__file__).resolve().parents[1] / "programs"


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="Mul_4L_1c/2c not in the corpus")
def test_each_point_has_the_digest_of_run_with_the_same_seed(tmp_path):
    """Every device count draws the keys and inputs of ``caramel run --seed S --no-check`` of its member."""
    for g in (1, 2):
        (tmp_path / f"Mul_4L_{g}c").symlink_to(SHARED_PROGRAMS / f"Mul_4L_{g}c")
    result = profile_scaling(str(tmp_path / "Mul_4L"), [1, 2], n=256, seed=3, repeats=1, backend="cpu-plan")
    for point in result.points:
        member = load_program(tmp_path / f"Mul_4L_{point.gpus}c", progress=False)
        assert point.digest == run_program(member, n=256, backend="cpu", seed=3, check=None).digest
        assert point.digest != run_program(member, n=256, backend="cpu", seed=4, check=None).digest


@pytest.mark.skipif(not (SHARED_PROGRAMS / "MulRotate_10L_4c").is_dir(), reason="MulRotate_10L_4c not in the corpus")
@pytest.mark.parametrize("devices", [1, 2, 4])
def test_comm_figures_count_the_calls_and_bytes_the_fabric_sees(devices):
    """comm_figures: the most calls one device issues and the bytes all devices send, as the in-process fabric
    logs them in a run (one device: none)."""
    from caramel.ckks.check import check_path, prepare_check
    from caramel.execute.drive import run_on_devices
    from caramel.execute.fabric.threads import FakeNetwork
    from caramel.execute.placement import device_programs
    from caramel.plan import build_plan
    from caramel.plan.collectives import CollectiveKind
    from caramel.ring import Context
    from caramel.scaling import comm_figures

    program = load_program(SHARED_PROGRAMS / "MulRotate_10L_4c", progress=False)
    plan, ctx = build_plan(program), Context(n=1024)
    memory = prepare_check(check_path(program.name), program, ctx, rng=3).memory
    net = FakeNetwork(devices)
    run_on_devices(plan, ctx, memory, gpus=devices, network=net)
    calls = max(sum(len(g) for g in log) for log in net.log)
    sent = sum(op.rows for d, log in enumerate(net.log) for g in log for op in g
               if (op.kind is CollectiveKind.BROADCAST) == (op.root == d))
    assert comm_figures(device_programs(plan, devices, ctx.primes), ctx.n) == (calls, sent * 4 * ctx.n)
    assert (calls > 0) == (devices > 1)


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="Mul_4L_1c/2c/4c not in the corpus")
def test_every_point_has_a_prediction_beside_its_replay(tmp_path):
    from caramel.scaling import render_scaling

    for g in (1, 2, 4):
        (tmp_path / f"Mul_4L_{g}c").symlink_to(SHARED_PROGRAMS / f"Mul_4L_{g}c")
    result = profile_scaling(str(tmp_path / "Mul_4L"), [1, 2, 4], n=256, seed=3, repeats=1, backend="cpu-plan")
    for p in result.points:
        assert p.measured and p.replay_ms > 0 and p.digest
        assert p.predicted_ms >= p.predicted_floor_ms > 0 and p.predicted_comm_wait_ms >= 0
        assert "cost estimates" in p.prediction
    assert result.points[0].predicted_comm_wait_ms == 0 and result.points[2].predicted_comm_wait_ms > 0
    text = render_scaling(result)
    assert "a PREDICTION of the timeline model" in text and "(not run)" not in text


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="Mul_4L_1c/2c not in the corpus")
def test_predict_only_runs_nothing_and_says_so(tmp_path, monkeypatch):
    """--predict-only: no keys, no inputs, no run; every point a prediction, its measured figures None (JSON null),
    the table's measured columns '-'."""
    import json

    import caramel.api
    from caramel.results import json_text, scaling_document
    from caramel.scaling import render_scaling

    for g in (1, 2):
        (tmp_path / f"Mul_4L_{g}c").symlink_to(SHARED_PROGRAMS / f"Mul_4L_{g}c")
    monkeypatch.setattr(caramel.api, "prepare_inputs", lambda *a, **k: pytest.fail("inputs prepared"))
    result = profile_scaling(str(tmp_path / "Mul_4L"), [1, 2], n=256, repeats=1, backend="cpu-plan",
                             predict_only=True)
    assert [p.measured for p in result.points] == [False, False]
    doc = json.loads(json_text(scaling_document(result)))
    for p in doc["points"]:
        assert p["replay_ms"] is None and p["compute_floor_ms"] is None and p["speedup"] is None
        assert p["predicted_ms"] > 0 and p["digest"] == ""
    assert {"replay_ms", "predicted_ms", "compute_floor_ms", "comm_wait_ms", "collectives", "bytes"} <= set(
        doc["points"][1])
    assert doc["points"][1]["collectives"] > 0 and doc["points"][1]["bytes"] > 0 and doc["timings_s"] == {}
    text = render_scaling(result)
    assert "Mul_4L_2c (not run)" in text and "not a measurement" in text


def test_a_missing_member_fails_before_any_point_runs(tmp_path, monkeypatch):
    """``--gpus 1,3`` of a family without a 3-chip program is refused, naming the member, before the
    1-device point runs (a long profile does not end in an error after minutes of work)."""
    import caramel.api
    from caramel.errors import CaramelError

    (tmp_path / "Mul_4L_1c").symlink_to(REPO_PROGRAMS / "Mul_4L_1c")
    started = []
    monkeypatch.setattr(caramel.api, "prepare_inputs", lambda *a, **k: started.append(a))
    with pytest.raises(CaramelError, match="Mul_4L_3c"):
        profile_scaling(str(tmp_path / "Mul_4L"), [1, 3], n=256, seed=3, repeats=1, backend="cpu-plan")
    assert not started


def _point(gpus: int, ms: float | None, predicted: float | None = None):
    from caramel.scaling import ScalingPoint

    return ScalingPoint(f"P_{gpus}c", gpus, ms, ms, ms, 1, 0, 0, None, None, predicted_ms=predicted)


def test_speedup_is_over_one_device_measured_never_assumed():
    from caramel.scaling import ScalingResult, render_scaling

    def result(*points):
        return ScalingResult("P", 256, "exact", "cpu-plan", "cpu", "wall", "today", list(points))

    r = result(_point(1, 12.0, 11.0), _point(2, 8.0, 7.0), _point(4, None, 5.5))
    assert [r.speedup(p) for p in r.points] == [1.0, 1.5, None]
    assert [r.predicted_speedup(p) for p in r.points] == [1.0, pytest.approx(11 / 7), 2.0]
    # without a one-device run, 2 and 4 devices have times but no speedup: t(2) * 2 would assume 2 scale perfectly
    r = result(_point(2, 8.0, 7.0), _point(4, 5.0, 5.5))
    assert [r.speedup(p) for p in r.points] == [None, None]
    assert [r.predicted_speedup(p) for p in r.points] == [None, None]
    rows = [line.split() for line in render_scaling(r).splitlines() if line.split()[:2] in (["2", "P_2c"], ["4", "P_4c"])]
    assert [row[5:7] for row in rows] == [["-", "-"], ["-", "-"]]


def test_each_device_alone_on_a_gpu_has_a_floor_and_a_timeline():
    """On a GPU: the floors of :func:`compute_only_ms` and :func:`device_profiles` (each device program of a
    2-device run replayed without collectives on the current GPU) are times, and each device's timeline has tasks
    that compute."""
    pytest.importorskip("cupy")
    from caramel.api import default_spec, gpu_available

    if not gpu_available():
        pytest.skip("no CUDA device")
    import numpy as np

    from caramel.ckks.check import prepare_check
    from caramel.plan import build_plan
    from caramel.ring import Context
    from caramel.scaling import compute_only_ms, device_profiles

    program = load_program(REPO_PROGRAMS / "Mul_4L_2c", progress=False)
    ctx = Context(n=4096)
    memory = prepare_check(default_spec(program), program, ctx, rng=np.random.default_rng(3)).memory
    plan = build_plan(program)
    floors = compute_only_ms(plan, ctx, memory, "exact", 2, repeats=3, streams=2)
    profiles = device_profiles(plan, ctx, memory, "exact", 2, repeats=3, streams=2)
    assert len(floors) == len(profiles) == 2 and all(f > 0 for f in floors)
    for floor, timeline in profiles:
        assert floor > 0 and timeline.tasks and timeline.compute_us() > 0
