"""NTT epilogues (issue 14, :func:`caramel.plan.fusion.fuse_ntt_epilogues`): which NTTs become half NTTs and
which operands transformed, the rules every plan keeps, the cache model, and plans equal to the reference. The
GPU kernels are tested in tests/backends/test_cuda_epilogue.py and tests/plan/test_cuda_plan.py."""

from __future__ import annotations

from functools import lru_cache

import pytest

from caramel.execute.drive import run_plan
from caramel.execute.reference import run_reference
from caramel.plan import Kind, Row, build_plan, plan_stats
from caramel.plan.fusion import HalfNtt, Unit, fuse_ntt_epilogues
from caramel.plan.kernel import MAX_TRANSFORMED, Expr, ExprOp, Prologue
from caramel.ring import Context

from plan_helpers import check_plan, corpus, load_corpus, random_memory, store_mismatches


@pytest.mark.parametrize("name", ["BootstrapModRaise_4L_2c", "RotMulAdd_4L_1c", "PolyX8_4L_4c"])
def test_fused_sees_every_program_of_the_plans_elementwise_kernels_once(name):
    """build_plan's ``fused`` is called once, with the programs of the plan's elementwise kernels: the epilogues
    among them (a first run queues their compiles there, before batching and ordering)."""
    seen = []
    plan = build_plan(load_corpus(name), fused=seen.append)
    assert seen == [{k.expr for c in plan.chips for k in c.kernels if k.kind is Kind.ELEMENTWISE}]
    assert any(e.transformed for e in seen[0])


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


def ntt(src: int, dst: int, key=None) -> Unit:
    return Unit(Kind.NTT, key, Row(0, (src,), (dst,)), (src,), (dst,), (0,))


def sum_of(ins: tuple[int, ...], out: int, gathered: tuple[int, ...] = ()) -> Unit:
    ops = tuple(ExprOp("add", (0 if i == 0 else len(ins) + i - 1, i + 1)) for i in range(len(ins) - 1))
    expr = Expr(len(ins), 0, ops, (len(ins) + len(ops) - 1,), gathered)
    row = Row(0, ins, (out,), gather=(1,) * len(gathered))
    return Unit(Kind.ELEMENTWISE, expr, row, ins, (out,), (1,))


def test_an_ntt_read_once_by_an_elementwise_row_is_half():
    lift = Prologue(Kind.SUD_LIFT, 1)
    units = [ntt(0, 10), ntt(1, 11, lift), ntt(2, 12), sum_of((10, 11, 12, 3), 20)]
    out = fuse_ntt_epilogues(units, pinned={12})  # 12 is stored: its NTT stays whole
    assert [u.key for u in out[:3]] == [HalfNtt(None), HalfNtt(lift), None]
    assert out[3].key.transformed == (0, 1) and out[3].row == units[3].row and out[3].ins == units[3].ins


def test_a_row_with_gathered_operands_transforms_the_others():
    units = [ntt(0, 10), ntt(1, 11), sum_of((10, 11, 2), 20, gathered=(1,))]
    out = fuse_ntt_epilogues(units, pinned=set())
    assert out[2].key.transformed == (0,) and out[2].key.gathered == (1,)
    assert isinstance(out[0].key, HalfNtt) and out[1].key is None  # 11 is read through an automorphism


@pytest.mark.parametrize("why", ["two readers", "read twice", "gathered", "not elementwise"])
def test_ntts_that_stay_whole(why):
    units = [ntt(0, 10)]
    if why == "two readers":
        units += [sum_of((10, 1), 20), sum_of((10, 2), 21)]
    elif why == "read twice":
        units += [sum_of((10, 10), 20)]
    elif why == "gathered":
        units += [sum_of((1, 10), 20, gathered=(1,))]
    else:
        units += [ntt(10, 20)]
    out = fuse_ntt_epilogues(units, pinned=set())
    assert out[0].key is None and all(not getattr(u.key, "transformed", ()) for u in out[1:])


