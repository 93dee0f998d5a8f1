"""The communication layer on the CPU: collectives derived from plans, their global order, the
placement of chips on devices, per-device communication steps, and the multi-device executor
over the fake fabric (NCCL's semantics in host threads) against the reference."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))

from caramel.backends.numpy_backend import NumpyBackend  # noqa: E402
from caramel.ckks.check import check_path, prepare_check  # noqa: E402
from caramel.errors import DeadlockError, ExecutionError  # noqa: E402
from caramel.execute.drive import HostRun, run_on_devices, run_threads  # noqa: E402
from caramel.execute.fabric import RowOp  # noqa: E402
from caramel.execute.fabric.threads import FakeNetwork  # noqa: E402
from caramel.execute.placement import ZERO, LocalSum, ModRows, device_comm_step, device_programs, placement  # noqa: E402
from caramel.execute.runner import DeviceRun  # noqa: E402
from caramel.plan.collectives import (  # noqa: E402
    Collective, CollectiveKind, check_reduce_size, plan_collectives,
)
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.plan import Kind, PlanError, build_plan  # noqa: E402
from caramel.program import Mem, Opcode  # noqa: E402
from caramel.ring import Context  # noqa: E402

from plan_helpers import corpus, load_corpus, program_from_text, random_memory, store_mismatches  # noqa: E402

B, R = CollectiveKind.BROADCAST, CollectiveKind.REDUCE


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


@lru_cache(maxsize=4)
def prepared(name: str):
    program = load_corpus(name)
    return program, build_plan(program), prepare_check(check_path(program.name), program, context(1024), rng=3).memory


# ---------------------------------------------------------------------------------------------- collectives


def test_collectives_of_a_real_program_match_its_communication():
    program, plan, _ = prepared("MulRotate_10L_4c")
    cols = plan_collectives(plan, context(1024).primes)
    comms = [(chip.chip, c) for chip in plan.chips for k in chip.kernels if k.kind is Kind.COMM for c in k.comms]
    assert sum(len(c.members) for c in cols) == len(comms)
    assert [c.key for c in cols] == sorted(c.key for c in cols)
    for c in cols:
        assert c.root in c.members
        if c.kind is B:
            assert c.src[0][0] == c.root and {ch for ch, _ in c.dst} == set(c.members) - {c.root}
        else:
            assert [ch for ch, _ in c.dst] == [c.root] and {ch for ch, _ in c.src} == set(c.members)


def _retag(plan, chip: int, fn):
    """A copy of ``plan`` whose chip's COMM kernels pass through ``fn`` (None drops one)."""
    cp = plan.chips[chip]
    kernels = []
    for k in cp.kernels:
        k2 = fn(k) if k.kind is Kind.COMM else k
        if k2 is not None:
            kernels.append(k2)
    chips = list(plan.chips)
    chips[chip] = dataclasses.replace(cp, kernels=tuple(kernels))
    return dataclasses.replace(plan, chips=tuple(chips))


def test_participants_at_different_levels_are_refused():
    _, plan, _ = prepared("Mul_10L_2c")
    bad = _retag(plan, 1, lambda k: dataclasses.replace(k, level=k.level + 1))
    with pytest.raises(PlanError, match="different plan levels"):
        plan_collectives(bad)


def test_a_missing_participant_is_refused_before_any_work():
    _, plan, memory = prepared("Mul_10L_2c")
    seen = []

    def drop_first(k):
        if not seen:
            seen.append(k)
            return None
        return k

    bad = _retag(plan, 1, drop_first)
    with pytest.raises(PlanError, match=r"chip 0 line \d+: dis @ \d+:2 has 0 receiver\(s\) \(chips none\), expected 1"):
        run_on_devices(bad, context(1024), memory, gpus=2)


def test_plan_pairing_uses_the_rules_of_validate():
    """A plan's communication is checked by the same pairing rules as a program
    (:func:`caramel.validate.check_pairing`): a second sender for one id is named as validate names it."""
    _, plan, _ = prepared("Mul_10L_2c")

    def rcv_to_dis(k):
        comms = tuple(c._replace(op=Opcode.DIS, src=c.dst, dst=-1) if c.op is Opcode.RCV else c for c in k.comms)
        return dataclasses.replace(k, comms=comms)

    with pytest.raises(PlanError, match=r"dis @ \d+ has two senders: chip 0 \(chip 0:\d+\) and chip 1"):
        plan_collectives(_retag(plan, 1, rcv_to_dis))


