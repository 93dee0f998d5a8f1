"""Fusion and batching: from one chip's operations (:func:`caramel.plan.plan.lower`) to kernels.

Three steps, each linear in the number of operations:

1. :func:`fuse` removes dead operations (nothing stored, sent or read later depends on them) and
   fuses elementwise operations vertically: an elementwise operation whose result is read by
   exactly one later operation, which is elementwise on the same prime, and is neither stored nor
   sent, is folded into that consumer. The result is a tree with one output (its root); all its
   other values stay in registers. A tree reads each distinct input buffer once; trees stop
   growing at ``max_inputs`` vector inputs. Every remaining operation (a tree, an NTT, a
   base conversion, a communication...) is a :class:`Unit`, in program order.
   :func:`fuse_ntt_loads` then fuses across NTT boundaries: a forward NTT whose input limb was
   written by a ``SUD_LIFT``, ``MOD`` or ``BASECONV`` row (on the NTT's prime; the kinds chosen, by
   default :data:`DEFAULT_NTT_LOADS`), is read by nothing else and is not stored computes that row
   in its load (a :class:`~caramel.plan.kernel.Prologue`);
   the limb disappears (no buffer, no traffic), and so does the producer once none of its outputs
   is left (a conversion keeps the outputs that other rows read).
2. :func:`levels` gives every unit its level in the whole-program DAG: one more than the highest
   level of the units whose buffers it reads (0 for none); a ``rcv`` takes the level of its
   ``dis`` and every participant of a ``joi`` the highest level of its participants (the
   cross-chip edges weigh 0), so that all participants of one communication share its level
   (a collective backend issues it as one call). It walks the chips round-robin like the reference scheduler, so
   it also finds deadlocks. Two units of one level never depend on each other.
   :func:`merge_siblings` then fuses horizontally: trees of one level and prime that read a common
   buffer become one unit with several outputs (a "sibling row"), which reads it once.
   :func:`fuse_automorphisms` then computes automorphisms in their consumers' loads: an
   ``AUTOMORPHISM`` row whose output is read only by elementwise units and is not stored is
   dropped, and those units read its input through the permutation (a *gathered* operand,
   ``Expr.gathered`` and ``Row.gather``); the limb between them is never written or read.
   :func:`fuse_ntt_epilogues` last marks the forward NTTs whose output only one elementwise unit reads as
   *half* NTTs and that operand as *transformed* (``Expr.transformed``, ``Kernel.half``): the values stay
   the same; a backend with a two-pass transform runs the second pass in the consumer's load, so that the
   NTT's output is never written in full and read again.
3. :func:`batch` groups the units of one chip with the same level, kind and signature (the
   expression of a tree, the bases of a conversion, an NTT's prologue) into one kernel: the horizontal batching of
   independent instances (different limbs) into rows. Kernels run in level order, communication
   first within a level; all communications of one (chip, level) form one group. That order has
   no deadlock: a chip blocked at the group of level d waits for a send of level <= d that
   another chip has not reached, so that chip is blocked at a level < d; levels cannot decrease
   forever around a cycle.
"""

from __future__ import annotations

from collections import Counter
from itertools import chain
from operator import attrgetter
from typing import NamedTuple

from caramel.errors import ArgumentError, DeadlockError
from caramel.expr import ARITY
from caramel.program import Opcode, Stream
from caramel.plan.kernel import MAX_TRANSFORMED, Comm, Expr, ExprOp, Kernel, Kind, Op, Prologue, Row

_RANK = {k: i for i, k in enumerate(Kind)}  # COMM first within a level
#: ``_new(Unit, fields)``, ``_new(Row, fields)``: a named tuple from all its fields in order, without its Python-level
#: ``__new__`` or ``_replace`` (the passes build one per operation).
_new = tuple.__new__
_INS, _OUTS = attrgetter("ins"), attrgetter("outs")  # (a unit's input and output buffers, in C)

