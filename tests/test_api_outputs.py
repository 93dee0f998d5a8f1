"""RunOutcome.outputs: the decrypted outputs of a run from Python, by name, at their true scale."""

from __future__ import annotations

import numpy as np
import pytest

import caramel
from caramel.userdata import OutputScaleError

from tests.conftest import REPO

N = 256


def test_outputs_are_the_decrypted_values_at_their_true_scale():
    program = caramel.load_program(REPO / "programs" / "Mul_4L_1c")
    x = np.linspace(-0.5, 0.5, N // 2)
    outcome = caramel.run_program(program, n=N, backend="cpu", inputs={"x": x, "y": np.full(N // 2, 0.5)})
    assert set(outcome.outputs) == {"z"}
    z = outcome.outputs["z"]
    assert z.shape == (N // 2,) and z.dtype == np.complex128
    assert np.allclose(z, x * 0.5, atol=1e-3)


def test_outputs_of_a_run_without_a_check_are_refused_not_guessed():
    program = caramel.load_program(REPO / "programs" / "Mul_4L_1c")
    outcome = caramel.run_program(program, n=N, backend="cpu", check=None)
    with pytest.raises(OutputScaleError, match="scale is unknown"):
        outcome.outputs
