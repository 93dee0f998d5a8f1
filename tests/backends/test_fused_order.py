"""The order of a one-kernel transform's items (caramel.backends.cuda.ntt.fused.fused_item, mirrored by the kernel):
every item once, and every second-pass item after all first-pass items of its limb, so that a block that waits
only waits for blocks that started before it (no deadlock)."""

from __future__ import annotations

import pytest

from caramel.backends.cuda.ntt import fused, tables


@pytest.mark.parametrize("rows", [1, 2, 5, 47, 130])
@pytest.mark.parametrize("lag", [1, 3, 48, 1000])
@pytest.mark.parametrize("p,q", [(8, 8), (8, 1), (1, 8), (8, 2)])
def test_every_item_once_and_after_its_limb(rows, lag, p, q):
    items = [fused.fused_item(t, rows, lag, p, q) for t in range(rows * (p + q))]
    assert sorted(items) == sorted([(True, limb, k) for limb in range(rows) for k in range(p)]
                                   + [(False, limb, k) for limb in range(rows) for k in range(q)])
    last_first = {}
    for t, (first, limb, _) in enumerate(items):
        if first:
            last_first[limb] = t
        else:
            assert limb in last_first and last_first[limb] < t, (limb, t)


@pytest.mark.parametrize("lag", [1, 3, 48])
def test_second_pass_trails_by_lag(lag):
    """In the steady state the second pass of limb k - lag follows the first pass of limb k."""
    rows, p, q = 100, 8, 8
    items = [fused.fused_item(t, rows, lag, p, q) for t in range(rows * (p + q))]
    t = p * lag + 10 * (p + q)  # step lag + 10: limb lag + 10 first, then limb 10 second
    assert items[t] == (True, lag + 10, 0)
    assert items[t + p] == (False, 10, 0)


def test_shapes():
    """(row items, column tiles) of a limb: the first pass's and the second's."""
    assert fused.fused_items(16) == (8, 8)
    assert fused.fused_items(13) == (1, 8)
    assert fused.counter_words(7) == 8
    assert fused.fused_smem(16, 5) >= 4 * (32 * 256 + 2 * 256)  # a column tile and its twiddles (COL_SMEM) fit
    assert fused.fused_smem(16, 5) == tables.warp_smem(8, 5)