#: Defaults of ``build_plan``: vector inputs of a tree or a merged row (``max_inputs``) and outputs of a
#: merged row (``max_outputs``, :func:`merge_siblings`), chosen by timing BootstrapLike_51L_1c's
#: graph under several caps (``python -m bench replay --plan max_outputs=...``; docs/PERFORMANCE.md).
MAX_INPUTS = 32
MAX_OUTPUTS = 8


class Unit(NamedTuple):
    """One row of a future kernel: ``kind``, batching ``key``, the :class:`Row` (or
    :class:`Comm`), the buffers it reads and writes, and its source instruction indices."""

    kind: Kind
    key: object
    row: Row | Comm
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    index: tuple[int, ...]


def fuse(
    ops: list[Op], pinned: set[int], n_buffers: int, *, enable: bool = True, max_inputs: int = MAX_INPUTS
) -> list[Unit]:
    """Dead-code removal and vertical fusion of one chip's operations (see the module docstring).
    ``pinned``: buffers that must hold their value at the end (the chip's stores); buffer ids
    are below ``n_buffers``."""
    COMM, E, BASECONV, RSV, MOD = Kind.COMM, Kind.ELEMENTWISE, Kind.BASECONV, Kind.RSV, Kind.MOD
    with_arg = (Kind.AUTOMORPHISM, Kind.SUD_LIFT)  # (the kinds whose Row.arg is the operation's)
    # Liveness, last operation first: one is live when it communicates or writes a needed buffer; it needs its inputs.
    needed = set(pinned)
    disjoint, need = needed.isdisjoint, needed.update
    live: list[int] = []
    for j, o in zip(range(len(ops) - 1, -1, -1), reversed(ops)):
        if o.kind is COMM or not disjoint(o.outs):
            live.append(j)
            need(o.ins)
    live.reverse()
    live_ops = ops if len(live) == len(ops) else list(map(ops.__getitem__, live))
    kinds, primes, op_ins, op_outs, op_scalars, op_args, op_index = zip(*live_ops) if live_ops else ((),) * 7
    # n_use[b]: live operations reading b (each counted once), plus one if b is pinned.
    n_use = Counter(chain.from_iterable(map(set, op_ins)))
    n_use.update(pinned)

    # Trees, bottom-up in program order: micro-ops (op index, name, args, source instruction index) in post-order. An
    # argument is 2*buffer (a vector input), 2*scalar+1 (a scalar) or -1-j (the result of op j).
    # trees: the trees not folded (yet), by the buffer their root writes (an operation's outputs are buffers of
    # their own: SSA), as (root j, prime, micro-ops, vector inputs).
    trees: dict[int, tuple[int, int, list, int]] = {}
    for j, kind, prime, ins, outs, scalars, name, index in zip(live, kinds, primes, op_ins, op_outs, op_scalars, op_args,
                                                                op_index):
        if kind is not E or not enable:  # (unfused: every operation its own unit, below)
            continue
        twice = len(ins) == 2 and ins[0] == ins[1]
        if twice:
            ins = ins[:1]
        micro: list | None = None
        args: list = []
        n_leaves = len(ins)
        for b in ins:
            t = trees.get(b)
            if t is not None and n_use[b] == 1 and t[1] == prime and n_leaves - 1 + t[3] <= max_inputs:
                del trees[b]
                if micro is None:  # (the folded tree's list is its own: extended in place)
                    micro = t[2]
                else:
                    micro += t[2]
                n_leaves += t[3] - 1
                args.append(-1 - t[0])
            else:
                args.append(2 * b)
        if twice:
            args.append(args[0])
        for sc in scalars:
            args.append(2 * sc + 1)
        if micro is None:
            micro = [(j, name, tuple(args), index)]
        else:
            micro.append((j, name, tuple(args), index))
        trees[outs[0]] = (j, prime, micro, n_leaves)

    units: list[Unit] = []
    add = units.append
    exprs: dict = {}
    for kind, prime, ins, outs, scalars, arg, index in zip(kinds, primes, op_ins, op_outs, op_scalars, op_args,
                                                           op_index):
        if kind is E:
            if not enable:
                add(_op_unit(prime, ins, outs, scalars, arg, index, exprs))
                continue
            t = trees.get(outs[0])
            if t is not None:  # (else folded into its consumer)
                add(_tree_unit(prime, outs, t[2], exprs))
        elif kind is COMM:
            add(_new(Unit, (kind, None, arg, ins, outs, (index,))))
        elif kind is BASECONV:
            key = (arg.in_limbs, tuple(arg.out_limbs[s] for s in sorted(arg.slots)))
            add(_new(Unit, (kind, key, _new(Row, (-1, ins, outs, (), None, ())), ins, outs, (index,))))
        else:
            key = arg if kind is RSV else len(ins) if kind is MOD else None
            row = _new(Row, (prime, ins, outs, (), arg if kind in with_arg else None, ()))
            add(_new(Unit, (kind, key, row, ins, outs, (index,))))
    return units


