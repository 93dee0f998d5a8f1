"""Row order inside kernels (caramel.plan.order.recent_first): rows whose inputs were written most
recently go first; the plan computes the same values."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import pytest

from caramel.backends.cuda.target import CUDA_TARGET
from caramel.errors import ArgumentError
from caramel.execute.drive import run_plan
from caramel.plan import Kind, build_plan
from caramel.plan.order import for_target, recent_first, write_order
from caramel.ring import Context
from caramel.target import NEUTRAL

from plan_helpers import check_plan, corpus, load_corpus, program_from_text, random_memory, store_mismatches


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


def input_keys(chip, target=NEUTRAL):
    """Per kernel, the write rank of each row's most recent input on ``target``, as recent_first defines it."""
    rank, seq, keys = {}, 0, []
    for kernel in chip.kernels:
        keys.append([max((rank.get(b, -1) for b in row.ins), default=-1) for row in kernel.rows])
        written = ([c.dst for c in kernel.comms if c.dst >= 0] if kernel.kind is Kind.COMM
                   else [b for row in write_order(kernel, target) for b in row.outs])
        for b in written:
            rank[b], seq = seq, seq + 1
    return keys


def chain_program():
    """Two limbs' elementwise chain: x_l = a_l * b_l for l = 0..3, then y_l = x_l + c_l, in plan order
    l = 0..3 both times: the second kernel's most recent inputs are x_3, x_2, ..."""
    return program_from_text(chain_program_text())


def chain_program_text() -> str:
    lines = []
    for l in range(4):
        lines += [f"load r{10 * l}: i1({l})", f"load r{10 * l + 1}: i2({l})", f"load r{10 * l + 2}: i3({l})"]
    for l in range(4):
        lines += [f"mul r{10 * l + 3}: r{10 * l}, r{10 * l + 1} | {l}", f"ntt r{10 * l + 4}: r{10 * l + 3} | {l}"]
    for l in range(4):
        lines += [f"add r{10 * l + 5}: r{10 * l + 4}, r{10 * l + 2} | {l}", f"store r{10 * l + 5}: v1({l})"]
    return "\n".join(lines)


def test_a_consumer_reads_the_last_written_rows_first():
    """After an elementwise kernel (rows written in row order) and an NTT (two kernels on the CUDA backend: rows
    finished in reverse row order), each kernel takes its rows most-recent-input first."""
    plan = build_plan(chain_program(), row_order="batch", fuse_epilogue=False)
    ordered = recent_first(plan, CUDA_TARGET)
    kinds = [k.kind for k in ordered.chips[0].kernels]
    assert kinds == [Kind.ELEMENTWISE, Kind.NTT, Kind.ELEMENTWISE]
    mul, ntt, add = ordered.chips[0].kernels
    # the NTT reads the products newest first: mul wrote limb 0 .. 3, so the NTT takes 3 .. 0
    assert [r.prime for r in ntt.rows] == [3, 2, 1, 0]
    # its second pass takes them last-first (limb 0, the last intermediate written, first), so it finishes
    # limb 3 last, and the sum takes limb 3 first
    assert [r.prime for r in add.rows] == [3, 2, 1, 0]
    assert [r.prime for r in mul.rows] == [0, 1, 2, 3]  # program inputs only: plan order kept
    # a half NTT (its reader runs the second pass) finishes its rows in row order
    mul, ntt, add = recent_first(build_plan(chain_program(), row_order="batch"), CUDA_TARGET).chips[0].kernels
    assert ntt.half and add.expr.transformed
    assert [r.prime for r in ntt.rows] == [3, 2, 1, 0] and [r.prime for r in add.rows] == [0, 1, 2, 3]


