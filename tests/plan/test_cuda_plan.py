"""The same plans on the GPU: :class:`caramel.backends.cuda.backend.CupyBackend` (the Backend
interface over the kernels of :mod:`caramel.backends.cuda`), bit-identical to the CPU reference.
Skipped without CuPy or a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.backends.cuda import available  # noqa: E402

if not available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.backends.cuda.backend import CupyBackend  # noqa: E402
from caramel.execute.drive import run_plan  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.ring import Context  # noqa: E402

from plan_helpers import random_memory, random_program, store_mismatches  # noqa: E402

pytestmark = pytest.mark.gpu
REPO_PROGRAMS = ["Add_4L_1c", "BootstrapModRaise_4L_2c", "MulRotate_4L_1c", "Mul_4L_2c", "PolyX8_4L_4c"]


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