#: The kinds whose row an NTT may compute in its load (:func:`fuse_ntt_loads`).
PROLOGUE_KINDS = (Kind.SUD_LIFT, Kind.MOD, Kind.BASECONV)

#: The loads a plan fuses by default (``build_plan(fuse_ntt=True)``): the lift and ``mod``. The
#: converting load (``BASECONV``) is built, bit-exact and tested on every backend, but slower on the
#: GPU, whose NTT is arithmetic-bound (docs/PERFORMANCE.md, alternatives): every output prime repeats
#: the conversion's per-input products. ``fuse_ntt="all"`` adds it.
DEFAULT_NTT_LOADS = frozenset({Kind.SUD_LIFT, Kind.MOD})


def ntt_load_kinds(fuse_ntt) -> frozenset[Kind]:
    """The producer kinds that NTT loads compute for the build option ``fuse_ntt``: True, the
    defaults (:data:`DEFAULT_NTT_LOADS`); False or None, none; ``"all"``, every one of
    :data:`PROLOGUE_KINDS`; ``"none"``; or a collection (or comma-separated string) of those kinds or
    their names (``"sud_lift,mod,baseconv"``). Anything else raises :class:`ArgumentError`."""
    if fuse_ntt is True:
        return DEFAULT_NTT_LOADS
    if fuse_ntt is False or fuse_ntt is None or fuse_ntt == "none":
        return frozenset()
    if fuse_ntt == "all":
        return frozenset(PROLOGUE_KINDS)
    items = fuse_ntt.split(",") if isinstance(fuse_ntt, str) else fuse_ntt
    names = {k.value: k for k in PROLOGUE_KINDS}
    try:
        out = frozenset(x if isinstance(x, Kind) else names[str(x).strip()] for x in items if str(x).strip())
    except (KeyError, TypeError):
        raise ArgumentError(f"NTT loads must be 'all', 'none' or among {', '.join(names)}, not {fuse_ntt!r}") from None
    if not out <= frozenset(PROLOGUE_KINDS):
        raise ArgumentError(f"NTT loads must be among {', '.join(names)}, not {fuse_ntt!r}")
    return out


#: The prologue that computes buffer b written by unit src, per producer kind: (src, b) ->
#: (prologue, the prime of b, the fused row's argument: the lift's source prime).
_PROLOGUE_OF = {
    Kind.SUD_LIFT: lambda src, b: (Prologue(Kind.SUD_LIFT, 1), src.row.prime, src.row.arg),
    Kind.MOD: lambda src, b: (Prologue(Kind.MOD, len(src.ins)), src.row.prime, None),
    Kind.BASECONV: lambda src, b: (Prologue(Kind.BASECONV, len(src.ins), src.key[0]),
                                   src.key[1][src.outs.index(b)], None),
}


