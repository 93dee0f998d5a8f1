"""NTT epilogues (caramel.backends.cuda.ntt: ``ntt(half=True)`` and the epilogue kernel of an elementwise
program with ``transformed`` operands): the forward transform's column pass, then the program reading those
operands through the row pass, against the CPU reference (``ctx.ntt``, then the program in 64-bit NumPy) on fresh
random data at N = 4096 (the transform runs whole, the operands are plain) and 65536. Output rows are poisoned
before the launch. Skipped without CuPy or a GPU."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.backends.cuda import available  # noqa: E402

if not available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.backends.cuda import elementwise as dew  # noqa: E402
from caramel.backends.cuda import ntt as dntt  # noqa: E402
from caramel.backends.cuda.config import EpilogueConfig, KernelConfig  # noqa: E402
from caramel.expr import Expr, ExprOp  # noqa: E402
from tests.backends.cuda_support import POISON, i32, pair, rng  # noqa: E402,F401 (pair, rng: fixtures)
from tests.backends.kernel_sources import inner_products  # noqa: E402

pytestmark = pytest.mark.gpu

#: Epilogue kernel settings (KernelConfig.with_settings) every test runs under: the defaults, other launch bounds,
#: 16-byte words where the defaults take one residue a thread, another first split stage.
SETTINGS = {"default": [], "two-blocks": ["epilogue.min_blocks=2"], "three-blocks": ["epilogue.min_blocks=3/2"],
            "words": ["epilogue.scalar_from=17"], "split-6": ["epilogue.split_from=6"]}


@pytest.fixture(params=list(SETTINGS))
def kernels(request) -> KernelConfig:
    return KernelConfig().with_settings(SETTINGS[request.param])


def evaluate(program: Expr, operands: list[np.ndarray], q: int) -> list[np.ndarray]:
    vals = [v.astype(np.uint64) for v in operands]
    for op in program.ops:
        a, b = vals[op.args[0]], vals[op.args[-1]]
        vals.append((a * b) % np.uint64(q) if op.op == "mul" else (a + b) % np.uint64(q))
    return [vals[o].astype(np.uint32) for o in program.outputs]


@pytest.mark.parametrize("f,p,o", [(1, 1, 1), (2, 13, 2), (3, 2, 4), (5, 7, 2), (8, 8, 3), (9, 4, 2), (12, 12, 4),
                                   (14, 18, 5), (16, 1, 1)], ids=str)
def test_epilogue_runs_the_row_pass_in_its_load(pair, rng, kernels, f, p, o):
    ctx, ring = pair
    program = inner_products(f, p, o)
    rows = 3
    primes = [int(x) for x in rng.choice(64, rows, replace=False)]
    nv = program.n_vec
    # per row: nv operand limbs (the transformed ones hold coefficients, transformed in place by the half NTT)
    host = np.full((rows * (nv + o) + 2, ctx.n), POISON, dtype=np.uint32)
    slots = rng.permutation(len(host))
    vec = slots[: rows * nv].reshape(rows, nv)
    out = slots[rows * nv : rows * (nv + o)].reshape(rows, o)
    coeff = {}
    for r, l in enumerate(primes):
        for k in range(nv):
            host[vec[r, k]] = rng.integers(0, ctx.q(l), ctx.n, dtype=np.uint64).astype(np.uint32)
            coeff[r, k] = host[vec[r, k]].copy()
    arena = cp.asarray(host)
    t_slots = np.array([[vec[r, k] for k in program.transformed] for r in range(rows)])
    t_primes = np.repeat(primes, len(program.transformed))
    dntt.ntt(ring, arena, i32(t_slots.ravel()), i32(t_slots.ravel()), i32(t_primes), half=True)
    dew.fused(ring, program, arena, i32(out), i32(vec), i32(primes), kernels=kernels)
    have = cp.asnumpy(arena)
    for r, l in enumerate(primes):
        operands = [ctx.ntt(coeff[r, k], l) if k in program.transformed else coeff[r, k] for k in range(nv)]
        for j, want in enumerate(evaluate(program, operands, ctx.q(l))):
            got = have[out[r, j]]
            bad = np.flatnonzero(got != want)
            assert not bad.size, (f"row {r} output {j}: {bad.size} residues differ, first at {bad[0]}: "
                                  f"want {want[bad[0]]}, have {got[bad[0]]}")


@pytest.mark.parametrize("f,gathered", [(2, (1, 5)), (6, (7, 9))], ids=str)
def test_epilogue_with_gathered_operands(pair, rng, kernels, f, gathered):
    """Transformed operands beside operands read through an automorphism (the epilogue kernel's body gathers as the
    plain kernel does; with one group a block (F = 6), one residue a thread)."""
    ctx, ring = pair
    program = inner_products(f, 4, 2, gathered=gathered)  # two plain operands through automorphisms
    rows, nv, o = 2, program.n_vec, 2
    primes = [int(x) for x in rng.choice(64, rows, replace=False)]
    steps = [[1, -3], [5, 0]]  # rotation steps per row and gathered operand (0: 5^0 = 1, the identity)
    galois = np.array([[ctx.galois_element(s) for s in row] for row in steps], dtype=np.int32)
    host = np.full((rows * (nv + o) + 1, ctx.n), POISON, dtype=np.uint32)
    slots = rng.permutation(len(host))
    vec, out = slots[: rows * nv].reshape(rows, nv), slots[rows * nv : rows * (nv + o)].reshape(rows, o)
    for r, l in enumerate(primes):
        for k in range(nv):
            host[vec[r, k]] = rng.integers(0, ctx.q(l), ctx.n, dtype=np.uint64).astype(np.uint32)
    coeff = host.copy()
    arena = cp.asarray(host)
    t_slots = np.array([[vec[r, k] for k in program.transformed] for r in range(rows)])
    dntt.ntt(ring, arena, i32(t_slots.ravel()), i32(t_slots.ravel()), i32(np.repeat(primes, f)), half=True)
    dew.fused(ring, program, arena, i32(out), i32(vec), i32(primes), galois=i32(galois), kernels=kernels)
    have = cp.asnumpy(arena)
    for r, l in enumerate(primes):
        operands = []
        for k in range(nv):
            x = coeff[vec[r, k]]
            if k in program.transformed:
                x = ctx.ntt(x, l)
            elif k in program.gathered:
                x = ctx.automorphism(x, int(galois[r, program.gathered.index(k)]))
            operands.append(x)
        for j, want in enumerate(evaluate(program, operands, ctx.q(l))):
            assert np.array_equal(have[out[r, j]], want), f"row {r} output {j}"


def test_launch_bounds_without_spills(pair):
    """An epilogue kernel takes the first of EpilogueConfig.min_blocks (4, 3, 2) whose blocks fit in shared memory
    and under which it needs no local memory: a small program and one of 12 transformed operands four blocks a
    multiprocessor, one of 14 three (four do not fit), and a program of 8 with 40 plain operands and 8 outputs, which
    spills under four blocks (64 registers), fewer."""
    ctx, ring = pair
    if ctx.n < 8192:
        pytest.skip("no epilogue kernel below N = 8192")
    assert EpilogueConfig().min_blocks == (4, 3, 2)
    for shape, want in (((1, 1, 1), 4), ((12, 12, 4), 4), ((14, 18, 5), 3)):
        kernel, blocks = dew.epilogue_kernel(ring, inner_products(*shape))
        assert (blocks, kernel.local_size_bytes) == (want, 0), shape
    big = inner_products(8, 40, 8)
    assert dew.epilogue_kernel(ring, big, EpilogueConfig(min_blocks=(4,)))[0].local_size_bytes > 0  # it spills
    kernel, blocks = dew.epilogue_kernel(ring, big)
    assert blocks < 4 and (kernel.local_size_bytes == 0 or blocks == 2)


def test_program_checks(pair):
    ctx, ring = pair
    with pytest.raises(ValueError, match="transformed"):
        Expr(2, 0, (ExprOp("add", (0, 1)),), (2,), transformed=(1, 0))
    with pytest.raises(ValueError, match="transformed"):
        Expr(2, 0, (ExprOp("add", (0, 1)),), (2,), gathered=(0,), transformed=(0,))
    arena = cp.zeros((1, ctx.n), dtype=cp.uint32)
    with pytest.raises(ValueError, match="first pass"):
        dntt.launch(ring, arena, i32([0]), i32([0]), i32([0]), True, half=True)
