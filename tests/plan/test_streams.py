"""caramel.plan.streams: multi-stream schedules of chip plans.

Schedules of corpus plans pass :func:`check_schedule` for 1, 2, 4 and 8 streams and every row
reuse order (with a row a buffer, the hazards are the data dependencies alone); one stream needs
no wait; independent branches spread over streams; a schedule missing any one of its waits (or a
join) is rejected. Executing the kernels on the NumPy backend
in random orders consistent with a schedule's happens-before gives stores bit-identical to the
in-order run, also for the most concurrent schedule allowed (every kernel on its own stream,
waiting only for its :func:`hazards`); waiting only for the data dependencies is caught."""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import numpy as np
import pytest

from caramel.backends.numpy_backend import NumpyBackend
from caramel.errors import ExecutionError
from caramel.execute.drive import run_plan
from caramel.execute.runner import _rows, lower_kernel
from caramel.plan import build_plan
from caramel.plan import Kind, assign_rows
from caramel.plan.cost import task_cost
from caramel.plan.streams import (
    StreamSchedule, Task, assign_streams, check_schedule, happens_before_order, hazards,
)
from caramel.ring import Context, Mode

from plan_helpers import PROGRAMS, chip_tasks, load_corpus, random_memory, store_mismatches

ONE_CHIP = ["Mul_10L_1c", "MulRotate_10L_1c", "PolyX8_10L_1c", "Relin2_10L_1c", "RotMulAdd_10L_1c",
            "BootstrapModRaise_10L_1c"]
LARGE = "BootstrapLike_20L_1c"
STREAMS = [1, 2, 4, 8]
REUSE = ["lifo", "fifo", "none"]

if not PROGRAMS.is_dir():
    pytest.skip(f"corpus {PROGRAMS} not found", allow_module_level=True)


@lru_cache(maxsize=None)
def context() -> Context:
    return Context(n=1024)


@lru_cache(maxsize=None)
def planned(name: str):
    """(program, its plan, random input memory, the in-order run's result). The plan keeps its
    independent sibling kernels apart (``max_outputs=1``): the scheduler is tested on levels of
    several kernels, which merged sibling rows would turn into one kernel in these small programs."""
    program = load_corpus(name)
    plan = build_plan(program, max_outputs=1)
    memory = random_memory(program, context(), seed=5)
    return program, plan, memory, run_plan(plan, context(), memory, "exact")


@lru_cache(maxsize=None)
def rows(name: str, reuse: str):
    return assign_rows(planned(name)[1].chips[0], reuse=reuse)


@lru_cache(maxsize=None)
def tasks(name: str, reuse: str) -> tuple[Task, ...]:
    return tuple(chip_tasks(planned(name)[1].chips[0], rows(name, reuse)[0]))


def streams_used(sch: StreamSchedule) -> int:
    """How many distinct streams have tasks."""
    return len(set(sch.stream))


def n_waits(sch: StreamSchedule) -> int:
    """Cross-stream waits, joins included."""
    return sum(map(len, sch.waits)) + len(sch.joins)


def run_in(name: str, reuse: str, order) -> dict:
    """The chip's stores after running its kernels in ``order`` on the NumPy backend."""
    _, plan, memory, _ = planned(name)
    chip, ctx = plan.chips[0], context()
    rows_of, count = rows(name, reuse)
    b = NumpyBackend(ctx, count)
    if chip.inputs:
        b.write(_rows(rows_of, list(chip.inputs.values())), np.stack([memory[m] for m in chip.inputs]))
    if chip.zero_buffer >= 0:
        b.write(_rows(rows_of, [chip.zero_buffer]), np.zeros((1, ctx.n), dtype=np.uint32))
    b.set_scalars(np.array([s.value(ctx.primes, memory) for s in chip.scalars], dtype=np.uint32))
    calls = [lower_kernel(k, rows_of, ctx, Mode.EXACT) for k in chip.kernels]
    for k in order:
        calls[k](b)
    names = list(chip.stores)
    return dict(zip(names, b.read(_rows(rows_of, [chip.stores[m] for m in names]))))


def mismatches(name: str, stores: dict) -> list[str]:
    want = planned(name)[3]
    return store_mismatches(want, dataclasses.replace(want, stores=[stores]))


def own_streams(chip, need) -> StreamSchedule:
    """Every kernel on its own stream, waiting for exactly ``need[k]``: the most concurrent
    schedule that ``need`` allows."""
    n = len(chip.kernels)
    waited = sorted({j for w in need for j in w} | set(range(1, n)))
    event = [-1] * n
    for e, j in enumerate(waited):
        event[j] = e
    return StreamSchedule(n, tuple(range(n)), tuple(map(tuple, need)), tuple(range(1, n)), tuple(event), len(waited))