def fuse_ntt_loads(units: list[Unit], pinned: set[int], kinds=PROLOGUE_KINDS) -> list[Unit]:
    """Fusion across NTT boundaries (see the module docstring): every NTT unit whose one input is
    written by a unit of ``kinds`` (among :data:`PROLOGUE_KINDS`) on the NTT's prime, read by no other unit (each
    reader counted once, communication included) and not in ``pinned`` reads that unit's inputs
    instead, with the :class:`~caramel.plan.kernel.Prologue` as its batching key. The producer
    loses that output (a conversion keeps its other outputs, under the key of the outputs left)
    and is dropped when none is left. Order is kept."""
    readers = _readers(units)
    fused = frozenset(kinds) & frozenset(PROLOGUE_KINDS)
    producer = {b: j for j, u in enumerate(units) if u.kind in fused for b in u.outs}
    out: list[Unit | None] = list(units)
    taken: dict[int, set[int]] = {}
    NTT = Kind.NTT
    for j, u in enumerate(units):
        if u.kind is not NTT:
            continue
        b = u.ins[0]
        p = producer.get(b)
        if p is None or b in pinned or readers[b] != 1:
            continue
        src = units[p]
        pro, prime, arg = _PROLOGUE_OF[src.kind](src, b)
        if prime != u.row.prime:
            continue
        row = _new(Row, (prime, src.ins, u.row.outs, (), arg, ()))
        out[j] = _new(Unit, (NTT, pro, row, src.ins, u.outs, tuple(sorted(set(src.index) | set(u.index)))))
        taken.setdefault(p, set()).add(b)
    for p, bufs in taken.items():
        src = units[p]
        keep = [i for i, b in enumerate(src.outs) if b not in bufs]
        if not keep:
            out[p] = None
        else:  # a conversion with outputs left (only conversions have several)
            outs = tuple(src.outs[i] for i in keep)
            key = (src.key[0], tuple(src.key[1][i] for i in keep))
            out[p] = Unit(src.kind, key, Row(-1, src.ins, outs), src.ins, outs, src.index)
    return [u for u in out if u is not None]


def _readers(units: list[Unit]) -> Counter:
    """How many units read each buffer (a unit that reads it several times counted once)."""
    return Counter(chain.from_iterable(map(set, map(_INS, units))))


def _tree_unit(prime: int, outs: tuple[int, ...], micro: list, exprs: dict) -> Unit:
    """The canonical :class:`Expr` of a tree (one object per distinct expression, kept in
    ``exprs``) and its row (on ``prime``, writing ``outs``: the root's): operands numbered by first use."""
    flat = [a for m in micro for a in m[2]]  # every argument, in order
    first = dict.fromkeys(flat)  # (by first use)
    vec = [a for a in first if a >= 0 and not a & 1]
    sca = [a for a in first if a >= 0 and a & 1]
    nv, ns = len(vec), len(sca)
    base = nv + ns
    num = dict(zip(vec, range(nv)))
    num.update(zip(sca, range(nv, base)))
    num.update(zip([-1 - m[0] for m in micro], range(base, base + len(micro))))
    # The key: operation names and numbered arguments, flat (an operation's arity is its name's, :data:`ARITY`).
    names = tuple([m[1] for m in micro])
    args = tuple(map(num.__getitem__, flat))
    key = (nv, ns, names, args)
    expr = exprs.get(key)
    if expr is None:
        expr = exprs[key] = Expr(nv, ns, _expr_ops(names, args), (base + len(micro) - 1,))
    ins = tuple([a >> 1 for a in vec])
    row = Row(prime, ins, outs, tuple([a >> 1 for a in sca]))
    return Unit(Kind.ELEMENTWISE, expr, row, ins, outs, tuple(sorted({m[3] for m in micro})))


def _op_unit(prime: int, ins: tuple[int, ...], outs: tuple[int, ...], scalars: tuple[int, ...], name: str,
             index: int, exprs: dict) -> Unit:
    """The unit of one elementwise operation alone: :func:`_tree_unit` of its one-operation tree (its arguments as
    :func:`fuse` writes them). When no operand repeats, they are numbered in order and the expression is the
    operation's name and arity alone."""
    nv, ns = len(ins), len(scalars)
    if len(set(ins)) < nv or len(set(scalars)) < ns:
        return _tree_unit(prime, outs, [(0, name, tuple([2 * b for b in ins] + [2 * s + 1 for s in scalars]), index)],
                          exprs)
    key = (nv, ns, (name,), tuple(range(nv + ns)))
    expr = exprs.get(key)
    if expr is None:
        expr = exprs[key] = Expr(nv, ns, _expr_ops((name,), key[3]), (nv + ns,))
    return _new(Unit, (Kind.ELEMENTWISE, expr, _new(Row, (prime, ins, outs, scalars, None, ())), ins, outs, (index,)))


