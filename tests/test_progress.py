"""Progress that moves: the long phases report their work as it is done (instructions run on the
reference, calls of the plan engine, keys made, key files written), the phase bar shows no rate
or time left (its phases are of very unequal length), and `caramel keys` says what it does."""

from __future__ import annotations

import pytest

import caramel
import caramel.api
from caramel import cli
from caramel.ckks.bind import requirements
from caramel.ckks.keyset import generate_keyset
from caramel.execute.drive import run_plan
from caramel.execute.reference import run_reference
from caramel.plan import build_plan
from caramel.ring import Context

from tests.conftest import REPO

MUL = REPO / "programs" / "Mul_4L_2c"
N = 256


@pytest.fixture(scope="module")
def case():
    program = caramel.load_program(MUL)
    ctx = Context(n=N)
    prepared = caramel.api.prepare_inputs(program, ctx, generate_keyset(program, ctx, 1), 1)
    return program, ctx, prepared.memory


def _same(a, b) -> bool:
    return len(a.stores) == len(b.stores) and all(
        x.keys() == y.keys() and all((x[k] == y[k]).all() for k in x) for x, y in zip(a.stores, b.stores))


def _recorder():
    calls = []
    return calls, lambda done, total: calls.append((done, total))


def test_the_reference_reports_every_instruction(case):
    program, ctx, memory = case
    calls, progress = _recorder()
    want = run_reference(program, ctx, memory)
    got = run_reference(program, ctx, memory, progress=progress)
    total = program.instruction_count
    assert [d for d, _ in calls] == list(range(1, total + 1)) and {t for _, t in calls} == {total}
    assert _same(got, want)


def test_the_plan_engine_reports_every_call(case):
    program, ctx, memory = case
    plan = build_plan(program)
    calls, progress = _recorder()
    got = run_plan(plan, ctx, memory, progress=progress)
    total = calls[-1][1]
    assert total > 1 and [d for d, _ in calls] == list(range(1, total + 1))
    assert _same(got, run_plan(plan, ctx, memory))


def test_key_generation_reports_every_key_and_makes_the_same_keys():
    program = caramel.load_program(REPO / "programs" / "BootstrapModRaise_4L_2c")
    ctx = Context(n=N)
    calls, progress = _recorder()
    with_bar = generate_keyset(program, ctx, 4, progress=progress)
    plain = generate_keyset(program, ctx, 4)
    count = len(requirements(program).keys)
    assert count > 1 and calls == [(i, count) for i in range(1, count + 1)]
    for k in plain.keys:
        assert (with_bar.keys[k].c0 == plain.keys[k].c0).all()


class Spy:
    """A :class:`caramel.logs.Counter` stand-in recording every (done, total)."""

    made: list = []

    def __init__(self, desc, unit):
        self.desc, self.unit, self.calls = desc, unit, []
        Spy.made.append(self)

    def __call__(self, done, total):
        self.calls.append((done, total))

    def close(self):
        pass


@pytest.fixture
def spy(monkeypatch):
    Spy.made = []
    monkeypatch.setattr("caramel.logs.counter", Spy)
    return Spy.made


@pytest.mark.parametrize("backend,unit", [("cpu", "instructions"), ("cpu-plan", "calls")])
def test_a_run_reports_its_instructions_and_keys_as_they_are_done(spy, capsys, backend, unit):
    program = caramel.load_program(MUL)
    assert cli.main(["run", str(MUL), "--n", str(N), "--backend", backend, "-q"]) == 0
    by_unit = {s.unit: s for s in spy}
    assert by_unit["keys"].calls == [(1, 1)]
    run = by_unit[unit].calls
    assert len(run) > 1 and run[-1][0] == run[-1][1] and [d for d, _ in run] == list(range(1, len(run) + 1))
    if backend == "cpu":
        assert run[-1][1] == program.instruction_count


def test_the_phase_bar_shows_no_rate_and_no_time_left(capsys, monkeypatch):
    from caramel.logs import PHASE_FORMAT

    assert "rate" not in PHASE_FORMAT and "remaining" not in PHASE_FORMAT
    monkeypatch.setenv("CARAMEL_PROGRESS", "1")
    assert cli.main(["run", str(MUL), "--n", str(N), "--backend", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "[phase 2/3," in err and "step/s" not in err and "s/step" not in err


def test_caramel_keys_says_what_it_does_and_counts_keys_and_files(spy, capsys, tmp_path):
    assert cli.main(["keys", str(MUL), "--n", str(N), "--out", str(tmp_path / "a"), "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "making the secrets and 1 evaluation keys at N = 256 on the cpu" in err  # a line at once, bar or not
    assert [s.calls for s in spy] == [[(1, 1)], [(1, 1)]]  # keys made, then key files written


@pytest.mark.parametrize("command", ["run", "keys", "profile"])
def test_help_says_what_the_default_n_costs_on_a_cpu(capsys, command):
    assert cli.main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "default 65536; on a CPU" in text and "--n 4096" in text
