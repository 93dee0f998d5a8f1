"""The plan: lowering, vertical fusion, horizontal batching, communication groups, levels,
arena rows, reports, and the figures on BootstrapLike_51L."""

from __future__ import annotations

import json

import pytest

from caramel.errors import DeadlockError
from caramel.plan import Kind, ScalarSpec, assign_rows, build_plan
from caramel.plan.kernel import Prologue
from caramel.plan.report import plan_report, plan_stats
from caramel.program import Mem, Opcode

from plan_helpers import check_plan, corpus, load_corpus, program_from_text


def kinds(plan, chip=0):
    return [k.kind for k in plan.chips[chip].kernels]


def test_a_chain_fuses_into_one_kernel_that_reads_each_input_once():
    plan = build_plan(program_from_text(
        """
        load r0: i1(0)
        load r1: i2(0)
        mul r3: r0, r1 | 0
        add r4: r3[X], r0 | 0
        neg r5: r4[X] | 0
        store r5: v1(0)
        """
    ))
    check_plan(plan)
    (k,) = plan.chips[0].kernels
    assert k.kind is Kind.ELEMENTWISE and k.expr.text() == "v2s0: t2=mul(v0,v1) t3=add(t2,v0) t4=neg(t3) -> t4"
    (row,) = k.rows
    c = plan.chips[0]
    assert row.ins == (c.inputs[Mem("i1", 0)], c.inputs[Mem("i2", 0)]) and row.outs == (c.stores[Mem("v1", 0)],)
    assert k.lines == (4, 5, 6)


def test_a_value_read_twice_or_stored_is_a_kernel_output():
    plan = build_plan(program_from_text(
        """
        load r0: i1(0)
        load r1: i2(0)
        mul r2: r0, r1 | 0
        add r3: r2, r0 | 0
        sub r4: r2, r1 | 0
        mul r5: r0, r0 | 0
        store r5: v3(0)
        neg r6: r5 | 0
        store r3: v1(0)
        store r4: v2(0)
        store r6: v4(0)
        """
    ), max_outputs=1)  # the trees themselves (sibling rows would merge those that share r0 or r2)
    check_plan(plan)
    c = plan.chips[0]
    texts = sorted(k.expr.text() for k in c.kernels)
    assert texts == [
        "v1s0: t1=mul(v0,v0) -> t1",
        "v1s0: t1=neg(v0) -> t1",
        "v2s0: t2=add(v0,v1) -> t2",
        "v2s0: t2=mul(v0,v1) -> t2",
        "v2s0: t2=sub(v0,v1) -> t2",
    ]
    # r2 (read twice) and r5 (stored) are outputs; mul(v0,v0) reads one input: another expression.
    assert [k.level for k in c.kernels] == [0, 0, 1, 1, 1]


def test_independent_limbs_batch_into_rows():
    text = "\n".join(f"load r{l}: i1({l})\nload r{10 + l}: i2({l})\nmul r{20 + l}: r{l}, r{10 + l} | {l}\n"
                     f"ntt r{30 + l}: r{20 + l} | {l}\nrot 3 r{40 + l}: r{30 + l} | {l}\nstore r{40 + l}: v1({l})"
                     for l in (3, 2, 1, 0))
    plan = build_plan(program_from_text(text), row_order="batch")  # rows as batched: in program order
    check_plan(plan)
    c = plan.chips[0]
    assert kinds(plan) == [Kind.ELEMENTWISE, Kind.NTT, Kind.AUTOMORPHISM]
    assert [k.size for k in c.kernels] == [4, 4, 4]
    assert [r.prime for r in c.kernels[1].rows] == [3, 2, 1, 0]
    assert [r.arg for r in c.kernels[2].rows] == [3, 3, 3, 3]
    assert [k.level for k in c.kernels] == [0, 1, 2] and c.deps == ((), (0,), (1,))


SUD_TEXT = """
        load r0: i1(3)
        int r1: r0[X] | 3
        load r2: i1(0)
        sud r3: r2[X], r1 | 0
        load r4: i2(0)
        add r5: r3[X], r4[X] | 0
        store r5: v1(0)
        """


