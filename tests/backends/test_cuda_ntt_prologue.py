"""The fused NTT loads of caramel.backends.cuda.ntt (``ntt_prologue``: sud lift, mod or base
conversion computed in the NTT's load) against the CPU reference (the producing function, then
``ctx.ntt``) on fresh random data at N = 4096 and 65536 in the three arithmetic modes. Output rows are
poisoned before the launch; input rows must come back unchanged. Skipped without CuPy or a GPU."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.backends.cuda import available  # noqa: E402

if not available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.backends.cuda import ntt as dntt  # noqa: E402
from caramel.ring import Mode  # noqa: E402
from caramel.ring import crt as rcrt  # noqa: E402
from tests.backends.cuda_support import POISON, i32, pair, rng  # noqa: E402,F401 (pair, rng: fixtures)

pytestmark = pytest.mark.gpu


def run(ctx, ring, rng, kind, inputs, prime_idx, ins_of, args, mode, tables=None):
    """Scatter ``inputs`` (K, N) over a poisoned arena, launch ntt_prologue with rows ins_of (R, W)
    (indices into ``inputs``), return (outputs (R, N), whether the inputs were kept)."""
    k, r = len(inputs), len(prime_idx)
    host = np.full((k + r + 3, ctx.n), POISON, dtype=np.uint32)
    slots = [int(s) for s in rng.permutation(len(host))]
    src, dst = slots[:k], slots[k:k + r]
    host[src] = inputs
    dev = cp.asarray(host)
    ins = np.array([[src[j] for j in row] for row in ins_of])
    dntt.ntt_prologue(ring, dev, kind, i32(ins), i32(dst), i32(prime_idx), i32(args), mode, tables)
    have = cp.asnumpy(dev)
    return have[dst], np.array_equal(have[src], inputs)


def expect(have, want, what):
    for row, (h, w) in enumerate(zip(have, want)):
        if not np.array_equal(h, w):
            bad = np.flatnonzero(h != w)
            raise AssertionError(f"{what}, row {row}: {bad.size} residues differ, first at {bad[0]}: "
                                 f"want {w[bad[0]]}, have {h[bad[0]]}" + (" (never written)" if h[bad[0]] == POISON else ""))


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
def test_lift_in_the_load(pair, rng, mode):
    ctx, ring = pair
    pairs = [(63, 0), (0, 63), (5, 4), (40, 2), (1, 0), (7, 7)]
    ts, ls = [t for t, _ in pairs], [l for _, l in pairs]
    rb = np.stack([rng.integers(0, ctx.q(t), ctx.n, dtype=np.uint64) for t in ts]).astype(np.uint32)
    rb[0, :4] = [0, (ctx.q(63) - 1) // 2, (ctx.q(63) + 1) // 2, ctx.q(63) - 1]  # the centring boundary
    have, kept = run(ctx, ring, rng, "sud_lift", rb, ls, [[j] for j in range(len(pairs))], ts, mode)
    want = np.stack([ctx.ntt(ctx.sud_lift(rb[j], t, l, mode), l) for j, (t, l) in enumerate(pairs)])
    expect(have, want, f"lift + ntt {mode.value}")
    assert kept


@pytest.mark.parametrize("m", [1, 2, 4])
def test_mod_in_the_load(pair, rng, m):
    ctx, ring = pair
    words = rng.integers(0, 1 << 32, (2 * m, ctx.n), dtype=np.uint64).astype(np.uint32)
    limbs = [0, 63, int(rng.integers(0, 64))]
    rows = [list(range(m)), list(range(m, 2 * m)), list(range(m))]
    have, kept = run(ctx, ring, rng, "mod", words, limbs, rows, [0] * 3, Mode.EXACT)
    want = np.stack([ctx.ntt(rcrt.mod_reduce(words[rows[j]], ctx.q(l)), l) for j, l in enumerate(limbs)])
    expect(have, want, f"mod ({m} words) + ntt")
    assert kept


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("s,d", [(1, 3), (13, 5), (20, 9), (51, 2)], ids=lambda v: str(v))
def test_conversion_in_the_load(pair, rng, mode, s, d):
    """Two conversions of S limbs, D output primes each (rows of one conversion side by side),
    including the extreme primes 0 and 63 as input and output."""
    ctx, ring = pair
    perm = [int(v) for v in rng.permutation(np.arange(1, 63))]
    in_limbs = sorted([0] + perm[: s - 1])
    out_limbs = sorted(perm[s - 1: s - 1 + d - 1] + [63])
    tables = dntt.PrologueTables(ring, in_limbs)
    xs = [np.stack([rng.integers(0, ctx.q(l), ctx.n, dtype=np.uint64) for l in in_limbs]).astype(np.uint32)
          for _ in range(2)]
    inputs = np.concatenate(xs)
    rows = [list(range(b * s, (b + 1) * s)) for b in range(2) for _ in out_limbs]
    primes = out_limbs * 2
    have, kept = run(ctx, ring, rng, "baseconv", inputs, primes, rows, [0] * len(primes), mode, tables)
    ref = ctx.base_converter(in_limbs, out_limbs)
    want = np.concatenate([ctx.ntt(ref.convert(x, mode), out_limbs) for x in xs])
    expect(have, want, f"base conversion {s} -> {d} + ntt {mode.value}")
    assert kept


def test_bad_arguments_are_refused(pair):
    ctx, ring = pair
    dev = cp.zeros((4, ctx.n), dtype=cp.uint32)
    with pytest.raises(ValueError):
        dntt.ntt_prologue(ring, dev, "intt", i32([[0]]), i32([1]), i32([0]), i32([0]), Mode.EXACT)
    with pytest.raises(ValueError):  # a conversion without its tables
        dntt.ntt_prologue(ring, dev, "baseconv", i32([[0, 1]]), i32([2]), i32([0]), i32([0]), Mode.EXACT)


@pytest.mark.parametrize("mode", list(Mode), ids=lambda m: m.value)
@pytest.mark.parametrize("name", ["Mul_4L_1c", "BootstrapModRaise_4L_2c", "PolyX8_4L_4c"])
def test_plans_with_every_load_on_the_gpu(pair, mode, name):
    """Plans whose NTTs compute every kind of load (``fuse_ntt="all"``), run through CupyBackend,
    bit-identical to the reference interpreter."""
    from pathlib import Path

    from caramel.backends.cuda.backend import CupyBackend
    from caramel.execute.drive import run_plan
    from caramel.execute.reference import run_reference
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from tests.plan.plan_helpers import random_memory, store_mismatches

    ctx, _ = pair
    program = load_program(Path(__file__).resolve().parents[2] / "programs" / name)
    plan = build_plan(program, fuse_ntt="all")
    assert any(k.prologue is not None for c in plan.chips for k in c.kernels)
    memory = random_memory(program, ctx, seed=11)
    have = run_plan(plan, ctx, memory, mode, backend=CupyBackend)
    assert not store_mismatches(run_reference(program, ctx, memory, mode), have)
