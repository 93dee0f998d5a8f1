"""An elementwise program: the one description that the planner fuses into and every backend evaluates.

:class:`Expr` is a tiny SSA program over vector operands (limbs) and scalar operands (residues), with one or more
vector outputs, every operation modulo the row's prime q exactly as the reference computes it (``add``:
(a + b) % q, ``sub``: (a + (q - b)) % q, ``mul``: a * b % q, ``neg``: (q - a) % q). The planner builds them
(:mod:`caramel.plan.fusion`); the NumPy backend interprets them, the CUDA backend generates one kernel per program
(:mod:`caramel.backends.cuda.elementwise`). This module imports nothing of caramel, so that both layers can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

#: Operation name -> arity.
ARITY = {"add": 2, "sub": 2, "mul": 2, "neg": 1}

#: Transformed operands of an expression at most (the GPU's epilogue kernel runs one or two warps' row passes each).
MAX_TRANSFORMED = 16


class ExprOp(NamedTuple):
    """One operation of an :class:`Expr`: ``op`` (a key of :data:`ARITY`) applied to the values ``args``."""

    op: str
    args: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Expr:
    """A tiny SSA program over ``n_vec`` vector and ``n_scalar`` scalar operands.

    Values 0..n_vec-1 are the vector operands, n_vec..n_vec+n_scalar-1 the scalar operands, then one value per entry
    of ``ops``; ``outputs`` are the values written (vector-valued; an operand itself may be an output, which makes a
    copy). A value is a scalar when all its arguments are scalars. ``gathered`` (ascending vector operand indices)
    are the operands read through an automorphism (:func:`caramel.plan.fusion.fuse_automorphisms`): operand k of row
    r is then arena[ins[k]][perm_g(j)] for the Galois element g of ``Row.gather``, i.e. the limb the folded
    ``AUTOMORPHISM`` row would have written. ``transformed`` (ascending, at most :data:`MAX_TRANSFORMED`, none
    gathered) are the operands that a forward NTT of the kernel's prime wrote as a *half* NTT (``Kernel.half``,
    :func:`caramel.plan.fusion.fuse_ntt_epilogues`): the value is the NTT's output all the same; a backend that
    splits the transform in two passes runs the second in this load. Construction checks all of this (ValueError).
    """

    n_vec: int
    n_scalar: int
    ops: tuple[ExprOp, ...]
    outputs: tuple[int, ...]
    gathered: tuple[int, ...] = ()
    transformed: tuple[int, ...] = ()

    def __post_init__(self):
        if self.n_vec < 0 or self.n_scalar < 0 or not self.outputs:
            raise ValueError("an expression needs operand counts >= 0 and at least one output")
        for name in ("gathered", "transformed"):
            ks = getattr(self, name)
            if list(ks) != sorted(set(ks)) or any(not 0 <= k < self.n_vec for k in ks):
                raise ValueError(f"{name} operands must be distinct vector operands in ascending order: {ks}")
        if len(self.transformed) > MAX_TRANSFORMED or set(self.transformed) & set(self.gathered):
            raise ValueError(f"transformed operands: at most {MAX_TRANSFORMED}, none of them gathered")
        kinds = self.kinds()
        for o in self.outputs:
            if not 0 <= o < len(kinds) or not kinds[o]:
                raise ValueError(f"output {o} is not a vector value of the expression")

    def kinds(self) -> list[bool]:
        """kinds()[v] is True when value v is a vector (per residue), False for a scalar."""
        kinds = [True] * self.n_vec + [False] * self.n_scalar
        for i, op in enumerate(self.ops):
            if ARITY.get(op.op) != len(op.args):
                raise ValueError(f"op {i}: unknown op {op.op!r} or wrong number of arguments")
            if any(not 0 <= a < len(kinds) for a in op.args):
                raise ValueError(f"op {i}: argument out of range {op.args}")
            kinds.append(any(kinds[a] for a in op.args))
        return kinds

    def plain(self) -> tuple[int, ...]:
        """The vector operands read from memory as they are (neither gathered nor transformed)."""
        return tuple(k for k in range(self.n_vec) if k not in self.gathered and k not in self.transformed)

    def text(self) -> str:
        """e.g. ``v3s1: t4=mul(v0,v1) t5=add(t4,v2) -> t5``; a gathered operand is ``v0@``, a transformed one
        ``v0^``."""
        def name(v: int) -> str:
            if v < self.n_vec:
                return f"v{v}@" if v in self.gathered else f"v{v}^" if v in self.transformed else f"v{v}"
            if v < self.n_vec + self.n_scalar:
                return f"s{v - self.n_vec}"
            return f"t{v}"

        base = self.n_vec + self.n_scalar
        body = " ".join(f"t{base + i}={o.op}({','.join(map(name, o.args))})" for i, o in enumerate(self.ops))
        return f"v{self.n_vec}s{self.n_scalar}: {body} -> {','.join(map(name, self.outputs))}"


__all__ = ["ARITY", "Expr", "ExprOp", "MAX_TRANSFORMED"]
