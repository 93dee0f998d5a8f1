"""Automorphisms computed in their consumers' loads (issue 14 item 3,
:func:`caramel.plan.fusion.fuse_automorphisms`): which rows fold, the gathered operands they leave
(``Expr.gathered``, ``Row.gather``), the NumPy gather, the cache, the CLI flag, and plans equal to
the reference."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from caramel.backends.numpy_backend import NumpyBackend
from caramel.execute.drive import run_plan
from caramel.execute.reference import run_reference
from caramel.plan import Kind, Row, build_plan, plan_report, plan_stats
from caramel.plan.fusion import Unit, fuse_automorphisms
from caramel.plan.kernel import Comm, Expr, ExprOp
from caramel.program import Opcode
from caramel.ring import Context

from plan_helpers import check_plan, corpus, load_corpus, program_from_text, random_memory, store_mismatches

ADD = Expr(2, 0, (ExprOp("add", (0, 1)),), (2,))


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


def aut(src: int, dst: int, step, index: int = 0) -> Unit:
    return Unit(Kind.AUTOMORPHISM, None, Row(0, (src,), (dst,), (), step), (src,), (dst,), (index,))


def add(a: int, b: int, out: int, index: int = 1) -> Unit:
    return Unit(Kind.ELEMENTWISE, ADD, Row(0, (a, b), (out,)), (a, b), (out,), (index,))


def gathered_reads(plan) -> int:
    return plan_stats(plan)["gathered_reads"]


# --------------------------------------------------------------------------- the pass on units


def test_an_automorphism_read_only_by_elementwise_rows_is_folded_into_each():
    units = [aut(10, 11, 3, 0), add(11, 12, 13, 1), add(14, 11, 15, 2), aut(20, 21, None, 3), add(21, 21, 22, 4)]
    out, lv = fuse_automorphisms(units, [0, 1, 1, 0, 1], pinned=set())
    assert [u.kind for u in out] == [Kind.ELEMENTWISE] * 3 and lv == [1, 1, 1]
    first, second, third = out
    assert first.row.ins == (10, 12) and first.key.gathered == (0,) and first.row.gather == (3,)
    assert second.row.ins == (14, 10) and second.key.gathered == (1,) and second.row.gather == (3,)
    assert third.row.ins == (20, 20) and third.key.gathered == (0, 1) and third.row.gather == (None, None)
    assert first.index == (0, 1) and first.ins == first.row.ins
    assert first.key.ops == ADD.ops and first.key.text() == "v2s0: t2=add(v0@,v1) -> t2"


def test_an_automorphism_also_read_otherwise_stored_or_sent_is_kept():
    ntt = Unit(Kind.NTT, None, Row(0, (11,), (16,)), (11,), (16,), (5,))
    dis = Unit(Kind.COMM, None, Comm(Opcode.DIS, 1, 2, 11, -1, 0), (11,), (), (6,))
    for other, pinned in ((ntt, set()), (dis, set()), (None, {11})):
        units = [aut(10, 11, 3), add(11, 12, 13)] + ([other] if other else [])
        out, _ = fuse_automorphisms(units, [0] * len(units), pinned)
        assert out == units


def test_no_automorphism_no_change():
    units = [add(1, 2, 3), add(3, 4, 5)]
    assert fuse_automorphisms(units, [0, 1], set()) == (units, [0, 1])


# --------------------------------------------------------------------------- plans

ROTATE = """
load r0: i1(0)
load r1: i2(0)
rot 3 r2: r0 | 0
rot -1 r3: r1 | 0
add r4: r2, r1 | 0
mul r5: r3, r0 | 0
store r4: v1(0)
store r5: v2(0)
"""


def test_rows_rotating_by_different_steps_batch_into_one_kernel():
    plan = build_plan(program_from_text(ROTATE), max_outputs=1)
    check_plan(plan)
    c = plan.chips[0]
    assert not [k for k in c.kernels if k.kind is Kind.AUTOMORPHISM]
    (add_k,) = [k for k in c.kernels if k.expr.ops[0].op == "add"]
    assert add_k.expr.gathered == (0,) and add_k.rows[0].gather == (3,)
    (mul_k,) = [k for k in c.kernels if k.expr.ops[0].op == "mul"]
    assert mul_k.expr.gathered == (0,) and mul_k.rows[0].gather == (-1,)
    # Two limbs rotated by different steps: one kernel, the steps per row.
    two = build_plan(program_from_text("""
        load r0: i1(0)
        load r1: i1(1)
        rot 3 r2: r0 | 0
        rot 5 r3: r1 | 1
        neg r4: r2 | 0
        neg r5: r3 | 1
        store r4: v1(0)
        store r5: v1(1)
        """))
    (k,) = two.chips[0].kernels
    assert k.expr.gathered == (0,) and sorted(r.gather for r in k.rows) == [(3,), (5,)]
    assert gathered_reads(two) == 2


def test_not_folded_when_stored_or_transformed_and_off_switch():
    stored = build_plan(program_from_text("""
        load r0: i1(0)
        rot 3 r1: r0 | 0
        neg r2: r1 | 0
        store r1: v1(0)
        store r2: v2(0)
        """))
    assert [k.kind for k in stored.chips[0].kernels] == [Kind.AUTOMORPHISM, Kind.ELEMENTWISE]
    transformed = build_plan(program_from_text("""
        load r0: i1(0)
        rot 3 r1: r0 | 0
        neg r2: r1 | 0
        int r3: r1 | 0
        store r2: v1(0)
        store r3: v2(0)
        """))
    assert Kind.AUTOMORPHISM in [k.kind for k in transformed.chips[0].kernels] and not gathered_reads(transformed)
    program = program_from_text(ROTATE)
    for plan in (build_plan(program, fuse_automorphism=False), build_plan(program, fuse=False)):
        assert sum(k.kind is Kind.AUTOMORPHISM for k in plan.chips[0].kernels) == 1 and not gathered_reads(plan)


def test_an_input_register_overwritten_before_the_consumer_is_still_read_right():
    """The consumer reads the automorphism's input buffer: SSA buffers are written once, so a
    register rewritten in between is another buffer, and the arena keeps the input's row alive."""
    program = program_from_text("""
        load r0: i1(0)
        load r1: i2(0)
        con r2: r0 | 0
        mul r0: r1, r1 | 0
        store r0: v3(0)
        add r3: r2, r0 | 0
        store r3: v1(0)
        """)
    plan = build_plan(program, max_outputs=1)
    check_plan(plan)
    assert gathered_reads(plan) == 1 and not any(k.kind is Kind.AUTOMORPHISM for k in plan.chips[0].kernels)
    (k,) = [k for k in plan.chips[0].kernels if k.expr.gathered]
    assert k.rows[0].gather == (None,) and k.rows[0].ins[0] == plan.chips[0].inputs[next(
        m for m in plan.chips[0].inputs if m.term == "i1")]
    ctx = context(64)
    memory = random_memory(program, ctx, seed=1)
    for mode in ("exact", "textbook", "emulator"):
        assert not store_mismatches(run_reference(program, ctx, memory, mode), run_plan(plan, ctx, memory, mode))


