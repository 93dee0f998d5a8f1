"""Sibling rows (caramel.plan.fusion.merge_siblings): elementwise trees of one level and prime that
read a common limb become one row with several outputs, which reads that limb once."""

from __future__ import annotations

from functools import lru_cache

import pytest

from caramel.errors import ArgumentError
from caramel.execute.drive import run_plan
from caramel.execute.reference import run_reference
from caramel.plan import Kind, Row, build_plan, plan_report, plan_stats
from caramel.plan.fusion import MAX_OUTPUTS, Unit, merge_siblings
from caramel.plan.kernel import Expr, ExprOp
from caramel.ring import Context

from plan_helpers import PROGRAMS, corpus, load_corpus, program_from_text, random_memory, store_mismatches

GIB = 2**30
MUL = Expr(2, 0, (ExprOp("mul", (0, 1)),), (2,))
ADD_SCALAR = Expr(1, 1, (ExprOp("add", (0, 1)),), (2,))


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


def unit(expr: Expr, prime: int, ins, out: int, scalars=(), index: int = 0) -> Unit:
    return Unit(Kind.ELEMENTWISE, expr, Row(prime, tuple(ins), (out,), tuple(scalars)), tuple(ins), (out,), (index,))


def rows_of(units):
    return [(u.row.prime, u.row.ins, u.row.outs, u.row.scalars) for u in units]


# --------------------------------------------------------------------------- the pass on units


def test_trees_sharing_a_limb_become_one_row_reading_it_once():
    units = [unit(MUL, 3, (0, 1), 10, index=1), unit(MUL, 3, (0, 2), 11, index=2)]
    out, levels = merge_siblings(units, [5, 5])
    assert levels == [5] and len(out) == 1
    (u,) = out
    assert u.row.ins == (0, 1, 2) and u.row.outs == (10, 11) and u.index == (1, 2)
    # d0 = v0 * v1, d1 = v0 * v2: the shared limb is operand 0 of both products
    assert u.key == Expr(3, 0, (ExprOp("mul", (0, 1)), ExprOp("mul", (0, 2))), (3, 4))


def test_scalars_follow_the_vectors_member_by_member():
    units = [unit(ADD_SCALAR, 0, (4,), 10, scalars=(7,)), unit(MUL, 0, (5, 4), 11)]
    (u,), _ = merge_siblings(units, [0, 0])
    assert u.row.ins == (4, 5) and u.row.scalars == (7,)
    assert u.key == Expr(2, 1, (ExprOp("add", (0, 2)), ExprOp("mul", (1, 0))), (3, 4))


def test_other_levels_primes_and_disjoint_inputs_stay_apart():
    units = [
        unit(MUL, 3, (0, 1), 10),
        unit(MUL, 3, (0, 2), 11),  # level 6: may read what level 5 wrote
        unit(MUL, 4, (0, 2), 12),  # another prime
        unit(MUL, 3, (5, 6), 13),  # nothing in common
        Unit(Kind.NTT, None, Row(3, (0,), (14,)), (0,), (14,), (9,)),
    ]
    out, levels = merge_siblings(units, [5, 6, 5, 5, 5])
    assert rows_of(out) == rows_of(units) and levels == [5, 6, 5, 5, 5]


def test_caps_on_outputs_and_inputs():
    units = [unit(MUL, 0, (0, k + 1), 10 + k, index=k) for k in range(5)]
    out, _ = merge_siblings(units, [0] * 5, max_inputs=16, max_outputs=2)
    assert [u.row.outs for u in out] == [(10, 11), (12, 13), (14,)]
    out, _ = merge_siblings(units, [0] * 5, max_inputs=3, max_outputs=8)
    assert [u.row.outs for u in out] == [(10, 11), (12, 13), (14,)]
    out, _ = merge_siblings(units, [0] * 5, max_outputs=1)
    assert rows_of(out) == rows_of(units)


def test_a_unit_joins_the_group_it_shares_most_with():
    units = [unit(MUL, 0, (0, 1), 10), unit(MUL, 0, (2, 3), 11), unit(MUL, 0, (2, 3), 12)]
    out, _ = merge_siblings(units, [0, 0, 0])
    assert [u.row.outs for u in out] == [(10,), (11, 12)]


