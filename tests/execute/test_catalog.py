"""Every decryptable family of the catalog passes its decryption check (issue: CPU reference and
CKKS client), the emulator mode shows its known failure, and the bootstrap programs run to
completion reproducibly."""

from __future__ import annotations

import pytest

from caramel.api import run_program
from caramel.ckks.check import parse_check
from caramel.parse import load_program
from caramel.ring import Context

from tests.conftest import corpus

CTX = Context(n=4096)
SMALL = [p for p in corpus("*_4L_*c") + corpus("*_10L_*c") if not p.name.startswith("BootstrapLike")]


@pytest.mark.parametrize("mode", ["exact", "textbook"])
@pytest.mark.parametrize("path", SMALL, ids=lambda p: p.name)
def test_decryption_check(path, mode):
    outcome = run_program(load_program(path), ctx=CTX, mode=mode, seed=1)
    assert outcome.report is not None, f"no check file for {path.name}"
    assert outcome.report.passed, outcome.report.summary()


@pytest.mark.parametrize("mode", ["exact", "textbook"])
@pytest.mark.parametrize("name", [f"{f}_51L_{c}c" for f in ("Mul", "MulRotate", "PolyX8") for c in (1, 8)])
def test_decryption_check_51_limbs(name, mode):
    paths = corpus(name)
    if not paths:
        pytest.skip(f"{name} not in the corpus")
    outcome = run_program(load_program(paths[0]), ctx=CTX, mode=mode, seed=2)
    assert outcome.report.passed, outcome.report.summary()


FRESH_ROTATE = parse_check(
    {
        "inputs": {"x": {"kind": "ciphertext", "scale": "S"}},
        "outputs": {"z": {"formula": "rot(x, -2)", "scale": "S", "tolerance_bits": 8}},
    },
    "fresh-rotate",
)


@pytest.mark.parametrize("name", ["Rotate_10L_1c", "Rotate_10L_4c"])
def test_emulator_mode_fails_on_keyswitch_at_scale_2_28(name):
    """ISA.md 4.9: the emulator's raw-input base conversion adds a multiple of Q_S to every lift,
    so keyswitching a fresh (scale 2^28) ciphertext decrypts to garbage, while the same run in
    exact and textbook modes decrypts correctly."""
    paths = corpus(name)
    if not paths:
        pytest.skip(f"{name} not in the corpus")
    program = load_program(paths[0])
    bits = {m: run_program(program, ctx=CTX, mode=m, seed=3, check=FRESH_ROTATE).report.results["z"] for m in
            ("exact", "textbook", "emulator")}
    assert bits["exact"].passed and bits["textbook"].passed
    assert bits["emulator"].precision_bits < 0, f"emulator should fail, got {bits['emulator']}"


@pytest.mark.parametrize("chips", [1, 2, 4, 8])
@pytest.mark.parametrize("family", ["BootstrapModRaise_10L", "BootstrapLike_20L"])
def test_bootstrap_programs_run_reproducibly(family, chips):
    paths = corpus(f"{family}_{chips}c")
    if not paths:
        pytest.skip("not in the corpus")
    program = load_program(paths[0])
    ctx = Context(n=1024)
    first = run_program(program, ctx=ctx, seed=11)
    again = run_program(program, ctx=ctx, seed=11)
    other = run_program(program, ctx=ctx, seed=12)
    assert first.digest == again.digest
    assert first.digest != other.digest
    if first.report is not None:
        assert first.report.passed, first.report.summary()
