"""``caramel plan``'s traffic floor per kernel kind: the plan model's bytes, split by kind."""

from __future__ import annotations

import pytest

from caramel.parse import load_program
from caramel.plan import build_plan
from caramel.backends.cuda.target import CUDA_TARGET
from caramel.plan.report import plan_report, plan_stats, traffic_floor_lines

from tests.conftest import REPO

PROGRAM = REPO / "programs" / "MulRotate_4L_1c"
pytestmark = pytest.mark.skipif(not PROGRAM.is_dir(), reason="programs/MulRotate_4L_1c not found")


def test_bytes_by_kind_add_up_to_the_plan():
    program = load_program(PROGRAM, progress=False)
    plan = build_plan(program)
    stats = plan_stats(plan, program, n=1024)
    assert sum(stats["bytes_by_kind"].values()) == stats["plan_bytes"]
    for kind, (kernels, _, _) in stats["by_kind"].items():
        assert (stats["bytes_by_kind"][kind] > 0) == (kernels > 0) or kind == "comm"
    assert all(b % (4 * 1024) == 0 for b in stats["bytes_by_kind"].values())


def test_floor_lines_in_the_report():
    """Priced at the target's copy bandwidth (the CUDA backend's); a target that gives none (the neutral one) gets
    the bytes and shares alone."""
    program = load_program(PROGRAM, progress=False)
    plan = build_plan(program, target=CUDA_TARGET)
    stats = plan_stats(plan, program, n=65536)
    gbs = CUDA_TARGET.copy_gbs
    lines = traffic_floor_lines(stats, gbs)
    assert f"{gbs:.0f} GB/s" in lines[0]
    assert lines[-1].split()[0] == "total"
    total_ms = float(lines[-1].split()[-1])
    assert total_ms == pytest.approx(stats["plan_bytes"] / gbs / 1e6, abs=1e-3)
    assert "traffic floor per kind" in plan_report(plan, program) and "GB/s" in plan_report(plan, program)
    plain = traffic_floor_lines(stats)
    assert "GB/s" not in plain[0] and plain[-1].split()[-1] == "100.0%"
    assert "GB/s" not in plan_report(build_plan(program), program)
