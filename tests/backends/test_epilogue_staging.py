"""Which plain operands an NTT epilogue kernel stages in shared memory (caramel.backends.cuda.ntt.epilogue_staged)
and the source that copies and reads them, without a GPU (the kernels' results: test_cuda_epilogue.py)."""

from __future__ import annotations

import re

import pytest

from caramel.backends.cuda import ntt as dntt
from caramel.backends.cuda.elementwise import FusedOp, FusedProgram


def program(f: int, p: int) -> FusedProgram:
    """sum_k t_k y_(k mod p) + y_0 over transformed t_0 .. t_(f-1) and plain y_0 .. y_(p-1)."""
    ops, acc = [], None
    for k in range(f):
        ops.append(FusedOp("mul", (k, f + k % p)))
        prod = f + p + len(ops) - 1
        if acc is not None:
            ops.append(FusedOp("add", (acc, prod)))
            prod = f + p + len(ops) - 1
        acc = prod
    ops.append(FusedOp("add", (acc, f)))
    return FusedProgram(f + p, 0, tuple(ops), (f + p + len(ops) - 1,), transformed=tuple(range(f)))


@pytest.mark.parametrize("f", range(1, dntt.EPILOGUE_MAX + 1))
@pytest.mark.parametrize("blocks", [2, 3])
def test_staged_operands_fit_beside_the_tiles(f, blocks):
    """One group a block (F >= 5 at 8 warps): the first plain operands, as many as fit with ``blocks`` blocks on a
    multiprocessor; with several groups none."""
    plain = tuple(range(f, f + 20))
    staged = dntt.epilogue_staged(tuple(range(f)), plain, blocks)
    assert staged == plain[: len(staged)]
    if dntt.epilogue_groups(f) > 1:
        assert staged == ()
        return
    if blocks * (dntt.epilogue_smem(f) + 1024) > dntt.SMEM_SM:  # the tiles alone do not fit so many blocks
        assert staged == ()
        return
    smem = dntt.epilogue_smem(f, len(staged))
    assert blocks * (smem + 1024) <= dntt.SMEM_SM
    assert len(staged) == len(plain) or blocks * (smem + 4096 + 1024) > dntt.SMEM_SM  # all, or one more would not fit


def test_no_staging_when_switched_off(monkeypatch):
    monkeypatch.setattr(dntt, "EPILOGUE_STAGE", False)
    assert dntt.epilogue_staged((0, 1, 2, 3, 4, 5, 6, 7), (8, 9), 2) == ()
    src = program(8, 2).source(16, True, 2)
    assert "cp_async16(stage" not in src and "(stage +" not in src and "cp_async_wait<1>" not in src


@pytest.mark.parametrize("scalar", [True, False])
@pytest.mark.parametrize("f,p,blocks", [(8, 6, 2), (5, 10, 3), (14, 18, 2), (16, 2, 2), (12, 4, 3)])
def test_source_copies_each_staged_operand_once_and_reads_it_from_shared_memory(f, p, blocks, scalar, monkeypatch):
    monkeypatch.setattr(dntt, "EPILOGUE_SCALAR_FROM", 5 if scalar else 99)
    prog = program(f, p)
    staged = dntt.epilogue_staged(prog.transformed, prog.plain(), blocks)
    src = prog.source(16, True, blocks)
    for k in prog.plain():
        copies = re.findall(rf"cp_async16\(stage \+ \d+ \+ 4 \* threadIdx\.x, arena \+ \(u64\)vec_slots\[r \* {f + p} "
                            rf"\+ {k}\]", src)
        if scalar:  # one residue a thread: point pe of the group
            from_stage = re.findall(rf"const u32 x{k} = stage\[(\d+) \+ pe\]", src)
            from_memory = re.findall(rf"const u32 x{k} = arena\[", src)
        else:
            from_stage = re.findall(rf"const uint4 x{k} = \*\(const uint4\*\)\(stage \+ (\d+) \+ 4 \* e\)", src)
            from_memory = re.findall(rf"const uint4 x{k} = \(\(const uint4\*\)arena\)", src)
        if k in staged:
            assert len(copies) == 1 and from_stage == [str(1024 * staged.index(k))] and not from_memory
        else:
            assert not copies and not from_stage and len(from_memory) == 1
    # the tables' group is waited for before the row passes, the staged one after them
    assert ("cp_async_wait<1>()" in src) == bool(staged)
    assert src.count("cp_async_wait<0>()") == 1


@pytest.mark.parametrize("f", range(1, dntt.EPILOGUE_MAX + 1))
def test_one_residue_a_thread_with_one_group(f, monkeypatch):
    """With one group a block the program runs one residue a thread (4 passes over the group), else 16-byte words;
    off, always words."""
    src = program(f, 3).source(16, True, 2)
    scalar = dntt.epilogue_groups(f) == 1
    assert dntt.epilogue_scalar(f) == scalar
    assert ("const int pe = 256 * c + threadIdx.x" in src) == scalar
    assert ("const int i = (G * tile + g) * 256 + e" in src) == (not scalar)
    monkeypatch.setattr(dntt, "EPILOGUE_SCALAR_FROM", dntt.EPILOGUE_MAX + 1)
    assert "const int pe =" not in program(f, 3).source(16, True, 2)


@pytest.mark.parametrize("f", range(1, dntt.EPILOGUE_MAX + 1))
def test_shared_memory_layout(f):
    """tl, one table a group (copied by its first warp), one warp tile a row pass: the kernel's offsets and
    epilogue_smem agree; three blocks fit up to 16 transformed operands (13 with the padded tiles)."""
    sf = dntt.warp_split_from(dntt.EPILOGUE_SPLIT_FROM, False)
    wt = 4 * ((1 << min(sf, 6)) - 1) + 4 * (8 - sf)  # _EPILOGUE's WT
    assert dntt.warp_table_entries(sf) == wt
    g = dntt.epilogue_groups(f)
    assert dntt.epilogue_smem(f) == 8 * 240 + g * 8 * wt + f * g * 16 * dntt.wpitch()
    assert dntt.epilogue_smem(f, 2) == dntt.epilogue_smem(f) + 8192
    assert dntt.epilogue_fits(f, 3) == (f <= (16 if dntt.TILE_SWIZZLE else 13))
    assert dntt.epilogue_fits(f, 2)
    src = program(f, 3).source(16, True, 2)
    assert "wtile_table<WT>(wt, WARP_TABLE(tl_all, pi, G * tile + grp, WT), lane)" in src
    assert "u32* tbase = dyn + 480 + G * 2 * WT" in src


@pytest.mark.parametrize("f", range(1, dntt.EPILOGUE_MAX + 1))
def test_row_pairs_dealt_over_the_warps(f, monkeypatch):
    """With one group a block and F not a multiple of the warps, the kernel deals its 2 F row pairs over the warps."""
    src = program(f, 3).source(16, True, 2)
    assert "constexpr bool BALANCE = true && G == 1 && S % 8 != 0;" in src
    assert f"constexpr int G = {dntt.epilogue_groups(f)}, S = F * G" in src and f"F = {f};" in src
    monkeypatch.setattr(dntt, "EPILOGUE_BALANCE", False)
    assert "constexpr bool BALANCE = false" in program(f, 3).source(16, True, 2)