def test_equal_sharing_patterns_give_one_expression():
    units = [unit(MUL, p, (10 * p, 10 * p + 1), 100 + 2 * p) for p in range(3)]
    units += [unit(MUL, p, (10 * p, 10 * p + 2), 101 + 2 * p) for p in range(3)]
    out, _ = merge_siblings(units, [0] * 6)
    assert len(out) == 3 and len({u.key for u in out}) == 1


# --------------------------------------------------------------------------- plans


def test_key_switch_like_inner_products_share_their_digits():
    """c0 = d0 k0 + d1 k1, c1 = d0 k2 + d1 k3 on each prime: one row per prime reads d0 and d1 once."""
    lines = []
    for l in (0, 1, 2):
        r = [f"r{12 * l + k}" for k in range(12)]
        lines += [f"load {r[k]}: {name}({l})" for k, name in enumerate(("i1", "i2", "k1", "k2", "k3", "k4"))]
        lines += [f"mul {r[6]}: {r[0]}, {r[2]} | {l}", f"mul {r[7]}: {r[1]}, {r[3]} | {l}",
                  f"add {r[8]}: {r[6]}, {r[7]} | {l}", f"mul {r[9]}: {r[0]}, {r[4]} | {l}",
                  f"mul {r[10]}: {r[1]}, {r[5]} | {l}", f"add {r[11]}: {r[9]}, {r[10]} | {l}",
                  f"store {r[8]}: v1({l})", f"store {r[11]}: v2({l})"]
    text = "\n".join(lines)
    program = program_from_text(text)
    merged, plain = build_plan(program), build_plan(program, max_outputs=1)
    (kernel,) = [k for k in merged.chips[0].kernels if k.kind is Kind.ELEMENTWISE]
    assert len(kernel.rows) == 3 and all(len(r.outs) == 2 and len(r.ins) == 6 for r in kernel.rows)
    assert plan_stats(merged)["plan_bytes"] < plan_stats(plain)["plan_bytes"]
    assert plan_stats(merged)["multi_output_rows"] == {2: 3}
    assert "elementwise rows with several outputs" in plan_report(merged)
    ctx = context(256)
    memory = random_memory(program, ctx, seed=2)
    for mode in ("exact", "textbook", "emulator"):
        got = run_plan(merged, ctx, memory, mode)
        assert not store_mismatches(run_plan(plain, ctx, memory, mode), got)
        assert not store_mismatches(run_reference(program, ctx, memory, mode), got)


@pytest.mark.parametrize("name", corpus(chips=(1, 2)))
def test_merged_plans_equal_the_reference(name):
    program = load_corpus(name)
    ctx = context(1024)
    memory = random_memory(program, ctx, seed=4)
    merged = build_plan(program, max_outputs=3, max_inputs=12)
    assert plan_stats(merged)["plan_bytes"] <= plan_stats(build_plan(program, max_outputs=1, max_inputs=12))["plan_bytes"]
    assert not store_mismatches(run_reference(program, ctx, memory, "exact"), run_plan(merged, ctx, memory, "exact"))


def test_bad_caps_are_refused():
    program = load_corpus("Mul_4L_1c")
    for bad in ({"max_outputs": 0}, {"max_inputs": 0}):
        with pytest.raises(ArgumentError):
            build_plan(program, **bad)


def test_bootstraplike_51_default_plan_traffic():
    """Issue 14: the plan that runs by default moves <= 40.6 GiB for BootstrapLike_51L_1c (43.2 GiB
    with the NTT loads alone, 45.1 with neither)."""
    if not (PROGRAMS / "BootstrapLike_51L.tar.xz").exists():
        pytest.skip("BootstrapLike_51L.tar.xz not found")
    program = load_corpus("BootstrapLike_51L_1c")
    default = plan_stats(build_plan(program, fuse_automorphism=False))
    alone = plan_stats(build_plan(program, max_outputs=1, fuse_automorphism=False))
    assert default["plan_bytes"] / GIB <= 40.6 < alone["plan_bytes"] / GIB
    assert sum(default["multi_output_rows"].values()) > 0
    assert max(default["multi_output_rows"]) <= MAX_OUTPUTS


def test_cli_plan_max_outputs():
    from tests.conftest import caramel_cli

    one = caramel_cli("plan", "programs/Mul_4L_1c", "--max-outputs", "1")
    assert one.returncode == 0 and "several outputs" not in one.stdout
    bad = caramel_cli("plan", "programs/Mul_4L_1c", "--max-outputs", "0")
    assert bad.returncode == 2
