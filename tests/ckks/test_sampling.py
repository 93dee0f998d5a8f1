"""caramel.ckks.sampling: the PCG64 state a key store keeps (PcgState)."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ckks.sampling import PcgState


@pytest.mark.parametrize("kept", [False, True])
def test_state_generator_draws_what_the_captured_one_draws(kept):
    rng = np.random.default_rng(11)
    if kept:
        rng.integers(0, 5, dtype=np.uint32)
    st = PcgState.of(rng)
    assert st.has_uint32 == int(kept)
    again = st.generator()
    assert again.bit_generator.state == rng.bit_generator.state
    q = np.array([[268042241], [204865537]], dtype=np.int64)
    assert np.array_equal(again.integers(0, q, size=(2, 64)), rng.integers(0, q, size=(2, 64)))


def test_words_round_trip_and_refusals():
    st = PcgState.of(np.random.default_rng([3, 4]))
    w = st.words()
    assert w.dtype == np.uint64 and w.shape == (PcgState.WORDS,)
    assert PcgState.from_words(w) == st
    for bad in ([*w[:3], w[3] ^ np.uint64(1), *w[4:]],  # even increment
                [*w[:4], 2, w[5]],  # has_uint32 not 0/1
                list(w[:5])):  # too short
        with pytest.raises(ValueError):
            PcgState.from_words(bad)


def test_other_generators_have_no_state():
    assert PcgState.of(np.random.Generator(np.random.Philox(1))) is None