def test_an_intt_finishes_its_rows_in_order():
    """An INTT (one kernel on the CUDA backend, limb by limb) finishes its rows in row order, so its reader takes
    them last-first."""
    text = chain_program_text().replace("ntt r", "int r")
    plan = build_plan(program_from_text(text), row_order="batch")
    mul, intt, add = recent_first(plan, CUDA_TARGET).chips[0].kernels
    assert intt.kind is Kind.INTT
    assert [r.prime for r in intt.rows] == [3, 2, 1, 0] and [r.prime for r in add.rows] == [0, 1, 2, 3]
    assert write_order(intt, CUDA_TARGET) == intt.rows


def test_build_plan_orders_rows_by_recency_by_default():
    program = load_corpus("BootstrapModRaise_4L_2c")
    batch = build_plan(program, row_order="batch")
    default = build_plan(program)
    assert default.chips == recent_first(batch).chips != batch.chips
    assert recent_first(default).chips == default.chips  # a fixed point: ordering again changes nothing
    assert "order" in default.timings and "order" not in batch.timings
    with pytest.raises(ArgumentError, match="row_order"):
        build_plan(program, row_order="newest")


def test_rows_are_a_permutation_and_sorted_by_recency():
    program = load_corpus("BootstrapModRaise_4L_2c")
    plan = build_plan(program, row_order="batch")
    ordered = recent_first(plan)
    check_plan(ordered)
    moved = 0
    for before, after in zip(plan.chips, ordered.chips):
        assert before.deps == after.deps and before.stores == after.stores
        for k0, k1 in zip(before.kernels, after.kernels):
            assert Counter(k0.rows) == Counter(k1.rows)
            assert (k0.kind, k0.expr, k0.level, k0.lines, k0.comms, k0.prologue) == \
                (k1.kind, k1.expr, k1.level, k1.lines, k1.comms, k1.prologue)
            if k0.kind is Kind.COMM:
                assert k0 == k1
            moved += k0.rows != k1.rows
        for keys in input_keys(after):
            assert keys == sorted(keys, reverse=True)
    assert moved > 0  # the pass does reorder something in a real plan


@pytest.mark.parametrize("name", [n for n in corpus(limbs=(4,), chips=(1, 2)) if n.split("_")[0] in
                                  ("Mul", "MulRotate", "BootstrapModRaise", "PolyX8", "Relin")])
def test_reordered_plans_compute_the_same_stores(name):
    program = load_corpus(name)
    ctx = context(256)
    memory = random_memory(program, ctx, seed=6)
    plan = build_plan(program, row_order="batch")
    for mode in ("exact", "emulator"):
        assert not store_mismatches(run_plan(plan, ctx, memory, mode), run_plan(recent_first(plan), ctx, memory, mode))


def test_on_the_neutral_target_every_transform_finishes_its_rows_in_order():
    """The NumPy backend's target runs every kernel's rows in order: the NTT's rows finish in row order, as the
    INTT's."""
    plan = build_plan(chain_program(), row_order="batch", fuse_epilogue=False)
    mul, ntt, add = recent_first(plan, NEUTRAL).chips[0].kernels
    assert ntt.kind is Kind.NTT and not ntt.half
    assert write_order(ntt, NEUTRAL) == ntt.rows
    assert [r.prime for r in ntt.rows] == [3, 2, 1, 0] and [r.prime for r in add.rows] == [0, 1, 2, 3]


def test_a_plan_is_ordered_for_its_target():
    """build_plan records the target it ordered the rows for; a plan ordered for another target (the neutral one of
    the plan cache's default) re-sorted for the CUDA backend's (what the GPU executors do) is the plan built for it;
    a plan in batch order is left as it is."""
    program = load_corpus("BootstrapLike_51L_1c")
    neutral, cuda = build_plan(program), build_plan(program, target=CUDA_TARGET)
    batch = build_plan(program, row_order="batch")
    assert (neutral.target, cuda.target, batch.target) == (NEUTRAL, CUDA_TARGET, None)
    assert cuda.chips == recent_first(batch, CUDA_TARGET).chips != neutral.chips
    assert for_target(neutral, CUDA_TARGET).chips == cuda.chips
    assert for_target(cuda, CUDA_TARGET) is cuda and for_target(batch, CUDA_TARGET) is batch
