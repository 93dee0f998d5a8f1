"""Tests of ``caramel.timeline``: the collective cost model and its fit, and the simulated replay on
hand-built device timelines whose times can be worked out by hand, and on real device programs."""

from __future__ import annotations

import math

import pytest

from caramel.timeline import (
    FIRST_FIT, FIRST_SAMPLES, Call, CollectiveCost, CollectiveModel, CollectiveSample, DeviceTimeline, ModelTask,
    device_timelines, fit, fit_overlap, simulate,
)

MIB = 2**20


def _model(group_us=10.0, call_us=1.0, us_per_mib=4.0) -> CollectiveModel:
    return CollectiveModel("test", (CollectiveCost(2, group_us, call_us, us_per_mib),))


# ---------------------------------------------------------------------------------------------- collective model


def test_fit_recovers_the_parameters_of_exact_samples():
    want = {2: (8.0, 0.5, 3.0), 4: (12.0, 1.5, 6.0)}
    samples = []
    for g, (gr, ca, mb) in want.items():
        for groups, calls, mib in ((1, 1, 0.25), (1, 40, 10.0), (0, 0, 600.0), (3, 7, 2.0)):
            samples.append(CollectiveSample(g, groups, calls, mib * MIB, groups * gr + calls * ca + mib * mb))
    model = fit(samples)
    for c in model.costs:
        assert (c.group_us, c.call_us, c.us_per_mib) == pytest.approx(want[c.gpus])


def test_fit_interpolates_what_a_size_cannot_tell_apart():
    """At 8 GPUs the calls and the bytes of the samples are proportional: the bandwidth is fitted, the per-call
    cost is taken from the sizes that determine it; a size with bytes alone takes its group cost from its
    neighbours in log2(gpus)."""
    by = {c.gpus: c for c in FIRST_FIT.costs}
    two, four, eight = by[2], by[4], by[8]
    assert eight.call_us == pytest.approx(two.call_us) and four.call_us == pytest.approx(two.call_us)
    assert four.group_us == pytest.approx((two.group_us + eight.group_us) / 2)
    for s in FIRST_SAMPLES:  # every sample of a size that fixes all its terms is reproduced
        if s.gpus == 2:
            c = by[2]
            assert s.groups * c.group_us + s.calls * c.call_us + s.nbytes / MIB * c.us_per_mib == pytest.approx(s.us)


def test_fit_leaves_out_a_term_that_would_be_negative():
    samples = [CollectiveSample(2, 1, 1, MIB, 5.0), CollectiveSample(2, 1, 1, 2 * MIB, 9.0),
               CollectiveSample(2, 1, 30, 3 * MIB, 12.5)]  # more calls, less time: no per-call cost
    (c,) = fit(samples).costs
    assert c.call_us == 0.0 and c.group_us >= 0 and c.us_per_mib > 0


def test_fit_needs_samples_that_fix_the_bandwidth():
    with pytest.raises(ValueError, match="no collective samples"):
        fit([])
    with pytest.raises(ValueError, match="determines the bandwidth"):
        fit([CollectiveSample(2, 1, 1, 0, 9.0), CollectiveSample(2, 1, 5, 0, 11.0)])
    with pytest.raises(ValueError, match="gpus >= 2"):
        fit([CollectiveSample(1, 1, 1, MIB, 9.0)])


