"""Key material and inputs come from separate seeds (caramel.ckks.keyset)."""

import numpy as np
import pytest

import caramel
from caramel.ckks.keyset import generate_keyset
from caramel.ring import Context

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "programs"


@pytest.fixture(scope="module")
def program():
    return caramel.load_program(EXAMPLES / "Mul_4L_2c")


def test_given_keys_equal_generated_from_key_seed(program):
    ctx = Context(n=1024)
    a = caramel.run_program(program, ctx=ctx, backend="cpu", seed=5, key_seed=9)
    b = caramel.run_program(program, ctx=ctx, backend="cpu", seed=5, keys=generate_keyset(program, ctx, 9))
    assert a.digest == b.digest
    assert a.report is None or a.report.passed


def test_seed_moves_inputs_not_keys(program):
    ctx = Context(n=1024)
    ks = generate_keyset(program, ctx, 3)
    a = caramel.run_program(program, ctx=ctx, backend="cpu", seed=1, keys=ks)
    b = caramel.run_program(program, ctx=ctx, backend="cpu", seed=2, keys=ks)
    assert a.digest != b.digest
    assert np.array_equal(a.prepared.secrets.s.coeffs, b.prepared.secrets.s.coeffs)
    c = caramel.run_program(program, ctx=ctx, backend="cpu", seed=1, key_seed=4)
    assert c.digest != a.digest
