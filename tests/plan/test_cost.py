"""The kernels' estimated device times (caramel.plan.cost): their families and lines, from a target's costs."""

from __future__ import annotations

import dataclasses

import pytest

from caramel.backends.cuda.target import COSTS, CUDA_TARGET
from caramel.plan.cost import Cost, comm_cost, estimate_us, family, fit, task_cost
from caramel.plan.kernel import Expr, ExprOp, Kernel, Kind, Row
from caramel.target import NEUTRAL, Target


def rows(count: int, ins: int, outs: int) -> tuple[Row, ...]:
    return tuple(Row(r % 3, tuple(range(ins * r, ins * r + ins)), tuple(range(1000 + outs * r, 1000 + outs * r + outs)))
                 for r in range(count))


def elementwise(count: int, n_vec: int, transformed: tuple[int, ...] = ()) -> Kernel:
    ops = tuple(ExprOp("add", (k, k + 1)) for k in range(n_vec - 1))
    return Kernel(Kind.ELEMENTWISE, rows(count, n_vec, 1), Expr(n_vec, 0, ops, (n_vec + len(ops) - 1,),
                                                                transformed=transformed))


def test_families():
    """Half NTTs and NTT epilogues apart; every other kernel under its kind's name."""
    ntt = Kernel(Kind.NTT, rows(4, 1, 1))
    assert family(ntt) == "ntt" and family(dataclasses.replace(ntt, half=True)) == "ntt-half"
    assert family(elementwise(4, 3)) == "elementwise" and family(elementwise(4, 3, (0, 2))) == "epilogue"
    assert family(Kernel(Kind.BASECONV, rows(2, 3, 5))) == "baseconv"


@pytest.mark.parametrize("kind", [Kind.NTT, Kind.INTT, Kind.BASECONV, Kind.AUTOMORPHISM, Kind.SUD_LIFT])
def test_a_line_in_the_traffic(kind):
    """base + per_limb * traffic, the traffic scaled to N; kinds without a line of their own cost as elementwise."""
    k = Kernel(kind, rows(10, 2, 1))
    c = COSTS.get(kind.value, COSTS["elementwise"])
    assert estimate_us(k, target=CUDA_TARGET) == pytest.approx(c.base_us + c.per_limb_us * 30)
    assert estimate_us(k, 4096, CUDA_TARGET) == pytest.approx(c.base_us + c.per_limb_us * 30 / 16)
    assert task_cost(k, target=CUDA_TARGET) == round(1000 * estimate_us(k, target=CUDA_TARGET))


def test_the_neutral_target_costs_the_traffic():
    """A backend without a fitted table (the NumPy backend's) ranks kernels by their traffic in limbs."""
    k = Kernel(Kind.NTT, rows(10, 2, 1))
    assert estimate_us(k) == estimate_us(k, target=NEUTRAL) == pytest.approx(30.0)
    assert task_cost(k) == 30000
    with pytest.raises(ValueError, match="elementwise"):
        Target("bad", costs=(("ntt", Cost(1.0, 1.0)),))


def test_an_epilogue_pays_for_its_row_passes():
    """Of two elementwise kernels with the same traffic, the one that runs the row passes of 3 transformed operands a
    row costs per_pass for each, on top of the epilogue family's own line."""
    plain, epi = elementwise(15, 4), elementwise(15, 4, (0, 1, 3))
    assert plain.traffic() == epi.traffic() == 15 * 5
    c = COSTS["epilogue"]
    assert estimate_us(epi, target=CUDA_TARGET) == pytest.approx(c.base_us + c.per_limb_us * 75 + c.per_pass_us * 45)
    assert estimate_us(epi, target=CUDA_TARGET) > estimate_us(plain, target=CUDA_TARGET)


def test_communication_and_the_smallest_cost():
    assert comm_cost(0) < comm_cost(3) and comm_cost(0) >= 1
    assert task_cost(Kernel(Kind.ELEMENTWISE, (), elementwise(1, 2).expr)) >= 1



def test_fit_recovers_the_lines():
    """Times made by known lines (varied traffic, rows and transformed operands) give those lines back, with R^2 = 1;
    a family with fewer samples than terms is left out; at N = 4096 the per-limb terms are scaled back to 65536."""
    want = {"elementwise": Cost(2.0, 0.05), "epilogue": Cost(8.0, 0.07, 0.1), "ntt": Cost(11.0, 0.15)}
    kernels = [elementwise(r, v) for r, v in ((3, 2), (5, 4), (9, 3), (12, 6))]
    kernels += [elementwise(r, v, t) for r, v, t in ((3, 4, (0,)), (7, 5, (0, 2)), (15, 6, (1, 2, 4)), (4, 3, (0, 1)))]
    kernels += [Kernel(Kind.NTT, rows(r, 1, 1)) for r in (4, 40, 400)]
    target = Target("made", costs=tuple(want.items()))
    for n in (65536, 4096):
        samples = [(k, estimate_us(k, n, target)) for k in kernels]
        got = fit(samples + [(Kernel(Kind.BASECONV, rows(2, 3, 5)), 7.0)], n)
        assert set(got) == set(want)  # one baseconv sample: too few for a line
        for name, line in want.items():
            assert got[name][0] == pytest.approx(line, abs=1e-9) and got[name][1] == pytest.approx(1.0)
