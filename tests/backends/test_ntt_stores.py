"""The NTT kernels' stores and their L2 eviction priority (caramel.backends.cuda.ntt.EVICT_LAST, store16), without a
GPU: which stores go through store16, what it emits, and that the kernels' cache keys follow the switch (the results
under the default: test_cuda_kernels.py and test_cuda_ntt_prologue.py on a GPU)."""

from __future__ import annotations

import re

import pytest

from caramel.backends.cuda import ntt as dntt


def store16_body(source: str) -> str:
    start = source.index("__device__ __forceinline__ void store16(")
    return source[start:source.index("\n}\n", start)]


@pytest.mark.parametrize("on", [True, False])
def test_store16_is_evict_last_when_switched_on(on, monkeypatch):
    monkeypatch.setattr(dntt, "EVICT_LAST", on)
    src = dntt._source(16)
    assert f"#define EVICT_LAST {int(on)}" in src
    body = store16_body(src)
    # evict-first first (FUSED_CS), then the evict-last policy and the hinted store, else a plain store
    assert body.index("__stcs") < body.index("createpolicy.fractional.L2::evict_last") < body.index("*p = v")
    assert "st.global.L2::cache_hint.v4.u32" in body


@pytest.mark.parametrize("logn", [13, 16])
def test_every_pass_store_goes_through_store16(logn):
    """The column, row and prologue column kernels write the arena only through store16 (so EVICT_LAST covers them):
    no direct 16-byte store to ``dst``."""
    sources = [dntt._source(logn), dntt._prologue_source(logn, 1, 0, True)]
    for src in sources:
        assert not re.search(r"\*\s*\(\s*uint4\s*\*\s*\)\s*\(\s*dst\b[^;]*=", src)
        assert "store16<" in src


def test_cache_keys_follow_the_switch(monkeypatch):
    keys = set()
    for on in (True, False):
        monkeypatch.setattr(dntt, "EVICT_LAST", on)
        keys.add(dntt.epilogue_settings())
    assert len(keys) == 2