# ---------------------------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("reuse", REUSE)
@pytest.mark.parametrize("n_streams", STREAMS)
@pytest.mark.parametrize("name", ONE_CHIP + [LARGE])
def test_schedules_pass_the_check(name, n_streams, reuse):
    chip = planned(name)[1].chips[0]
    ts = tasks(name, reuse)
    sch = assign_streams(ts, n_streams)
    check_schedule(ts, sch)
    assert len(sch.stream) == len(chip.kernels) and max(sch.stream) < n_streams
    assert sch.n_events == len({j for w in sch.waits for j in w} | set(sch.joins))
    need = hazards(ts)
    for k, w in enumerate(sch.waits):
        assert all(j < k and sch.stream[j] != sch.stream[k] for j in w)
        assert set(w) <= set(need[k])
    if n_streams == 1:
        assert set(sch.stream) == {0} and n_waits(sch) == 0 and sch.n_events == 0 and sch.joins == ()
    else:
        used = set(sch.stream) - {0}
        assert sorted(sch.stream[j] for j in sch.joins) == sorted(used)


def test_tasks_name_their_kernels_and_rows():
    name = "PolyX8_10L_1c"
    chip = planned(name)[1].chips[0]
    rows_of = rows(name, "fifo")[0]
    for k, (kernel, task) in enumerate(zip(chip.kernels, tasks(name, "fifo"))):
        assert task.reads == {int(rows_of[b]) for b in kernel.reads()}
        assert task.writes == {int(rows_of[b]) for b in kernel.writes()}
        assert task.deps == chip.deps[k] and task.cost == task_cost(kernel) and task.stream is None
        assert task.name.startswith(f"kernel {k} ({kernel.kind.value}")


def test_hazards_include_data_deps_and_row_reuse():
    chip = planned("Mul_10L_1c")[1].chips[0]
    need = hazards(tasks("Mul_10L_1c", "lifo"))
    assert all(set(d) <= set(n) for d, n in zip(chip.deps, need))
    assert any(set(n) - set(d) for d, n in zip(chip.deps, need)), "row reuse adds orderings"


@pytest.mark.parametrize("name", ["BootstrapModRaise_10L_1c", "PolyX8_10L_1c", LARGE])
def test_independent_branches_spread(name):
    chip = planned(name)[1].chips[0]
    for n_streams in (2, 4, 8):
        sch = assign_streams(tasks(name, "fifo"), n_streams)
        assert streams_used(sch) > 1, n_streams
        assert n_waits(sch) < len(chip.kernels)
    assert streams_used(assign_streams(tasks(LARGE, "lifo"), 8)) > 1 if name == LARGE else True


@pytest.mark.parametrize("name", ONE_CHIP + [LARGE])
def test_a_row_a_buffer_leaves_only_the_data_dependencies(name):
    """reuse="none": every input and every buffer written has a row of its own, so the only hazards are the
    plan's data dependencies (no write-after-read or write-after-write between kernels); more rows than fifo."""
    chip = planned(name)[1].chips[0]
    rows_of, count = rows(name, "none")
    used = [b for b in range(chip.n_buffers) if rows_of[b] >= 0]
    assert len({int(rows_of[b]) for b in used}) == len(used) == count > rows(name, "fifo")[1]
    assert hazards(tasks(name, "none")) == tuple(tuple(sorted(d)) for d in chip.deps)


def test_fifo_reuse_keeps_the_row_count_and_the_result():
    for name in ONE_CHIP + [LARGE]:
        assert rows(name, "fifo")[1] == rows(name, "lifo")[1], name
    name = "PolyX8_10L_1c"
    assert not mismatches(name, run_in(name, "fifo", range(len(planned(name)[1].chips[0].kernels))))
    with pytest.raises(ValueError, match="reuse"):
        assign_rows(planned(name)[1].chips[0], reuse="random")


@pytest.mark.parametrize("name", ["BootstrapModRaise_10L_1c", "PolyX8_10L_1c", LARGE])
def test_every_dropped_wait_is_caught(name):
    chip = planned(name)[1].chips[0]
    ts = tasks(name, "fifo")
    sch = assign_streams(ts, 4)
    cases = [(k, j) for k, w in enumerate(sch.waits) for j in w]
    assert cases
    for k, j in cases:
        waits = list(sch.waits)
        waits[k] = tuple(i for i in waits[k] if i != j)
        with pytest.raises(ExecutionError, match="not ordered after"):
            check_schedule(ts, dataclasses.replace(sch, waits=tuple(waits)))
    for j in sch.joins:
        broken = dataclasses.replace(sch, joins=tuple(i for i in sch.joins if i != j))
        with pytest.raises(ExecutionError, match="not joined"):
            check_schedule(ts, broken)


