"""Tests of ``caramel profile`` on the NumPy plan engine (``--backend cpu-plan``, N = 256): fast, no GPU."""

from __future__ import annotations

import json

import pytest

from caramel.cli import main
from caramel.parse import load_program
from caramel.plan import build_plan
from caramel.plan.kernel import ChipPlan, Plan
from caramel.profile import VARIANTS, KernelRecord, chrome_trace, critical_path_ms, kind_table, profile_program, render

from tests.conftest import REPO

PROGRAM = REPO / "programs" / "MulRotate_4L_1c"
pytestmark = pytest.mark.skipif(not PROGRAM.is_dir(), reason="programs/MulRotate_4L_1c not found")


@pytest.fixture(scope="module")
def program():
    return load_program(PROGRAM, progress=False)


@pytest.fixture(scope="module")
def result(program):
    return profile_program(program, n=256, repeats=2, backend="cpu-plan", seed=1)


def test_three_variants_are_timed(result, program):
    assert [v.name for v in result.variants] == list(VARIANTS)
    eager, graph, fused = result.variants
    assert eager.launches >= graph.launches >= fused.launches >= 1
    assert fused.launches == build_plan(program, fuse=True).kernels
    assert all(v.repeats == 2 and 0 < v.min_ms <= v.median_ms <= v.max_ms for v in result.variants)
    assert result.digests_agree and eager.digest
    text = render(result)
    for name in VARIANTS:
        assert f"\n{name} " in text
    assert "speedup" in text and "time per kernel kind" in text


def test_kind_table_sums_to_the_kernel_count(result, program):
    kernels = build_plan(program, fuse=True).kernels
    table = kind_table(result.kernels)
    assert sum(count for _, count, _, _, _ in table) == kernels == len(result.kernels)
    assert sum(share for *_, share in table) == pytest.approx(1.0)
    assert {kind for kind, *_ in table} <= {"elementwise", "ntt", "intt", "automorphism", "baseconv", "sud_lift",
                                             "rsv", "mod", "ntt-half", "epilogue"}
    total_line = [line for line in render(result).splitlines() if line.startswith("total ")]
    assert total_line and total_line[0].split()[1] == str(kernels)


def _chip(chip: int, deps) -> ChipPlan:
    return ChipPlan(chip, (), tuple(tuple(d) for d in deps), 0, {}, -1, (), {}, 0)


def _records(chip: int, durations) -> list[KernelRecord]:
    return [KernelRecord(chip, k, "elementwise", 1, (), 0.0, d) for k, d in enumerate(durations)]


def test_critical_path_follows_the_dependencies():
    """0 -> 1 -> 3 and 0 -> 2 -> 3: the longer branch counts; a kernel without dependencies starts a chain; the
    longest chip wins; a chip's kernels never chain through another chip's."""
    plan = Plan("p", (_chip(0, [[], [0], [0], [1, 2], []]), _chip(1, [[], [0]])))
    records = _records(0, [1.0, 5.0, 2.0, 1.0, 6.5]) + _records(1, [0.5, 4.0])
    assert critical_path_ms(records, plan) == pytest.approx(7.0)  # 1 + 5 + 1
    assert critical_path_ms(records, Plan("p", (plan.chips[1],))) == pytest.approx(4.5)  # its own kernel 0's 0.5
    records[4].dur_ms = 7.5  # the lone kernel is now the longest chain
    assert critical_path_ms(records, plan) == pytest.approx(7.5)
    assert critical_path_ms([], plan) == 0.0


def test_critical_path_is_reported(result, program):
    total = sum(r.dur_ms for r in result.kernels)
    assert 0 < result.critical_ms <= total + 1e-9
    assert result.critical_ms == pytest.approx(critical_path_ms(result.kernels, build_plan(program, fuse=True)))
    assert f"critical path (the longest chain of dependent kernels at these times): {result.critical_ms:.3f} ms" \
        in render(result)


def test_chrome_trace(result, program):
    trace = json.loads(json.dumps(chrome_trace(result)))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == build_plan(program, fuse=True).kernels
    for e in events:
        assert e["name"].split(" x")[0] == e["cat"]
        assert e["ts"] >= 0 and e["dur"] >= 0 and e["pid"] == 0 and e["tid"] == 0
        assert e["args"]["rows"] >= 1 and e["args"]["lines"]
    assert [e["ts"] for e in events] == sorted(e["ts"] for e in events)


def test_cli_profile(capsys, tmp_path, program):
    trace = tmp_path / "trace.json"
    code = main(["profile", str(PROGRAM), "--n", "256", "--backend", "cpu-plan", "--repeats", "2", "-q",
                 "--trace", str(trace)])
    out, _ = capsys.readouterr()
    assert code == 0, out
    assert all(f"\n{name} " in out for name in VARIANTS)
    data = json.loads(trace.read_text())
    assert sum(e["ph"] == "X" for e in data["traceEvents"]) == build_plan(program, fuse=True).kernels


def test_cli_profile_multichip_on_cpu(capsys):
    code = main(["profile", str(REPO / "programs" / "Mul_4L_2c"), "--n", "256", "--backend", "cpu-plan",
                 "--repeats", "1", "-q"])
    out, _ = capsys.readouterr()
    assert code == 0 and "graph+fusion" in out


def test_inputs_are_those_of_run_with_the_same_seed(result, program):
    """profile --seed S draws the keys and inputs of `caramel run --seed S --no-check` (the same digest)."""
    from caramel.api import run_program

    want = run_program(program, n=256, backend="cpu", seed=1, check=None).digest
    assert {v.digest for v in result.variants} == {want}
    assert run_program(program, n=256, backend="cpu", seed=2, check=None).digest != want