def test_model_interpolates_in_log2_and_clamps_outside():
    m = CollectiveModel("m", (CollectiveCost(2, 10.0, 1.0, 4.0), CollectiveCost(8, 20.0, 3.0, 16.0)))
    assert m.at(4) == CollectiveCost(4, 15.0, 2.0, 10.0)
    assert m.at(16) == CollectiveCost(16, 20.0, 3.0, 16.0) and m.at(2) == m.costs[0]
    assert m.call_time_us(4, MIB // 2) == pytest.approx(2.0 + 5.0)
    assert CollectiveCost(2, 0, 0, 1.0).gbps == pytest.approx(MIB / 1e3)


# ---------------------------------------------------------------------------------------------- simulation


def _kernel(us, stream=0, waits=()):
    return ModelTask(stream, tuple(waits), float(us))


def _comm(before, key, after=0.0, stream=1, waits=(), group=(0, 1), nbytes=MIB):
    return ModelTask(stream, tuple(waits), float(before), (Call(key, group, nbytes),), float(after), comm=True)


def test_one_stream_replays_the_sum_of_its_tasks():
    tl = DeviceTimeline(0, (_kernel(3), _kernel(4), _kernel(5)))
    r = simulate([tl], _model())
    assert r.predicted_ms == pytest.approx(12e-3) and r.compute_floor_ms == pytest.approx(12e-3)
    assert r.comm_wait_ms == 0 and r.collectives == 0


@pytest.mark.parametrize("overlap, want", [(0.0, 20.0), (1.0, 10.0), (0.5, 40 / 3)])
def test_kernels_at_once_share_the_device(overlap, want):
    """Two kernels of 10 us on two streams: overlap 0 takes their sum, 1 their longest; 0.5: each runs at 3/4
    speed, so both end at 40/3 us."""
    tl = DeviceTimeline(0, (_kernel(10, 0), _kernel(10, 1)))
    assert simulate([tl], _model(), overlap=overlap).predicted_ms == pytest.approx(want / 1e3)


def test_a_wait_orders_tasks_across_streams():
    tl = DeviceTimeline(0, (_kernel(10, 0), _kernel(5, 1, waits=(0,)), _kernel(1, 0)))
    assert simulate([tl], _model(), overlap=1.0).predicted_ms == pytest.approx(15e-3)


def test_a_collective_starts_when_every_member_has_issued_it():
    """Device 0 issues at 10 us, device 1 at 30: the call starts at 30 + group_us (10) and takes call_us (1) +
    1 MiB * 4 us; then device 0's kernel after it (5 us)."""
    d0 = DeviceTimeline(0, (_kernel(10), _comm(0, "c", stream=1, waits=(0,)), _kernel(5, 0, waits=(1,))))
    d1 = DeviceTimeline(1, (_kernel(30), _comm(0, "c", stream=1, waits=(0,))))
    r = simulate([d0, d1], _model())
    assert r.devices[0].end_us == pytest.approx(30 + 10 + 1 + 4 + 5)
    assert r.devices[1].end_us == pytest.approx(30 + 10 + 1 + 4)
    assert [d.floor_us for d in r.devices] == pytest.approx([15.0, 30.0])
    assert r.comm_wait_ms == pytest.approx((50 - 30) / 1e3)
    assert [(d.calls, d.groups, d.nbytes) for d in r.devices] == [(1, 1, MIB), (1, 1, MIB)]


def test_calls_of_a_device_run_in_issue_order():
    """Device 0 issues call a (with device 1, late) then b (with device 2, ready at once): b waits for a on
    device 0's communication stream."""
    m = _model(group_us=0.0, call_us=2.0, us_per_mib=0.0)
    d0 = DeviceTimeline(0, (_comm(0, "a", stream=0, group=(0, 1)), _comm(0, "b", stream=0, group=(0, 2))))
    d1 = DeviceTimeline(1, (_kernel(50), _comm(0, "a", stream=0, group=(0, 1))))
    d2 = DeviceTimeline(2, (_comm(0, "b", stream=0, group=(0, 2)),))
    r = simulate([d0, d1, d2], m)
    assert [d.end_us for d in r.devices] == pytest.approx([54.0, 52.0, 54.0])


def test_local_work_around_the_collectives_takes_compute():
    tl = DeviceTimeline(0, (_comm(3, "x", after=4, stream=0, group=(0,)),))
    assert simulate([tl], _model(group_us=0, call_us=2, us_per_mib=0)).predicted_ms == pytest.approx(9e-3)


def test_collectives_issued_in_opposite_orders_deadlock():
    d0 = DeviceTimeline(0, (_comm(0, "a", stream=0), _comm(0, "b", stream=0)))
    d1 = DeviceTimeline(1, (_comm(0, "b", stream=0), _comm(0, "a", stream=0)))
    with pytest.raises(ValueError, match=r"deadlocks: tasks never done on device\(s\) 0 \(2 tasks\), 1 \(2 tasks\)"):
        simulate([d0, d1], _model())


def test_scaled_multiplies_compute_only():
    tl = DeviceTimeline(0, (_kernel(2), _comm(1, "x", after=3, stream=0, group=(0,))))
    s = tl.scaled(2.0)
    assert s.compute_us() == pytest.approx(12.0) and s.tasks[1].calls == tl.tasks[1].calls


def test_fit_overlap_finds_the_sharing_that_gives_a_replay():
    tl = DeviceTimeline(0, tuple(_kernel(10 + k, k % 3) for k in range(9)))
    want = simulate([tl], _model(), overlap=0.4).predicted_ms * 1e3
    assert fit_overlap(tl, want) == pytest.approx(0.4, abs=1e-6)
    assert fit_overlap(tl, 1e9) == 0.0 and fit_overlap(tl, 0.0) == 1.0
    assert fit_overlap(DeviceTimeline(0, (_kernel(5), _kernel(6))), 11.0) is None  # one stream: no sharing


# ---------------------------------------------------------------------------------------------- real programs


def test_estimated_timelines_of_a_program_follow_its_device_programs():
    from caramel.execute.placement import CommStep, device_programs
    from caramel.plan import build_plan
    from caramel.plan.cost import estimate_us
    from caramel.ring import Context

    from tests.conftest import SHARED_PROGRAMS

    if not (SHARED_PROGRAMS / "MulRotate_10L_4c").is_dir():
        pytest.skip("MulRotate_10L_4c not in the corpus")
    from caramel.parse import load_program

    plan, n = build_plan(load_program(SHARED_PROGRAMS / "MulRotate_10L_4c", progress=False)), 4096
    progs = device_programs(plan, 4, Context(n=n).primes, reuse="none", keep_inputs=True)
    tls = device_timelines(progs, n, 3)
    for prog, tl in zip(progs, tls):
        assert len(tl.tasks) == len(prog.steps)
        for step, task in zip(prog.steps, tl.tasks):
            if isinstance(step, CommStep):
                assert task.comm and task.stream == 2
                assert sum(c.nbytes for c in task.calls) == len(step.ops) * 4 * n
            else:
                assert not task.calls and task.before_us == pytest.approx(estimate_us(step[2], n))
    r = simulate(tls)
    assert r.predicted_ms >= r.compute_floor_ms > 0 and math.isfinite(r.predicted_ms)
    assert r.collectives == max(sum(len(t.calls) for t in tl.tasks) for tl in tls)


def test_timelines_and_models_go_through_json():
    import json

    from caramel.timeline import model_from_json, model_json, timeline_from_json, timeline_json

    tl = DeviceTimeline(1, (_kernel(2.5, 0), _comm(1.0, (65537, "broadcast", 0), after=0.5, waits=(0,))))
    assert timeline_from_json(json.loads(json.dumps(timeline_json(tl)))) == tl
    assert model_from_json(json.loads(json.dumps(model_json(FIRST_FIT)))) == FIRST_FIT