def test_at_most_max_transformed_operands():
    n = MAX_TRANSFORMED + 2
    units = [ntt(k, 100 + k) for k in range(n)] + [sum_of(tuple(100 + k for k in range(n)), 999)]
    out = fuse_ntt_epilogues(units, pinned=set())
    assert out[-1].key.transformed == tuple(range(MAX_TRANSFORMED))
    assert [isinstance(u.key, HalfNtt) for u in out[:n]] == [k < MAX_TRANSFORMED for k in range(n)]


def epilogue_rules(plan) -> int:
    """Check the plan's half NTTs against its transformed operands; the number of half NTT rows."""
    half_rows = 0
    for chip in plan.chips:
        readers: dict[int, list[tuple[bool, bool]]] = {}  # buffer -> (transformed read?, gathered expr?) per read
        for k in chip.kernels:
            if k.kind is Kind.ELEMENTWISE:
                assert len(k.expr.transformed) <= MAX_TRANSFORMED
                assert not set(k.expr.transformed) & set(k.expr.gathered)
            for r in k.rows:
                for j, b in enumerate(r.ins):
                    readers.setdefault(b, []).append((k.expr is not None and j in k.expr.transformed, False))
            for c in k.comms:
                readers.setdefault(c.src, []).append((False, False))
        stored = set(chip.stores.values())
        half_outputs = set()
        for k in chip.kernels:
            if k.kind is Kind.NTT and k.half:
                for r in k.rows:
                    half_rows += 1
                    (b,) = r.outs
                    half_outputs.add(b)
                    assert b not in stored and readers.get(b) == [(True, False)], \
                        "a half NTT output, read once, transformed"
        transformed = {b for k in chip.kernels if k.expr is not None for r in k.rows for j, b in enumerate(r.ins)
                       if j in k.expr.transformed}
        assert transformed == half_outputs
    return half_rows


@pytest.mark.parametrize("name", ["BootstrapModRaise_4L_2c", "Relin2_10L_1c", "MulRotate_4L_4c", "Mul_4L_1c"])
def test_plans_keep_the_rules(name):
    plan = build_plan(load_corpus(name))
    check_plan(plan)
    assert epilogue_rules(plan) == plan_stats(plan)["ntt_epilogue_rows"]
    off = build_plan(load_corpus(name), fuse_epilogue=False)
    assert epilogue_rules(off) == 0
    # only keys change: the same rows, NTTs and traffic
    rows = lambda p, kind: sorted(r for c in p.chips for k in c.kernels if k.kind is kind for r in k.rows)
    assert all(rows(plan, kind) == rows(off, kind) for kind in Kind)
    assert plan_stats(plan)["plan_bytes"] == plan_stats(off)["plan_bytes"]


def test_the_bootstrap_half_ntts():
    plan = build_plan(load_corpus("BootstrapLike_51L_1c"))
    assert epilogue_rules(plan) == 13599  # every NTT output that one elementwise row reads (at most 14 a row)
    # a half NTT has no second pass in the cache model: 2 limbs less a row without a cache
    from caramel.backends.cuda.target import CUDA_TARGET
    from caramel.plan.cache_model import plan_traffic

    off = build_plan(load_corpus("BootstrapLike_51L_1c"), fuse_epilogue=False)
    assert plan_traffic(off, 0, CUDA_TARGET).memory - plan_traffic(plan, 0, CUDA_TARGET).memory == 2 * 13599


@pytest.mark.parametrize("name", [n for n in corpus(limbs=(4,), chips=(1, 2)) if n.split("_")[0] in
                                  ("Mul", "MulRotate", "BootstrapModRaise", "Relin2", "Rescale")])
def test_plans_with_epilogues_compute_the_reference(name):
    program = load_corpus(name)
    ctx = context(256)
    memory = random_memory(program, ctx, seed=11)
    plan = build_plan(program)
    assert any(k.half for c in plan.chips for k in c.kernels)
    want = run_reference(program, ctx, memory, "exact")
    assert not store_mismatches(want, run_plan(plan, ctx, memory, "exact"))


def test_cli_no_epilogue():
    from tests.conftest import caramel_cli

    on = caramel_cli("plan", "programs/Mul_4L_2c")
    off = caramel_cli("plan", "programs/Mul_4L_2c", "--no-epilogue")
    assert on.returncode == 0 and off.returncode == 0
    assert "NTT epilogues" in on.stdout and "NTT epilogues" not in off.stdout
