"""The warp tiles' shared-memory layout (caramel.backends.cuda.ntt: warp_tiles.cuh's wsidx, wsidx_a, wsidx_b), without
a GPU: a model of the three CUDA formulas (checked against the source's text) that every point has its own word, that
a 16-byte chunk stays whole, that the passes' forms agree with wsidx, and that the passes' shared-memory accesses are
free of bank conflicts; and that the warp tiles' twiddle tables (warp_table_index) hold what the passes read (the
kernels' results: test_cuda_kernels.py, test_cuda_epilogue.py)."""

from __future__ import annotations

import pytest

from caramel.backends.cuda.ntt import tables
from caramel.backends.cuda.ntt.common import WPITCH
from caramel.backends.cuda.ntt.transform import transform_source

BANKS = 32


def wsidx(x: int, p: int) -> int:
    return x * WPITCH + (p ^ (((p >> 5) & 3) << 2))


def wsidx_a(x: int, u: int, k: int) -> int:
    return x * WPITCH + 16 * k + (u ^ (((k >> 1) & 3) << 2))


def wsidx_b(x: int, g: int, c: int) -> int:
    return x * WPITCH + 16 * g + 4 * (c ^ ((g >> 1) & 3))


def test_the_model_is_the_source():
    src = transform_source(16, True)
    assert "return x * WPITCH + (p ^ (((p >> 5) & 3) << 2));" in src
    assert "return x * WPITCH + 16 * k + (u ^ (((k >> 1) & 3) << 2));" in src
    assert "return x * WPITCH + 16 * g + 4 * (c ^ ((g >> 1) & 3));" in src
    assert f"#define WPITCH {WPITCH}\n" in src


def test_every_point_its_own_word_and_chunks_whole():
    assert WPITCH % BANKS == 16 and WPITCH >= 256
    words = [wsidx(x, p) for x in range(4) for p in range(256)]
    assert len(set(words)) == 1024 and max(words) < 4 * WPITCH
    for x in range(4):
        assert all(x * WPITCH <= wsidx(x, p) < (x + 1) * WPITCH for p in range(256))
        for p in range(0, 256, 4):
            assert [wsidx(x, p + e) for e in range(4)] == [wsidx(x, p) + e for e in range(4)]
            assert wsidx(x, p) % 4 == 0  # 16-byte aligned


def test_the_passes_forms_are_wsidx():
    for x in range(4):
        for u in range(16):
            for k in range(16):
                assert wsidx_a(x, u, k) == wsidx(x, u + 16 * k)
        for g in range(16):
            for c in range(4):
                assert wsidx_b(x, g, c) == wsidx(x, 16 * g + 4 * c)


def test_no_bank_conflicts():
    """Pass A: a warp (rows x, x + 1 on its two halves, lane u of each) reads or writes point u + 16 k: 32 distinct
    banks. Pass B: 16-byte accesses go 8 lanes at a time; lanes g .. g + 7 of one row read chunk c of their groups:
    8 distinct groups of 4 banks."""
    for x in (0, 2):
        for k in range(16):
            banks = {wsidx_a(x + (lane >> 4), lane & 15, k) % BANKS for lane in range(32)}
            assert len(banks) == 32
        for c in range(4):
            for lane0 in range(0, 32, 8):
                lanes = range(lane0, lane0 + 8)
                assert len({wsidx_b(x + (lane >> 4), lane & 15, c) % BANKS // 4 for lane in lanes}) == 8


def test_the_programs_loads():
    """An epilogue kernel's program reads its transformed operands one residue a thread (a warp: points 32 w .. + 31
    of row c) or in 16-byte words (8 lanes: points 4 e of row e / 64): without conflicts."""
    one = [len({wsidx(row, 32 * w + lane) % BANKS for lane in range(32)}) for row in range(4) for w in range(8)]
    words = [len({wsidx(e >> 6, (e & 63) * 4) % BANKS // 4 for e in range(e0, e0 + 8)}) for e0 in range(0, 256, 8)]
    assert (min(one), min(words)) == (32, 8)


@pytest.mark.parametrize("a_bits", [5, 8])
@pytest.mark.parametrize("sf", [4, 5, 6, 7, 8])
def test_warp_tables_hold_what_the_passes_read(a_bits, sf):
    """Every read of wpass from its warp's table wt, at the offset the kernel computes, finds the twiddle index that
    ntt_pass's formula gives: stage s < SFT of row x (bt = bt0 + x), group g, j < 2^d (d = s - 4 in pass B, else g = 0
    and d = s): wt[4 (2^s - 1) + (x << s) + (g << d) + j] is (bt << s) + (g << d) + j; a split stage s >= sf reads its
    row factor bt << s at wt[4 (2^SFT - 1) + 4 (s - sf) + x]."""
    index = tables.warp_table_index(a_bits, sf)
    sft = min(sf, 6)
    assert index.shape == ((1 << a_bits) // 4, tables.warp_table_entries(sf))
    assert index.min() >= 1 << a_bits and index.max() < 1 << (a_bits + 8)
    reads = 0
    for tile, wt in enumerate(index):
        bt0 = (1 << a_bits) + 4 * tile
        for x in range(4):
            for s in range(8):
                d = s - 4 if s >= 4 else s
                for g in range(16 if s >= 4 else 1):
                    if s < sft:
                        for j in range(1 << d):
                            assert wt[4 * ((1 << s) - 1) + (x << s) + (g << d) + j] == ((bt0 + x) << s) + (g << d) + j
                            reads += 1
                    elif s >= sf:
                        assert wt[4 * ((1 << sft) - 1) + 4 * (s - sf) + x] == (bt0 + x) << s
    assert reads > 0