def test_reduce_size_guard():
    q = (1 << 28) - 57
    check_reduce_size(16, q, "joi")
    with pytest.raises(ExecutionError, match="at most 16 participants"):
        check_reduce_size(17, q, "joi @ 1")


def check_order(sequences: Mapping[int, Sequence[object]], members: Mapping[object, Iterable[int]]) -> list[object]:
    """One global order of collectives consistent with every rank's own issue order, or an
    :class:`ExecutionError`.

    ``sequences[r]``: the collective ids rank r issues, in order; ``members[x]``: the ranks of
    collective x. Each rank must issue each of its collectives exactly once, and the union of the
    per-rank orders must be acyclic (otherwise two ranks wait on each other: the error names
    the cycle). Returns a topological order of all collectives.
    """
    import networkx as nx

    problems = []
    for x, ranks in members.items():
        for r in ranks:
            count = list(sequences.get(r, ())).count(x)
            if count != 1:
                problems.append(f"rank {r} issues collective {x} {count} times, expected once")
    for r, seq in sequences.items():
        for x in seq:
            if r not in set(members.get(x, ())):
                problems.append(f"rank {r} issues collective {x} but is not one of its members")
    if problems:
        raise ExecutionError("inconsistent collectives:\n  " + "\n  ".join(problems[:20]))
    g = nx.DiGraph()
    g.add_nodes_from(members)
    for r, seq in sequences.items():
        g.add_edges_from(zip(seq[:-1], seq[1:]), rank=r)
    try:
        return list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(g)
        text = ", ".join(f"{a} before {b} on rank {g.edges[a, b]['rank']}" for a, b in cycle)
        raise ExecutionError(f"no collective order is consistent with every rank: {text}") from None


def test_check_order_accepts_one_global_order_and_names_a_cycle():
    members = {"a": (0, 1), "b": (1, 2), "c": (0, 2)}
    order = check_order({0: ["a", "c"], 1: ["a", "b"], 2: ["b", "c"]}, members)
    assert order.index("a") < order.index("b") < order.index("c")
    with pytest.raises(ExecutionError, match="no collective order is consistent"):
        check_order({0: ["a", "c"], 1: ["b", "a"], 2: ["c", "b"]}, members)
    with pytest.raises(ExecutionError, match="issues collective b 0 times"):
        check_order({0: ["a", "c"], 1: ["a"], 2: ["b", "c"]}, members)


def test_every_corpus_plan_has_a_consistent_collective_order():
    for name in corpus(chips=(2, 4, 8)):
        _, plan, _ = prepared(name)
        cols = plan_collectives(plan, context(1024).primes)
        seqs = {c: [] for c in range(len(plan.chips))}
        for chip in plan.chips:
            for k in chip.kernels:
                if k.kind is Kind.COMM:
                    seqs[chip.chip] += sorted(c.sync for c in k.comms)
        check_order(seqs, {c.sync: c.members for c in cols})


def test_placement_is_contiguous_blocks():
    assert placement(8, 2) == (0, 0, 0, 0, 1, 1, 1, 1)
    assert placement(8, 8) == tuple(range(8))
    assert placement(4, 8) == (0, 1, 2, 3)
    assert placement(3, 1) == (0, 0, 0)


def test_device_step_of_a_broadcast_over_two_devices():
    col = Collective(7, B, 0, (0, 1, 2, 3), 5, 0, ((0, 10),), ((1, 11), (2, 12), (3, 13)))
    where = placement(4, 2)
    root = device_comm_step(0, [col], 0, where)
    assert [(o.kind, o.group, o.root, o.send, o.recv) for o in root.ops] == [(B, (0, 1), 0, (0, 10), None)]
    assert root.after == (LocalSum(((0, 10),), (1, 11), 5),)
    other = device_comm_step(0, [col], 1, where)
    assert [(o.send, o.recv) for o in other.ops] == [(None, (2, 12))]
    assert other.after == (LocalSum(((2, 12),), (3, 13), 5),)


