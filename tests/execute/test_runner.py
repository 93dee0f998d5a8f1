"""The chip runner (:class:`caramel.execute.runner.DeviceRun`) in the shapes the GPU driver uses it,
on NumPy: per-row lowering (the eager baseline) and the stream schedule of a 1-chip graph."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))

from caramel.backends.numpy_backend import NumpyBackend  # noqa: E402
from caramel.ckks.check import check_path, prepare_check  # noqa: E402
from caramel.execute.placement import device_programs, gpu_device_programs  # noqa: E402
from caramel.execute.result import RunResult  # noqa: E402
from caramel.execute.runner import DeviceRun  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.plan.cost import task_cost  # noqa: E402
from caramel.plan.streams import assign_streams, happens_before_order  # noqa: E402
from caramel.ring import Context  # noqa: E402

from plan_helpers import chip_tasks, load_corpus, store_mismatches  # noqa: E402

CTX = Context(n=1024)


def prepared(name: str):
    program = load_corpus(name)
    return program, prepare_check(check_path(program.name), program, CTX, rng=3).memory


def result(run: DeviceRun, plan, memory) -> RunResult:
    return RunResult.from_stores(run.stores(), memory, plan.instructions)


@pytest.mark.parametrize("name", ["MulRotate_4L_1c", "Relin2_10L_2c"])
def test_per_row_calls_give_the_reference(name):
    """``per_row``: one call per kernel row (with an unfused plan, one per instruction)."""
    program, memory = prepared(name)
    plan = build_plan(program, fuse=False)
    run = DeviceRun(device_programs(plan, 1, CTX.primes)[0], plan, CTX, memory, "exact", NumpyBackend,
                    per_row=True)
    rows = sum(len(k.rows) for c in plan.chips for k in c.kernels)
    assert sum(k is not None for k in run.kernel_of) == rows
    run.run()
    assert not store_mismatches(run_reference(program, CTX, memory), result(run, plan, memory))


def test_kernel_tasks_cost_their_estimated_time():
    """Each kernel's task costs its estimated time at the run's N (caramel.plan.cost): what the streams balance."""
    program, memory = prepared("BootstrapModRaise_4L_1c")
    plan = build_plan(program)
    run = DeviceRun(gpu_device_programs(plan, 1, CTX, 2)[0], plan, CTX, memory, "exact", NumpyBackend)
    assert [t.cost for t in run.tasks] == [task_cost(k, CTX.n) for k in plan.chips[0].kernels]
    assert len({t.cost for t in run.tasks}) > 1


@pytest.mark.parametrize("streams", [2, 4])
def test_one_chip_schedule_is_the_chip_schedule(streams):
    """A 1-chip device without communication spreads its kernels over every stream, exactly as
    the chip's own tasks (:func:`chip_tasks`) would be; any order the schedule allows gives the
    reference (the GPU replays this schedule as one graph)."""
    program, memory = prepared("BootstrapModRaise_4L_1c")
    plan = build_plan(program)
    prog = gpu_device_programs(plan, 1, CTX, streams)[0]
    run = DeviceRun(prog, plan, CTX, memory, "exact", NumpyBackend)
    have = run.schedule(streams, comm_stream=False)
    want = assign_streams(chip_tasks(plan.chips[0], prog.rows_of[0], CTX.n), streams)
    assert (have.stream, have.waits, have.joins) == (want.stream, want.waits, want.joins)
    for t in happens_before_order(have, np.random.default_rng(streams)):
        run.run_task(t)
    assert not store_mismatches(run_reference(program, CTX, memory), result(run, plan, memory))


def test_gpu_rows_a_row_a_buffer_where_the_memory_allows():
    """gpu_device_programs: one stream reuses rows last-in first-out; several give every buffer its own row when the
    arena takes at most ARENA_SHARE of the memory free (or when it is unknown), else reuse rows first-in first-out
    (as few rows as one stream); an explicit ``reuse`` wins. Every layout runs to the reference."""
    from caramel.execute import placement
    from caramel.plan import assign_rows

    program, memory = prepared("BootstrapModRaise_4L_1c")
    plan = build_plan(program)
    chip = plan.chips[0]
    rows = {r: assign_rows(chip, reuse=r, keep_inputs=True)[1] for r in ("lifo", "fifo", "none")}
    assert rows["none"] > rows["fifo"] == rows["lifo"]

    def n_rows(streams, **kw):
        return gpu_device_programs(plan, 1, CTX, streams, **kw)[0].n_rows

    base = n_rows(1) - rows["lifo"]  # rows besides the chip's (scratch, zero row...)
    none_bytes = (rows["none"] + base) * 4 * CTX.n
    assert n_rows(4) == n_rows(4, free_bytes=none_bytes / placement.ARENA_SHARE) == rows["none"] + base
    assert n_rows(4, free_bytes=none_bytes / placement.ARENA_SHARE - 1) == rows["fifo"] + base
    assert n_rows(1, free_bytes=10**15) == rows["lifo"] + base
    assert n_rows(4, reuse="fifo") == n_rows(2, reuse="lifo") == rows["fifo"] + base
    for streams, kw in ((4, {}), (4, {"free_bytes": 1}), (1, {})):
        prog = gpu_device_programs(plan, 1, CTX, streams, **kw)[0]
        run = DeviceRun(prog, plan, CTX, memory, "exact", NumpyBackend)
        sch = run.schedule(streams, comm_stream=False) if streams > 1 else None
        for t in happens_before_order(sch, np.random.default_rng(7)) if sch else range(len(run.tasks)):
            run.run_task(t)
        assert not store_mismatches(run_reference(program, CTX, memory), result(run, plan, memory)), (streams, kw)
