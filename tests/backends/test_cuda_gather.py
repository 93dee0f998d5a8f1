"""The CUDA fused elementwise kernel with gathered operands (automorphisms computed in the load,
:mod:`caramel.backends.cuda.elementwise`) against the CPU reference on fresh random data, and a plan
whose automorphisms are folded into their consumers on the GPU against the reference.
Skipped without CuPy or without a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.backends.cuda import available  # noqa: E402

if not available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.backends.cuda import elementwise as ew  # noqa: E402
from caramel.backends.cuda.backend import CupyBackend  # noqa: E402
from caramel.execute.drive import run_plan  # noqa: E402
from caramel.expr import Expr  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.plan import build_plan, plan_stats  # noqa: E402
from tests.backends.cuda_support import i32, pair, rng  # noqa: E402,F401 (pair, rng: fixtures)
from tests.backends.test_cuda_kernels import Arena, _ref_op, expect_inputs_kept, expect_rows, limb_choice, \
    random_program, residues  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("trial", range(3))
def test_fused_program_with_gathered_operands(pair, rng, trial):
    ctx, ring = pair
    base = random_program(rng)
    k = int(rng.integers(1, base.n_vec + 1))
    gathered = tuple(sorted(int(v) for v in rng.choice(base.n_vec, k, replace=False)))
    prog = Expr(base.n_vec, base.n_scalar, base.ops, base.outputs, gathered)
    rows = 5
    limbs = limb_choice(rng, rows)
    steps = [1, -1, 7, ctx.n // 4 - 3, None]
    gal = np.array([[ctx.conjugation_element if s is None else ctx.galois_element(s)
                     for s in rng.permutation(np.array(steps, dtype=object))[:k]] for _ in range(rows)])
    vecs = [residues(ctx, limbs, rng) for _ in range(prog.n_vec)]
    svals = [np.array([rng.integers(0, ctx.q(l)) for l in limbs], dtype=np.uint32) for _ in range(prog.n_scalar)]
    arena = Arena(ctx.n, (prog.n_vec + len(prog.outputs)) * rows, rng)
    vslots = np.stack([arena.put(v) for v in vecs], axis=1)
    oslots = np.array([arena.take(len(prog.outputs)) for _ in range(rows)])
    scal = np.stack(svals, axis=1).reshape(-1) if svals else np.zeros(1, dtype=np.uint32)
    sidx = np.arange(rows * prog.n_scalar).reshape(rows, prog.n_scalar)
    dev = arena.upload()
    ew.fused(ring, prog, dev, i32(oslots), i32(vslots), i32(limbs), cp.asarray(scal), i32(sidx), i32(gal))
    q = ctx.moduli(limbs)
    values = [v.astype(np.uint64) for v in vecs]
    for m, j in enumerate(gathered):
        values[j] = np.stack([ctx.automorphism(vecs[j][r], int(gal[r, m])) for r in range(rows)]).astype(np.uint64)
    values += [s[:, None].astype(np.uint64) for s in svals]
    for op in prog.ops:
        values.append(_ref_op(op.op, values[op.args[0]], values[op.args[-1]], q))
    have = arena.download()
    for o_k, o in enumerate(prog.outputs):
        want = np.broadcast_to(values[o], (rows, ctx.n)).astype(np.uint32)
        expect_rows(have, oslots[:, o_k], want, f"fused {prog.text()} output {o_k}")
    expect_inputs_kept(arena, have, oslots.reshape(-1))


@pytest.mark.parametrize("name,n,mode", [("MulRotate_4L_1c", 4096, "exact"), ("MulRotate_4L_1c", 4096, "textbook"),
                                         ("RotMulAdd_4L_1c", 4096, "emulator"), ("MulRotate_4L_1c", 65536, "exact")])
def test_folded_plan_on_the_gpu(request, name, n, mode):
    from caramel.parse import load_program
    from caramel.ring import Context

    from tests.plan.plan_helpers import random_memory, store_mismatches

    from tests.conftest import SHARED_PROGRAMS

    path = request.config.rootpath / "programs" / name
    program = load_program(path if path.exists() else SHARED_PROGRAMS / name)
    plan = build_plan(program)
    assert plan_stats(plan)["gathered_reads"] > 0
    ctx = Context(n=n)
    memory = random_memory(program, ctx, 3)
    want = run_reference(program, ctx, memory, mode)
    have = run_plan(plan, ctx, memory, mode, backend=CupyBackend)
    problems = store_mismatches(want, have)
    assert not problems, f"{name} N={n} {mode}: " + "; ".join(problems[:3])
