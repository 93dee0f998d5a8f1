"""Fuzzing the loader and validator (issue "Hardening").

* a bounded run of the mutation fuzzer of ``scripts/fuzz.py`` (imported, one copy of the machinery)
  over the shared corpus: every mutant loads and validates or fails with a located CaramelError;
* hypothesis properties: ``parse_instruction`` and ``parse_manifest`` on arbitrary and on
  grammar-shaped text raise only ``ParseError``; ``load_program`` on random bytes likewise.
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caramel.errors import CaramelError, ParseError
from caramel.parse import load_program, parse_instruction, parse_manifest, parse_stream
from caramel.program import Instruction, Manifest
from tests.conftest import REPO, SHARED_PROGRAMS, corpus


def _load_fuzz():
    name = "caramel_scripts_fuzz"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()

CI_CASES = 300
CI_SEED = 20261121


@pytest.fixture(scope="module")
def programs():
    if not corpus():
        pytest.skip(f"shared corpus not found at {SHARED_PROGRAMS}")
    return fuzz.corpus_programs(SHARED_PROGRAMS)


def test_mutation_fuzz_bounded(programs, tmp_path):
    summary = fuzz.fuzz(programs, seed=CI_SEED, cases=CI_CASES, workdir=tmp_path)
    assert summary.cases == CI_CASES
    assert sum(summary.outcomes.values()) == CI_CASES
    assert not summary.failures, "\n".join(f"{d}\n  {c.reproducer()}" for c, d in summary.failures)
    # the mutations reach every outcome: not everything is rejected by the first line check
    assert summary.outcomes["parse"] and summary.outcomes["validation"] and summary.outcomes["valid"]


def test_cases_are_reproducible(programs):
    a, b = fuzz.make_case(programs, 7, 123), fuzz.make_case(programs, 7, 123)
    assert a.files == b.files and a.mutations == b.mutations
    assert "--seed 7 --case 123" in a.reproducer()


def test_fuzzer_flags_uncaught_exceptions(programs, tmp_path, monkeypatch):
    """The oracle itself: a non-Caramel exception from the loader is reported as a failure."""

    def boom(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(fuzz, "load_program", boom)
    outcome, detail = fuzz.run_case(fuzz.make_case(programs, 1, 1), tmp_path)
    assert outcome == "failure" and "KeyError" in detail


@pytest.mark.parametrize("digits", [19, 4301, 20000])
def test_long_numbers_are_parse_errors(digits):
    """Regression (found by the fuzzer): numbers past Python's 4300-digit int conversion limit
    escaped as ValueError from manifests and stream headers."""
    big = "9" * digits
    with pytest.raises(ParseError, match=r"^m:2: "):
        parse_manifest(f"Input Stream:\ni1 | x:c0 | [{big}]\n;\nOutput Stream:\n;\n", "m", chip=True)
    with pytest.raises(ParseError, match=r"^m:2: "):
        parse_manifest(f"Input Stream:\nk1 | K:0:{big}:0:0:c0:[1] | [1]\n;\nOutput Stream:\n;\n", "m", chip=True)
    with pytest.raises(ParseError, match=r"^m:2: "):
        parse_manifest(f"Input Stream:\ni{big} | x:c0 | [1]\n;\nOutput Stream:\n;\n", "m", chip=True)
    with pytest.raises(ParseError, match=r"^f:1"):
        parse_stream(f"Instruction Stream {big}:\n", "f", 0)
    with pytest.raises(ParseError, match=r"^f:2"):
        parse_instruction(f"rot {big} r1: r0 | 3", "f", 2)


# ----------------------------------------------------------------------------------------------
# Hypothesis
# ----------------------------------------------------------------------------------------------

_OPCODES = st.sampled_from(fuzz.OPCODES)
_NUMBER = st.one_of(st.integers(0, 70), st.integers(-(2**70), 2**70), st.sampled_from(["9" * 4400, "00", "-0"]))
_TOKEN = st.one_of(
    st.builds(lambda p, n: f"{p}{n}", st.sampled_from(["r", "s", "B", "b", "i", "k", "v", "t", "", "-"]), _NUMBER),
    st.sampled_from(fuzz.OPERANDS),
    st.builds(lambda b, n, m: f"b{b}{{{m}}}" if n else f"i{b}({m})", st.integers(0, 99), st.booleans(), _NUMBER),
    st.text(alphabet="rsbBX0123456789[]{}(),:|@ -F", max_size=12),
)
_SEP = st.sampled_from([" ", ": ", ", ", " | ", ":", " @ ", "", ",", " : "])


@st.composite
def grammar_shaped(draw):
    parts = [draw(_OPCODES)]
    for _ in range(draw(st.integers(0, 7))):
        parts.append(draw(_SEP))
        parts.append(draw(_TOKEN))
    return " ".join(parts[:1]) + "".join(parts[1:]) if draw(st.booleans()) else " ".join(parts)


def _check_instruction(text: str) -> None:
    try:
        got = parse_instruction(text, "f", 3)
    except ParseError as err:
        assert str(err).startswith("f:3"), str(err)
    else:
        assert isinstance(got, Instruction)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=120))
def test_parse_instruction_arbitrary_text(text):
    _check_instruction(text)


@settings(deadline=None, max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(grammar_shaped())
def test_parse_instruction_grammar_shaped(text):
    _check_instruction(text)


_MANIFEST_LINE = st.one_of(
    st.sampled_from(["Input Stream:", "Output Stream:", "Ciphertext Stream:", "Plaintext Stream:", "Scalar Stream:",
                     "Evalkey Stream:", ";", ""]),
    st.builds(lambda t, n, s, l: f"{t}{n} | {s} | [{l}]", st.sampled_from("ipskvtx"), _NUMBER,
              st.one_of(st.sampled_from(["x:c0", "y:p", "s:s", "K:0:1:2:-3:c1:[1,2]", "K:9:0:0:0:c0:[0]"]),
                        st.text(max_size=20)),
              st.lists(_NUMBER, max_size=4).map(lambda xs: ",".join(map(str, xs)))),
    st.text(max_size=40),
)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300), st.booleans())
def test_parse_manifest_arbitrary_text(text, chip):
    try:
        got = parse_manifest(text, "m", chip=chip)
    except ParseError as err:
        assert str(err).startswith("m"), str(err)
    else:
        assert isinstance(got, Manifest)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_MANIFEST_LINE, max_size=14), st.booleans())
def test_parse_manifest_shaped_lines(lines, chip):
    try:
        got = parse_manifest("\n".join(lines) + "\n", "m", chip=chip)
    except ParseError as err:
        assert str(err).startswith("m"), str(err)
    else:
        assert isinstance(got, Manifest)


@settings(deadline=None, max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.sampled_from([b"", b"Instruction Stream 0:\n"]))
def test_load_program_random_bytes(data, prefix):
    from caramel.validate import validate

    with tempfile.TemporaryDirectory() as where:
        folder = Path(where)
        (folder / "instructions0").write_bytes(prefix + data)
        try:
            validate(load_program(folder, cache=False))
        except CaramelError as err:
            assert str(folder) in str(err), str(err)
