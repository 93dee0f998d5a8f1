"""The index identity of the gathered elementwise operand (caramel.backends.cuda.elementwise, module
docstring), on the CPU: the 4 sources of outputs 4i..4i+3 of an automorphism in NTT form lie in one
aligned 16-byte word, output 4i + d at component br2((br2(s mod 4) + br2(d) g) mod 4), s the source of
4i, for every odd Galois element g (the kernel's gather4 computes one source index and these)."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.ring import Context


def _br(x: int, bits: int) -> int:
    return int(format(x, f"0{bits}b")[::-1], 2)


def _source(j: int, g: int, logn: int) -> int:
    """br(((g (2 br(j) + 1)) mod 2N - 1) / 2): the input index that output j of X -> X^g reads."""
    e = (g * (2 * _br(j, logn) + 1)) % (2 << logn)
    return _br((e - 1) >> 1, logn)


def _br2(x: int) -> int:
    return ((x & 1) << 1) | ((x >> 1) & 1)


@pytest.mark.parametrize("logn", [2, 3, 8, 12, 16])
def test_four_outputs_read_one_word_in_the_predicted_order(logn):
    rng = np.random.default_rng(logn)
    n = 1 << logn
    for _ in range(400):
        g, i = int(rng.integers(0, n)) * 2 + 1, int(rng.integers(0, n // 4))
        s = _source(4 * i, g, logn)
        t = _br2(s & 3)
        for d in range(4):
            sd = _source(4 * i + d, g, logn)
            assert sd >> 2 == s >> 2 and sd & 3 == _br2((t + _br2(d) * g) & 3)


def test_the_model_is_the_reference_automorphism():
    """_source is the permutation of caramel.ring's automorphism (so the identity above is about the
    kernel's real index)."""
    ctx = Context(n=64)
    x = np.arange(64, dtype=np.uint32)
    for g in (3, 5, 25, 127):
        assert [int(v) for v in ctx.automorphism(x, g)] == [_source(j, g, 6) for j in range(64)]
