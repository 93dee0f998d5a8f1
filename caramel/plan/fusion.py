"""Fusion and batching: from one chip's operations (:func:`caramel.plan.plan.lower`) to kernels.

Three steps, each linear in the number of operations:

1. :func:`fuse` removes dead operations (nothing stored, sent or read later depends on them) and
   fuses elementwise operations vertically: an elementwise operation whose result is read by
   exactly one later operation, which is elementwise on the same prime, and is neither stored nor
   sent, is folded into that consumer. The result is a tree with one output (its root); all its
   other values stay in registers. A tree reads each distinct input buffer once; trees stop
   growing at ``max_inputs`` vector inputs. Every remaining operation (a tree, an NTT, a
   base conversion, a communication...) is a :class:`Unit`, in program order.
2. :func:`levels` gives every unit its level in the whole-program DAG: one more than the highest
   level of the units whose buffers it reads (0 for none); a ``rcv`` takes the level of its
   ``dis`` and the destination of a ``joi`` the highest level of its participants (the
   cross-chip edges weigh 0). It walks the chips round-robin like the reference scheduler, so
   it also finds deadlocks. Two units of one level never depend on each other.
3. :func:`batch` groups the units of one chip with the same level, kind and signature (the
   expression of a tree, the bases of a conversion) into one kernel: the horizontal batching of
   independent instances (different limbs) into rows. Kernels run in level order, communication
   first within a level; all communications of one (chip, level) form one group. That order has
   no deadlock: a chip blocked at the group of level d waits for a send of level <= d that
   another chip has not reached, so that chip is blocked at a level < d; levels cannot decrease
   forever around a cycle.
"""

from __future__ import annotations

from typing import NamedTuple

from caramel.errors import DeadlockError
from caramel.program import Opcode, Stream
from caramel.plan.plan import Comm, Expr, ExprOp, Kernel, Kind, Op, Row

_RANK = {k: i for i, k in enumerate(Kind)}  # COMM first within a level


class Unit(NamedTuple):
    """One row of a future kernel: ``kind``, batching ``key``, the :class:`Row` (or
    :class:`Comm`), the buffers it reads and writes, and its source instruction indices."""

    kind: Kind
    key: object
    row: Row | Comm
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    index: tuple[int, ...]


def fuse(ops: list[Op], pinned: set[int], *, enable: bool = True, max_inputs: int = 16) -> list[Unit]:
    """Dead-code removal and vertical fusion of one chip's operations (see the module docstring).
    ``pinned``: buffers that must hold their value at the end (the chip's stores)."""
    needed = set(pinned)
    live = [False] * len(ops)
    for j in range(len(ops) - 1, -1, -1):
        o = ops[j]
        if o.kind is Kind.COMM or any(b in needed for b in o.outs):
            live[j] = True
            needed.update(o.ins)
    n_use: dict[int, int] = dict.fromkeys(pinned, 1)
    consumer: dict[int, int] = {}
    producer: dict[int, int] = {}
    for j, o in enumerate(ops):
        if live[j]:
            for b in set(o.ins):
                n_use[b] = n_use.get(b, 0) + 1
                consumer[b] = j
            for b in o.outs:
                producer[b] = j

    # Trees, bottom-up in program order: micro-ops (name, args, instruction index) in post-order;
    # an argument is ("v", buffer), ("s", scalar index) or ("t", position of an earlier micro-op).
    E = Kind.ELEMENTWISE
    trees: dict[int, list] = {}
    leaves: dict[int, int] = {}
    folded: set[int] = set()
    for j, o in enumerate(ops):
        if not live[j] or o.kind is not E:
            continue
        micro: list = []
        args: list = []
        seen: dict[int, tuple] = {}
        n_leaves = len(set(o.ins))
        for b in o.ins:
            a = seen.get(b)
            if a is None:
                p = producer.get(b)
                if (
                    enable
                    and p is not None
                    and ops[p].kind is E
                    and n_use[b] == 1
                    and ops[p].prime == o.prime
                    and n_leaves - 1 + leaves[p] <= max_inputs
                ):
                    off = len(micro)
                    for name, sub_args, index in trees.pop(p):
                        micro.append((name, tuple(("t", x + off) if k == "t" else (k, x) for k, x in sub_args), index))
                    n_leaves += leaves.pop(p) - 1
                    folded.add(p)
                    a = ("t", len(micro) - 1)
                else:
                    a = ("v", b)
                seen[b] = a
            args.append(a)
        args.extend(("s", s) for s in o.scalars)
        micro.append((o.arg, tuple(args), o.index))
        trees[j] = micro
        leaves[j] = n_leaves

    units: list[Unit] = []
    for j, o in enumerate(ops):
        if not live[j] or j in folded:
            continue
        if o.kind is E:
            units.append(_tree_unit(o, trees[j]))
        elif o.kind is Kind.COMM:
            units.append(Unit(o.kind, None, o.arg, o.ins, o.outs, (o.index,)))
        elif o.kind is Kind.BASECONV:
            conv = o.arg
            key = (conv.in_limbs, tuple(conv.out_limbs[s] for s in sorted(conv.slots)))
            units.append(Unit(o.kind, key, Row(-1, o.ins, o.outs), o.ins, o.outs, (o.index,)))
        else:
            key = o.arg if o.kind is Kind.RSV else len(o.ins) if o.kind is Kind.MOD else None
            arg = o.arg if o.kind in (Kind.AUTOMORPHISM, Kind.SUD_LIFT) else None
            units.append(Unit(o.kind, key, Row(o.prime, o.ins, o.outs, (), arg), o.ins, o.outs, (o.index,)))
    return units


