"""``caramel plan``'s traffic floor per kernel kind: the plan model's bytes, split by kind."""

from __future__ import annotations

import pytest

from caramel.parse import load_program
from caramel.plan import build_plan
from caramel.plan.report import COPY_GBS, plan_report, plan_stats, traffic_floor_lines

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
    program = load_program(PROGRAM, progress=False)
    plan = build_plan(program)
    stats = plan_stats(plan, program, n=65536)
    lines = traffic_floor_lines(stats)
    assert f"{COPY_GBS:.0f} GB/s" in lines[0]
    assert lines[-1].split()[0] == "total"
    total_ms = float(lines[-1].split()[-1])
    assert total_ms == pytest.approx(stats["plan_bytes"] / COPY_GBS / 1e6, abs=1e-3)
    assert "traffic floor per kind" in plan_report(plan, program)
