"""The roofline of ``caramel profile``: per kernel kind, time, bytes of the plan's traffic model,
achieved GB/s and share of the copy bandwidth (pure functions; the NumPy plan engine for one run)."""

from __future__ import annotations

import pytest

from caramel.parse import load_program
from caramel.plan import build_plan
from caramel.plan.report import plan_stats
from caramel.profile import KernelRecord, profile_program, render, render_roofline, roofline_table

from tests.conftest import REPO

PROGRAM = REPO / "programs" / "MulRotate_4L_1c"


def _rec(kind: str, ms: float, nbytes: int) -> KernelRecord:
    return KernelRecord(0, 0, kind, 1, (), 0.0, ms, nbytes)


def test_roofline_rates_and_shares():
    rows = roofline_table([_rec("ntt", 1.0, 2_000_000_000), _rec("ntt", 1.0, 2_000_000_000),
                           _rec("elementwise", 0.5, 1_000_000_000)], copy_gbs=4000.0)
    assert [r.kind for r in rows] == ["ntt", "elementwise", "total"]
    ntt, ew, total = rows
    assert (ntt.kernels, ntt.ms, ntt.bytes) == (2, 2.0, 4_000_000_000)
    assert ntt.gbs == pytest.approx(2000.0) and ntt.share == pytest.approx(0.5)
    assert ew.gbs == pytest.approx(2000.0)
    assert (total.kernels, total.ms, total.bytes) == (3, 2.5, 5_000_000_000)
    assert total.share == pytest.approx(2000.0 / 4000.0)


def test_roofline_without_ceiling_or_time():
    rows = roofline_table([_rec("mod", 0.0, 10)])
    assert rows[0].gbs == 0.0 and rows[0].share == 0.0
    assert "-" in render_roofline([_rec("mod", 0.0, 10)])


@pytest.mark.skipif(not PROGRAM.is_dir(), reason="programs/MulRotate_4L_1c not found")
def test_profile_records_the_plan_traffic():
    """The instrumented run's bytes per kind are the plan model's (caramel plan's traffic floor)."""
    program = load_program(PROGRAM, progress=False)
    n = 256
    result = profile_program(program, n=n, repeats=1, backend="cpu-plan", seed=3)
    stats = plan_stats(build_plan(program, fuse=True), program, n)
    by_kind: dict[str, int] = {}
    for k in result.kernels:  # NTT epilogues' records (caramel.plan.cost.family) under the plan's kinds
        kind = {"ntt-half": "ntt", "epilogue": "elementwise"}.get(k.kind, k.kind)
        by_kind[kind] = by_kind.get(kind, 0) + k.bytes
    assert by_kind == {k: b for k, b in stats["bytes_by_kind"].items() if b}
    assert sum(by_kind.values()) == stats["plan_bytes"]
    text = render(result)  # on the CPU: no roofline (the model counts GPU traffic), never "GB/s 0"
    assert "no roofline on the CPU" in text and "GB/s" not in text
    import dataclasses

    text = render(dataclasses.replace(result, backend="gpu"))
    assert "roofline per kernel kind" in text and "MiB moved" in text


@pytest.mark.skipif(not PROGRAM.is_dir(), reason="programs/MulRotate_4L_1c not found")
def test_records_charge_each_kernel_the_plan_models_traffic():
    """A record's bytes are its kernel's traffic in the plan model (Kernel.traffic), also for an NTT
    whose load converts (each distinct input read once), as `caramel plan` counts them."""
    from caramel.plan.kernel import Kind
    from caramel.profile import _record

    plan = build_plan(load_program(PROGRAM, progress=False), fuse_ntt="all")
    kernels = [k for chip in plan.chips for k in chip.kernels]
    converting = [k for k in kernels if k.prologue is not None and k.prologue.kind is Kind.BASECONV]
    assert converting, "expected an NTT with a converting load in the every-load plan"
    assert any(len(set(k.reads())) < len(k.reads()) for k in converting)  # where the old count differed
    for k in kernels:
        assert _record(k, 0, 0, 0.0, 1.0, limb_bytes=1024).bytes == k.traffic() * 1024


def test_ntt_epilogues_have_their_own_kinds():
    """A half NTT goes under ``ntt-half``, an elementwise kernel with transformed operands under ``epilogue``; the
    other kernels under their kind, and the bytes are the plan model's either way."""
    from caramel.plan.cost import family
    from caramel.profile import _record

    plan = build_plan(load_program(PROGRAM, progress=False))
    kernels = [k for chip in plan.chips for k in chip.kernels]
    kinds = {family(k) for k in kernels}
    assert {"ntt-half", "epilogue"} <= kinds
    for k in kernels:
        want = "ntt-half" if k.half else "epilogue" if k.expr is not None and k.expr.transformed else k.kind.value
        assert _record(k, 0, 0, 0.0, 1.0, limb_bytes=8).kind == want
    off = build_plan(load_program(PROGRAM, progress=False), fuse_epilogue=False)
    assert not {"ntt-half", "epilogue"} & {family(k) for chip in off.chips for k in chip.kernels}


def test_gpu_instrumented_run_times_every_kernel_in_one_graph():
    """On a GPU: one record per kernel of the fused plan, in plan order, one after the other (the
    clock stamps sit between the kernels of one one-stream graph), each with a time of at least 0 (a stamp's own time subtracted); the
    run's results are those of the replay."""
    cp = pytest.importorskip("cupy")
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no GPU")
    except cp.cuda.runtime.CUDARuntimeError:
        pytest.skip("no GPU")
    from caramel.api import default_spec
    from caramel.ckks.check import prepare_check
    from caramel.execute.cuda_graph import GpuRun
    from caramel.plan.cost import family
    from caramel.profile import _instrument_gpu
    from caramel.ring import Context

    import numpy as np

    program = load_program(PROGRAM, progress=False)
    ctx = Context(n=4096)
    memory = prepare_check(default_spec(program), program, ctx, rng=np.random.default_rng(5)).memory
    plan = build_plan(program)
    run = GpuRun(plan, ctx, memory, "exact")
    run.run(graph=True)
    expect = run.result().memory
    records = _instrument_gpu(run)
    kernels = plan.chips[0].kernels
    assert [r.index for r in records] == list(range(len(kernels)))
    assert [r.kind for r in records] == [family(k) for k in kernels]
    assert all(r.dur_ms >= 0 for r in records) and sum(r.dur_ms for r in records) > 0
    for a, b in zip(records, records[1:]):  # in order, without overlap (one stream)
        assert b.start_ms >= a.start_ms + a.dur_ms
    got = run.result().memory
    assert got.keys() == expect.keys() and all(np.array_equal(got[m], expect[m]) for m in expect)