def test_report_json_and_traffic():
    program = load_corpus("Rotate_4L_1c")
    folded, plain = build_plan(program), build_plan(program, fuse_automorphism=False)
    f, p = plan_stats(folded), plan_stats(plain)
    assert f["gathered_reads"] == f["gathered_automorphisms"] == 4 and p["gathered_reads"] == 0
    assert f["by_kind"]["automorphism"][1] == p["by_kind"]["automorphism"][1] - 4
    # Each folded row saves its write and its read; the gathered read is charged like a plain one.
    assert p["plan_bytes"] - f["plan_bytes"] == 2 * 4 * 4 * 65536
    assert "automorphisms computed in their consumers' loads: 4" in plan_report(folded)
    assert "consumers' loads" not in plan_report(plain)
    assert '"gather":[[' in folded.to_json() and "@" in folded.to_json()


# --------------------------------------------------------------------------- the NumPy gather


def test_numpy_gathered_operand_is_the_automorphism_then_the_expression():
    ctx = context(256)
    rng = np.random.default_rng(7)
    b = NumpyBackend(ctx, 12)
    b.arena[:] = rng.integers(0, ctx.q(0), b.arena.shape, dtype=np.uint64).astype(np.uint32)
    expr = Expr(2, 0, (ExprOp("mul", (0, 1)), ExprOp("add", (2, 1))), (3,), (1,))
    ins = np.array([[0, 1], [2, 3], [4, 1]], dtype=np.int32)
    outs = np.array([[8], [9], [10]], dtype=np.int32)
    primes = np.zeros(3, dtype=np.int32)
    galois = np.array([[ctx.galois_element(3)], [ctx.conjugation_element], [ctx.galois_element(3)]], dtype=np.int32)
    b.elementwise(expr, ins, outs, primes, np.zeros((3, 0), dtype=np.int32), galois)
    q = np.uint64(ctx.q(0))
    for r in range(3):
        y = ctx.automorphism(b.arena[ins[r, 1]][None], int(galois[r, 0]))[0].astype(np.uint64)
        want = (b.arena[ins[r, 0]].astype(np.uint64) * y % q + y) % q
        assert np.array_equal(b.arena[outs[r, 0]], want.astype(np.uint32))


