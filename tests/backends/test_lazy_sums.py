"""Sums of products that reduce once (caramel.backends.cuda.elementwise: ``lazy_sums`` and ``lazy_sum``), on the
CPU: which values a sum absorbs, that the sums compute the program's values, and that the
64-bit accumulator's C expression never overflows. The GPU runs them in tests/backends/test_cuda_kernels.py."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.backends.cuda import elementwise as ew
from caramel.backends.cuda.elementwise import lazy_sum, lazy_sums
from caramel.expr import Expr, ExprOp


def program(n_vec: int, n_scalar: int, ops, outputs) -> Expr:
    return Expr(n_vec, n_scalar, tuple(ExprOp(o, tuple(a)) for o, a in ops), tuple(outputs))


def test_inner_product_is_one_sum():
    # v0 v1 + v2 v3 + v4: values 5 = mul(0,1), 6 = mul(2,3), 7 = add(5,6), 8 = add(7,4)
    p = program(5, 0, [("mul", (0, 1)), ("mul", (2, 3)), ("add", (5, 6)), ("add", (7, 4))], [8])
    sums, hidden = lazy_sums(p)
    assert sums == {8: ((0, 1), (2, 3), (4,))}
    assert hidden == {5, 6, 7}


def test_shared_values_outputs_and_plain_sums_stay():
    # 3 = mul(0,1) read twice; 4 = add(3,2) an output; 5 = add(4,3); 6 = add(0,1) and 7 = add(6,2): residues alone
    p = program(3, 0, [("mul", (0, 1)), ("add", (3, 2)), ("add", (4, 3)), ("add", (0, 1)), ("add", (6, 2))],
                [4, 5, 7])
    assert lazy_sums(p) == ({}, frozenset())
    # once read only by an add, the product joins it
    p = program(3, 0, [("mul", (0, 1)), ("add", (3, 2)), ("add", (4, 0))], [5])
    assert lazy_sums(p) == ({5: ((0, 1), (2,), (0,))}, frozenset({3, 4}))


def test_scalar_products_and_subtractions():
    # 3 = mul(0, s2) (vector times scalar), 4 = sub(1, 0), 5 = add(3, 4)
    p = program(2, 1, [("mul", (0, 2)), ("sub", (1, 0)), ("add", (3, 4))], [5])
    sums, hidden = lazy_sums(p)
    assert sums == {5: ((0, 2), (4,))} and hidden == {3}


def evaluate(p: Expr, inputs: list[int], q: int, lazy: bool) -> list[int]:
    """The program's outputs with Python integers: every operation reduced (lazy=False), or the sums of
    ``lazy_sums`` as their terms' exact sum, reduced once, and their hidden values never computed."""
    sums, hidden = lazy_sums(p) if lazy else ({}, frozenset())
    values = list(inputs) + [None] * len(p.ops)
    base = p.n_vec + p.n_scalar
    for i, op in enumerate(p.ops):
        v = base + i
        if v in hidden:
            continue
        if v in sums:
            values[v] = sum(values[t[0]] * (values[t[1]] if len(t) == 2 else 1) for t in sums[v]) % q
            continue
        a, b = values[op.args[0]], values[op.args[-1]]
        values[v] = {"add": a + b, "sub": a - b, "mul": a * b, "neg": -a}[op.op] % q
    return [values[o] for o in p.outputs]


def random_sums(rng, n_vec: int = 6, n_scalar: int = 2, n_ops: int = 30) -> Expr:
    """Random programs leaning to sums of products (adds of fresh products, some values read twice)."""
    ops, kinds = [], [True] * n_vec + [False] * n_scalar
    for _ in range(n_ops):
        op = str(rng.choice(["add", "add", "mul", "mul", "sub", "neg"]))
        args = tuple(int(rng.integers(0, len(kinds))) if rng.random() < 0.4 else len(kinds) - 1 - int(rng.integers(
            0, min(3, len(kinds)))) for _ in range(1 if op == "neg" else 2))
        ops.append((op, args))
        kinds.append(any(kinds[a] for a in args))
    vector = [v for v, k in enumerate(kinds) if k and v >= n_vec]
    outputs = [int(v) for v in rng.choice(vector, min(3, len(vector)), replace=False)] or [0]
    return program(n_vec, n_scalar, ops, outputs)


@pytest.mark.parametrize("seed", range(40))
def test_sums_compute_the_program(seed):
    rng = np.random.default_rng(seed)
    p = random_sums(rng)
    q = 268042241
    inputs = [int(x) for x in rng.integers(0, q, p.n_vec + p.n_scalar)]
    assert evaluate(p, inputs, q, lazy=True) == evaluate(p, inputs, q, lazy=False)


def test_some_random_programs_have_sums():
    found = [lazy_sums(random_sums(np.random.default_rng(seed)))[0] for seed in range(40)]
    assert sum(bool(s) for s in found) >= 20


class U64(int):
    """An unsigned 64-bit C value: sums and products that leave 64 bits fail."""

    def __add__(self, other):
        return U64.of(int(self) + int(other))

    __radd__ = __add__

    def __mul__(self, other):
        return U64.of(int(self) * int(other))

    __rmul__ = __mul__

    @staticmethod
    def of(x: int) -> "U64":
        assert 0 <= x < 1 << 64, "a 64-bit intermediate overflows"
        return U64(x)


@pytest.mark.parametrize("count", [1, ew.LAZY_TERMS, ew.LAZY_TERMS + 1, 4 * ew.LAZY_TERMS + 3])
def test_accumulator_never_overflows(count):
    """The C expression of a sum of ``count`` - 1 products and a residue, all of the largest residues the kernels
    allow (q < 2^30), evaluated with every intermediate checked to fit 64 bits, is the exact sum mod q."""
    q = (1 << 30) - 35
    terms = tuple((0, 1) for _ in range(count - 1)) + ((0,),)
    expr = lazy_sum(terms, lambda v: f"a{v}").replace("(u64)", "")
    got = eval(expr, {"reduce64": lambda x, q_, mu: U64.of(x % q_)}, {"a0": U64(q - 1), "a1": U64(q - 1), "q": q,
                                                                        "mu": 0})
    assert got == ((count - 1) * (q - 1) ** 2 + (q - 1)) % q
    assert expr.count("reduce64") == 1 + (count - 1) // ew.LAZY_TERMS