def test_malformed_schedules_are_rejected():
    name = "PolyX8_10L_1c"
    chip = planned(name)[1].chips[0]
    ts = tasks(name, "fifo")
    sch = assign_streams(ts, 2)
    with pytest.raises(ExecutionError, match="covers"):
        check_schedule(ts, dataclasses.replace(sch, stream=sch.stream[:-1]))
    with pytest.raises(ExecutionError, match="outside"):
        check_schedule(ts, dataclasses.replace(sch, stream=(5,) + sch.stream[1:]))
    k = next(k for k, w in enumerate(sch.waits) if w)
    event = list(sch.event)
    event[sch.waits[k][0]] = -1
    with pytest.raises(ExecutionError, match="records no event"):
        check_schedule(ts, dataclasses.replace(sch, event=tuple(event)))
    # everything on stream 1 of 2 without waits: ordered, but not joined to stream 0
    one = dataclasses.replace(sch, stream=(1,) * len(chip.kernels), waits=((),) * len(chip.kernels), joins=())
    with pytest.raises(ExecutionError, match="not joined"):
        check_schedule(ts, one)
    with pytest.raises(ValueError, match="need n_streams >= 1"):
        assign_streams(ts, 0)


def test_data_deps_alone_are_not_enough():
    name = "Mul_10L_1c"
    chip = planned(name)[1].chips[0]
    ts = tasks(name, "lifo")
    with pytest.raises(ExecutionError, match="write-after-read"):
        check_schedule(ts, own_streams(chip, chip.deps))


def test_comm_kernels_stay_on_stream_zero():
    plan = build_plan(load_corpus("Mul_10L_2c"))
    for chip in plan.chips:
        assert any(k.kind is Kind.COMM for k in chip.kernels)
        ts = chip_tasks(chip, assign_rows(chip, reuse="fifo")[0])
        sch = assign_streams(ts, 4)
        check_schedule(ts, sch)
        assert all(s == 0 for k, s in zip(chip.kernels, sch.stream) if k.kind is Kind.COMM)


def test_reserved_streams_take_only_pinned_tasks():
    """Pinned tasks (a device's communication) keep their stream, in order; the others never use
    the reserved ones; the check rejects a pinned task moved elsewhere."""
    name = "BootstrapModRaise_10L_1c"
    base = tasks(name, "fifo")
    ts = [dataclasses.replace(t, stream=3) if k % 7 == 0 else t for k, t in enumerate(base)]
    sch = assign_streams(ts, 4, reserved=1)
    check_schedule(ts, sch)
    assert all((s == 3) == (k % 7 == 0) for k, s in enumerate(sch.stream))
    assert len(set(sch.stream) - {3}) > 1
    moved = dataclasses.replace(sch, stream=(0,) + sch.stream[1:])
    with pytest.raises(ExecutionError, match="must go on stream 3"):
        check_schedule(ts, moved)
    with pytest.raises(ValueError, match="reserved"):
        assign_streams(ts, 2, reserved=2)
    with pytest.raises(ValueError, match="pinned to stream 3"):
        assign_streams(ts, 3)


# ---------------------------------------------------------------------------------------------- execution


@pytest.mark.parametrize("reuse", REUSE)
@pytest.mark.parametrize("n_streams", [2, 4, 8])
@pytest.mark.parametrize("name", ONE_CHIP)
def test_out_of_order_runs_are_bit_identical(name, n_streams, reuse):
    chip = planned(name)[1].chips[0]
    sch = assign_streams(tasks(name, reuse), n_streams)
    orders = {tuple(happens_before_order(sch, np.random.default_rng(seed))) for seed in range(12)}
    if streams_used(sch) > 1:
        assert len(orders) > 1
    for order in orders:
        assert sorted(order) == list(range(len(chip.kernels)))
        problems = mismatches(name, run_in(name, reuse, order))
        assert not problems, f"{name} {n_streams} streams {reuse}: " + "; ".join(problems[:3])


@pytest.mark.parametrize("reuse", REUSE)
@pytest.mark.parametrize("name", ONE_CHIP + [LARGE])
def test_hazards_are_complete(name, reuse):
    """Every kernel on its own stream, waiting only for its hazards: any order of that DAG
    reproduces the in-order run."""
    chip = planned(name)[1].chips[0]
    ts = tasks(name, reuse)
    sch = own_streams(chip, hazards(ts))
    check_schedule(ts, sch)
    seeds = 4 if name == LARGE else 16
    orders = {tuple(happens_before_order(sch, np.random.default_rng(seed))) for seed in range(seeds)}
    if reuse == "fifo":  # (last-in first-out reuse orders the small programs' kernels totally)
        assert len(orders) > 1
    for order in orders:
        problems = mismatches(name, run_in(name, reuse, order))
        assert not problems, f"{name} {reuse}: " + "; ".join(problems[:3])


def test_random_orders_catch_missing_hazards():
    """The execution check is sensitive: orders allowed by the data dependencies alone (no row
    reuse hazards) give wrong stores."""
    name = "Mul_10L_1c"
    chip = planned(name)[1].chips[0]
    sch = own_streams(chip, chip.deps)
    wrong = sum(bool(mismatches(name, run_in(name, "lifo", happens_before_order(sch, np.random.default_rng(seed)))))
                for seed in range(16))
    assert wrong > 0