# --------------------------------------------------------------------------- the same bits


def _aut_programs() -> list[str]:
    return [n for n in corpus(chips=(1, 2)) if n.split("_")[0] in ("Rotate", "RotMulAdd", "MulRotate")]


@pytest.mark.parametrize("mode", ["exact", "textbook", "emulator"])
@pytest.mark.parametrize("name", _aut_programs())
def test_folded_plans_equal_the_reference(name, mode):
    """The corpus programs with automorphisms (every 1- and 2-chip one of them; the others plan as
    before, and tests/execute/test_plan_engine.py runs every program's default plan)."""
    program = load_corpus(name)
    plan = build_plan(program)
    assert gathered_reads(plan) > 0
    ctx = context(256)
    memory = random_memory(program, ctx, seed=5)
    assert not store_mismatches(run_reference(program, ctx, memory, mode), run_plan(plan, ctx, memory, mode))


def test_bootstraplike_20_folds_and_equals_the_reference():
    program = load_corpus("BootstrapLike_20L_1c")
    plan = build_plan(program)
    assert gathered_reads(plan) > 0
    ctx = context(256)
    memory = random_memory(program, ctx, seed=6)
    assert not store_mismatches(run_reference(program, ctx, memory, "exact"), run_plan(plan, ctx, memory, "exact"))


def test_cli_no_aut_fuse():
    from tests.conftest import caramel_cli

    on = caramel_cli("plan", "programs/MulRotate_4L_1c")
    off = caramel_cli("plan", "programs/MulRotate_4L_1c", "--no-aut-fuse")
    assert on.returncode == 0 and off.returncode == 0
    assert "automorphisms computed in their consumers' loads" in on.stdout
    assert "without automorphisms in their consumers' loads (--no-aut-fuse): plan traffic" in on.stdout
    assert "consumers' loads" not in off.stdout


# --------------------------------------------------------------------------- the plan cache


def test_cache_round_trip_keeps_gathered_operands():
    import caramel.plan_cache as pc

    program = load_corpus("BootstrapLike_20L_1c")
    plan = build_plan(program)
    meta = pc._meta("key", True, 32, True, 8, True)
    back = pc.from_bytes(pc.to_bytes(plan, meta), meta, plan.name)
    assert back.chips == plan.chips
    rows = [r for c in back.chips for k in c.kernels for r in k.rows if r.gather]
    assert rows and {type(a) for r in rows for a in r.gather} <= {int, type(None)}
    assert any(None in r.gather for r in rows) or any(isinstance(a, int) for r in rows for a in r.gather)
    assert any(k.expr is not None and k.expr.gathered for c in back.chips for k in c.kernels)
    # The option is part of the entry's identity; an entry of another format is not used.
    assert pc.entry_path(pc.Path("."), meta) != pc.entry_path(pc.Path("."), pc._meta("key", True, 32, True, 8, False))
    with pytest.raises(pc.PlanEntryError):
        pc.from_bytes(pc.to_bytes(plan, {**meta, "format": 2}), meta, plan.name)


def test_bootstraplike_51_folds_4932_of_5772_automorphism_rows():
    """Issue 14: of BootstrapLike_51L_1c's 5772 automorphism rows, the 4932 read only by elementwise
    kernels are folded into them: 840 rows left, 2 limbs less traffic per folded row."""
    from plan_helpers import PROGRAMS

    if not (PROGRAMS / "BootstrapLike_51L.tar.xz").exists():
        pytest.skip("BootstrapLike_51L.tar.xz not found")
    program = load_corpus("BootstrapLike_51L_1c")
    folded, plain = plan_stats(build_plan(program)), plan_stats(build_plan(program, fuse_automorphism=False))
    assert plain["by_kind"]["automorphism"][1] == 5772 and folded["by_kind"]["automorphism"][1] == 840
    assert folded["gathered_reads"] == folded["gathered_automorphisms"] == 4932
    assert plain["plan_bytes"] - folded["plan_bytes"] == 2 * 4932 * 4 * 65536
