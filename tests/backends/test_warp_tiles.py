"""The warp tiles' shared-memory layouts (caramel.backends.cuda.ntt: wsidx, wsidx_a, wsidx_b, TILE_SWIZZLE), without a
GPU: a model of the three CUDA formulas (checked against the source's text) that every point has its own word, that
a 16-byte chunk stays whole, that the passes' forms agree with wsidx, and that the passes' shared-memory accesses are
free of bank conflicts in both layouts; and that the warp tiles' twiddle tables (warp_table_index) hold what the passes
read (the kernels' results: test_cuda_kernels.py, test_cuda_epilogue.py)."""

from __future__ import annotations

import pytest

from caramel.backends.cuda import ntt as dntt

BANKS = 32


def wsidx(x: int, p: int, swizzle: bool) -> int:
    return x * dntt.wpitch(swizzle) + (p ^ (((p >> 5) & 3) << 2) if swizzle else p + ((p >> 4) << 2))


def wsidx_a(x: int, u: int, k: int, swizzle: bool) -> int:
    return x * dntt.wpitch(swizzle) + 16 * k + (u ^ (((k >> 1) & 3) << 2) if swizzle else u + 4 * k)


def wsidx_b(x: int, g: int, c: int, swizzle: bool) -> int:
    return x * dntt.wpitch(swizzle) + (16 * g + 4 * (c ^ ((g >> 1) & 3)) if swizzle else 20 * g + 4 * c)


def test_the_model_is_the_source():
    src = dntt._source(16)
    assert "return x * WPITCH + (SWIZZLE ? p ^ (((p >> 5) & 3) << 2) : p + ((p >> 4) << 2));" in src
    assert "return x * WPITCH + 16 * k + (SWIZZLE ? u ^ (((k >> 1) & 3) << 2) : u + 4 * k);" in src
    assert "return x * WPITCH + (SWIZZLE ? 16 * g + 4 * (c ^ ((g >> 1) & 3)) : 20 * g + 4 * c);" in src
    for swizzle in (True, False):
        head = dntt._source(16, swizzle=swizzle)
        assert f"#define WPITCH {dntt.wpitch(swizzle)}\n#define SWIZZLE {int(swizzle)}\n" in head


@pytest.mark.parametrize("swizzle", [True, False])
def test_every_point_its_own_word_and_chunks_whole(swizzle):
    pitch = dntt.wpitch(swizzle)
    assert pitch % BANKS == 16 and pitch >= 256
    words = [wsidx(x, p, swizzle) for x in range(4) for p in range(256)]
    assert len(set(words)) == 1024 and max(words) < 4 * pitch
    for x in range(4):
        assert all(x * pitch <= wsidx(x, p, swizzle) < (x + 1) * pitch for p in range(256))
        for p in range(0, 256, 4):
            assert [wsidx(x, p + e, swizzle) for e in range(4)] == [wsidx(x, p, swizzle) + e for e in range(4)]
            assert wsidx(x, p, swizzle) % 4 == 0  # 16-byte aligned


@pytest.mark.parametrize("swizzle", [True, False])
def test_the_passes_forms_are_wsidx(swizzle):
    for x in range(4):
        for u in range(16):
            for k in range(16):
                assert wsidx_a(x, u, k, swizzle) == wsidx(x, u + 16 * k, swizzle)
        for g in range(16):
            for c in range(4):
                assert wsidx_b(x, g, c, swizzle) == wsidx(x, 16 * g + 4 * c, swizzle)


@pytest.mark.parametrize("swizzle", [True, False])
def test_no_bank_conflicts(swizzle):
    """Pass A: a warp (rows x, x + 1 on its two halves, lane u of each) reads or writes point u + 16 k: 32 distinct
    banks. Pass B: 16-byte accesses go 8 lanes at a time; lanes g .. g + 7 of one row read chunk c of their groups:
    8 distinct groups of 4 banks."""
    for x in (0, 2):
        for k in range(16):
            banks = {wsidx_a(x + (lane >> 4), lane & 15, k, swizzle) % BANKS for lane in range(32)}
            assert len(banks) == 32
        for c in range(4):
            for lane0 in range(0, 32, 8):
                lanes = range(lane0, lane0 + 8)
                assert len({wsidx_b(x + (lane >> 4), lane & 15, c, swizzle) % BANKS // 4 for lane in lanes}) == 8


@pytest.mark.parametrize("swizzle", [True, False])
def test_the_programs_loads(swizzle):
    """An epilogue kernel's program reads its transformed operands one residue a thread (a warp: points 32 w .. + 31
    of row c) or in 16-byte words (8 lanes: points 4 e of row e / 64): without conflicts in the swizzled layout; the
    padded one puts some of them on a bank twice."""
    one = [len({wsidx(row, 32 * w + lane, swizzle) % BANKS for lane in range(32)})
           for row in range(4) for w in range(8)]
    words = [len({wsidx(e >> 6, (e & 63) * 4, swizzle) % BANKS // 4 for e in range(e0, e0 + 8)})
             for e0 in range(0, 256, 8)]
    assert (min(one), min(words)) == ((32, 8) if swizzle else (28, 7))


def test_the_swizzled_tiles_are_smaller():
    """A warp tile: 4 rows of 272 words (4352 bytes) against 336 (5376 bytes)."""
    assert dntt.wpitch(True) == 272 and dntt.wpitch(False) == 336
    assert dntt.warp_smem(4, 5, True) == dntt.warp_smem(4, 5, False) - 4 * 4 * 4 * (336 - 272)


@pytest.mark.parametrize("a_bits", [5, 8])
@pytest.mark.parametrize("sf", [4, 5, 6, 7, 8])
def test_warp_tables_hold_what_the_passes_read(a_bits, sf):
    """Every read of wpass from its warp's table wt, at the offset the kernel computes, finds the twiddle index that
    ntt_pass's formula gives: stage s < SFT of row x (bt = bt0 + x), group g, j < 2^d (d = s - 4 in pass B, else g = 0
    and d = s): wt[4 (2^s - 1) + (x << s) + (g << d) + j] is (bt << s) + (g << d) + j; a split stage s >= sf reads its
    row factor bt << s at wt[4 (2^SFT - 1) + 4 (s - sf) + x]."""
    index = dntt.warp_table_index(a_bits, sf)
    sft = min(sf, 6)
    assert index.shape == ((1 << a_bits) // 4, dntt.warp_table_entries(sf))
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