def test_sud_lowers_to_lift_ntt_and_a_fused_tail():
    plan = build_plan(program_from_text(SUD_TEXT), fuse_ntt=False, fuse_epilogue=False)
    check_plan(plan)
    c = plan.chips[0]
    assert kinds(plan) == [Kind.INTT, Kind.SUD_LIFT, Kind.NTT, Kind.ELEMENTWISE]
    lift = c.kernels[1].rows[0]
    assert (lift.prime, lift.arg) == (0, 3)
    assert c.kernels[3].expr.text() == "v3s1: t4=sub(v0,v1) t5=mul(t4,s0) t6=add(t5,v2) -> t6"
    assert c.scalars == (ScalarSpec(None, (3,), 0),)
    assert c.kernels[3].rows[0].ins[1] == c.kernels[2].rows[0].outs[0]
    # By default the NTT lifts in its load (fusion across NTT boundaries): no lift kernel, no lifted limb.
    fused = build_plan(program_from_text(SUD_TEXT))
    check_plan(fused)
    assert kinds(fused) == [Kind.INTT, Kind.NTT, Kind.ELEMENTWISE]
    ntt = fused.chips[0].kernels[1]
    assert ntt.prologue == Prologue(Kind.SUD_LIFT, 1)
    assert (ntt.rows[0].prime, ntt.rows[0].arg, ntt.rows[0].ins) == (0, 3, c.kernels[1].rows[0].ins)
    # and the tail, the NTT's only reader, runs its second pass (an NTT epilogue): a half NTT, a transformed operand
    assert ntt.half and fused.chips[0].kernels[2].expr.text() == "v3s1: t4=sub(v0,v1^) t5=mul(t4,s0) t6=add(t5,v2) -> t6"


def test_base_conversion_is_one_kernel_and_its_reads_batch():
    plan = build_plan(program_from_text(
        """
        load r0: i1(0)
        load r1: i1(1)
        loas s0: s3(63)
        bci B0: [2,62,63], [0,1]
        pl1 B0: r0 | 0
        bcw B0: r1 | 1
        ntt r2: b0{2} | 63
        ntt r3: b0{0} | 2
        mus r4: r2, s0 | 63
        store r4: v1(63)
        store r3: v1(2)
        """
    ), fuse_epilogue=False)  # both NTTs in one kernel (else the one only mus reads is a half NTT of its own)
    check_plan(plan)
    c = plan.chips[0]
    assert kinds(plan) == [Kind.INTT, Kind.BASECONV, Kind.NTT, Kind.ELEMENTWISE]
    conv = c.kernels[1]
    assert (conv.in_limbs, conv.out_limbs) == ((0, 1), (2, 63))  # slot 1 (limb 62) is never read
    assert conv.rows[0].ins == (c.kernels[0].rows[0].outs[0], c.inputs[Mem("i1", 1)])  # pl1 -> INTT, bcw aliases
    assert c.kernels[2].size == 2
    assert c.scalars == (ScalarSpec(Mem("s3", 63), (), 63),)


def test_copies_and_dead_code_make_no_kernel():
    plan = build_plan(program_from_text(
        """
        load r0: i1(0)
        mov r1: r0 | 0
        neg r2: r1 | 0
        spill r1[X]: v7(0)
        load r3: v7(0)
        evg r4: k2(0)
        store r3: v1(0)
        """
    ))
    c = plan.chips[0]
    assert c.kernels == () and c.stores[Mem("v1", 0)] == c.inputs[Mem("i1", 0)] == c.stores[Mem("v7", 0)]
    assert Mem("k2", 0) not in c.inputs  # never used: not needed in memory


def test_unfused_plan_has_one_operation_per_row():
    program = load_corpus("MulRotate_10L_2c")
    plan = build_plan(program, fuse=False)
    check_plan(plan)
    assert all(len(k.expr.ops) == 1 for c in plan.chips for k in c.kernels if k.kind is Kind.ELEMENTWISE)
    assert plan.kernels > build_plan(program).kernels


def test_max_inputs_bounds_fused_trees():
    plan = build_plan(load_corpus("BootstrapLike_20L_1c"), max_inputs=3)
    check_plan(plan)
    assert max(k.expr.n_vec for c in plan.chips for k in c.kernels if k.expr) == 3


def test_communication_groups():
    plan = build_plan(load_corpus("MulRotate_4L_2c"))
    check_plan(plan)
    for c in plan.chips:
        groups = [k for k in c.kernels if k.kind is Kind.COMM]
        assert groups
        for k in groups:
            assert len({m.sync for m in k.comms}) == len(k.comms)
        # Input-broadcast keyswitching: each chip sends its own limbs and receives the others' in one group.
        assert any({m.op for m in k.comms} == {Opcode.DIS, Opcode.RCV} for k in groups)


def test_deadlock_is_found_at_build_time():
    program = program_from_text(
        "rcv @ 65537:2 r0: \nload r1: i1(2)\ndis @ 65538:2 : r1\nstore r0: v1(1)",
        "rcv @ 65538:2 r0: \nload r1: i1(1)\ndis @ 65537:2 : r1\nstore r0: v1(2)",
    )
    with pytest.raises(DeadlockError, match="chip 0 waits at .*instructions0:2"):
        build_plan(program)