def test_device_step_of_a_reduce_sums_locally_first():
    col = Collective(9, R, 3, (0, 1, 2, 3), 2, 0, ((0, 1), (1, 2), (2, -1), (3, 4)), ((3, 5),))
    where = placement(4, 2)
    d0 = device_comm_step(0, [col], 0, where)
    assert d0.before == (LocalSum(((0, 1), (1, 2)), (-1, 0), 2),) and d0.scratch == 1
    assert [(o.send, o.recv, o.root) for o in d0.ops] == [((-1, 0), None, 1)]
    d1 = device_comm_step(0, [col], 1, where)
    assert [(o.send, o.recv) for o in d1.ops] == [((3, 4), (3, 5))]
    assert d1.after == (ModRows(((3, 5),), 2),)
    local = device_comm_step(0, [col], 0, placement(4, 1))
    assert local.ops == () and local.before == (LocalSum(((0, 1), (1, 2), (3, 4)), (3, 5), 2),)
    empty = Collective(9, R, 1, (0, 1), 2, 0, ((0, -1), (1, -1)), ((1, 5),))
    assert device_comm_step(0, [empty], 0, placement(2, 2)).ops[0].send == ZERO


# ---------------------------------------------------------------------------------------------- fake fabric


@pytest.mark.parametrize("name", corpus(chips=(2, 4, 8)))
def test_devices_match_the_reference(name):
    program, plan, memory = prepared(name)
    want = run_reference(program, context(1024), memory)
    for g in sorted({1, 2, len(plan.chips) // 2, len(plan.chips)}):
        have = run_on_devices(plan, context(1024), memory, gpus=g)
        problems = store_mismatches(want, have)
        assert not problems, f"{name} on {g} devices: " + "; ".join(problems[:3])


@pytest.mark.parametrize("name", corpus(chips=(2, 4, 8)))
def test_devices_on_several_streams_match_the_reference(name):
    """Each device's tasks in a random order that its multi-stream schedule allows (kernels
    spread over S - 1 streams, communication on stream S - 1), as the GPUs may run them."""
    program, plan, memory = prepared(name)
    want = run_reference(program, context(1024), memory)
    k = len(plan.chips)
    for g, streams in sorted({(1, 2), (2, 3), (k, 2), (k, 3)}):
        have = run_on_devices(plan, context(1024), memory, gpus=g, streams=streams, seed=g * streams)
        problems = store_mismatches(want, have)
        assert not problems, f"{name} on {g} devices, {streams} streams: " + "; ".join(problems[:3])


def test_device_schedules_put_communication_on_its_own_stream():
    program, plan, memory = prepared("BootstrapModRaise_10L_4c")
    run = HostRun(plan, context(1024), memory, gpus=2, streams=3)
    for r, sch in zip(run.runs, run.schedules):
        comm = [t for t, task in enumerate(r.tasks) if task.name.startswith("communication")]
        assert comm and all(sch.stream[t] == 2 for t in comm)
        assert all(sch.stream[t] < 2 for t in range(len(r.tasks)) if t not in comm)
        assert [c for t in comm for c in r.task_calls[t]] == [c for c in range(len(r.calls)) if r.is_comm(c)]
        assert sum(len(r.task_calls[t]) for t in range(len(r.tasks))) == len(r.calls)


@pytest.mark.parametrize("name", corpus(chips=(2, 4, 8)))
def test_gpu_device_programs_never_overwrite_their_inputs(name):
    """The device programs the GPUs replay (:func:`gpu_device_programs`): no kernel and no
    communication step writes an input's or the zero buffer's row, so a replay needs no restore."""
    from caramel.execute.placement import gpu_device_programs

    program, plan, memory = prepared(name)
    for g, streams in ((1, 1), (2, 2), (len(plan.chips), 2)):
        for prog in gpu_device_programs(plan, g, context(1024), streams):
            run = DeviceRun(prog, plan, context(1024), memory, "exact", NumpyBackend)
            written = set().union(*(t.writes for t in run.tasks))
            assert not written & set(run.init_rows.tolist()), f"{name} on {g} devices, device {prog.device}"


@pytest.mark.parametrize("chips, devices", [(4, 2), (8, 8)])
def test_relayout_equals_a_fresh_build(chips, devices):
    """:func:`relayout` (how a GPU run short of memory falls back from a row a buffer to first-in first-out without
    checking the collectives again) gives the device programs that a build with the new layout gives."""
    from caramel.execute.placement import relayout

    _, plan, _ = prepared(f"MulRotate_10L_{chips}c")
    primes = context(1024).primes
    none = device_programs(plan, devices, primes, reuse="none", keep_inputs=True)
    for old, want in zip(none, device_programs(plan, devices, primes, reuse="fifo", keep_inputs=True)):
        have = relayout(old, plan, "fifo", keep_inputs=True)
        assert have.n_rows < old.n_rows and have.scratch_base > 0
        assert have.rows_of.keys() == want.rows_of.keys()
        assert all(np.array_equal(have.rows_of[c], want.rows_of[c]) for c in want.rows_of)
        assert dataclasses.replace(have, rows_of={}) == dataclasses.replace(want, rows_of={})


def test_random_stream_orders_catch_a_missing_wait():
    """Without the waits between kernels and communication, some random order reads a limb before
    it arrives or overwrites one before it is sent: the multi-stream test above can fail."""
    program, plan, memory = prepared("MulRotate_10L_4c")
    want = run_reference(program, context(1024), memory)
    wrong = 0
    for seed in range(8):
        run = HostRun(plan, context(1024), memory, gpus=4, streams=2, seed=seed)
        run.schedules = [dataclasses.replace(s, waits=((),) * len(s.waits)) for s in run.schedules]
        wrong += bool(store_mismatches(want, run.result()))
    assert wrong > 0


@pytest.mark.parametrize("chips, devices", [(2, 2), (4, 2), (8, 8)])
def test_bootstraplike_20l_on_devices(chips, devices):
    program = load_corpus(f"BootstrapLike_20L_{chips}c")
    ctx = context(1024)
    memory = random_memory(program, ctx, seed=chips)
    want = run_reference(program, ctx, memory, "textbook")
    have = run_on_devices(build_plan(program), ctx, memory, "textbook", gpus=devices)
    assert not store_mismatches(want, have)


def test_joi_reduce_applies_mod_q_after_the_uint32_sum():
    # Three contributions of q - 1: the uint32 sum is 3q - 3, the result (q - 3) mod q.
    program = program_from_text(
        "load r0: i1(1)\njoi @ 65537:3 r1: r0 | 1\nstore r1: v1(1)",
        "load r0: i2(1)\njoi @ 65537:3 : r0 | 1",
        "load r0: i3(1)\njoi @ 65537:3 : r0 | 1",
    )
    ctx = context(1024)
    q = ctx.q(1)
    memory = {m: np.full(ctx.n, q - 1, dtype=np.uint32) for m in random_memory(program, ctx)}
    net = FakeNetwork(3)
    have = run_on_devices(build_plan(program), ctx, memory, gpus=3, network=net)
    assert np.all(have.stores[0][Mem("v1", 1)] == q - 3)
    assert [len(calls) for calls in net.log] == [1, 1, 1]
    assert {(op.kind, op.root, op.group) for calls in net.log for op in calls[0]} == {(R, 0, (0, 1, 2))}


def test_joi_with_one_contribution_arrives_as_sent():
    """The reference's joi copies its first contribution and adds later ones mod q: with one source (the others
    sourceless) the destination gets that limb as it was, even a residue of another prime at or above q_base;
    the devices' uint32 reduce then skips the ``% q``."""
    program = program_from_text("joi @ 65537:2 r1:  | 1\nstore r1: v1(1)", "load r0: i2(2)\njoi @ 65537:2 : r0 | 1")
    ctx = context(1024)
    memory = {m: np.full(ctx.n, ctx.q(m.limb) - 1, dtype=np.uint32) for m in random_memory(program, ctx)}
    assert ctx.q(2) - 1 >= ctx.q(1)
    have = run_on_devices(build_plan(program), ctx, memory, gpus=2)
    assert np.all(have.stores[0][Mem("v1", 1)] == ctx.q(2) - 1)
    assert not store_mismatches(run_reference(program, ctx, memory), have)


def test_one_group_call_per_communication_step():
    _, plan, memory = prepared("MulRotate_10L_8c")
    progs = device_programs(plan, 8, context(1024).primes)
    net = FakeNetwork(8)
    run_on_devices(plan, context(1024), memory, gpus=8, network=net)
    for d, prog in enumerate(progs):
        steps = [s for s in prog.steps if not isinstance(s, tuple) and s.ops]
        n_ops = sum(len(s.ops) for s in steps)
        assert len(net.log[d]) == len(steps)
        assert sum(op.rows for g in net.log[d] for op in g) == n_ops
        assert sum(len(g) for g in net.log[d]) < n_ops  # limbs of one root share one call
    assert max(op.rows for g in net.log[0] for op in g) > 1


def test_pack_buckets_by_group_kind_and_root_in_the_same_order_everywhere():
    from caramel.execute.placement import DeviceOp, pack, staging_rows

    ops = [DeviceOp(s, k, (0, 1), r, (0, s), None, 1) for s, k, r in
           ((5, B, 1), (3, B, 0), (9, R, 1), (4, B, 1), (7, B, 0), (8, R, 1))]
    buckets = pack(ops)
    assert [[o.sync for o in b] for b in buckets] == [[3, 7], [4, 5], [8, 9]]
    assert pack(list(reversed(ops))) == buckets
    assert staging_rows(ops) == 6 and staging_rows(ops[:1]) == 0


def _fabric_pair(timeout=0.5):
    net = FakeNetwork(2, timeout)
    backends = [NumpyBackend(context(1024), 4) for _ in range(2)]
    return net, backends


def test_fake_fabric_detects_a_collective_order_mismatch():
    net, bs = _fabric_pair()
    a = RowOp(1, B, (0, 1), 0, 0, -1)
    b = RowOp(2, B, (0, 1), 1, -1, 1)
    workers = [lambda: net.fabric(0).group(bs[0], [a, dataclasses.replace(b, send=-1, recv=1)]),
               lambda: net.fabric(1).group(bs[1], [b, dataclasses.replace(a, send=-1, recv=1)])]
    with pytest.raises(ExecutionError, match="collective order mismatch on devices"):
        run_threads(workers, 5.0, net.abort, lambda d: "?")


def test_watchdog_names_the_device_that_never_joined():
    net, bs = _fabric_pair(timeout=0.3)
    op = RowOp(5, B, (0, 1), 0, -1, 2)
    gate = threading.Event()

    def late():
        gate.wait(2.0)

    start = time.monotonic()
    with pytest.raises(DeadlockError, match=r"device\(s\) \[0\] never issued it"):
        run_threads([late, lambda: net.fabric(1).group(bs[1], [op])], 5.0, net.abort, lambda d: "waiting")
    gate.set()
    assert time.monotonic() - start < 3.0


def test_watchdog_timeout_reports_every_unfinished_device():
    net = FakeNetwork(2)
    gate = threading.Event()
    with pytest.raises(DeadlockError, match=r"(?s)no progress after 0.2 s.*device 0: stuck here.*device 1: stuck here"):
        run_threads([lambda: gate.wait(3.0)] * 2, 0.2, net.abort, lambda d: "stuck here")
    gate.set()


# ---------------------------------------------------------------------------------------------- parts and rows


def run_device_programs(progs, plan, ctx, memory, mode="exact", *, streams: int = 1, seed: int = 0):
    """Every device program (as given: any row layout) on the fake fabric in host threads; with ``streams`` > 1
    each device runs its tasks in a random order that its schedule allows (as :class:`HostRun`)."""
    from caramel.execute.result import merge_results
    from caramel.plan.streams import happens_before_order

    net = FakeNetwork(len(progs), 60.0)
    runs = [DeviceRun(p, plan, ctx, memory, mode, NumpyBackend, net.fabric(p.device)) for p in progs]

    def body(r):
        if streams > 1:
            order = happens_before_order(r.schedule(streams), np.random.default_rng((seed, r.prog.device)))
            for t in order:
                r.run_task(t)
        else:
            r.run()
        return r.prog.chips, r.stores()

    out = run_threads([lambda r=r: body(r) for r in runs], 60.0, net.abort, lambda d: runs[d].position)
    return merge_results(plan, memory, out), net


@pytest.mark.parametrize("name", corpus(chips=(2, 4, 8)))
def test_calls_in_place_over_contiguous_rows_match_the_reference(name):
    """With a row a buffer the rows are laid out for the calls (:func:`contiguous_rows`): no call of these programs
    needs a gather or scatter copy, and the devices, in random orders of their three-stream schedules, give the
    reference's stores bit for bit."""
    from caramel.execute.runner import _packed
    from caramel.execute.placement import CommStep

    program, plan, memory = prepared(name)
    want = run_reference(program, context(1024), memory)
    k = len(plan.chips)
    for g in sorted({2, k}):
        progs = device_programs(plan, g, context(1024).primes, reuse="none", keep_inputs=True)
        for p in progs:
            steps = [s for s in p.steps if isinstance(s, CommStep) and s.ops]
            assert all(not _packed(p, s.ops)[0] and not _packed(p, s.ops)[2] for s in steps), f"{name}: copies"
            assert p.n_rows == p.staging_base  # no staging row
        have, _ = run_device_programs(progs, plan, context(1024), memory, streams=3, seed=g)
        problems = store_mismatches(want, have)
        assert not problems, f"{name} on {g} devices: " + "; ".join(problems[:3])


def test_contiguous_rows_is_a_permutation_that_lays_out_every_call():
    from caramel.execute.placement import CommStep, bucket_sides, chip_rows, contiguous_rows, in_place

    _, plan, _ = prepared("BootstrapModRaise_10L_4c")
    for prog in device_programs(plan, 2, context(1024).primes, reuse="none", keep_inputs=True):
        old, base = chip_rows(plan, prog.chips, "none", True)
        new = contiguous_rows(old, base, prog.steps)
        assert sorted(r for c in prog.chips for r in new[c] if r >= 0) == list(range(base))
        assert all(np.array_equal(new[c] < 0, old[c] < 0) for c in prog.chips)
        calls = [b for s in prog.steps if isinstance(s, CommStep) for b in pack_of(s)]
        assert calls and all(in_place(side) for b in calls for side in bucket_sides(b, prog.row))


def pack_of(step):
    from caramel.execute.placement import pack

    return [b for b in pack(step.ops) if len(b) > 1]


def test_first_in_first_out_rows_go_through_staging_and_match():
    """Without a row a buffer the calls gather and scatter through staging rows, as before."""
    program, plan, memory = prepared("MulRotate_10L_4c")
    progs = device_programs(plan, 4, context(1024).primes, reuse="fifo", keep_inputs=True)
    assert any(p.n_rows > p.staging_base for p in progs)
    have, _ = run_device_programs(progs, plan, context(1024), memory, streams=3, seed=5)
    assert not store_mismatches(run_reference(program, context(1024), memory), have)


def test_comm_parts_split_each_level_by_first_readers_in_one_order_for_all():
    from caramel.execute.placement import comm_parts

    _, plan, _ = prepared("BootstrapModRaise_10L_4c")
    cols = plan_collectives(plan, context(1024).primes)
    fine, coarse = comm_parts(plan, cols, 1), comm_parts(plan, cols, 10**6)
    assert all(len(parts) == 1 for parts in coarse.values())
    assert sum(len(p) for p in fine.values()) > len(fine)  # some level splits
    for parts in (fine, coarse, comm_parts(plan, cols)):
        flat = [c for level, ps in sorted(parts.items()) for p in ps for c in p]
        assert sorted(c.key for c in flat) == sorted(c.key for c in cols) and len(flat) == len(cols)
        assert all(c.level == level for level, ps in parts.items() for p in ps for c in p)
    mid = comm_parts(plan, cols, 4)
    assert all(len(p) >= 4 for ps in mid.values() if len(ps) > 1 for p in ps)


def test_a_kernel_waits_for_the_part_it_reads_not_for_the_whole_level():
    """With every part apart (no least size), some kernel follows one part of a level and not another, and the
    devices still match the reference."""
    from caramel.execute.placement import CommStep
    from caramel.plan.streams import hazards

    program, plan, memory = prepared("BootstrapModRaise_10L_4c")
    progs = device_programs(plan, 2, context(1024).primes, reuse="none", keep_inputs=True, part_limbs=1)
    found = False
    for prog in progs:
        run = DeviceRun(prog, plan, context(1024), memory, "exact", NumpyBackend)
        need: list[set[int]] = []  # every task a task follows, through any chain of hazards
        for t, direct in enumerate(hazards(run.tasks)):
            need.append(set(direct).union(*(need[j] for j in direct)))
        levels: dict[int, list[int]] = {}
        for t, s in enumerate(prog.steps):
            if isinstance(s, CommStep):
                levels.setdefault(s.level, []).append(t)
        for t, s in enumerate(prog.steps):
            if not isinstance(s, CommStep):
                for parts in levels.values():
                    if len(parts) > 1 and any(p in need[t] for p in parts) and not all(p in need[t] for p in parts):
                        found = True
    assert found
    have, _ = run_device_programs(progs, plan, context(1024), memory, streams=3, seed=1)
    assert not store_mismatches(run_reference(program, context(1024), memory), have)


@pytest.mark.parametrize("name", ["MulRotate_10L_1c", "BootstrapModRaise_10L_1c"])
def test_a_one_chip_program_keeps_its_rows_and_steps(name):
    """A 1-chip program has no collective: its device program is the chip's kernels in order on assign_rows' rows,
    as before the calls were laid out (its replay and stream schedule do not change)."""
    from caramel.execute.placement import chip_rows

    _, plan, _ = prepared(name)
    (prog,) = device_programs(plan, 1, context(1024).primes, reuse="none", keep_inputs=True)
    rows, base = chip_rows(plan, (0,), "none", True)
    assert np.array_equal(prog.rows_of[0], rows[0]) and prog.scratch_base == base
    assert [s[1] for s in prog.steps] == list(range(len(plan.chips[0].kernels)))
