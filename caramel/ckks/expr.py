"""A small, safe arithmetic expression evaluator for check files (never ``eval``).

The text is parsed with :func:`ast.parse` in ``eval`` mode and every node is checked against a
whitelist before anything is evaluated:

* numbers (int, float, complex literals such as ``1j``; no strings, bytes, booleans or None);
* names, which must be declared in the environment (or be an allowed function, when called);
* ``+ - * / **`` and unary ``+ -`` (on numbers and vectors; never on sequences such as ``q``);
* calls ``f(a, b, ...)`` of an *allowed* function given by plain name, positional arguments only;
* subscripts ``q[i]`` of a declared sequence with an integer index (``q[L-1]``);
* the reductions, always available: ``sum(v)`` (the sum of a vector's slots, or of a sequence's
  elements), ``prod(v)`` (their product), and over a range ``sum(E for i in range(a, b))`` =
  E(a) + E(a+1) + ... + E(b-1), ``prod(E for i in range(a, b))`` likewise (``range(b)`` starts at 0;
  exactly one ``for`` over ``range``, no ``if``; ``i`` must not shadow a declared name).

Everything else (attribute access, lambda, other comprehensions, comparisons, boolean operators,
conditional expressions, keyword arguments, starred arguments, slices, f-strings, walrus, ...) is
rejected with :class:`ExprError`. Resource limits, so that the memory and time an expression can take
stay bounded: at most ``MAX_LENGTH`` characters, ``MAX_NODES`` AST nodes nested at most ``MAX_DEPTH``
deep; ranges of at most ``MAX_RANGE`` values; at most ``MAX_STEPS`` evaluation steps in all; exponents
must be real numbers with |exponent| <= ``MAX_EXPONENT`` (``MAX_ARRAY_EXPONENT`` for arrays); integer
results are capped at ``MAX_INT_BITS`` bits (so ``2**10**10`` and ``(10**200)**200`` are refused
before they are computed); sequences cannot be repeated or concatenated (``q * 10**9`` is refused).
Vectors have the slot count of the ring, so the memory of an evaluation is at most ``MAX_DEPTH``
live vectors.
"""

from __future__ import annotations

import ast
import numbers
from typing import Any, Callable, Mapping

import numpy as np

from caramel.errors import CaramelError

MAX_LENGTH = 20000
MAX_NODES = 10000
MAX_DEPTH = 200
MAX_RANGE = 1 << 16
MAX_STEPS = 2_000_000
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
#: Reductions available in every expression (see the module docstring).
REDUCTIONS = frozenset({"sum", "prod"})


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
        raise ExprError(f"cannot parse {text[:200]!r}: {exc}") from None
    short = text if len(text) <= 200 else text[:200] + "..."
    # size and depth first, without recursion
    count, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ExprError(f"expression {short!r} has more than {MAX_NODES} nodes")
        if depth > MAX_DEPTH:
            raise ExprError(f"expression {short!r} is nested deeper than {MAX_DEPTH} (write long sums as "
                            f"sum(... for i in range(...)) or split them into [let] bindings)")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    _check_node(tree, frozenset(names), frozenset(functions), short)
    return tree