@pytest.mark.parametrize("name", corpus() + [f"BootstrapLike_20L_{c}c" for c in (1, 2, 4, 8)])
def test_corpus_plans_are_well_formed(name):
    plan = build_plan(load_corpus(name))
    check_plan(plan)
    for c in plan.chips:
        for keep in (False, True):
            _check_rows(c, keep)


def _check_rows(chip, keep_inputs=False):
    """No two buffers that are live at the same time share an arena row."""
    rows, count = assign_rows(chip, keep_inputs=keep_inputs)
    start = list(chip.inputs.values()) + ([chip.zero_buffer] if chip.zero_buffer >= 0 else [])
    last = {}
    for k, kernel in enumerate(chip.kernels):
        for b in kernel.reads():
            last[b] = k
    for b in list(chip.stores.values()) + (start if keep_inputs else []):
        last[b] = len(chip.kernels)
    owner = {}
    for b in start:
        assert rows[b] not in owner
        owner[rows[b]] = b
    for k, kernel in enumerate(chip.kernels):
        for b in kernel.writes():
            r = int(rows[b])
            assert 0 <= r < count
            prev = owner.get(r)
            assert prev is None or last.get(prev, -1) < k, f"kernel {k}: row {r} of buffer {b} still holds live {prev}"
            owner[r] = b


@pytest.mark.parametrize("name", ["BootstrapLike_20L_1c", "BootstrapModRaise_10L_4c", "MulRotate_10L_2c"])
def test_kept_inputs_are_never_overwritten(name):
    """``keep_inputs``: no kernel writes an input's (or the zero buffer's) row, so a replayed
    graph needs no restore; without it, rows of dead inputs are reused."""
    plan = build_plan(load_corpus(name))
    reused = False
    for chip in plan.chips:
        start = list(chip.inputs.values()) + ([chip.zero_buffer] if chip.zero_buffer >= 0 else [])
        for keep in (False, True):
            rows, count = assign_rows(chip, keep_inputs=keep)
            kept = {int(rows[b]) for b in start}
            written = {int(rows[b]) for k in chip.kernels for b in k.writes()}
            if keep:
                assert not kept & written and count >= assign_rows(chip)[1]
            else:
                reused |= bool(kept & written)
    assert reused


def test_bootstraplike_51L_figures():
    """The workload of record: at most 1/10 as many kernels as instructions, and less memory
    traffic than one pass per instruction."""
    program = load_corpus("BootstrapLike_51L_1c")
    plan = build_plan(program)
    stats = plan_stats(plan, program)
    assert stats["kernels"] * 10 <= stats["instructions"], stats["kernels"]
    assert stats["plan_bytes"] < stats["instruction_bytes"]
    assert sum(v[0] for v in stats["by_kind"].values()) == plan.kernels
    check_plan(plan)


def test_report_and_json():
    program = load_corpus("Mul_4L_2c")
    plan = build_plan(program)
    text = plan_report(plan, program, n=4096)
    assert f"{program.instruction_count} instructions -> {plan.kernels} kernels" in text
    for line in ("elementwise", "per instruction:", "plan:", "critical path:", "parallel width:", "build time:"):
        assert line in text
    data = json.loads(plan.to_json())
    assert [len(c["kernels"]) for c in data["chips"]] == [len(c.kernels) for c in plan.chips]
    assert data["chips"][0]["kernels"][0]["kind"] in {k.value for k in Kind}


@pytest.mark.parametrize(("name", "ins", "scalars"), [
    ("add", (3, 4), ()), ("mul", (3, 3), ()), ("sub", (5,), (1,)), ("mul", (6,), (2,)), ("neg", (7,), ()),
])
def test_an_operation_alone_is_its_one_operation_tree(name, ins, scalars):
    """An unfused plan's unit of one elementwise operation (``fusion._op_unit``) is ``fusion._tree_unit`` of the
    one-operation tree that fusion would write for it, repeated operands included, sharing its expression object."""
    from caramel.plan import fusion

    twice = len(ins) == 2 and ins[0] == ins[1]
    args = [2 * b for b in (ins[:1] if twice else ins)] + ([2 * ins[0]] if twice else []) + [2 * s + 1 for s in scalars]
    exprs: dict = {}
    tree = fusion._tree_unit(0, (9,), [(0, name, tuple(args), 11)], exprs)
    alone = fusion._op_unit(0, ins, (9,), scalars, name, 11, exprs)
    assert alone == tree and alone.key is tree.key and len(exprs) == 1
