"""The compile pool (caramel.backends.cuda.compiler.schedule) with a fake compiler, without a GPU: jobs queued without
waiting, the heaviest first, one pool shared by every caller, identical sources compiled once across batches."""

from __future__ import annotations

import threading
from typing import NamedTuple

import pytest

from caramel.backends.cuda import compiler
from caramel.backends.cuda.config import EpilogueConfig
from caramel.backends.cuda.kernel_set import COMPILE_WEIGHTS, KernelSet
from caramel.backends.cuda.ntt.epilogue import epilogue_scalar, epilogue_weight
from caramel.expr import Expr, ExprOp
from caramel.ring import Context, Mode

from tests.backends.test_config import fake  # noqa: F401 (the fixture, shared)


class Job:
    """A job that records when it ran and may wait for a gate."""

    def __init__(self, name: str, weight: float = 1.0, gate: threading.Event | None = None, log=None):
        self.name, self.weight, self.gate, self.log = name, weight, gate, log

    def __call__(self):
        if self.gate is not None:
            assert self.gate.wait(10)
        compiler.module(self.name)
        if self.log is not None:
            self.log.append(self.name)


def test_schedule_returns_at_once_and_wait_waits(fake):
    gate = threading.Event()
    batch = compiler.schedule([Job("a", gate=gate), Job("b", gate=gate)], workers=2)
    assert len(batch) == 2 and not batch.done() and batch.seconds is None  # queued, blocked on the gate
    gate.set()
    assert batch.wait(progress=False) == 2 and batch.done() and batch.seconds >= 0
    assert sorted(fake.compiles) == ["a", "b"]


def test_heaviest_first(fake):
    """On one thread the jobs of a batch run heaviest first, ties in the given order."""
    log: list[str] = []
    gate = threading.Event()
    blocker = compiler.schedule([Job("blocker", gate=gate)], workers=1)  # holds the only thread while we queue
    batch = compiler.schedule([Job("light", 0.5, log=log), Job("one", log=log), Job("heavy", 8, log=log),
                               Job("two", log=log), Job("mid", 3, log=log)], workers=1)
    gate.set()
    blocker.wait(progress=False)
    batch.wait(progress=False)
    assert log == ["heavy", "mid", "one", "two", "light"]


def test_a_heavier_job_queued_later_starts_first(fake):
    """A free thread takes the heaviest job pending whichever batch queued it: a long compile queued late (a plan's
    base conversion behind its epilogues) does not wait for the lighter jobs queued before it."""
    log: list[str] = []
    gate = threading.Event()
    blocker = compiler.schedule([Job("blocker", gate=gate)], workers=1)
    early = compiler.schedule([Job("a", log=log), Job("b", log=log)], workers=1)
    late = compiler.schedule([Job("late", 3, log=log), Job("c", log=log)], workers=1)
    gate.set()
    for batch in (blocker, early, late):
        batch.wait(progress=False)
    assert log == ["late", "a", "b", "c"]


RUNS: list[str] = []  # what Value jobs ran


class Value(NamedTuple):
    """A job that is a value (as a Module is): equal jobs are the same job."""

    name: str

    def __call__(self):
        RUNS.append(self.name)
        compiler.module(self.name)


def test_an_equal_job_queued_again_is_not_run_again(fake):
    """A job equal to one queued before on the device is not queued again (no thread of the pool waits on it): the
    later batch holds the earlier job's future; another device, or a job that failed, is queued anew."""
    RUNS.clear()
    gate = threading.Event()
    blocker = compiler.schedule([Job("blocker", gate=gate)], workers=1)
    first = compiler.schedule([Value("x")], workers=1)
    again = compiler.schedule([Value("x"), Value("y")], workers=1)
    assert again.futures[0] is first.futures[0] and len(again) == 2
    gate.set()
    for batch in (blocker, first, again):
        batch.wait(progress=False)
    assert RUNS == ["x", "y"]
    with fake.cuda.Device(1):
        compiler.compile_sources([Value("x")], workers=1, progress=False)
    assert RUNS == ["x", "y", "x"]
    with pytest.raises(RuntimeError, match="nvrtc says no"):
        compiler.compile_sources([Value("broken")], workers=1, progress=False)
    with pytest.raises(RuntimeError, match="nvrtc says no"):
        compiler.compile_sources([Value("broken")], workers=1, progress=False)
    assert RUNS.count("broken") == 2


def test_a_cancelled_job_is_queued_anew(fake):
    """A job whose future was cancelled before it ran is queued again by a later batch (not held, nor asked for an
    exception it never had)."""
    RUNS.clear()
    gate = threading.Event()
    blocker = compiler.schedule([Job("blocker", gate=gate)], workers=1)
    first = compiler.schedule([Value("x")], workers=1)
    assert first.futures[0].cancel()
    again = compiler.schedule([Value("x")], workers=1)
    assert again.futures[0] is not first.futures[0]
    gate.set()
    blocker.wait(progress=False)
    again.wait(progress=False)
    assert RUNS == ["x"]