def _check_node(node: ast.AST, names: frozenset[str], functions: frozenset[str], text: str) -> None:
    """Whitelist check of ``node`` with the names in scope (depth already bounded)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in REDUCTIONS \
            and node.func.id not in names:
        if node.keywords or len(node.args) != 1 or isinstance(node.args[0], ast.Starred):
            raise ExprError(f"{node.func.id}() takes one positional argument in {text!r}")
        arg = node.args[0]
        if isinstance(arg, ast.GeneratorExp):
            var, bounds = _range_generator(arg, names, functions, text)
            for b in bounds:
                _check_node(b, names, functions, text)
            _check_node(arg.elt, names | {var}, functions, text)
        else:
            _check_node(arg, names, functions, text)
        return
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
            raise ExprError(f"call of {what!r} is not allowed in {text!r} (functions: "
                            f"{sorted(set(functions) | REDUCTIONS)})")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise ExprError(f"only positional arguments are allowed in {text!r}")
        for a in node.args:
            _check_node(a, names, functions, text)
        return
    if isinstance(node, ast.Subscript) and not isinstance(node.value, ast.Name):
        raise ExprError(f"only a declared name may be subscripted in {text!r}")
    if isinstance(node, ast.Name):
        if node.id in functions and node.id not in names:
            raise ExprError(f"function {node.id!r} must be called in {text!r}")
        if node.id not in names:
            raise ExprError(f"name {node.id!r} is not declared in {text!r}")
    for child in ast.iter_child_nodes(node):
        _check_node(child, names, functions, text)


def _range_generator(gen: ast.GeneratorExp, names, functions, text: str) -> tuple[str, list[ast.AST]]:
    """The loop variable and the bound expressions of ``E for i in range(a, b)``; refuses every other form."""
    if len(gen.generators) != 1:
        raise ExprError(f"a reduction takes exactly one 'for ... in range(...)' in {text!r}")
    comp = gen.generators[0]
    if comp.ifs or comp.is_async or not isinstance(comp.target, ast.Name):
        raise ExprError(f"a reduction takes 'for NAME in range(...)' without 'if' in {text!r}")
    it = comp.iter
    if not (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and not it.keywords and 1 <= len(it.args) <= 2 and not any(isinstance(a, ast.Starred) for a in it.args)):
        raise ExprError(f"a reduction iterates over range(b) or range(a, b) only, in {text!r}")
    var = comp.target.id
    if var in names or var in functions or var in REDUCTIONS:
        raise ExprError(f"loop variable {var!r} shadows a declared name in {text!r}")
    return var, list(it.args)


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


def _no_sequences(a: Any, b: Any, op: str, text: str) -> None:
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        raise ExprError(f"{op} of a sequence is not allowed in {text!r} (index it: q[i])")


def _slot_reduce(kind: str, v: Any, text: str) -> Any:
    """``sum(v)`` / ``prod(v)``: over a vector's slots or a sequence's elements; a number is itself."""
    if isinstance(v, (tuple, list)):
        out = 1 if kind == "prod" else 0
        for x in v:
            out = _check_int(out * x if kind == "prod" else out + x, text)
        return out
    if isinstance(v, np.ndarray):
        return complex(np.prod(v) if kind == "prod" else np.sum(v))
    return v


def evaluate(
    expr: str | ast.Expression,
    env: Mapping[str, Any],
    functions: Mapping[str, Callable[..., Any]] | None = None,
) -> Any:
    """Evaluate a validated expression over ``env`` (numbers, NumPy arrays, sequences) and ``functions``.

    Python ints stay exact under ``+ - * **``; ``/`` is true division. ``sum``/``prod`` are the
    reductions of the module docstring.
    """
    functions = functions or {}
    if isinstance(expr, str):
        text = expr if len(expr) <= 200 else expr[:200] + "..."
        tree = parse(expr, set(env), set(functions))
    else:
        text, tree = ast.unparse(expr)[:200], expr
    steps = [0]

    def ev(node: ast.AST, scope: Mapping[str, Any]) -> Any:
        steps[0] += 1
        if steps[0] > MAX_STEPS:
            raise ExprError(f"evaluation of {text!r} takes more than {MAX_STEPS} steps")
        if isinstance(node, ast.Expression):
            return ev(node.body, scope)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in scope:
                raise ExprError(f"name {node.id!r} is not declared in {text!r}")
            return scope[node.id]
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand, scope)
            if isinstance(v, (tuple, list)):
                raise ExprError(f"sign of a sequence is not allowed in {text!r}")
            return -v if isinstance(node.op, ast.USub) else +v
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left, scope), ev(node.right, scope)
            op = node.op
            _no_sequences(a, b, type(op).__name__, text)
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
            seq = ev(node.value, scope)
            idx = ev(node.slice, scope)
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
            name = node.func.id  # type: ignore[union-attr]
            if name in REDUCTIONS and name not in scope:
                arg = node.args[0]
                if not isinstance(arg, ast.GeneratorExp):
                    return _slot_reduce(name, ev(arg, scope), text)
                return reduce_range(name, arg, scope)
            fn = functions[name]
            return fn(*[ev(a, scope) for a in node.args])
        raise ExprError(f"{type(node).__name__} is not allowed in {text!r}")

    def reduce_range(kind: str, gen: ast.GeneratorExp, scope: Mapping[str, Any]) -> Any:
        comp = gen.generators[0]
        bounds = []
        for b in comp.iter.args:  # type: ignore[attr-defined]
            v = ev(b, scope)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ExprError(f"range bounds must be integers in {text!r}")
            bounds.append(v)
        values = range(*bounds)
        if len(values) > MAX_RANGE:
            raise ExprError(f"range of {len(values)} values exceeds {MAX_RANGE} in {text!r}")
        var = comp.target.id  # type: ignore[attr-defined]
        out: Any = 1 if kind == "prod" else 0
        inner = dict(scope)
        for i in values:
            inner[var] = i
            v = ev(gen.elt, inner)
            if isinstance(v, (tuple, list)):
                raise ExprError(f"{kind} over a range of sequences is not allowed in {text!r}")
            if kind == "prod":
                if isinstance(out, int) and isinstance(v, int) and out.bit_length() + v.bit_length() > MAX_INT_BITS:
                    raise ExprError(f"integer larger than 2^{MAX_INT_BITS} in {text!r}")
                out = out * v
            else:
                out = _check_int(out + v, text)
        return out

    try:
        return ev(tree, env)
    except ExprError:
        raise
    except (ArithmeticError, TypeError, ValueError, IndexError, MemoryError, RecursionError) as exc:
        raise ExprError(f"cannot evaluate {text!r}: {exc}") from None
