"""The host side of caramel.backends.cuda.transfer (no GPU needed): the split copy out of a pinned buffer."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.backends.cuda import transfer


@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 4097, 1 << 16])
def test_split_copy_equals_assignment(monkeypatch, n):
    monkeypatch.setattr(transfer, "PARALLEL_COPY_BYTES", 1024)
    monkeypatch.setattr(transfer, "FILL_THREADS", 3)  # odd parts, on any machine
    src = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    dst = np.zeros(n, dtype=np.uint8)
    transfer._copy(dst, src)
    assert np.array_equal(dst, src)