def merge_siblings(units: list[Unit], unit_levels: list[int], max_inputs: int = MAX_INPUTS,
                   max_outputs: int = MAX_OUTPUTS) -> tuple[list[Unit], list[int]]:
    """Horizontal fusion of sibling trees: elementwise units of one level and prime that read a
    common buffer become one unit with several outputs, which reads each distinct buffer once.

    Units of one level never depend on each other (:func:`levels`), so the merged unit, at that
    level, computes the same values. Greedy in program order: a unit joins the open group of its
    (level, prime) with which it shares the most input buffers (the first on a tie), if the
    group's distinct vector inputs stay at most ``max_inputs`` and its outputs at most
    ``max_outputs``; otherwise it starts a group. The merged :class:`Expr` is the members'
    expressions one after the other, operands numbered by first use (:func:`_merged_unit`), so
    equal sharing patterns give equal expressions and still batch into one kernel. Returns the
    units and their levels, order kept (a group takes the place of its first member)."""
    E = Kind.ELEMENTWISE
    groups: list[list[int]] = []  # members (unit indices) of every group
    group_ins: list[set[int]] = []
    # (level, prime) -> buffer -> the groups that read it and may still take a member (a full group leaves the index:
    # it is never chosen; a dict keeps them in order and drops one in O(1))
    open_by_key: dict[tuple[int, int], dict[int, dict[int, None]]] = {}
    group_of = [-1] * len(units)
    for j, u in enumerate(units):
        if u.kind is not E:
            continue
        index = open_by_key.get((unit_levels[j], u.row.prime))
        if index is None:
            index = open_by_key[unit_levels[j], u.row.prime] = {}
        ins = set(u.ins)
        shared: dict[int, int] = {}  # open group -> inputs it shares with u (the size of group_ins[g] & ins)
        for b in ins:
            gs = index.get(b)
            if gs:
                for g in gs:
                    shared[g] = shared.get(g, 0) + 1
        best = -1
        if shared:
            n_ins = len(ins)
            for g, n in sorted(shared.items(), key=_most_shared) if len(shared) > 1 else shared.items():
                if len(group_ins[g]) + n_ins - n <= max_inputs:  # (the size of group_ins[g] | ins)
                    best = g
                    break
        if best < 0:
            best = len(groups)
            groups.append([])
            group_ins.append(set())
        members, seen = groups[best], group_ins[best]
        members.append(j)
        new = ins - seen
        seen |= ins
        if len(members) < max_outputs:
            for b in new:
                gs = index.get(b)
                if gs is None:
                    index[b] = {best: None}
                else:
                    gs[best] = None
        else:  # full: out of the index
            for b in seen:
                gs = index.get(b)
                if gs:
                    gs.pop(best, None)
        group_of[j] = best
    out_units: list[Unit] = []
    out_levels: list[int] = []
    exprs: dict = {}
    flat: dict = {}
    for j, u in enumerate(units):
        g = group_of[j]
        if g >= 0 and groups[g][0] != j:
            continue
        if g >= 0 and len(groups[g]) > 1:
            u = _merged_unit([units[m] for m in groups[g]], exprs, flat)
        out_units.append(u)
        out_levels.append(unit_levels[j])
    return out_units, out_levels


def _most_shared(item: tuple[int, int]) -> tuple[int, int]:
    """The order of candidate groups (group, shared inputs) in :func:`merge_siblings`: most shared first, then the
    oldest."""
    return -item[1], item[0]


