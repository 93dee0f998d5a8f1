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
    assert blocks * (smem + 4096 + 1024) > dntt.SMEM_SM  # one more would not fit (20 were offered)


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


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("f", range(1, dntt.EPILOGUE_MAX + 1))
def test_shared_memory_layout(f, full, monkeypatch):
    """tl (split stages only), one table a group, one warp tile a row pass: the kernel's offsets and epilogue_smem
    agree. With several groups a block each group's first warp copies the table of the stages below the split; with
    one group and EPILOGUE_FULL_TABLE every thread copies the full table (every stage, no tl), and three blocks fit
    up to 12 transformed operands (13 with the split table)."""
    monkeypatch.setattr(dntt, "EPILOGUE_FULL_TABLE", full)
    sf, sft = dntt.epilogue_table(f)
    g = dntt.epilogue_groups(f)
    assert (sf, sft) == ((8, 8) if full and g == 1 else (dntt.EPILOGUE_SPLIT_FROM, min(dntt.EPILOGUE_SPLIT_FROM, 6)))
    wt = 4 * ((1 << sft) - 1) + 4 * (8 - sf)  # _EPILOGUE's WT
    assert dntt.warp_table_entries(sf, sft) == wt and (sft == 8) == (wt == 1020)
    tl = 8 * 240 if sf < 8 else 0
    assert dntt.epilogue_smem(f) == tl + g * 8 * wt + f * g * 16 * dntt.WPITCH
    assert dntt.epilogue_smem(f, 2) == dntt.epilogue_smem(f) + 8192
    assert dntt.epilogue_fits(f, 3) == (f <= (12 if full else 13))
    assert dntt.epilogue_fits(f, 2)
    src = program(f, 3).source(16, True, 2)
    assert f"constexpr int SF = {sf}, SFT = {sft}," in src and "u32* tbase = dyn + TLW + G * 2 * WT" in src
    assert "constexpr int TLW = SF < 8 ? 480 : 0;" in src
    assert ("-ft1" in dntt.epilogue_settings()) == full  # part of the kernels' cache key


def test_full_table_layout():
    """wtile_table_full's copies (entry e of the 1020 to wt[4 (2^s - 1) + 2^s x + k]) fill each slot once, and the
    row passes' reads (wpass with SFT = 8: pass A wt[4 (2^s - 1) + 2^s x + j], pass B wt[4 (2^s - 1) + 2^s x + g +
    16 j]) find tw[((bt0 + x) << s) + (g << d) + j]: a model of the two index formulas of the CUDA source (the GPU
    tests run the kernels), with pass B's 16 lanes g reading 16 consecutive entries."""
    bt0 = 256 + 4 * 5
    wt = [None] * 1020
    for e in range(1020):
        s = ((e >> 2) + 1).bit_length() - 1  # 31 - __clz((e >> 2) + 1)
        o = e - 4 * ((1 << s) - 1)
        d, i = s - 4, o & ((1 << s) - 1)
        k = i if s < 4 else 16 * (i & ((1 << d) - 1)) + (i >> d)
        at = 4 * ((1 << s) - 1) + (o - i) + k
        assert wt[at] is None
        wt[at] = (bt0 << s) + o
    assert None not in wt
    for s0 in (0, 4):
        for d in range(4):
            s = s0 + d
            for x in range(4):
                for j in range(1 << d):
                    reads = []
                    for g in range(16 if s0 == 4 else 1):
                        at = 4 * ((1 << s) - 1) + (x << s) + (g + 16 * j if s0 == 4 else j)
                        assert wt[at] == ((bt0 + x) << s) + (g << d) + j
                        reads.append(at)
                    assert reads == list(range(reads[0], reads[0] + len(reads)))
    src = program(8, 3).source(16, True, 2)
    assert "const int k = s < 4 ? i : 16 * (i & ((1 << d) - 1)) + (i >> d);" in src
    assert "wts[SFT == 8 && S0 == 4 ? 16 * j : j]" in src


@pytest.mark.parametrize("f", range(1, dntt.EPILOGUE_MAX + 1))
def test_row_pairs_dealt_over_the_warps(f, monkeypatch):
    """With one group a block and F not a multiple of the warps, the kernel deals its 2 F row pairs over the warps."""
    src = program(f, 3).source(16, True, 2)
    assert "constexpr bool BALANCE = true && G == 1 && S % 8 != 0;" in src
    assert f"constexpr int G = {dntt.epilogue_groups(f)}, S = F * G" in src and f"F = {f};" in src
    monkeypatch.setattr(dntt, "EPILOGUE_BALANCE", False)
    assert "constexpr bool BALANCE = false" in program(f, 3).source(16, True, 2)
