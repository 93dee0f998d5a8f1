"""The same plans on the GPU: a thin CuPy implementation of :class:`caramel.backends.Backend` over
the kernels of :mod:`caramel.backends.cuda` (one call each), bit-identical to the CPU reference.
Skipped without CuPy or a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.backends.cuda import available  # noqa: E402

if not available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.backends import Backend  # noqa: E402
from caramel.backends.cuda import CudaRing, FusedOp, FusedProgram  # noqa: E402
from caramel.backends.cuda import automorphism as dauto  # noqa: E402
from caramel.backends.cuda import basis as dbasis  # noqa: E402
from caramel.backends.cuda import crt as dcrt  # noqa: E402
from caramel.backends.cuda import elementwise as dew  # noqa: E402
from caramel.backends.cuda import ntt as dntt  # noqa: E402
from caramel.execute.plan_engine import run_plan  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.ring import Context  # noqa: E402

from plan_helpers import random_memory, random_program, store_mismatches  # noqa: E402

pytestmark = pytest.mark.gpu
REPO_PROGRAMS = ["Add_4L_1c", "BootstrapModRaise_4L_2c", "MulRotate_4L_1c", "Mul_4L_2c", "PolyX8_4L_4c"]
_RINGS: dict[int, CudaRing] = {}


class CupyBackend(Backend):
    """The Backend interface on a device arena: each method is one kernel of caramel.backends.cuda.
    Host index arrays are uploaded once (cached while the caller keeps them)."""

    def __init__(self, ctx, rows: int):
        self.ctx = ctx
        if ctx.n not in _RINGS:
            _RINGS[ctx.n] = CudaRing(ctx)
        self.ring = _RINGS[ctx.n]
        self.arena = cp.zeros((max(rows, 1), ctx.n), dtype=cp.uint32)
        self.scalars = cp.zeros(1, dtype=cp.uint32)
        self._dev: dict[int, tuple] = {}
        self._programs: dict = {}
        self._convs: dict = {}
        self._crt: dict = {}

    def d(self, x: np.ndarray):
        got = self._dev.get(id(x))
        if got is None or got[0] is not x:
            got = self._dev[id(x)] = (x, cp.asarray(np.ascontiguousarray(x, dtype=np.int32)))
        return got[1]

    def write(self, rows, data) -> None:
        self.arena[cp.asarray(rows)] = cp.asarray(data)

    def read(self, rows) -> np.ndarray:
        return cp.asnumpy(self.arena[cp.asarray(rows)])

    def set_scalars(self, values) -> None:
        if len(values):
            self.scalars = cp.asarray(np.asarray(values, dtype=np.uint32))

    def elementwise(self, expr, ins, outs, primes, scalars) -> None:
        program = self._programs.get(expr)
        if program is None:
            ops = tuple(FusedOp(o.op, tuple(o.args)) for o in expr.ops)
            program = self._programs[expr] = FusedProgram(expr.n_vec, expr.n_scalar, ops, tuple(expr.outputs))
        dew.fused(
            self.ring, program, self.arena, self.d(outs), self.d(ins), self.d(primes), self.scalars, self.d(scalars)
        )

    def ntt(self, ins, outs, primes) -> None:
        dntt.ntt(self.ring, self.arena, self.d(ins), self.d(outs), self.d(primes))

    def intt(self, ins, outs, primes) -> None:
        dntt.intt(self.ring, self.arena, self.d(ins), self.d(outs), self.d(primes))

    def automorphism(self, ins, outs, galois) -> None:
        dauto.automorphism(self.ring, self.arena, self.d(ins), self.d(outs), self.d(galois))

    def base_convert(self, in_limbs, out_limbs, ins, outs, mode) -> None:
        key = (tuple(in_limbs), tuple(out_limbs))
        conv = self._convs.get(key)
        if conv is None:
            conv = self._convs[key] = dbasis.BaseConversion(self.ring, in_limbs, out_limbs)
        conv.convert(self.arena, self.d(ins), self.d(outs), mode)

    def sud_lift(self, ins, outs, src_primes, dst_primes, mode) -> None:
        dbasis.sud_lift(self.ring, self.arena, self.d(ins), self.d(outs), self.d(src_primes), self.d(dst_primes), mode)

    def rsv(self, basis, ins, outs, primes) -> None:
        # The CUDA rsv accumulates in place: copy the words to their new rows, then accumulate.
        basis = tuple(basis)
        crt = self._crt.get(basis)
        if crt is None:
            crt = self._crt[basis] = dcrt.CrtBasis(self.ring, basis)
        m = len(basis)
        words = self.d(np.ascontiguousarray(ins[:, :m]))
        self.arena[self.d(outs)] = self.arena[words]
        pos = np.array([[basis.index(int(p))] for p in primes], dtype=np.int32)
        crt.rsv(self.arena, self.d(outs), cp.asarray(np.ascontiguousarray(ins[:, m:])), cp.asarray(pos))

    def mod(self, ins, outs, primes) -> None:
        dcrt.mod(self.ring, self.arena, self.d(ins), self.d(outs), self.d(primes))


def check(program, n: int, mode: str, seed: int = 0) -> None:
    ctx = Context(n=n)
    memory = random_memory(program, ctx, seed)
    want = run_reference(program, ctx, memory, mode)
    have = run_plan(build_plan(program), ctx, memory, mode, backend=CupyBackend)
    problems = store_mismatches(want, have)
    assert not problems, f"{program.name} N={n} {mode}: " + "; ".join(problems[:3])


@pytest.mark.parametrize("mode", ["exact", "textbook", "emulator"])
@pytest.mark.parametrize("name", REPO_PROGRAMS)
def test_repo_programs_on_the_gpu(name, mode, request):
    check(load_program(request.config.rootpath / "programs" / name), 4096, mode)


@pytest.mark.parametrize("seed", range(12))
def test_random_programs_on_the_gpu(seed):
    program = random_program(seed, chips=1 + seed % 3, canonical=True)
    check(program, 4096, ("exact", "textbook", "emulator")[seed % 3], seed)


def test_full_size_ring(request):
    check(load_program(request.config.rootpath / "programs" / "Mul_4L_2c"), 65536, "exact")