def test_batches_share_the_pool_and_the_cache(fake):
    """Two batches on one pool: the second's job of a source the first is compiling waits for it (one compile), and
    the earlier batch's jobs go first; a pool of another size is another pool."""
    gate = threading.Event()
    first = compiler.schedule([Job("shared", gate=gate), Job("x")], workers=2)
    second = compiler.schedule([Job("shared"), Job("y")], workers=2)
    gate.set()
    first.wait(progress=False)
    second.wait(progress=False)
    assert fake.compiles.count("shared") == 1 and compiler.loaded() == 3
    assert compiler._pool(2) is compiler._pool(2) and compiler._pool(3) is not compiler._pool(2)


def test_a_failure_is_raised_by_wait_after_every_job(fake):
    batch = compiler.schedule([Job("broken"), Job("fine")], workers=2)
    with pytest.raises(RuntimeError, match="nvrtc says no"):
        batch.wait(progress=False)
    assert batch.done() and "fine" in fake.compiles


def test_jobs_run_on_the_device_current_when_scheduled(fake):
    seen = []
    with fake.cuda.Device(3):
        batch = compiler.schedule([lambda: seen.append(fake.cuda.runtime.getDevice())], workers=2)
    batch.wait(progress=False)
    assert seen == [3]


def test_modules_are_jobs_weighted_by_family():
    """A KernelSet's modules are jobs (callable) whose weights order the transform first."""
    ring = KernelSet(Context(65536)).ring([Mode.EXACT]).modules
    assert {key[0] for key in ring} == {"twiddle", "gather", "ntt", "prologue", "basis", "crt", "automorphism"}
    assert len([k for k in ring if k[0] == "prologue"]) == 3
    heaviest = max(ring.values(), key=compiler.weight)
    assert heaviest.key[0] == "ntt" and heaviest.weight == COMPILE_WEIGHTS["ntt"]
    assert compiler.weight(lambda: None) == 1.0 and callable(heaviest)
    two = KernelSet(Context(65536)).ring(list(Mode)).modules
    assert len([k for k in two if k[0] == "prologue"]) == 3 * len(Mode)


def _sum_of(n_vec: int, transformed: int) -> Expr:
    """x0 + x1 + ... + x(n_vec - 1), its first ``transformed`` operands read through the transform."""
    ops = tuple(ExprOp("add", (0 if k == 0 else n_vec + k - 1, k + 1)) for k in range(n_vec - 1))
    return Expr(n_vec, 0, ops, (2 * n_vec - 2,), transformed=tuple(range(transformed)))


def test_epilogue_modules_weigh_their_register_pressure():
    """An epilogue module weighs its program's registers (epilogue_weight), not its family's 1: evaluated in 16-byte
    words (few transformed operands) a wide program outweighs a base conversion and the same program evaluated one
    residue a thread, so that the programs whose first candidates spill (and compile a second and a third) start
    first; a batch orders them so."""
    config = EpilogueConfig()
    found = KernelSet(Context(65536))
    wide, narrow, scalar = _sum_of(25, 1), _sum_of(6, 1), _sum_of(25, config.scalar_from + 3)
    assert not epilogue_scalar(1, config) and epilogue_scalar(config.scalar_from + 3, config)
    for expr in (narrow, scalar, wide):
        found.elementwise(expr, None, None, None, None)
    weights = {m.key[3]: m.weight for m in found.modules.values() if m.key[0] == "epilogue"}
    assert weights == {e: epilogue_weight(len(e.transformed), e.n_vec, 1, config) for e in (wide, narrow, scalar)}
    assert weights[wide] == 1 + 26 * 4 / 32 > COMPILE_WEIGHTS["basis"] > weights[narrow]
    assert weights[wide] > weights[scalar] == 1 + 26 / 32
    order = sorted(found.modules.values(), key=lambda m: -compiler.weight(m))
    assert [m.key[3] for m in order if m.key[0] == "epilogue"] == [wide, narrow, scalar]


def test_jobs_compile_at_once(fake):
    """Four jobs on four threads are inside their compiles together (a barrier that four must reach: run one after
    another, it would break)."""
    barrier = threading.Barrier(4, timeout=10)
    real = fake.RawModule

    class Together(real):
        def compile(self):
            barrier.wait()
            super().compile()

    fake.RawModule = Together
    assert compiler.compile_sources([Job(f"k{i}") for i in range(4)], workers=4, progress=False) == 4
    assert sorted(fake.compiles) == [f"k{i}" for i in range(4)]
