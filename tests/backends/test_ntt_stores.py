"""The NTT kernels' stores and their L2 eviction priority (caramel.backends.cuda.ntt: passes.cuh's store16), without
a GPU: which stores go through store16 and what it emits (the results: test_cuda_kernels.py and
test_cuda_ntt_prologue.py on a GPU)."""

from __future__ import annotations

import re

import pytest

from caramel.backends.cuda.ntt.prologue import prologue_source
from caramel.backends.cuda.ntt.transform import transform_source


def store16_body(source: str) -> str:
    start = source.index("__device__ __forceinline__ void store16(")
    return source[start:source.index("\n}\n", start)]


def test_store16_is_evict_first_or_evict_last():
    """Evict-first (the one-kernel inverse's last pass), else under an evict-last policy; never a plain store."""
    body = store16_body(transform_source(16, True))
    assert body.index("__stcs") < body.index("createpolicy.fractional.L2::evict_last")
    assert "st.global.L2::cache_hint.v4.u32" in body and "*p = v" not in body


@pytest.mark.parametrize("logn", [13, 16])
def test_every_pass_store_goes_through_store16(logn):
    """The column, row and prologue column kernels write the arena only through store16: no direct 16-byte store to
    ``dst``."""
    for src in (transform_source(logn, True), prologue_source(logn, 1, 0, True, True)):
        assert not re.search(r"\*\s*\(\s*uint4\s*\*\s*\)\s*\(\s*dst\b[^;]*=", src)
        assert "store16<" in src
