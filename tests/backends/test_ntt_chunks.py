"""The row ranges of a chunked NTT launch (caramel.backends.cuda.ntt.row_chunks), on the CPU."""

from __future__ import annotations

import pytest

from caramel.backends.cuda.ntt import row_chunks


@pytest.mark.parametrize("rows", [1, 5, 63, 64, 65, 200, 931])
@pytest.mark.parametrize("chunk", [0, 1, 7, 64, 96, 1000])
def test_ranges_cover_the_rows_once_in_order_and_evenly(rows, chunk):
    parts = row_chunks(rows, chunk)
    covered = [i for p in parts for i in range(p.start, p.stop)]
    assert covered == list(range(rows))
    sizes = [p.stop - p.start for p in parts]
    if chunk <= 0 or rows <= chunk:
        assert sizes == [rows]
    else:
        assert len(parts) == -(-rows // chunk) and max(sizes) <= chunk
        assert all(s == sizes[0] for s in sizes[:-1]) and 0 < sizes[-1] <= sizes[0]
