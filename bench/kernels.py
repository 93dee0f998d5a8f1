"""Every kernel of the backend interface checked limb for limb against the CPU reference (the NumPy backend: the
reference's arithmetic) on fresh random data, then timed: one command on a GPU machine.

    python -m bench kernels [--check-n 4096,65536] [--rows 512] [--config default --config ntt.split_from=6/6]
    python -m bench kernels --only ntt --ntt-rows 1024,256,64      # the batched NTT and INTT alone
    python -m bench kernels --only epilogue --epilogues 12x12x4     # NTT epilogues against the two-pass NTT

Checks: each kernel on N of ``--check-n`` (every prime at N <= 8192), outputs poisoned first, the whole arena read
back and compared with the NumPy backend's. Timings at ``--n``: a CUDA graph of launches over rotating input sets
(together larger than L2), replayed, median (``bench.harness.graph_time``); the copy rate of 256 MiB is the
ceiling. Every ``--config`` gets its checks and timings, in this process. ``--backend cpu-plan`` runs the same on
the NumPy backend (wall clock), which only exercises the harness.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from bench.harness import Record, ab_runs, add_common, config_sets, graph_time, kernel_options, log, need_gpu, \
    sets_for, wall_time

#: Kernel families of ``--only``.
FAMILIES = ("ntt", "elementwise", "automorphism", "conversion", "lift", "rsv", "mod", "prologue", "epilogue")
#: (S, D, B) of the base conversions BootstrapLike_51L_1c runs most (S inputs, D outputs, B conversions a launch).
CONVERSIONS = "13x50x1,13x50x3,16x47x2,21x42x1,15x45x4,3x52x2,20x40x2,19x38x3"
#: Inner products F x P x O of the NTT epilogues (F transformed operands, P plain ones, O outputs).
EPILOGUES = "2x13x2,2x7x2,1x24x1,4x12x2,8x14x3,12x12x4,14x18x5"


@dataclass
class Built:
    """One kernel case: the initial arena (``data``, rows x N), per input set the call's arguments (``sets``),
    the call, the rows it writes (poisoned before a check), and for the rate: limbs produced and limbs moved."""

    data: np.ndarray
    sets: list[Any]
    call: Callable[[Any, Any], None]
    outs: list[int] = field(default_factory=list)
    limbs: int = 0
    moved: int = 0


def i32(a) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(a, dtype=np.int32))


def residues(rng, ctx, primes) -> np.ndarray:
    """Random residues, one row per prime index of ``primes`` (each below its prime)."""
    return np.stack([rng.integers(0, ctx.primes[p], ctx.n, dtype=np.uint64) for p in primes]).astype(np.uint32)


def cycling(ctx, count: int, start: int = 0) -> np.ndarray:
    return i32((np.arange(count) + start) % len(ctx.primes))


def _sets(block: np.ndarray, sets: int) -> np.ndarray:
    """The arena of ``sets`` input sets: one set's rows drawn, repeated (the sets differ by their rows' addresses,
    which is what keeps a timing out of L2)."""
    return np.tile(block, (sets, 1))


# ----------------------------------------------------------------------------------------------
# the cases: each makes `sets` independent copies of its rows, so that a timing rotates over them


def transform(ctx, rng, rows: int, sets: int, inverse: bool = False, in_place: bool = False) -> Built:
    per = rows if in_place else 2 * rows
    primes = cycling(ctx, rows)
    args, outs = [], []
    for s in range(sets):
        ins = i32(np.arange(rows) + per * s)
        dst = ins if in_place else i32(ins + rows)
        args.append((ins, dst, primes))
        outs += [] if in_place else dst.tolist()  # (in place: the inputs are not poisoned)
    data = _sets(residues(rng, ctx, np.tile(primes, per // rows)), sets)
    call = (lambda b, a: b.intt(*a)) if inverse else (lambda b, a: b.ntt(*a))
    return Built(data, args, call, outs, rows, 2 * rows)


def elementwise(ctx, rng, rows: int, sets: int, expr, gathered: bool = False) -> Built:
    width = expr.n_vec + len(expr.outputs)
    primes = cycling(ctx, rows)
    args, outs = [], []
    for s in range(sets):
        base = width * rows * s
        ins = i32(np.arange(rows * expr.n_vec).reshape(expr.n_vec, rows).T + base)
        out = i32(np.arange(rows * len(expr.outputs)).reshape(len(expr.outputs), rows).T + base + rows * expr.n_vec)
        scal = i32(np.arange(rows * expr.n_scalar).reshape(rows, expr.n_scalar) % max(1, rows))
        galois = i32([[ctx.galois_element(1 + r % 7)] * len(expr.gathered) for r in range(rows)]) if gathered \
            else None
        args.append((expr, ins, out, primes, scal, galois))
        outs += out.ravel().tolist()
    data = _sets(residues(rng, ctx, np.tile(primes, width)), sets)
    return Built(data, args, lambda b, a: b.elementwise(*a), outs, rows * len(expr.outputs), rows * width)


def automorphism(ctx, rng, rows: int, sets: int) -> Built:
    primes = cycling(ctx, rows)
    galois = i32([ctx.galois_element(1 + r % 7) for r in range(rows)])
    args, outs = [], []
    for s in range(sets):
        ins = i32(np.arange(rows) + 2 * rows * s)
        args.append((ins, i32(ins + rows), galois))
        outs += (ins + rows).tolist()
    data = _sets(residues(rng, ctx, np.tile(primes, 2)), sets)
    return Built(data, args, lambda b, a: b.automorphism(*a), outs, rows, 2 * rows)


def lift(ctx, rng, rows: int, sets: int, mode) -> Built:
    last = len(ctx.primes) - 1
    src, dst = i32(np.full(rows, last)), i32(np.arange(rows) % last)
    args, outs = [], []
    for s in range(sets):
        ins = i32(np.arange(rows) + 2 * rows * s)
        args.append((ins, i32(ins + rows), src, dst, mode))
        outs += (ins + rows).tolist()
    data = _sets(np.concatenate([residues(rng, ctx, src), residues(rng, ctx, dst)]), sets)
    return Built(data, args, lambda b, a: b.sud_lift(*a), outs, rows, 2 * rows)


def conversion(ctx, rng, s_in: int, d_out: int, batch: int, sets: int, mode, spread: bool = False) -> Built:
    limbs = [int(x) for x in rng.permutation(len(ctx.primes))] if spread else list(range(len(ctx.primes)))
    in_limbs, out_limbs = tuple(sorted(limbs[:s_in])), tuple(sorted(limbs[s_in: s_in + d_out]))
    per = batch * (s_in + d_out)
    args, outs = [], []
    for s in range(sets):
        ins = i32(np.arange(batch * s_in).reshape(batch, s_in) + per * s)
        out = i32(np.arange(batch * d_out).reshape(batch, d_out) + per * s + batch * s_in)
        args.append((in_limbs, out_limbs, ins, out, mode))
        outs += out.ravel().tolist()
    data = _sets(np.concatenate([residues(rng, ctx, in_limbs * batch), residues(rng, ctx, out_limbs * batch)]),
                 sets)
    return Built(data, args, lambda b, a: b.base_convert(*a), outs, batch * d_out, per)


def rsv(ctx, rng, m: int, groups: int, sets: int) -> Built:
    basis = tuple(range(m))
    per = groups * (m + 1) + groups * m  # zero accumulators and a source a group, then the new words
    primes = i32([g % m for g in range(groups)])
    args, outs = [], []
    for s in range(sets):
        base = per * s
        ins = i32([[base + g * (m + 1) + w for w in range(m + 1)] for g in range(groups)])
        out = i32([[base + groups * (m + 1) + g * m + w for w in range(m)] for g in range(groups)])
        args.append((basis, ins, out, primes))
        outs += out.ravel().tolist()
    block = np.zeros((per, ctx.n), np.uint32)
    for g in range(groups):
        block[g * (m + 1) + m] = residues(rng, ctx, [g % m])[0]
    return Built(_sets(block, sets), args, lambda b, a: b.rsv(*a), outs, groups * m, groups * (2 * m + 1))


def mod(ctx, rng, m: int, rows: int, sets: int) -> Built:
    per = rows * (m + 1)
    args, outs = [], []
    for s in range(sets):
        ins = i32(np.arange(rows * m).reshape(rows, m) + per * s)
        out = i32(np.arange(rows) + per * s + rows * m)
        args.append((ins, out, cycling(ctx, rows)))
        outs += out.tolist()
    data = _sets(rng.integers(0, 1 << 32, (per, ctx.n), dtype=np.uint64).astype(np.uint32), sets)
    return Built(data, args, lambda b, a: b.mod(*a), outs, rows, rows * (m + 1))


def prologue(ctx, rng, kind: str, rows: int, sets: int, mode) -> Built:
    """A forward NTT whose load computes its input: a lift from the last prime, ``mod`` of 4 words, or a conversion
    of 13 limbs (to the row's prime)."""
    from caramel.plan.kernel import Kind, Prologue

    last = len(ctx.primes) - 1
    width = {"sud_lift": 1, "mod": 4, "baseconv": 13}[kind]
    in_limbs = tuple(range(40, 40 + width)) if kind == "baseconv" else ()
    pro = Prologue(Kind(kind), width, in_limbs)
    primes = i32(np.arange(rows) % 40)  # outputs in primes the conversion does not read, none the lift's source
    per = rows * width + rows
    argv = i32(np.full(rows, last)) if kind == "sud_lift" else i32(np.zeros(rows))
    args, outs = [], []
    for s in range(sets):
        ins = i32(np.arange(rows * width).reshape(rows, width) + per * s)
        out = i32(np.arange(rows) + per * s + rows * width)
        args.append((pro, ins, out, primes, argv, mode))
        outs += out.tolist()
    if kind == "sud_lift":
        block = residues(rng, ctx, [last] * rows)
    elif kind == "mod":
        block = rng.integers(0, 1 << 32, (rows * width, ctx.n), dtype=np.uint64).astype(np.uint32)
    else:
        block = residues(rng, ctx, list(in_limbs) * rows)
    data = _sets(np.concatenate([block, residues(rng, ctx, primes)]), sets)
    return Built(data, args, lambda b, a: b.ntt_prologue(*a), outs, rows, rows * (width + 1))


def inner_product(f: int, p: int, o: int, transformed: bool, gathered: tuple[int, ...] = ()):
    """out_j = sum_m t_m y_((m o + j) mod p) + the y_k with k = j mod o: a key-switching inner product over F
    operands t (operands 0, 2, .., 2f - 2 when p >= f, interleaved with the plain y; ``transformed``: written by a
    half NTT, the row pass in this kernel's load) and P plain ones y (``gathered``: those read through an
    automorphism). Returns (the Expr, the operands t)."""
    from caramel.plan.kernel import Expr, ExprOp

    ts = tuple(range(0, 2 * f, 2)) if p >= f else tuple(range(f))
    plain = [k for k in range(f + p) if k not in ts]
    ops, values, outputs = [], f + p, []
    for j in range(o):
        acc = None
        for m, t in enumerate(ts):
            ops.append(ExprOp("mul", (t, plain[(m * o + j) % p])))
            prod, values = values, values + 1
            if acc is not None:
                ops.append(ExprOp("add", (acc, prod)))
                prod, values = values, values + 1
            acc = prod
        for k in range(j % p, p, o):
            ops.append(ExprOp("add", (acc, plain[k])))
            acc, values = values, values + 1
        outputs.append(acc)
    return Expr(f + p, 0, tuple(ops), tuple(outputs), tuple(gathered), ts if transformed else ()), ts


def epilogue(ctx, rng, f: int, p: int, o: int, rows: int, sets: int, fused: bool) -> Built:
    """The F operands' forward NTTs, then the inner product: as a half NTT and the epilogue kernel (``fused``), or
    the whole NTT and the plain kernel."""
    expr, ts = inner_product(f, p, o, fused)
    nv = expr.n_vec
    per = rows * (nv + o)
    primes = cycling(ctx, rows)
    args, outs = [], []
    for s in range(sets):
        ins = i32(np.arange(rows * nv).reshape(rows, nv) + per * s)
        out = i32(np.arange(rows * o).reshape(rows, o) + per * s + rows * nv)
        tslots = i32(ins[:, list(ts)].ravel())
        args.append((tslots, i32(np.repeat(primes, f)), expr, ins, out, primes, i32(np.zeros((rows, 0)))))
        outs += out.ravel().tolist()
    data = _sets(residues(rng, ctx, np.concatenate([np.repeat(primes, nv), np.repeat(primes, o)])), sets)

    def call(b, a):
        tslots, tprimes, expr, ins, out, primes, scalars = a
        b.ntt(tslots, tslots, tprimes, half=fused)
        b.elementwise(expr, ins, out, primes, scalars)
    return Built(data, args, call, outs, rows * o, rows * ((4 if not fused else 2) * f + nv + o))


def cases(ctx, rng, args, sets: int, *, check: bool) -> list[tuple[str, str, Callable[[], Built]]]:
    """(family, name, builder) of every case of ``--only``, at check sizes (``check``) or timing sizes."""
    from caramel.plan.kernel import Expr, ExprOp
    from caramel.ring import Mode

    small = ctx.n <= 8192
    rows = (len(ctx.primes) if small else 12) if check else args.rows
    add = Expr(2, 0, (ExprOp("add", (0, 1)),), (2,))
    mul = Expr(2, 0, (ExprOp("mul", (0, 1)),), (2,))
    two = Expr(2, 1, (ExprOp("mul", (0, 1)), ExprOp("add", (3, 2)), ExprOp("sub", (1, 0))), (4, 5))
    gathered = Expr(2, 0, (ExprOp("add", (0, 1)),), (2,), (0,))
    out: list[tuple[str, str, Callable[[], Built]]] = []
    ntt_rows = [rows] if check else [int(r) for r in args.ntt_rows.split(",") if r]
    for r in ntt_rows:
        out += [("ntt", f"ntt R={r}", lambda r=r: transform(ctx, rng, r, sets)),
                ("ntt", f"intt R={r}", lambda r=r: transform(ctx, rng, r, sets, inverse=True))]
    out += [("ntt", f"ntt in place R={rows}", lambda: transform(ctx, rng, rows, sets, in_place=True)),
            ("elementwise", f"add R={rows}", lambda: elementwise(ctx, rng, rows, sets, add)),
            ("elementwise", f"mul R={rows}", lambda: elementwise(ctx, rng, rows, sets, mul)),
            ("elementwise", f"(a*b + s, b - a) R={rows}", lambda: elementwise(ctx, rng, rows, sets, two)),
            ("elementwise", f"add, one operand gathered R={rows}",
             lambda: elementwise(ctx, rng, rows, sets, gathered, gathered=True)),
            ("automorphism", f"automorphism R={rows}", lambda: automorphism(ctx, rng, rows, sets))]
    for mode in (Mode.EXACT, Mode.TEXTBOOK, Mode.EMULATOR) if check else (Mode.EXACT,):
        out.append(("lift", f"sud lift {mode.value} R={rows}", lambda mode=mode: lift(ctx, rng, rows, sets, mode)))
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.conversions.split(",") if s]
    if check:
        shapes = shapes[:3] + [(1, 3, 1), (40, 24, 1), (55, 9, 1), (5, 8, 2)]
    for k, (s, d, b) in enumerate(shapes):
        for mode in tuple(Mode) if check or k == 0 else (Mode.EXACT,):
            out.append(("conversion", f"conversion {s} -> {d}, B={b}, {mode.value}",
                        lambda s=s, d=d, b=b, mode=mode: conversion(ctx, rng, s, d, b, sets, mode, spread=check)))
    out += [("rsv", "rsv m=4, G=2", lambda: rsv(ctx, rng, 4, 2, sets)),
            ("mod", "mod m=4, R=2", lambda: mod(ctx, rng, 4, 2, sets))]
    for kind in ("sud_lift", "mod", "baseconv"):
        out.append(("prologue", f"NTT with a {kind} load R={rows}",
                    lambda kind=kind: prologue(ctx, rng, kind, rows, sets, Mode.EXACT)))
    er = min(rows, 15) if check else args.epilogue_rows
    for shape in args.epilogues.split(",") if args.epilogues else ():
        f, p, o = (int(x) for x in shape.split("x"))
        for fused in (False, True):
            out.append(("epilogue", f"epilogue {shape} R={er} " + ("half NTT + epilogue" if fused else
                                                                    "two-pass NTT + plain kernel"),
                        lambda f=f, p=p, o=o, fused=fused: epilogue(ctx, rng, f, p, o, er, sets, fused)))
    only = set(args.only.split(",")) if args.only else set(FAMILIES)
    return [c for c in out if c[0] in only]


