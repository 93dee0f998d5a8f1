"""The lazy inverse butterflies' bounds (caramel.backends.cuda.ntt: butterflies.cuh's inv_bound, gs_sum_diff, gs_pass_end),
without a GPU: a model of the CUDA closed form (checked against the source's text) equals the recurrence it stands
for, and a pass run on worst-case values (every input at its bound, exact integers) never reaches 2^32 with the
largest prime below 2^28 and hands the next pass values below INV_IN q (the kernels' results: test_cuda_kernels.py)."""

from __future__ import annotations

import pytest

from caramel.backends.cuda.ntt.transform import transform_source

INV_IN = 4
Q = (1 << 28) - 57  # the bounds are multiples of q: the largest 28-bit q is the tightest case


def closed_form(k: int, dd: int) -> int:
    """inv_bound of the CUDA source, line for line."""
    low = k & ((1 << dd) - 1)
    last = 3 if low >= 8 else 2 if low >= 4 else 1 if low >= 2 else 0
    b = INV_IN << dd if low == 0 else 2 << (dd - 1 - last)
    return min(b, 16)


def recurrence(k: int, dd: int) -> int:
    """The bound before stage dd: INV_IN, then after stage j a Shoup product (2) where bit j of k is set, else the sum
    of two values of the stage's input bound, those above 8 first brought to 8."""
    b = INV_IN
    for j in range(dd):
        b = 2 if (k >> j) & 1 else 2 * min(b, 8)
    return b


def test_the_model_is_the_source():
    src = transform_source(16, True)
    assert "#define INV_IN 4\n" in src
    for line in ("const int low = k & ((1 << dd) - 1);",
                 "const int last = low >= 8 ? 3 : low >= 4 ? 2 : low >= 2 ? 1 : 0;",
                 "const int b = low == 0 ? INV_IN << dd : 2 << (dd - 1 - last);", "return b > 16 ? 16 : b;"):
        assert line in src


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_closed_form_is_the_recurrence(stages):
    assert all(closed_form(k, dd) == recurrence(k, dd) for k in range(1 << stages) for dd in range(stages + 1))


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_worst_case_pass_stays_below_2_32(stages):
    """Every value at its bound minus one (the largest it can hold), through gs_sum_diff's reductions, sum and
    difference, the Shoup product's bound (below 2q), and gs_pass_end: nothing reaches 2^32, no difference is
    negative, and the outputs are below INV_IN q."""
    v = [INV_IN * Q - 1] * (1 << stages)
    for dd in range(stages):
        for k in range(1 << stages):
            if k & (1 << dd):
                continue
            b = closed_form(k, dd)
            x, y = v[k], v[k + (1 << dd)]
            assert x < b * Q and y < b * Q
            if b > 8:  # csub(x, 8q): the worst case stays just below 8q
                x, y = min(x, 8 * Q - 1), min(y, 8 * Q - 1)
            c = (2 if b <= 2 else b if b <= 8 else 8) * Q
            assert x + y < 1 << 32 and 0 <= x + c - y < 1 << 32
            v[k], v[k + (1 << dd)] = x + y, 2 * Q - 1  # the sum, the product of the difference (below 2q)
    for k in range(1 << stages):
        assert v[k] < closed_form(k, stages) * Q
        out = v[k]
        if closed_form(k, stages) > 8:
            out = min(out, 8 * Q - 1)
        if closed_form(k, stages) > 4:
            out = min(out, 4 * Q - 1)
        assert out < INV_IN * Q