def _merged_unit(members: list[Unit], exprs: dict, flat: dict) -> Unit:
    """One elementwise unit computing every member's outputs: the members' operations in order,
    vector operands numbered by first use over all members, each member's scalars after all
    vectors (see :func:`merge_siblings`). ``exprs``: the merged expressions by key; ``flat``: each member
    expression's operation names and arguments, flat (by ``id``: the expressions are alive in the units)."""
    vec = dict.fromkeys(chain.from_iterable([u.row.ins for u in members]))  # (by first use)
    number = dict(zip(vec, range(len(vec)))).__getitem__
    nv = len(vec)
    ns = sum([u.key.n_scalar for u in members])
    names: list[str] = []
    args: list[int] = []
    outputs: list[int] = []
    s0, base = nv, nv + ns
    for u in members:
        e: Expr = u.key
        f = flat.get(id(e))
        if f is None:
            f = flat[id(e)] = (tuple([o.op for o in e.ops]), tuple([a for o in e.ops for a in o.args]))
        n_ops = len(f[0])
        # value[a]: the merged number of the member's value a (its vector operands, scalars, then operations)
        value = list(map(number, u.row.ins))
        value += range(s0, s0 + e.n_scalar)
        value += range(base, base + n_ops)
        at = value.__getitem__
        names += f[0]
        args += map(at, f[1])
        outputs += map(at, e.outputs)
        s0 += e.n_scalar
        base += n_ops
    # The key: operation names and arguments, flat (an operation's arity is its name's, :data:`ARITY`).
    key = (nv, ns, tuple(names), tuple(args), tuple(outputs))
    expr = exprs.get(key)
    if expr is None:  # built (and checked) once per distinct expression, not once per merged row
        expr = exprs[key] = Expr(nv, ns, _expr_ops(key[2], key[3]), key[4])
    row = Row(members[0].row.prime, tuple(vec), tuple([b for u in members for b in u.row.outs]),
              tuple([s for u in members for s in u.row.scalars]))
    return Unit(Kind.ELEMENTWISE, expr, row, row.ins, row.outs, tuple(sorted({i for u in members for i in u.index})))


def _expr_ops(names: tuple[str, ...], args: tuple[int, ...]) -> tuple[ExprOp, ...]:
    """The operations of names and their arguments, flat (each operation takes its name's :data:`ARITY`)."""
    ops, k = [], 0
    for name in names:
        n = ARITY[name]
        ops.append(ExprOp(name, args[k:k + n]))
        k += n
    return tuple(ops)


def fuse_automorphisms(units: list[Unit], unit_levels: list[int], pinned: set[int]) -> tuple[list[Unit], list[int]]:
    """Automorphisms computed in their consumers' loads (see the module docstring).

    An ``AUTOMORPHISM`` unit a -> b (rotation step or conjugation ``arg``) is folded when b is not
    in ``pinned`` and every unit that reads b is ELEMENTWISE (a communication, NTT, conversion...
    reading b keeps it). Each such reader then reads a instead, as a gathered operand: its
    :class:`Expr` gets the operand's index in ``gathered`` and its :class:`Row` the automorphism's
    argument in ``gather`` (per row, so rows of one kernel may rotate by different steps), which
    gives the same values: out_b[j] = a[perm_g(j)] whatever the prime. Buffers are written once
    (SSA), so a is unchanged where the reader runs; the reader's level stays above a's writer's.
    The automorphism unit is dropped. Returns the units and their levels, order kept."""
    E, AUT = Kind.ELEMENTWISE, Kind.AUTOMORPHISM
    writer = {u.outs[0]: j for j, u in enumerate(units) if u.kind is AUT}
    if not writer:
        return units, unit_levels
    blocked = set(pinned)  # (and every buffer that a unit other than an elementwise one reads)
    for u in units:
        if u.kind is not E:
            blocked.update(u.ins)
    fold = {b: units[j] for b, j in writer.items() if b not in blocked}
    folded = fold.keys() & set(chain.from_iterable(u.ins for u in units if u.kind is E))
    exprs: dict = {}
    out_units: list[Unit] = []
    out_levels: list[int] = []
    for u, lv in zip(units, unit_levels):
        if u.kind is AUT and u.outs[0] in folded:
            continue
        if u.kind is E and not folded.isdisjoint(u.ins):
            e: Expr = u.key
            auts = [fold.get(b) if b in folded else None for b in u.row.ins]
            gathered = tuple(k for k, a in enumerate(auts) if a is not None)
            ins = tuple(b if a is None else a.ins[0] for b, a in zip(u.row.ins, auts))
            key = (id(e), gathered)  # (e is alive in ``units``; equal distinct objects: equal results)
            expr = exprs.get(key)
            if expr is None:
                expr = exprs[key] = Expr(e.n_vec, e.n_scalar, e.ops, e.outputs, gathered)
            r = u.row
            row = _new(Row, (r.prime, ins, r.outs, r.scalars, r.arg, tuple([auts[k].row.arg for k in gathered])))
            index = tuple(sorted(set(u.index).union(*(auts[k].index for k in gathered))))
            u = _new(Unit, (E, expr, row, ins, u.outs, index))
        out_units.append(u)
        out_levels.append(lv)
    return out_units, out_levels


