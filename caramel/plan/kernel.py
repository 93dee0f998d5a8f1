"""The plan's types: kernel kinds, kernels, chip plans and plans (and the fused expressions, :mod:`caramel.expr`).

The rules these types follow (what each :class:`Kind` reads and writes, how an :class:`Expr` reduces
modulo q) are in :mod:`caramel.plan.plan`, which builds them; :mod:`caramel.plan.fusion` groups
:class:`Op` s into kernels.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Mapping, NamedTuple

from caramel.expr import MAX_TRANSFORMED, Expr, ExprOp
from caramel.program import Mem, Opcode
from caramel.target import Target


class Kind(enum.Enum):
    """Kernel kinds; the value is the name used in reports."""

    COMM = "comm"
    ELEMENTWISE = "elementwise"
    NTT = "ntt"
    INTT = "intt"
    AUTOMORPHISM = "automorphism"
    BASECONV = "baseconv"
    SUD_LIFT = "sud_lift"
    RSV = "rsv"
    MOD = "mod"

    __hash__ = object.__hash__  # (identity, in C: see :class:`caramel.program.Opcode`)


class Row(NamedTuple):
    """One independent instance of a kernel: prime index, input and output buffers, scalar
    table indices (ELEMENTWISE), a per-row argument (see :class:`Kind` rules) and, for an
    ELEMENTWISE row whose expression has ``gathered`` operands, the automorphism of each (in
    ``Expr.gathered`` order): the rotation step, or None for a conjugation (as ``arg`` of an
    ``AUTOMORPHISM`` row)."""

    prime: int
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    scalars: tuple[int, ...] = ()
    arg: int | None = None
    gather: tuple[int | None, ...] = ()


class Prologue(NamedTuple):
    """What a fused NTT computes in its load instead of reading its input limb (issue 14, fusion
    across NTT boundaries): the row that wrote that limb, which nothing else read and nothing
    stored. ``kind`` is the producer's kind and ``width`` the inputs a row reads:

    * ``SUD_LIFT``: ``Row.ins`` (y,), ``Row.arg`` the source prime t; the load lifts y from q_t to
      the row's prime (mode-dependent, as the ``SUD_LIFT`` kernel);
    * ``MOD``: ``Row.ins`` the accumulator's ``width`` words; the load is X mod q (the ``MOD`` kernel);
    * ``BASECONV``: ``Row.ins`` the conversion's ``width`` inputs in ``in_limbs`` order; the load is
      the conversion's output in the row's prime (the run's arithmetic mode).

    The NTT then transforms that limb as usual: same bits as the two kernels one after the other.
    """

    kind: Kind
    width: int
    in_limbs: tuple[int, ...] = ()


class Comm(NamedTuple):
    """One communication: ``op`` (DIS, RCV, JOI), its sync id and group size, the buffer sent or
    contributed (``src``, -1 if none), the buffer received (``dst``, -1 if none), the prime."""

    op: Opcode
    sync: int
    size: int
    src: int
    dst: int
    prime: int


class ScalarSpec(NamedTuple):
    """An entry of a chip's scalar table, reduced modulo q_prime.

    With ``mem``: the loaded scalar, int(memory[mem]) mod q_{mem.limb} mod q_prime (``loas`` then
    a use at base ``prime``). Without: the immediate (prod_{l in limbs} q_l)^-1 mod q_prime (the
    factor of ``sud``: q_t^-1, or P^-1 for P the product of a base conversion's input primes).
    """

    mem: Mem | None
    limbs: tuple[int, ...]
    prime: int

    def value(self, primes, memory: Mapping[Mem, object]) -> int:
        q = primes[self.prime]
        if self.mem is not None:
            return int(memory[self.mem]) % primes[self.mem.limb] % q
        product = 1
        for l in self.limbs:
            product = product * primes[l] % q
        return pow(product, -1, q)


def galois_of(ctx, step: int | None) -> int:
    """The Galois element of an automorphism argument for ``ctx``: 5^step mod 2N for a rotation,
    2N - 1 for a conjugation (``step`` None)."""
    return ctx.conjugation_element if step is None else ctx.galois_element(step)


@dataclass(frozen=True, slots=True)
class Kernel:
    """One launch: ``kind``, ``rows`` (or ``comms`` for COMM), ``expr`` (ELEMENTWISE),
    ``in_limbs``/``out_limbs`` (BASECONV; ``in_limbs`` is the basis of RSV), its ``level`` in the
    whole-program DAG, the source ``lines`` of the instructions it executes and, for an NTT whose
    load computes its input, the ``prologue`` (:class:`Prologue`). A ``half`` NTT writes limbs that only
    transformed operands read (``Expr.transformed``): a backend that splits the transform in two passes runs
    only the first here; its outputs hold the NTT's values on every other backend."""

    kind: Kind
    rows: tuple[Row, ...] = ()
    expr: Expr | None = None
    in_limbs: tuple[int, ...] = ()
    out_limbs: tuple[int, ...] = ()
    comms: tuple[Comm, ...] = ()
    level: int = 0
    lines: tuple[int, ...] = ()
    prologue: Prologue | None = None
    half: bool = False

    def reads(self) -> list[int]:
        """Every buffer the kernel reads (with repeats across rows)."""
        if self.kind is Kind.COMM:
            return [c.src for c in self.comms if c.src >= 0]
        return [b for r in self.rows for b in r.ins]

    def writes(self) -> list[int]:
        """Every buffer the kernel writes."""
        if self.kind is Kind.COMM:
            return [c.dst for c in self.comms if c.dst >= 0]
        return [b for r in self.rows for b in r.outs]

    def traffic(self) -> int:
        """Limbs the plan's traffic model charges: each input read once, each output written once.
        An NTT whose load converts (a ``BASECONV`` prologue) reads each distinct input once: its
        blocks of one column tile run next to each other, so the other output primes re-read the
        inputs from L2."""
        if self.prologue is not None and self.prologue.kind is Kind.BASECONV:
            return len(set(self.reads())) + len(self.writes())
        return len(self.reads()) + len(self.writes())

    def galois(self, ctx) -> list[int]:
        """AUTOMORPHISM: the Galois element of every row for ``ctx`` (rotation or conjugation)."""
        return [galois_of(ctx, r.arg) for r in self.rows]

    def gather_galois(self, ctx) -> list[list[int]]:
        """ELEMENTWISE with gathered operands: per row, the Galois element of each gathered operand."""
        return [[galois_of(ctx, a) for a in r.gather] for r in self.rows]

    @property
    def size(self) -> int:
        return len(self.comms) if self.kind is Kind.COMM else len(self.rows)


@dataclass(frozen=True)
class ChipPlan:
    """The plan of one chip: ``kernels`` in execution order, ``deps[k]`` the earlier kernels that
    kernel k reads from; ``inputs`` (memory limb -> buffer, filled from the input image before
    the run), ``zero_buffer`` (filled with zeros, -1 if unused), ``scalars`` (the scalar table),
    ``stores`` (memory name -> buffer holding it at the end: the chip's stores and spills)."""

    chip: int
    kernels: tuple[Kernel, ...]
    deps: tuple[tuple[int, ...], ...]
    n_buffers: int
    inputs: dict[Mem, int]
    zero_buffer: int
    scalars: tuple[ScalarSpec, ...]
    stores: dict[Mem, int]
    instructions: int


@dataclass(frozen=True)
class Plan:
    """The plan of a program: one :class:`ChipPlan` per chip, the build ``timings`` (seconds per phase) and the
    ``target`` its kernels' rows are ordered for (:func:`caramel.plan.order.recent_first`; None: as batched)."""

    name: str
    chips: tuple[ChipPlan, ...]
    timings: dict[str, float] = field(default_factory=dict)
    target: Target | None = None

    @property
    def kernels(self) -> int:
        return sum(len(c.kernels) for c in self.chips)

    def __repr__(self) -> str:  # short: a plan holds every kernel of every chip
        return f"Plan({self.name!r}, {len(self.chips)} chips, {self.kernels} kernels)"

    @property
    def instructions(self) -> int:
        return sum(c.instructions for c in self.chips)

    def to_json(self) -> str:
        """JSON of the plan: per chip its kernels (kind, level, rows, expression, comms, lines, deps)."""
        def kernel(k: Kernel, deps) -> dict:
            out: dict = {"kind": k.kind.value, "level": k.level, "deps": list(deps), "lines": list(k.lines)}
            if k.rows:
                out["rows"] = [[r.prime, list(r.ins), list(r.outs), list(r.scalars), r.arg] for r in k.rows]
            if k.expr is not None:
                out["expr"] = k.expr.text()
                if k.expr.gathered:
                    out["gather"] = [list(r.gather) for r in k.rows]
            if k.in_limbs or k.out_limbs:
                out["in_limbs"], out["out_limbs"] = list(k.in_limbs), list(k.out_limbs)
            if k.prologue is not None:
                out["prologue"] = {"kind": k.prologue.kind.value, "width": k.prologue.width,
                                   "in_limbs": list(k.prologue.in_limbs)}
            if k.half:
                out["half"] = True
            if k.comms:
                out["comms"] = [[c.op.value, c.sync, c.size, c.src, c.dst, c.prime] for c in k.comms]
            return out

        chips = [
            {
                "chip": c.chip,
                "buffers": c.n_buffers,
                "inputs": {str(m): b for m, b in c.inputs.items()},
                "stores": {str(m): b for m, b in c.stores.items()},
                "zero_buffer": c.zero_buffer,
                "scalars": [[str(s.mem) if s.mem else None, list(s.limbs), s.prime] for s in c.scalars],
                "kernels": [kernel(k, d) for k, d in zip(c.kernels, c.deps)],
            }
            for c in self.chips
        ]
        return json.dumps({"program": self.name, "timings": self.timings, "chips": chips}, separators=(",", ":"))


class Op(NamedTuple):
    """One operation before fusion and batching (one row of a future kernel). ELEMENTWISE: ``arg``
    is the operation name; COMM: ``arg`` is the :class:`Comm`; BASECONV: ``arg`` is the
    :class:`~caramel.plan.dag.Conversion`. ``index`` is the source instruction's index."""

    kind: Kind
    prime: int
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    scalars: tuple[int, ...]
    arg: object
    index: int