# ----------------------------------------------------------------------------------------------
# driver


def make_backend(kind: str, ctx, rows: int, config=None):
    """An arena of ``rows`` limbs on the CUDA backend (``gpu``, with ``config``) or the NumPy one."""
    if kind == "gpu":
        from caramel.backends.cuda.backend import CupyBackend

        return CupyBackend(ctx, rows, **kernel_options(config))
    from caramel.backends.numpy_backend import NumpyBackend

    return NumpyBackend(ctx, rows)


def check(rec: Record, backend: str, n: int, args, config, label: str, seed: int) -> None:
    """Every case at ring degree ``n``: poisoned outputs, one call on ``backend`` and on the NumPy backend, the
    whole arenas compared."""
    from caramel.ring import Context

    ctx = Context(n=n)
    rng = np.random.default_rng(seed)
    bad = []
    for family, name, build in cases(ctx, rng, args, 1, check=True):
        b = build()
        data = b.data.copy()
        data[b.outs] = 0xFFFFFFFF
        have_be, want_be = make_backend(backend, ctx, len(data), config), make_backend("cpu", ctx, len(data))
        rows = i32(np.arange(len(data)))
        scalars = rng.integers(0, min(ctx.primes), len(data), dtype=np.uint64).astype(np.uint32)
        for be in (have_be, want_be):
            be.write(rows, data)
            be.set_scalars(scalars)
        try:
            b.call(have_be, b.sets[0])
            b.call(want_be, b.sets[0])
            ok = np.array_equal(have_be.read(rows), want_be.read(rows))
        except Exception as exc:  # a kernel that does not compile or launch: named, the others still checked
            log(f"{name}: {type(exc).__name__}: {exc}")
            ok = False
        if not ok:
            bad.append(name)
        del have_be, want_be
    rec.check(f"every kernel at N={n} = CPU reference, limb for limb", not bad, ", ".join(bad), config=label)