class HalfNtt(NamedTuple):
    """The batching key of a half NTT unit (:func:`fuse_ntt_epilogues`): its prologue (or None)."""

    prologue: Prologue | None


def fuse_ntt_epilogues(units: list[Unit], pinned: set[int]) -> list[Unit]:
    """NTT epilogues (see the module docstring): a forward NTT unit whose output b is not in ``pinned``
    and is read by exactly one unit, an ELEMENTWISE one that reads b at one operand position, not a gathered
    one, becomes a half NTT (key :class:`HalfNtt`), and that operand transformed (the first
    :data:`~caramel.plan.kernel.MAX_TRANSFORMED` such operands of a unit, in operand order).
    Buffers, rows and levels are unchanged: only keys (expressions) change, so kernels batch by them."""
    E, NTT = Kind.ELEMENTWISE, Kind.NTT
    ntt_of = {u.outs[0]: j for j, u in enumerate(units) if u.kind is NTT and not isinstance(u.key, HalfNtt)}
    if not ntt_of:
        return units
    readers = _readers(units)
    out = list(units)
    exprs: dict = {}
    ntt_outs = ntt_of.keys()
    for j, u in enumerate(units):
        if u.kind is not E or ntt_outs.isdisjoint(u.ins):
            continue
        e: Expr = u.key
        ins = u.row.ins
        # (unit j reads b: one reader is unit j alone)
        chosen = tuple(k for k, b in enumerate(ins) if b in ntt_of and b not in pinned and readers[b] == 1
                       and ins.count(b) == 1 and k not in e.gathered)[:MAX_TRANSFORMED]
        if not chosen:
            continue
        key = (id(e), chosen)  # (e is alive in ``units``; equal distinct objects: equal results)
        expr = exprs.get(key)
        if expr is None:
            expr = exprs[key] = Expr(e.n_vec, e.n_scalar, e.ops, e.outputs, e.gathered, chosen)
        out[j] = _new(Unit, (E, expr, u.row, u.ins, u.outs, u.index))
        for k in chosen:
            n = ntt_of[ins[k]]
            v = units[n]
            out[n] = _new(Unit, (NTT, HalfNtt(v.key), v.row, v.ins, v.outs, v.index))
    return out


