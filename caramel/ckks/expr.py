"""A small, safe arithmetic expression evaluator for check files (never ``eval``).

The text is parsed with :func:`ast.parse` in ``eval`` mode and every node is checked against a
whitelist before anything is evaluated:

* numbers (int, float, complex literals such as ``1j``; no strings, bytes, booleans or None);
* names, which must be declared in the environment (or be an allowed function, when called);
* ``+ - * / **`` and unary ``+ -``;
* calls ``f(a, b, ...)`` of an *allowed* function given by plain name, positional arguments only;
* subscripts ``q[i]`` of a declared sequence with an integer index (``q[L-1]``).

Everything else (attribute access, lambda, comprehensions, comparisons, boolean operators,
conditional expressions, keyword arguments, starred arguments, slices, f-strings, walrus, ...) is
rejected with :class:`ExprError`. Resource limits: at most ``MAX_LENGTH`` characters and
``MAX_NODES`` AST nodes; exponents must be real numbers with |exponent| <= ``MAX_EXPONENT``
(``MAX_ARRAY_EXPONENT`` for arrays); integer results are capped at ``MAX_INT_BITS`` bits (so
``2**10**10`` and ``(10**200)**200`` are refused before they are computed).
"""

from __future__ import annotations

import ast
import numbers
from typing import Any, Callable, Mapping

import numpy as np

from caramel.errors import CaramelError

MAX_LENGTH = 2000
MAX_NODES = 500
MAX_EXPONENT = 1024
MAX_ARRAY_EXPONENT = 64
MAX_INT_BITS = 1 << 16

_BINOPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Pow)
_UNARY = (ast.USub, ast.UAdd)
_ALLOWED = (
    ast.Expression,
    ast.BinOp,
    ast.UnaryOp,
    ast.Constant,
    ast.Name,
    ast.Load,
    ast.Call,
    ast.Subscript,
    *_BINOPS,
    *_UNARY,
)


class ExprError(CaramelError):
    """An expression that is malformed, unsafe, uses an undeclared name, or fails to evaluate."""


def parse(text: str, names: set[str] | frozenset[str], functions: set[str] | frozenset[str] = frozenset()) -> ast.Expression:
    """Parse and validate ``text``; ``names`` are the declared variables, ``functions`` the callables."""
    if not isinstance(text, str):
        raise ExprError(f"expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise ExprError(f"expression longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise ExprError(f"cannot parse {text!r}: {exc}") from None
    count = 0
    for node in ast.walk(tree):
        count += 1
        if count > MAX_NODES:
            raise ExprError(f"expression {text!r} has more than {MAX_NODES} nodes")
        if not isinstance(node, _ALLOWED):
            raise ExprError(f"{type(node).__name__} is not allowed in {text!r}")
        if isinstance(node, ast.BinOp) and not isinstance(node.op, _BINOPS):
            raise ExprError(f"operator {type(node.op).__name__} is not allowed in {text!r}")
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, _UNARY):
            raise ExprError(f"operator {type(node.op).__name__} is not allowed in {text!r}")
        if isinstance(node, ast.Constant) and (
            isinstance(node.value, bool) or not isinstance(node.value, (int, float, complex))
        ):
            raise ExprError(f"constant {node.value!r} is not allowed in {text!r}")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in functions:
                what = node.func.id if isinstance(node.func, ast.Name) else type(node.func).__name__
                raise ExprError(f"call of {what!r} is not allowed in {text!r} (functions: {sorted(functions)})")
            if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
                raise ExprError(f"only positional arguments are allowed in {text!r}")
        if isinstance(node, ast.Subscript) and not isinstance(node.value, ast.Name):
            raise ExprError(f"only a declared name may be subscripted in {text!r}")
        if isinstance(node, ast.Name) and node.id not in names and node.id not in functions:
            raise ExprError(f"name {node.id!r} is not declared in {text!r}")
    # a bare function name is only allowed as the callee of a call
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in functions and node.id not in names:
            if not _is_callee(tree, node):
                raise ExprError(f"function {node.id!r} must be called in {text!r}")
    return tree


def _is_callee(tree: ast.AST, name: ast.Name) -> bool:
    return any(isinstance(n, ast.Call) and n.func is name for n in ast.walk(tree))


def _check_int(v: Any, text: str) -> Any:
    if isinstance(v, int) and v.bit_length() > MAX_INT_BITS:
        raise ExprError(f"integer larger than 2^{MAX_INT_BITS} in {text!r}")
    return v


def _pow(a: Any, b: Any, text: str) -> Any:
    if isinstance(b, np.ndarray) or not isinstance(b, numbers.Real):
        raise ExprError(f"exponent must be a real number in {text!r}")
    limit = MAX_ARRAY_EXPONENT if isinstance(a, np.ndarray) else MAX_EXPONENT
    if abs(b) > limit:
        raise ExprError(f"exponent {b} exceeds {limit} in {text!r}")
    if isinstance(a, int) and isinstance(b, int) and b > 0 and abs(a).bit_length() * b > MAX_INT_BITS:
        raise ExprError(f"power with exponent {b} exceeds 2^{MAX_INT_BITS} in {text!r}")
    if isinstance(a, int) and isinstance(b, int) and b < 0:
        return float(a) ** b if a else _fail(f"0 to a negative power in {text!r}")
    return a**b


def _fail(msg: str):
    raise ExprError(msg)


def evaluate(
    expr: str | ast.Expression,
    env: Mapping[str, Any],
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> Any:
    """Evaluate a validated expression over ``env`` (numbers, NumPy arrays, sequences) and ``functions``.

    Python ints stay exact under ``+ - * **``; ``/`` is true division.
    """
    functions = functions or {}
    if isinstance(expr, str):
        text = expr
        tree = parse(expr, set(env), set(functions))
    else:
        text, tree = ast.unparse(expr), expr

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise ExprError(f"name {node.id!r} is not declared in {text!r}")
            return env[node.id]
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else +v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            op = node.op
            if isinstance(op, ast.Add):
                return _check_int(a + b, text)
            if isinstance(op, ast.Sub):
                return _check_int(a - b, text)
            if isinstance(op, ast.Mult):
                if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_INT_BITS:
                    raise ExprError(f"integer larger than 2^{MAX_INT_BITS} in {text!r}")
                return a * b
            if isinstance(op, ast.Div):
                if not isinstance(b, np.ndarray) and b == 0:
                    raise ExprError(f"division by zero in {text!r}")
                return a / b
            return _pow(a, b, text)
        if isinstance(node, ast.Subscript):
            seq = ev(node.value)
            idx = ev(node.slice)
            if isinstance(idx, float) and idx.is_integer():
                idx = int(idx)
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise ExprError(f"index must be an integer in {text!r}")
            if not isinstance(seq, (tuple, list)):
                raise ExprError(f"{ast.unparse(node.value)!r} cannot be indexed in {text!r}")
            if not 0 <= idx < len(seq):
                raise ExprError(f"index {idx} out of range 0..{len(seq) - 1} in {text!r}")
            return seq[idx]
        if isinstance(node, ast.Call):
            fn = functions[node.func.id]  # type: ignore[union-attr]
            return fn(*[ev(a) for a in node.args])
        raise ExprError(f"{type(node).__name__} is not allowed in {text!r}")

    try:
        return ev(tree)
    except ExprError:
        raise
    except (ArithmeticError, TypeError, ValueError, IndexError) as exc:
        raise ExprError(f"cannot evaluate {text!r}: {exc}") from None
