"""The warp tiles' twiddle tables and the shared memory of the kernels that hold tiles.

A row pass (the row kernels, the one-kernel transforms' row items, the epilogues) reads the twiddles of stage s of
row bt as one table entry tw[(bt << s) + i] (stages below its first split stage SF) or as the product of a row
factor tw[bt << s] and a factor tw[i] shared by all rows (stages SF and later): psi^br(x + y) = psi^br(x) psi^br(y)
when x and y have no common bit. Both come from :func:`warp_tables`, copied into shared memory with cp.async beside
the data (warp_tiles.cuh: WARP_TABLE).
"""

from __future__ import annotations

import weakref

import numpy as np

from caramel.backends.cuda.context import CudaRing, cupy
from caramel.backends.cuda.ntt.common import COLS, ROW_LOG, WPITCH
from caramel.backends.cuda.transfer import settled

#: Entry e of a prime's split-factor table for the warp-tile row kernels is tw[TL_INDEX[e]]: stage 4 + d
#: (d < 4) of pass B reads tw[(g << d) + j] (j < 2^d) at entry 16 (2^d - 1) + 16 j + g, so that the 16
#: lanes g of a row read 16 consecutive entries.
TL_INDEX = tuple(((e - 16 * ((1 << d) - 1)) & 15) << d | (e - 16 * ((1 << d) - 1)) >> 4
                 for d in range(4) for e in range(16 * ((1 << d) - 1), 16 * ((1 << (d + 1)) - 1)))
_TABLES: "weakref.WeakKeyDictionary[CudaRing, dict]" = weakref.WeakKeyDictionary()


def split_stage(split_from: int) -> int:
    """The first split stage SF of a row pass: ``split_from`` clamped to 4 .. 8 (they split in pass B only; 8: none).
    Its warp tables hold the stages below SFT = min(SF, 6)."""
    return min(max(int(split_from), 4), 8)


def warp_table_entries(sf: int) -> int:
    """WT: the entries of a warp tile's table wt (8 bytes each) with split stages from ``sf``."""
    return 4 * ((1 << min(sf, 6)) - 1) + 4 * (8 - sf)


def warp_table_index(a_bits: int, sf: int) -> np.ndarray:
    """The twiddle indices of every warp tile's table wt (tiles, WT) of a ring with 2^a_bits rows of 256 points and
    split stages from ``sf`` (SFT = min(sf, 6)): tile t (rows bt0 = 2^a_bits + 4 t ..) holds at 4 (2^s - 1) + j the
    one-product twiddle (bt0 << s) + j of stage s < SFT (j < 4 2^s: its 4 rows' 2^s each), then at
    4 (2^SFT - 1) + e the row factor (bt0 + e mod 4) << (sf + e // 4) of split stage sf + e // 4."""
    sft = min(sf, 6)
    bt0 = (1 << a_bits) + 4 * np.arange((1 << a_bits) // 4, dtype=np.int64)[:, None]
    parts = [(bt0 << s) + np.arange(4 << s) for s in range(sft)]
    e = np.arange(4 * (8 - sf))
    parts.append((bt0 + (e & 3)) << (sf + (e >> 2)))
    return np.concatenate(parts, axis=1)


def warp_tables(ring: CudaRing, inverse: bool, sf: int):
    """The row passes' tables of ``ring`` (forward or inverse twiddles), built on first use (like ``ring.twiddles``:
    before any graph capture): a row a prime of 240 + TILES WT entries (WT: warp_table_entries(sf), TILES: the warp
    tiles of a limb), its split-factor table tl (the twiddles at TL_INDEX), then every warp tile's table wt
    (warp_table_index), each a contiguous range that the kernels copy as it is (WARP_TABLE)."""
    tables = _TABLES.setdefault(ring, {})
    if (inverse, sf) not in tables:
        cp = cupy()
        tw = ring.twiddles[1 if inverse else 0]
        index = np.concatenate([np.asarray(TL_INDEX, dtype=np.int64),
                                warp_table_index(ring.logn - ROW_LOG, sf).reshape(-1)])
        tables[inverse, sf] = settled(cp.ascontiguousarray(tw[:, cp.asarray(index)]))
    return tables[inverse, sf]


def warp_smem(warps: int, sf: int) -> int:
    """Dynamic shared memory of ``warps`` warp tiles: the table tl (240 entries of 8 bytes), then per warp its 4 rows
    (4 WPITCH words) and its table wt (WT entries)."""
    return 8 * 240 + warps * (4 * 4 * WPITCH + 8 * warp_table_entries(sf))


def col_smem_words(a_bits: int) -> int:
    """COL_SMEM: the shared-memory words of a column tile of 2^a_bits-point columns, 32 of them, and of the column
    twiddles after it (2^a_bits entries of two words, passes.cuh: col_twiddles)."""
    return (COLS << a_bits) + 2 * (1 << a_bits)