def levels(units: list[list[Unit]], streams: list[Stream]) -> list[list[int]]:
    """The level of every unit of every chip (see the module docstring); raises
    :class:`DeadlockError` when communication cannot complete in any order."""
    chips = len(units)
    size = [1 + max(max(chain.from_iterable(map(_INS, us)), default=0),
                    max(chain.from_iterable(map(_OUTS, us)), default=0)) for us in units]
    buffer_level = [[0] * n for n in size]  # level + 1 of the unit that wrote the buffer
    out = [[0] * len(us) for us in units]
    pos = [0] * chips
    dis_level: dict[int, int] = {}
    joins: dict[int, list[int]] = {}
    joined = [False] * chips
    contributors: list[tuple[int, int, int]] = []  # (chip, unit, sync) of joi without destination
    COMM = Kind.COMM
    while True:
        progressed = False
        for c in range(chips):
            us, lv_of, p = units[c], buffer_level[c], pos[c]
            levels_c = out[c]
            while p < len(us):
                u = us[p]
                base = 0
                for b in u.ins:
                    if lv_of[b] > base:
                        base = lv_of[b]
                lv = base
                if u.kind is COMM:
                    cm = u.row
                    if cm.op == Opcode.DIS:
                        dis_level[cm.sync] = lv
                    elif cm.op == Opcode.RCV:
                        got = dis_level.get(cm.sync)
                        if got is None:
                            break
                        lv = got
                    else:
                        if not joined[c]:
                            st = joins.setdefault(cm.sync, [0, 0])
                            st[0] += 1
                            st[1] = max(st[1], base)
                            joined[c] = True
                        if cm.dst >= 0:
                            st = joins[cm.sync]
                            if st[0] < cm.size:
                                break
                            lv = st[1]
                        else:
                            contributors.append((c, p, cm.sync))
                        joined[c] = False
                for b in u.outs:
                    lv_of[b] = lv + 1
                levels_c[p] = lv
                p += 1
                progressed = True
            pos[c] = p
        if all(pos[c] == len(units[c]) for c in range(chips)):
            for c, p, sync in contributors:  # a contribution writes nothing: it may wait
                out[c][p] = joins[sync][1]
            return out
        if not progressed:
            waits = []
            for c in range(chips):
                if pos[c] < len(units[c]):
                    ins = streams[c].instructions[units[c][pos[c]].index[0]]
                    waits.append(f"chip {c} waits at {streams[c].path}:{ins.line} ({ins.text()})")
            raise DeadlockError("deadlock: every unfinished chip is blocked:\n  " + "\n  ".join(waits))


def batch(
    units: list[Unit], unit_levels: list[int], lines: list[int]
) -> tuple[tuple[Kernel, ...], tuple[tuple[int, ...], ...]]:
    """Kernels of one chip (units of equal level, kind and key batched into rows) in execution
    order, and each kernel's dependencies (the earlier kernels that wrote a buffer it reads).
    ``lines[i]`` is the source line of instruction i."""
    groups: dict[tuple, list[int]] = {}
    for j, (u, lv) in enumerate(zip(units, unit_levels)):
        groups.setdefault((lv, u.kind, u.key), []).append(j)
    order = sorted(groups.items(), key=lambda kv: (kv[0][0], _RANK[kv[0][1]], kv[1][0]))
    kernels: list[Kernel] = []
    deps: list[tuple[int, ...]] = []
    writer: dict[int, int] = {}
    for (lv, kind, key), members in order:
        k = len(kernels)
        batched = list(map(units.__getitem__, members))
        src = sorted({lines[i] for u in batched for i in u.index})
        if kind is Kind.COMM:
            kernel = Kernel(kind, comms=tuple(u.row for u in batched), level=lv, lines=tuple(src))
        else:
            rows = tuple(u.row for u in batched)
            if kind is Kind.ELEMENTWISE:
                kernel = Kernel(kind, rows, expr=key, level=lv, lines=tuple(src))
            elif kind is Kind.BASECONV:
                kernel = Kernel(kind, rows, in_limbs=key[0], out_limbs=key[1], level=lv, lines=tuple(src))
            elif kind is Kind.RSV:
                kernel = Kernel(kind, rows, in_limbs=key, level=lv, lines=tuple(src))
            elif kind is Kind.NTT and isinstance(key, HalfNtt):
                kernel = Kernel(kind, rows, level=lv, lines=tuple(src), prologue=key.prologue, half=True)
            elif kind is Kind.NTT and key is not None:
                kernel = Kernel(kind, rows, level=lv, lines=tuple(src), prologue=key)
            else:
                kernel = Kernel(kind, rows, level=lv, lines=tuple(src))
        d = {writer[b] for b in set(chain.from_iterable(u.ins for u in batched)) if b in writer}
        writer.update(dict.fromkeys(chain.from_iterable(u.outs for u in batched), k))
        kernels.append(kernel)
        deps.append(tuple(sorted(d)))
    return tuple(kernels), tuple(deps)
