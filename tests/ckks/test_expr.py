"""The safe expression evaluator of check files: accepts the format, rejects everything unsafe."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks.expr import ExprError, evaluate, parse

ENV = {"S": 2**28, "q": (204865537, 205651969, 206307329), "L": 3, "x": np.arange(4.0), "y": np.ones(4) * 2j}
FUNCS = {"rot": lambda v, k: np.roll(v, -k), "conj": np.conj, "scaled": lambda v, s: v * s}

GOOD = [
    ("S**2 / q[L-1]", 2**56 / 206307329),
    ("q[0] * q[1] * q[2]", 204865537 * 205651969 * 206307329),
    ("-S + 2**-3", -(2**28) + 0.125),
    ("2 * (1.5 - 3)", -3.0),
    ("1j * 2", 2j),
]


@pytest.mark.parametrize("text,want", GOOD, ids=[f"expr-ok/{t}" for t, _ in GOOD])
def test_accepts(text, want):
    got = evaluate(text, ENV, FUNCS)
    assert got == want and type(got) is type(want)


def test_arrays_and_functions():
    assert np.allclose(evaluate("x * y + rot(x, 1) - conj(y)", ENV, FUNCS), ENV["x"] * 2j + np.roll(ENV["x"], -1) + 2j)
    assert np.allclose(evaluate("x**8", ENV, FUNCS), ENV["x"] ** 8)
    assert np.allclose(evaluate("scaled(x, 3)", ENV, FUNCS), ENV["x"] * 3)


BAD = [
    ("x.real", "Attribute"),
    ("x.__class__", "Attribute"),
    ("__import__('os')", "call"),
    ("open('f')", "call"),
    ("rot", "must be called"),
    ("z + 1", "not declared"),
    ("lambda: 1", "Lambda"),
    ("[a for a in x]", "ListComp"),
    ("{a for a in x}", "SetComp"),
    ("(a for a in x)", "GeneratorExp"),
    ("2**10**10", "exponent"),
    ("(10**300)**300", "exceeds"),
    ("S**S", "exponent"),
    ("x**100", "exponent"),
    ("x**y", "exponent"),
    ("'a' * 3", "constant"),
    ("True", "constant"),
    ("None", "constant"),
    ("x if L else y", "IfExp"),
    ("L and S", "BoolOp"),
    ("L < S", "Compare"),
    ("q[0:2]", "Slice"),
    ("rot(x, k=1)", "positional"),
    ("rot(*x)", "positional"),
    ("(S := 1)", "NamedExpr"),
    ("f'{S}'", "JoinedStr"),
    ("[1, 2]", "List"),
    ("S % 3", "Mod"),
    ("S // 3", "FloorDiv"),
    ("S << 3", "LShift"),
    ("~S", "Invert"),
    ("x[0]", "cannot be indexed"),
    ("q[5]", "out of range"),
    ("q[0.5]", "integer"),
    ("1 / 0", "division by zero"),
    ("rot(x, 1)(2)", "call"),
    ("S;S", "parse"),
    ("import os", "parse"),
    ("9" * 30000, "longer"),
    ("+".join(["S"] * 400), "deeper"),
    ("rot(" + ",".join(["S"] * 6000) + ")", "nodes"),
    # memory bounds: no repetition or concatenation of sequences
    ("q * 10**9", "sequence"),
    ("10**9 * q", "sequence"),
    ("q + q", "sequence"),
    ("-q", "sequence"),
    # reductions: one for over range, no if, no shadowing, bounded ranges and steps
    ("sum(i for i in x)", "range"),
    ("sum(i for i in range(3) if i)", "if"),
    ("sum(i for i in range(3) for j in range(3))", "exactly one"),
    ("sum(S for S in range(3))", "shadows"),
    ("sum(x, 1)", "one positional"),
    ("sum(i for i in range(10**9))", "exceeds"),
    ("sum(sum(sum(i for i in range(60000)) for j in range(60000)) for k in range(2))", "steps"),
    ("sum(i for i in range(0.5))", "integers"),
    ("prod(q[i] for i in range(3)) ** 1000", "exceeds"),
    ("i + sum(i for i in range(3))", "not declared"),
]


@pytest.mark.parametrize("text,why", BAD, ids=[f"expr-reject/{i}" for i in range(len(BAD))])
def test_rejects(text, why):
    with pytest.raises(ExprError, match=why.replace("*", r"\*")):
        evaluate(text, ENV, FUNCS)


def test_reductions():
    assert evaluate("sum(i for i in range(4))", ENV) == 6
    assert evaluate("prod(q[i] for i in range(1, 3))", ENV) == 205651969 * 206307329
    assert evaluate("prod(q)", ENV) == 204865537 * 205651969 * 206307329
    assert evaluate("sum(q[L-1-i]**2**i for i in range(L))", ENV) == sum(ENV["q"][2 - i] ** 2**i for i in range(3))
    assert evaluate("sum(x)", ENV) == 6
    v = evaluate("sum(rot(x, i) for i in range(4))", ENV, FUNCS)
    assert np.allclose(v, np.full(4, 6.0))
    # the repeated squaring's true scale: S^(2^k) / prod over the levels of q[L-i]^(2^(k-i))
    k = 3
    want = (2**28) ** (2**k) / (ENV["q"][2] ** 4 * ENV["q"][1] ** 2 * ENV["q"][0])
    got = evaluate(f"S**(2**{k}) / prod(q[L-i]**2**({k}-i) for i in range(1, {k}+1))", ENV)
    assert got == pytest.approx(want, rel=1e-12)


def test_long_formulas_within_the_raised_caps():
    terms = " + ".join(f"rot(x * {i}, {i})" for i in range(64))  # a 64-term BSGS-like sum
    assert np.allclose(evaluate(terms, ENV, FUNCS), sum(np.roll(ENV["x"] * i, -i) for i in range(64)))


def test_parse_validates_without_values():
    parse("x * y", {"x", "y"}, {"rot"})
    with pytest.raises(ExprError):
        parse("x * w", {"x", "y"}, {"rot"})
    with pytest.raises(ExprError):
        parse("exec('1')", {"x"}, {"rot"})
    with pytest.raises(ExprError):
        parse(3, {"x"})  # type: ignore[arg-type]
