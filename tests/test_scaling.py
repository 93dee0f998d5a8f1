"""Tests of ``caramel.scaling`` (``caramel profile FAMILY --gpus ...``) on simulated devices: no GPU."""

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


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="Mul_4L_2c not in the corpus")
def test_comm_figures_count_the_device_collectives_and_their_limbs():
    """On one device a plan needs no collective; on two, each of Mul_4L_2c's collectives sends one limb."""
    from caramel.execute.placement import device_programs
    from caramel.plan import build_plan
    from caramel.ring import Context
    from caramel.scaling import comm_figures

    plan, primes = build_plan(load_program(SHARED_PROGRAMS / "Mul_4L_2c", progress=False)), Context(n=256).primes
    assert comm_figures(device_programs(plan, 1, primes), 256) == (0, 0)
    count, sent = comm_figures(device_programs(plan, 2, primes), 256)
    assert count > 0 and sent == count * 4 * 256


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