def timings(rec: Record, backend: str, args, config, label: str) -> None:
    from caramel.ring import Context

    ctx = Context(n=args.n)
    rng = np.random.default_rng(1)
    limb = 4 * ctx.n
    timer = graph_time if backend == "gpu" else wall_time
    if backend == "gpu":
        import cupy as cp

        big = cp.zeros((256 << 20) // 4, dtype=cp.uint32)
        copy = cp.empty_like(big)
        t = graph_time(lambda s: copy.__setitem__(Ellipsis, big), 1, per_replay=8, repeats=args.repeats)
        rec.add("device copy (ceiling)", round(2 * big.nbytes / t / 1e9), "GB/s", config=label)
        del big, copy
    for family, name, build in cases(ctx, rng, args, 1, check=False):
        b = build()
        sets = sets_for(len(b.data) * limb) if backend == "gpu" else 1
        if sets > 1:  # the case again over `sets` input sets: together larger than L2
            b = cases_one(ctx, rng, args, name, sets)
        t = time_case(b, make_backend(backend, ctx, len(b.data), config), timer, sets, args.repeats)
        rec.add(name, t * 1e6, "us", config=label, rate=f"{b.limbs / t / 1e6:.3f} M limbs/s",
                traffic=f"{b.moved * limb / t / 1e9:.0f} GB/s")
        if backend == "gpu":
            import cupy as cp

            cp.get_default_memory_pool().free_all_blocks()


def time_case(b: Built, be, timer, sets: int, repeats: int) -> float:
    """Seconds of one call of case ``b`` on backend ``be`` (its arena written first), by ``timer``."""
    be.write(i32(np.arange(len(b.data))), b.data)
    be.set_scalars(np.ones(max(1, len(b.data)), np.uint32))
    return timer(lambda s: b.call(be, b.sets[s]), sets, repeats=repeats)


def cases_one(ctx, rng, args, name: str, sets: int) -> Built:
    """The case ``name`` built again with ``sets`` input sets."""
    return next(build for _, n, build in cases(ctx, rng, args, sets, check=False) if n == name)()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench kernels", description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    ap.add_argument("--check-n", default="4096,65536", help="ring degrees of the checks ('' for none)")
    ap.add_argument("--no-time", action="store_true", help="checks only")
    ap.add_argument("--rows", type=int, default=512, help="rows of the timed launches (default 512)")
    ap.add_argument("--ntt-rows", default="1024", help="rows of the timed NTT and INTT launches (comma separated)")
    ap.add_argument("--only", default="", help=f"kernel families, comma separated: {', '.join(FAMILIES)}")
    ap.add_argument("--conversions", default=CONVERSIONS, help="base conversions SxDxB to time")
    ap.add_argument("--epilogues", default=EPILOGUES, help="epilogue inner products FxPxO to check and time")
    ap.add_argument("--epilogue-rows", type=int, default=150, help="rows of the timed epilogues (default 150)")
    ap.add_argument("--seed", type=int, default=None, help="data of the checks (default: fresh)")
    add_common(ap, repeats=15)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    args = parser().parse_args(argv)
    if args.base:
        return ab_runs("kernels", argv, args.base, args.rounds, args.json)
    if args.only and not set(args.only.split(",")) <= set(FAMILIES):
        raise SystemExit(f"bench kernels: --only takes {', '.join(FAMILIES)}")
    need_gpu(args.backend)
    backend = "gpu" if args.backend == "gpu" else "cpu"
    rec = Record("kernels", argv, args.backend)
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % (1 << 32))
    rec.add("seed of the checks' data", seed)
    for label, config in config_sets(args.config):
        for n in [int(x) for x in args.check_n.split(",") if x]:
            check(rec, backend, n, args, config, label, seed)
        if not args.no_time:
            timings(rec, backend, args, config, label)
    return rec.finish(args.json)


if __name__ == "__main__":
    raise SystemExit(main())
