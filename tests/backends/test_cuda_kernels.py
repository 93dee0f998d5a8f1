"""The CUDA kernels of caramel.backends.cuda against the CPU reference caramel.ring, limb for limb.

Every check draws fresh random residues (the seed is printed on failure), poisons the output rows with
0xFFFFFFFF (never a residue) before the launch, scatters the rows over the arena and compares every
output row with the reference; input rows that are not outputs must come back unchanged.
Skipped without CuPy or without a CUDA device.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.backends.cuda import CudaRing, available  # noqa: E402

if not available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.backends.cuda import automorphism as dauto  # noqa: E402
from caramel.backends.cuda import basis as dbasis  # noqa: E402
from caramel.backends.cuda import crt as dcrt  # noqa: E402
from caramel.backends.cuda import elementwise as ew  # noqa: E402
from caramel.backends.cuda import ntt as dntt  # noqa: E402
from caramel.backends.cuda.config import KernelConfig  # noqa: E402
from caramel.backends.cuda.ntt import fused as dfused  # noqa: E402
from caramel.expr import Expr, ExprOp  # noqa: E402
from caramel.ring import Context, Mode  # noqa: E402
from caramel.ring.primes import is_prime  # noqa: E402
from caramel.ring import crt as rcrt  # noqa: E402
from caramel.ring import modular as rmod  # noqa: E402
from tests.backends.cuda_support import POISON, i32, pair, rings, rng  # noqa: E402,F401 (pair, rng: fixtures)
from tests.backends.test_lazy_sums import random_sums  # noqa: E402

pytestmark = pytest.mark.gpu


def residues(ctx, limbs, rng) -> np.ndarray:
    """Uniform random canonical residues, one row per limb index."""
    return np.stack([rng.integers(0, ctx.q(l), ctx.n, dtype=np.uint64) for l in limbs]).astype(np.uint32)


class Arena:
    """A poisoned device arena with rows handed out at random positions."""

    def __init__(self, n: int, rows: int, rng):
        self.host = np.full((rows, n), POISON, dtype=np.uint32)
        self.free = list(rng.permutation(rows))
        self.inputs: dict[int, np.ndarray] = {}

    def put(self, data: np.ndarray) -> list[int]:
        slots = [int(self.free.pop()) for _ in range(len(data))]
        for s, row in zip(slots, data):
            self.host[s] = row
            self.inputs[s] = row.copy()
        return slots

    def take(self, count: int) -> list[int]:
        return [int(self.free.pop()) for _ in range(count)]

    def upload(self):
        self.dev = cp.asarray(self.host)
        return self.dev

    def download(self) -> np.ndarray:
        return cp.asnumpy(self.dev)


def expect_rows(have: np.ndarray, slots, want: np.ndarray, what: str) -> None:
    for k, (s, w) in enumerate(zip(slots, want)):
        h = have[s]
        if not np.array_equal(h, w):
            bad = np.flatnonzero(h != w)
            i = int(bad[0])
            raise AssertionError(
                f"{what}, row {k} (slot {s}): {bad.size} of {h.size} residues differ; "
                f"first at {i}: want {int(w[i])}, have {int(h[i])}"
                + (" (never written)" if h[i] == POISON else "")
            )


def expect_inputs_kept(arena: Arena, have: np.ndarray, written) -> None:
    for s, row in arena.inputs.items():
        if s not in set(written):
            assert np.array_equal(have[s], row), f"input slot {s} was modified"


def limb_choice(rng, count: int, limbs: int = 64) -> list[int]:
    """count limb indices of a ring of ``limbs`` primes, including the first and the last (with repeats allowed)."""
    extra = rng.integers(0, limbs, max(0, count - 2)).tolist()
    out = [0, limbs - 1] + extra
    rng.shuffle(out)
    return [int(l) for l in out[:count]]


# --------------------------------------------------------------------------- NTT


@pytest.mark.parametrize("inverse", [False, True], ids=["ntt", "intt"])
def test_ntt(pair, rng, inverse):
    ctx, ring = pair
    rows = 6
    limbs = limb_choice(rng, rows)
    x = residues(ctx, limbs, rng)
    arena = Arena(ctx.n, 3 * rows, rng)
    src = arena.put(x)
    dst = arena.take(rows)
    dst[1] = src[1]  # two rows in place
    dst[4] = src[4]
    dev = arena.upload()
    (dntt.intt if inverse else dntt.ntt)(ring, dev, i32(src), i32(dst), i32(limbs))
    have = arena.download()
    want = (ctx.intt if inverse else ctx.ntt)(x, limbs)
    expect_rows(have, dst, want, "intt" if inverse else "ntt")
    expect_inputs_kept(arena, have, dst)


def test_ntt_roundtrip_all_primes(pair, rng):
    ctx, ring = pair
    limbs = list(range(64))
    x = residues(ctx, limbs, rng)
    arena = Arena(ctx.n, 64, rng)
    slots = arena.put(x)
    dev = arena.upload()
    s = i32(slots)
    dntt.ntt(ring, dev, s, s, i32(limbs))
    mid = arena.download()
    expect_rows(mid, slots[:: 9], ctx.ntt(x[:: 9], limbs[:: 9]), "ntt")
    dntt.intt(ring, dev, s, s, i32(limbs))
    expect_rows(arena.download(), slots, x, "intt(ntt(x))")


def check_ntt_launch(pair, rng, label: str, rows: int = 5, in_place: tuple[int, ...] = (), settings=(),
                     **options) -> None:
    """``rows`` random limbs through ``dntt.launch(..., **options)`` under the defaults with ``settings``
    (KernelConfig.with_settings), forward and inverse, against the reference; the rows of ``in_place`` written over
    their inputs, the other inputs checked kept."""
    ctx, ring = pair
    kernels = KernelConfig().with_settings(settings)
    limbs = limb_choice(rng, rows, len(ctx.primes))
    x = residues(ctx, limbs, rng)
    for inverse in (False, True):
        arena = Arena(ctx.n, 3 * rows, rng)
        src = arena.put(x)
        dst = arena.take(rows)
        for i in in_place:
            dst[i] = src[i]
        dev = arena.upload()
        dntt.launch(ring, dev, i32(src), i32(dst), i32(limbs), inverse, kernels, **options)
        have = arena.download()
        expect_rows(have, dst, (ctx.intt if inverse else ctx.ntt)(x, limbs), f"{'intt' if inverse else 'ntt'} {label}")
        if in_place:
            expect_inputs_kept(arena, have, dst)


@pytest.mark.parametrize("split_from", ["0/0", "4/4", "5/5", "8/8", "6/5", "7/3"])
def test_ntt_split_from(pair, rng, split_from):
    """The row passes' whole-table twiddles for stages below split_from (clamped to 4 .. 8), forward and inverse,
    the inverse in one kernel, compute the reference."""
    check_ntt_launch(pair, rng, f"split_from={split_from}", settings=[f"ntt.split_from={split_from}"])


@pytest.mark.parametrize("warps,split_from", [(1, "5/5"), (2, "6/4"), (8, "8/7"), (4, "8/8"), (4, "0/3"), (4, "7/6")],
                         ids=str)
def test_ntt_row_warp(pair, rng, warps, split_from):
    """The row kernels with warp tiles (4 rows a warp, ``warps`` warps a block; split twiddles from stage split_from
    clamped to 4 .. 8, the one-product stages below 6 from the warp's table), forward and inverse, with two rows in
    place (N = 4096 runs the small kernels)."""
    check_ntt_launch(pair, rng, f"warps={warps} from={split_from}", rows=7, in_place=(0, 5),
                     settings=[f"ntt.warps={warps}", f"ntt.split_from={split_from}"])


def wide_primes(n: int, count: int) -> list[int]:
    """``count`` primes between 2^28 and 2^30, 1 mod 2N: a ring whose transforms reduce every stage (not lazily)."""
    out, q = [], (1 << 30) - 2 * n + 1
    while len(out) < count:
        if is_prime(q):
            out.append(q)
        q -= 2 * n
    return out


@pytest.mark.parametrize("n", [4096, 65536])
def test_ntt_with_primes_above_2_28(rng, n):
    """Primes of 29 and 30 bits: the butterflies reduce every stage (ring_lazy is False), forward and inverse."""
    ctx = Context(n, wide_primes(n, 6))
    ring = CudaRing(ctx)
    assert not dntt.ring_lazy(ring)
    check_ntt_launch((ctx, ring), rng, "29-30 bit primes", rows=6, in_place=(1,))


@pytest.mark.parametrize("n", [8192, 16384, 65536])
@pytest.mark.parametrize("rows,lag", [(1, 48), (7, 1), (7, 3), (40, 48), (40, 5), (130, 16)], ids=str)
def test_ntt_fused(rng, n, rows, lag):
    """The inverse in one kernel (both passes' items interleaved), every lag from 1 to beyond the rows, against the
    reference, some rows in place; the counters come back zeroed, so a second launch on them is right again."""
    kernels = KernelConfig().with_settings([f"ntt.fused_lag={lag}"])
    ctx, ring = rings(n)
    limbs = [int(l) for l in rng.integers(0, 64, rows)]
    x = residues(ctx, limbs, rng)
    counters = cp.zeros(dfused.counter_words(rows) + 3, dtype=cp.int32)
    want = ctx.intt(x, limbs)
    for attempt in range(2):
        arena = Arena(n, 2 * rows + 1, rng)
        src = arena.put(x)
        dst = arena.take(rows)
        dst[::3] = src[::3]
        dev = arena.upload()
        dntt.intt(ring, dev, i32(src), i32(dst), i32(limbs), counters, kernels)
        have = arena.download()
        expect_rows(have, dst, want, f"one-kernel intt N={n} launch {attempt}")
        expect_inputs_kept(arena, have, dst)
        assert not cp.asnumpy(counters).any(), "the counters were not reset"


def test_ntt_fused_graph(rng):
    """A CUDA graph of a forward transform and a one-kernel inverse with its counters replays right several times;
    captured without counters, the inverse falls back to the two kernels and is right too."""
    ctx, ring = rings(65536)
    limbs = [0, 63, 7, 12, 12]
    x = residues(ctx, limbs, rng)
    arena = Arena(ctx.n, 10, rng)
    src = arena.put(x)
    mid = arena.take(5)
    dev = arena.upload()
    s, m, p = i32(src), i32(mid), i32(limbs)
    counters = cp.zeros(dntt.counter_words(5), dtype=cp.int32)
    for given in (counters, None):
        dev[...] = cp.asarray(arena.host)
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            dntt.ntt(ring, dev, s, m, p)  # warm-up: compiles, builds the tables
            dntt.intt(ring, dev, m, m, p, counters=given)
            stream.begin_capture()
            dntt.ntt(ring, dev, s, m, p)
            dntt.intt(ring, dev, m, m, p, counters=given)
            graph = stream.end_capture()
        for replay in range(3):
            graph.launch(stream)
            stream.synchronize()
            have = cp.asnumpy(dev)
            expect_rows(have, mid, x, f"intt(ntt(x)) replay {replay} counters={given is not None}")
        assert not cp.asnumpy(counters).any()


def test_ntt_small_sizes(rng):
    for n in (16, 32, 256, 2048, 8192, 16384, 32768):
        ctx, ring = rings(n)
        limbs = [0, 63, 31]
        x = residues(ctx, limbs, rng)
        arena = Arena(n, 8, rng)
        src = arena.put(x)
        dst = arena.take(3)
        dev = arena.upload()
        dntt.ntt(ring, dev, i32(src), i32(dst), i32(limbs))
        expect_rows(arena.download(), dst, ctx.ntt(x, limbs), f"ntt N={n}")
        dntt.intt(ring, dev, i32(dst), i32(src), i32(limbs))
        expect_rows(arena.download(), src, x, f"intt N={n}")


# --------------------------------------------------------------------------- elementwise


def _ref_op(op: str, a, b, q):
    return {
        "add": lambda: rmod.add_mod(a, b, q),
        "sub": lambda: rmod.sub_mod(a, b, q),
        "mul": lambda: rmod.mul_mod(a, b, q),
        "neg": lambda: rmod.neg_mod(a, q),
    }[op]()


@pytest.mark.parametrize("op", ["add", "sub", "mul", "neg", "copy"])
def test_elementwise(pair, rng, op):
    ctx, ring = pair
    rows = 5
    limbs = limb_choice(rng, rows)
    a, b = residues(ctx, limbs, rng), residues(ctx, limbs, rng)
    arena = Arena(ctx.n, 4 * rows, rng)
    sa, sb = arena.put(a), arena.put(b)
    dst = arena.take(rows)
    dst[2] = sa[2]  # in place
    dev = arena.upload()
    q = ctx.moduli(limbs)
    if op in ("add", "sub", "mul"):
        getattr(ew, op)(ring, dev, i32(dst), i32(np.stack([sa, sb], axis=1)), i32(limbs))
        want = _ref_op(op, a, b, q)
    else:
        getattr(ew, op)(ring, dev, i32(dst), i32(sa), i32(limbs))
        want = a if op == "copy" else _ref_op(op, a, None, q)
    have = arena.download()
    expect_rows(have, dst, want, op)
    expect_inputs_kept(arena, have, dst)


@pytest.mark.parametrize("op", ["add", "sub", "mul"])
def test_elementwise_scalar(pair, rng, op):
    ctx, ring = pair
    rows = 5
    limbs = limb_choice(rng, rows)
    a = residues(ctx, limbs, rng)
    svals = np.array([rng.integers(0, ctx.q(l)) for l in limbs], dtype=np.uint32)
    svals[0] = 0
    scalars = np.concatenate([rng.integers(0, 1 << 20, 7).astype(np.uint32), svals])  # scalars at 7..
    arena = Arena(ctx.n, 2 * rows, rng)
    sa = arena.put(a)
    dst = arena.take(rows)
    dev = arena.upload()
    getattr(ew, f"{op}_scalar")(
        ring, dev, i32(dst), i32(sa), i32(limbs), cp.asarray(scalars), i32(np.arange(rows) + 7)
    )
    want = _ref_op(op, a, svals[:, None], ctx.moduli(limbs))
    expect_rows(arena.download(), dst, want, f"{op}_scalar")


def random_program(rng, n_vec=3, n_scalar=2, n_ops=9) -> Expr:
    kinds = [True] * n_vec + [False] * n_scalar
    ops = []
    for _ in range(n_ops):
        op = str(rng.choice(["add", "sub", "mul", "neg"]))
        args = tuple(int(rng.integers(0, len(kinds))) for _ in range(1 if op == "neg" else 2))
        ops.append(ExprOp(op, args))
        kinds.append(any(kinds[a] for a in args))
    vec_values = [v for v, k in enumerate(kinds) if k]
    outputs = tuple(int(v) for v in rng.choice(vec_values[n_vec:] or vec_values, 3))
    return Expr(n_vec, n_scalar, tuple(ops), outputs + (0,))


@pytest.mark.parametrize("threads", [256, 64])
@pytest.mark.parametrize("shape", ["random", "sums"])
def test_fused_program(pair, rng, shape, threads):
    """A random program (``sums``: one leaning to sums of products, test_lazy_sums.random_sums; its sums reduced
    once) against the reference's operations, in blocks of ``threads`` (ElementwiseConfig)."""
    ctx, ring = pair
    kernels = KernelConfig().with_settings([f"elementwise.threads={threads}"])
    prog = random_program(rng) if shape == "random" else random_sums(rng)
    rows = 4
    limbs = limb_choice(rng, rows)
    vecs = [residues(ctx, limbs, rng) for _ in range(prog.n_vec)]
    vecs[0][0, :8] = [ctx.q(limbs[0]) - 1] * 8  # the largest residues (the accumulator's worst case)
    svals = [np.array([rng.integers(0, ctx.q(l)) for l in limbs], dtype=np.uint32) for _ in range(prog.n_scalar)]
    arena = Arena(ctx.n, (prog.n_vec + len(prog.outputs)) * rows, rng)
    vslots = np.stack([arena.put(v) for v in vecs], axis=1)
    oslots = np.array([arena.take(len(prog.outputs)) for _ in range(rows)])
    oslots[1, 0] = vslots[1, 1]  # an output over an input of the same row
    scal = np.stack(svals, axis=1).reshape(-1)  # row r, scalar j at r * n_scalar + j
    sidx = np.arange(rows * prog.n_scalar).reshape(rows, prog.n_scalar)
    dev = arena.upload()
    ew.fused(ring, prog, dev, i32(oslots), i32(vslots), i32(limbs), cp.asarray(scal), i32(sidx), kernels=kernels)
    q = ctx.moduli(limbs)
    values = list(vecs) + [s[:, None] for s in svals]
    for op in prog.ops:
        a = values[op.args[0]]
        b = values[op.args[-1]]
        values.append(_ref_op(op.op, a, b, q))
    have = arena.download()
    for k, o in enumerate(prog.outputs):
        want = np.broadcast_to(values[o], (rows, ctx.n))
        expect_rows(have, oslots[:, k], want, f"fused {prog.text()} output {k}")


def test_fused_signature_cache(pair):
    _, ring = pair
    p1 = Expr(2, 0, (ExprOp("add", (0, 1)),), (2,))
    p2 = Expr(2, 0, (ExprOp("add", (0, 1)),), (2,))
    assert p1.text() == p2.text() == "v2s0: t2=add(v0,v1) -> t2"
    assert ew.kernel_name(p1) == ew.kernel_name(ew.ADD) and ew.plain_source(p1) is ew.plain_source(ew.ADD)
    with pytest.raises(ValueError, match="not a vector"):
        Expr(1, 1, (ExprOp("add", (1, 1)),), (2,))  # a scalar output


# --------------------------------------------------------------------------- automorphism


def test_automorphism(pair, rng):
    ctx, ring = pair
    n = ctx.n
    gs = [ctx.galois_element(s) for s in (1, -1, 5, n // 4 - 3)] + [ctx.conjugation_element, 1]
    limbs = limb_choice(rng, len(gs))
    x = residues(ctx, limbs, rng)
    arena = Arena(n, 2 * len(gs), rng)
    src = arena.put(x)
    dst = arena.take(len(gs))
    dev = arena.upload()
    dauto.automorphism(ring, dev, i32(src), i32(dst), i32(gs))
    have = arena.download()
    want = np.stack([ctx.automorphism(row, g) for row, g in zip(x, gs)])
    expect_rows(have, dst, want, "automorphism")
    expect_inputs_kept(arena, have, dst)


# --------------------------------------------------------------------------- base conversion and sud


class ConversionCase(NamedTuple):
    """A base conversion under test: the CPU context, the CUDA conversion and its CPU reference, the
    inputs xs (one (S, N) array a batch entry) and the arena holding them at rows ins (B, S)."""

    ctx: Context
    conv: dbasis.BaseConversion
    ref: object
    xs: list
    arena: Arena
    ins: np.ndarray


def random_limbs(rng, s: int, d: int) -> tuple[list[int], list[int]]:
    """S input and D output limbs of a random permutation; with S + D > 64 the outputs are its last
    D, so some primes are on both sides."""
    perm = [int(v) for v in rng.permutation(64)]
    return sorted(perm[:s]), sorted(perm[s : s + d]) if s + d <= 64 else sorted(perm[-d:])


def conversion_case(pair, rng, in_limbs, out_limbs, batch: int, extremes: bool = False,
                    tensor: bool | None = None) -> ConversionCase:
    """Fresh random inputs of a conversion in_limbs -> out_limbs, ``batch`` of them, put on a poisoned
    arena with room for their outputs; ``extremes``: the first input's first residues are q - 1, 0
    and q // 2; ``tensor``: the kernel (BaseConversion's argument)."""
    ctx, ring = pair
    xs = [residues(ctx, in_limbs, rng) for _ in range(batch)]
    if extremes:
        xs[0][:, :3] = np.array([[ctx.q(l) - 1, 0, ctx.q(l) // 2] for l in in_limbs], dtype=np.uint32)
    arena = Arena(ctx.n, batch * (len(in_limbs) + len(out_limbs)), rng)
    ins = np.array([arena.put(x) for x in xs])
    return ConversionCase(ctx, dbasis.BaseConversion(ring, in_limbs, out_limbs, tensor),
                          ctx.base_converter(in_limbs, out_limbs), xs, arena, ins)


@pytest.mark.parametrize("tensor", [True, False], ids=["tensor", "tiled"])
@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("shape", [(1, 3), (3, 5), (12, 20), (32, 32), (13, 50), (60, 3)],
                         ids=lambda s: f"S={s[0]},D={s[1]}")
def test_base_conversion(pair, rng, mode, shape, tensor):
    s, d = shape
    others = [int(l) for l in rng.permutation(np.arange(1, 63))]
    in_limbs = sorted([0] + others[: s - 1])  # limb 0 is an input, limb 63 an output
    out_limbs = sorted(others[s - 1 : s + d - 2] + [63])
    batch = 2
    c = conversion_case(pair, rng, in_limbs, out_limbs, batch, tensor=tensor)
    outs = np.array([c.arena.take(d) for _ in range(batch)])
    dev = c.arena.upload()
    c.conv.convert(dev, i32(c.ins), i32(outs), mode)
    have = c.arena.download()
    for b in range(batch):
        expect_rows(have, outs[b], c.ref.convert(c.xs[b], mode), f"base conversion {mode.value} batch {b}")
    expect_inputs_kept(c.arena, have, outs.reshape(-1))


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("shape", [(3, 5), (13, 40), (20, 41), (7, 24), (4, 17)], ids=lambda s: f"S={s[0]},D={s[1]}")
def test_base_conversion_chunks(pair, rng, mode, shape):
    """The tiled kernel with 8-wide (D mod 16 = 1..8) and 16-wide last chunks computes the reference."""
    s, d = shape
    c = conversion_case(pair, rng, *random_limbs(rng, s, d), 1, tensor=False)
    outs = np.array([c.arena.take(d)])
    dev = c.arena.upload()
    c.conv.convert(dev, i32(c.ins), i32(outs), mode)
    expect_rows(c.arena.download(), outs[0], c.ref.convert(c.xs[0], mode), f"base conversion {mode.value}")


def test_base_conversion_small_sizes(rng):
    """Below N = TC_ROWS the default is the tiled kernel; from it on, the tensor-core one; both compute
    the reference in every mode. The tensor-core kernel refuses an N that is not a multiple of TC_ROWS."""
    for n in (16, 64, 128, 256):
        ctx, ring = rings(n)
        c = conversion_case((ctx, ring), rng, *random_limbs(rng, 13, 20), 2)
        assert c.conv.tensor is (n % dbasis.TC_ROWS == 0)
        outs = np.array([c.arena.take(20) for _ in range(2)])
        dev = c.arena.upload()
        for mode in Mode:
            dev[cp.asarray(outs.reshape(-1))] = POISON
            c.conv.convert(dev, i32(c.ins), i32(outs), mode)
            have = c.arena.download()
            for b in range(2):
                expect_rows(have, outs[b], c.ref.convert(c.xs[b], mode), f"base conversion N={n} {mode.value}")
    with pytest.raises(ValueError, match="multiple of"):
        dbasis.BaseConversion(rings(64)[1], [0, 1], [2], tensor=True)


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_sud_lift(pair, rng, mode):
    ctx, ring = pair
    pairs = [(63, 0), (0, 63), (5, 4), (40, 2), (1, 0)]
    ts = [t for t, _ in pairs]
    ls = [l for _, l in pairs]
    rb = residues(ctx, ts, rng)
    rb[0, :4] = [0, (ctx.q(63) - 1) // 2, (ctx.q(63) + 1) // 2, ctx.q(63) - 1]  # the centring boundary
    arena = Arena(ctx.n, 2 * len(pairs), rng)
    src = arena.put(rb)
    dst = arena.take(len(pairs))
    dev = arena.upload()
    dbasis.sud_lift(ring, dev, i32(src), i32(dst), i32(ts), i32(ls), mode)
    want = np.stack([ctx.sud_lift(rb[k], t, l, mode) for k, (t, l) in enumerate(pairs)])
    expect_rows(arena.download(), dst, want, f"sud_lift {mode.value}")


# --------------------------------------------------------------------------- rsv / mod


@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_rsv_and_mod(pair, rng, m):
    ctx, ring = pair
    n = ctx.n
    basis = ([0, 63] + [int(l) for l in rng.permutation(np.arange(1, 63))])[:m]
    rng.shuffle(basis)
    crt_basis = dcrt.CrtBasis(ring, basis)
    primes = [ctx.q(l) for l in basis]
    qb = math.prod(primes)
    groups = 2
    # group 0 starts from zero (rsi), group 1 from a random valid X < Q_B
    start = [np.zeros((m, n), dtype=np.uint32)]
    start.append(rcrt.ints_to_words(np.array([int(rng.integers(0, 1 << 62)) * int(rng.integers(0, 1 << 62)) % qb
                                              for _ in range(n)], dtype=object), m))
    order = [list(range(m)), [int(j) for j in rng.permutation(m)]]  # source positions per group
    srcs = [residues(ctx, [basis[j] for j in order[g]], rng) for g in range(groups)]
    arena = Arena(n, groups * 2 * m + 3, rng)
    acc = np.array([arena.put(start[g]) for g in range(groups)])
    src = np.array([arena.put(srcs[g]) for g in range(groups)])
    dev = arena.upload()
    crt_basis.rsv(dev, i32(acc), i32(src), i32(order))
    have = arena.download()
    for g in range(groups):
        want = start[g]
        for k, j in enumerate(order[g]):
            want = rcrt.rsv_accumulate(want, srcs[g][k], primes, j)
        expect_rows(have, acc[g], want, f"rsv group {g}")
    # after a full resolve from zero, X is the CRT lift of the sources
    lifted = rcrt.words_to_ints(have[acc[0]])
    assert all(np.array_equal(lifted % q, srcs[0][j].astype(object)) for j, q in enumerate(primes))
    # mod: reduce both accumulators into limbs 0, 63 and a random one
    out_limbs = [0, 63, int(rng.integers(0, 64))]
    accs = np.array([acc[g % groups] for g in range(len(out_limbs))])
    outs = arena.take(len(out_limbs))
    dcrt.mod(ring, dev, i32(accs), i32(outs), i32(out_limbs))
    have = arena.download()
    want = np.stack([rcrt.mod_reduce(have[accs[k]], ctx.q(l)) for k, l in enumerate(out_limbs)])
    expect_rows(have, outs, want, "mod")


def test_move_rows_reads_every_row_before_writing(pair, rng):
    """move_rows over overlapping rows (a cycle, a row onto itself, a row to a fresh one) = NumPy's gather then
    scatter; the rows not named keep their values."""
    ctx, ring = pair
    arena = Arena(ctx.n, 8, rng)
    rows = arena.put(rng.integers(0, 1 << 32, (5, ctx.n), dtype=np.uint64).astype(np.uint32))
    fresh = arena.take(1)
    src = [rows[0], rows[1], rows[2], rows[3], rows[4]]
    dst = [rows[1], rows[2], rows[0], rows[3], fresh[0]]
    dev = arena.upload()
    want = arena.host.copy()
    want[dst] = arena.host[src]
    dcrt.move_rows(ring, dev, i32(src), i32(dst), cp.empty((len(src), ctx.n), dtype=np.uint32))
    assert np.array_equal(arena.download(), want)


def test_mod_any_words(pair, rng):
    ctx, ring = pair
    m = 8
    words = rng.integers(0, 1 << 32, (m, ctx.n), dtype=np.uint64).astype(np.uint32)
    arena = Arena(ctx.n, m + 2, rng)
    acc = arena.put(words)
    out = arena.take(2)
    dev = arena.upload()
    dcrt.mod(ring, dev, i32([acc, acc]), i32(out), i32([0, 63]))
    want = np.stack([rcrt.mod_reduce(words, ctx.q(l)) for l in (0, 63)])
    expect_rows(arena.download(), out, want, "mod of arbitrary words")


# --------------------------------------------------------------------------- graph capture


def test_graph_capture(rng):
    """A sequence of launches (no allocation, no sync) can be captured and replayed as a CUDA graph."""
    if not hasattr(cp.cuda, "Stream") or not hasattr(cp.cuda.Stream, "begin_capture"):
        pytest.skip("this CuPy cannot capture graphs")
    ctx, ring = rings(4096)
    limbs = [0, 63, 7]
    x = residues(ctx, limbs, rng)
    arena = Arena(ctx.n, 9, rng)
    src = arena.put(x)
    mid = arena.take(3)
    out = arena.take(3)
    dev = arena.upload()
    s, m, o, p = i32(src), i32(mid), i32(out), i32(limbs)
    pairs = i32(np.stack([src, mid], axis=1))
    dev_copy = dev.copy()

    def body():
        dntt.ntt(ring, dev, s, m, p)
        ew.add(ring, dev, o, pairs, p)
        dntt.intt(ring, dev, o, o, p)

    body()  # warm-up: compiles the modules and uploads the tables
    dev[...] = dev_copy
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        body()
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    have = cp.asnumpy(dev)
    want = ctx.intt(rmod.add_mod(x, ctx.ntt(x, limbs), ctx.moduli(limbs)), limbs)
    expect_rows(have, out, want, "graph replay")


# --------------------------------------------------------------------------- base conversion on the tensor cores


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("shape", [(1, 3, 1), (3, 5, 2), (7, 8, 1), (8, 11, 3), (13, 50, 3), (16, 47, 2), (21, 42, 1),
                                   (33, 20, 2), (60, 4, 1), (64, 9, 2)],
                         ids=lambda s: f"S={s[0]},D={s[1]},B={s[2]}")
@pytest.mark.parametrize("build", [None, (1, 4), (1, 6), (2, 4), (2, 1)], ids=str)
def test_base_conversion_tensor(pair, rng, mode, shape, build):
    """The tensor-core kernel (byte products on mma.m16n8k32) computes the reference residues in each
    build (one or two output tiles a loop iteration, a register cap; None: basis.tc_build's pick)."""
    s, d, batch = shape
    c = conversion_case(pair, rng, *random_limbs(rng, s, d), batch, extremes=True, tensor=True)
    outs = np.array([c.arena.take(d) for _ in range(batch)])
    dev = c.arena.upload()
    c.conv.convert(dev, i32(c.ins), i32(outs), mode, build=build)
    have = c.arena.download()
    for b in range(batch):
        expect_rows(have, outs[b], c.ref.convert(c.xs[b], mode), f"tensor base conversion {mode.value} batch {b}")
    expect_inputs_kept(c.arena, have, outs.reshape(-1))


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("shape", [(13, 9, 2), (5, 20, 1), (16, 47, 2)], ids=lambda s: f"S={s[0]},D={s[1]},B={s[2]}")
@pytest.mark.parametrize("build", [(1, 4), (1, 6), (2, 4)], ids=str)
def test_base_conversion_tensor_in_place(pair, rng, mode, shape, build):
    """Outputs may overwrite the inputs: a warp reads all its inputs before it writes."""
    s, d, batch = shape
    c = conversion_case(pair, rng, *random_limbs(rng, s, d), batch, tensor=True)
    shared = min(s, d)
    outs = np.array([list(c.ins[b][:shared]) + c.arena.take(d - shared) for b in range(batch)])
    dev = c.arena.upload()
    c.conv.convert(dev, i32(c.ins), i32(outs), mode, build=build)
    have = c.arena.download()
    for b in range(batch):
        expect_rows(have, outs[b], c.ref.convert(c.xs[b], mode),
                    f"in-place tensor base conversion {mode.value} batch {b}")


@pytest.mark.parametrize("shape", [(13, 50, 1), (55, 9, 2), (40, 24, 1)], ids=lambda s: f"S={s[0]},D={s[1]},B={s[2]}")
def test_base_conversion_default(pair, rng, shape):
    """convert's default (the tensor-core kernel at these N) computes the reference."""
    s, d, batch = shape
    c = conversion_case(pair, rng, *random_limbs(rng, s, d), batch)
    assert c.conv.tensor
    outs = np.array([c.arena.take(d) for _ in range(batch)])
    dev = c.arena.upload()
    for mode in Mode:
        dev[cp.asarray(outs.reshape(-1))] = POISON
        c.conv.convert(dev, i32(c.ins), i32(outs), mode)
        have = c.arena.download()
        for b in range(batch):
            expect_rows(have, outs[b], c.ref.convert(c.xs[b], mode), f"default base conversion {mode.value} batch {b}")
