"""The plan engine against the reference interpreter: bit-identical stores of every chip on every
corpus program at 4 and 10 limbs and every chip count (exact mode, N = 4096), a subset in
textbook and emulator modes (N = 1024), BootstrapLike_20L, and the engine's own rules."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plan"))

from caramel.backends import Backend  # noqa: E402
from caramel.backends.numpy_backend import NumpyBackend  # noqa: E402
from caramel.ckks.check import check_path, prepare_check  # noqa: E402
from caramel.errors import BindingError  # noqa: E402
from caramel.execute.drive import run_plan  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.plan import Kind, build_plan  # noqa: E402
from caramel.program import Mem  # noqa: E402
from caramel.ring import Context  # noqa: E402

from plan_helpers import corpus, load_corpus, program_from_text, random_memory, store_mismatches  # noqa: E402

SUBSET = [
    f"{family}_{limbs}L_{chips}c"
    for family in ("Mul", "MulRotate", "Relin2", "BootstrapModRaise", "PolyX8", "RotMulAdd", "AddScalar")
    for limbs, chips in ((4, 1), (10, 2), (10, 8))
]


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


@lru_cache(maxsize=8)
def prepared(name: str, n: int):
    program = load_corpus(name)
    return program, prepare_check(check_path(program.name), program, context(n), rng=7).memory


def compare(name: str, n: int, mode: str, **options) -> None:
    program, memory = prepared(name, n)
    want = run_reference(program, context(n), memory, mode)
    have = run_plan(build_plan(program, **options), context(n), memory, mode)
    problems = store_mismatches(want, have)
    assert not problems, f"{name} N={n} {mode}: " + "; ".join(problems[:3])
    assert have.executed == want.executed
    assert have.memory.keys() == want.memory.keys()


@pytest.mark.parametrize("name", corpus())
def test_exact_every_program(name):
    compare(name, 4096, "exact")


@pytest.mark.parametrize("mode", ["textbook", "emulator"])
@pytest.mark.parametrize("name", SUBSET)
def test_other_modes(name, mode):
    compare(name, 1024, mode)


@pytest.mark.parametrize("options", [{"fuse": False}, {"max_inputs": 2}])
def test_plan_options_do_not_change_results(options):
    compare("PolyX8_10L_4c", 1024, "exact", **options)


@pytest.mark.parametrize("chips,mode", [(1, "exact"), (2, "textbook")])
def test_bootstraplike(chips, mode):
    """The bootstrap-shaped program (rsv/mod, conjugation, spills, 2439 communications...)."""
    program = load_corpus(f"BootstrapLike_20L_{chips}c")
    ctx = context(256)
    memory = random_memory(program, ctx, seed=chips)
    want = run_reference(program, ctx, memory, mode)
    have = run_plan(build_plan(program), ctx, memory, mode)
    assert not store_mismatches(want, have)


class CountingBackend(NumpyBackend):
    """A backend that records its calls: shows the interface a device backend implements."""

    def __init__(self, ctx, rows):
        super().__init__(ctx, rows)
        self.calls: list[str] = []
        for name in ("elementwise", "ntt", "ntt_prologue", "intt", "automorphism", "base_convert", "sud_lift", "rsv",
                     "mod"):
            method = getattr(self, name)
            setattr(self, name, self._wrap(name, method))

    def _wrap(self, name, method):
        def call(*args):
            for a in args:
                if isinstance(a, np.ndarray):
                    assert a.dtype == np.int32
            self.calls.append(name)
            return method(*args)

        return call


def test_custom_backend_gets_one_call_per_kernel():
    program, memory = prepared("Mul_4L_2c", 1024)
    plan = build_plan(program)
    backends = []

    def factory(ctx, rows):
        b = CountingBackend(ctx, rows)
        backends.append(b)
        return b

    have = run_plan(plan, context(1024), memory, backend=factory)
    assert len(backends) == 1 and isinstance(backends[0], Backend)  # one device hosts every chip
    kinds = [{"baseconv": "base_convert"}.get(k.kind.value, k.kind.value) if k.prologue is None else "ntt_prologue"
             for chip in plan.chips for k in chip.kernels if k.kind is not Kind.COMM]
    calls = backends[0].calls
    # one call per kernel; the communication between chips: local copies and sums (elementwise)
    assert sorted(c for c in calls if c != "elementwise") == sorted(k for k in kinds if k != "elementwise")
    assert calls.count("elementwise") > kinds.count("elementwise")
    assert not store_mismatches(run_reference(program, context(1024), memory), have)


def test_a_plan_runs_twice_with_the_same_result():
    program, memory = prepared("RotMulAdd_4L_4c", 1024)
    plan = build_plan(program)
    first = run_plan(plan, context(1024), memory)
    assert not store_mismatches(first, run_plan(plan, context(1024), memory))


def test_bad_memory_is_a_binding_error():
    ctx = context(1024)
    program = program_from_text("load r0: i1(0)\nloas s0: s3(0)\nads r1: r0, s0 | 0\nstore r1: v1(0)")
    with pytest.raises(BindingError, match=r"2 input limb\(s\) not provided: i1\(0\), s3\(0\)"):
        run_plan(build_plan(program), ctx, {})
    memory = {Mem("i1", 0): np.full(1024, ctx.q(0), dtype=np.uint32), Mem("s3", 0): np.zeros(3, dtype=np.uint32)}
    bad = r"(?s)i1\(0\): residues must lie in .*s3\(0\): shape \(3,\), expected \(\) \(one residue\)"
    with pytest.raises(BindingError, match=bad):
        run_plan(build_plan(program), ctx, memory)


def test_joi_sums_every_contribution():
    program = program_from_text(
        "load r0: i1(1)\njoi @ 65537:3 r1: r0 | 1\nstore r1: v1(1)",
        "load r0: i2(1)\njoi @ 65537:3 : r0 | 1",
        "joi @ 65537:3 :  | 1",
    )
    ctx = context(1024)
    memory = random_memory(program, ctx)
    have = run_plan(build_plan(program), ctx, memory)
    q = np.uint64(ctx.q(1))
    want = (memory[Mem("i1", 1)].astype(np.uint64) + memory[Mem("i2", 1)]) % q
    assert np.array_equal(have.stores[0][Mem("v1", 1)], want.astype(np.uint32))
    assert not store_mismatches(run_reference(program, ctx, memory), have)