def _tree_unit(root: Op, micro: list) -> Unit:
    """The canonical :class:`Expr` of a tree and its row: operands numbered by first use."""
    vec: dict[int, int] = {}
    sca: dict[int, int] = {}
    for _, args, _ in micro:
        for k, x in args:
            if k == "v":
                vec.setdefault(x, len(vec))
            elif k == "s":
                sca.setdefault(x, len(sca))
    nv, ns = len(vec), len(sca)
    base = nv + ns
    ops = tuple(
        ExprOp(name, tuple(vec[x] if k == "v" else nv + sca[x] if k == "s" else base + x for k, x in args))
        for name, args, _ in micro
    )
    expr = Expr(nv, ns, ops, (base + len(ops) - 1,))
    ins = tuple(vec)
    row = Row(root.prime, ins, root.outs, tuple(sca))
    return Unit(Kind.ELEMENTWISE, expr, row, ins, root.outs, tuple(sorted({i for _, _, i in micro})))


def levels(units: list[list[Unit]], streams: list[Stream]) -> list[list[int]]:
    """The level of every unit of every chip (see the module docstring); raises
    :class:`DeadlockError` when communication cannot complete in any order."""
    chips = len(units)
    size = [1 + max((b for u in us for b in u.outs + u.ins), default=0) for us in units]
    buffer_level = [[0] * n for n in size]  # level + 1 of the unit that wrote the buffer
    out = [[0] * len(us) for us in units]
    pos = [0] * chips
    dis_level: dict[int, int] = {}
    joins: dict[int, list[int]] = {}
    joined = [False] * chips
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
                        joined[c] = False
                for b in u.outs:
                    lv_of[b] = lv + 1
                levels_c[p] = lv
                p += 1
                progressed = True
            pos[c] = p
        if all(pos[c] == len(units[c]) for c in range(chips)):
            return out
        if not progressed:
            waits = []
            for c in range(chips):
                if pos[c] < len(units[c]):
                    ins = streams[c].instructions[units[c][pos[c]].index[0]]
                    waits.append(f"chip {c} waits at {streams[c].path}:{ins.line} ({ins.text()})")
            raise DeadlockError("deadlock: every unfinished chip is blocked:\n  " + "\n  ".join(waits))


def batch(units: list[Unit], unit_levels: list[int], lines: list[int]) -> tuple[tuple[Kernel, ...], tuple[tuple[int, ...], ...]]:
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
        src = sorted({lines[i] for j in members for i in units[j].index})
        if kind is Kind.COMM:
            kernel = Kernel(kind, comms=tuple(units[j].row for j in members), level=lv, lines=tuple(src))
        else:
            rows = tuple(units[j].row for j in members)
            if kind is Kind.ELEMENTWISE:
                kernel = Kernel(kind, rows, expr=key, level=lv, lines=tuple(src))
            elif kind is Kind.BASECONV:
                kernel = Kernel(kind, rows, in_limbs=key[0], out_limbs=key[1], level=lv, lines=tuple(src))
            elif kind is Kind.RSV:
                kernel = Kernel(kind, rows, in_limbs=key, level=lv, lines=tuple(src))
            else:
                kernel = Kernel(kind, rows, level=lv, lines=tuple(src))
        d = set()
        for j in members:
            for b in units[j].ins:
                w = writer.get(b)
                if w is not None:
                    d.add(w)
        for j in members:
            for b in units[j].outs:
                writer[b] = k
        kernels.append(kernel)
        deps.append(tuple(sorted(d)))
    return tuple(kernels), tuple(deps)
