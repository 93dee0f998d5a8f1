"""An NTT epilogue kernel's source without a GPU (caramel.backends.cuda.ntt.epilogue): which plain operands it stages
in shared memory and how it copies and reads them, its shared-memory layout, one residue or one word a thread, and
its row pairs dealt over the warps (the kernels' results: test_cuda_epilogue.py)."""

from __future__ import annotations

import re

import pytest

from caramel.backends.cuda.config import EpilogueConfig
from caramel.backends.cuda.elementwise import epilogue_sources
from caramel.backends.cuda.ntt import epilogue as epi
from caramel.backends.cuda.ntt.common import SMEM_SM, WPITCH
from caramel.backends.cuda.ntt.tables import split_stage, warp_table_entries
from caramel.expr import Expr, ExprOp

DEFAULT = EpilogueConfig()


def program(f: int, p: int) -> Expr:
    """sum_k t_k y_(k mod p) + y_0 over transformed t_0 .. t_(f-1) and plain y_0 .. y_(p-1)."""
    ops, acc = [], None
    for k in range(f):
        ops.append(ExprOp("mul", (k, f + k % p)))
        prod = f + p + len(ops) - 1
        if acc is not None:
            ops.append(ExprOp("add", (acc, prod)))
            prod = f + p + len(ops) - 1
        acc = prod
    ops.append(ExprOp("add", (acc, f)))
    return Expr(f + p, 0, tuple(ops), (f + p + len(ops) - 1,), transformed=tuple(range(f)))


def source(expr: Expr, blocks: int, config: EpilogueConfig = DEFAULT) -> str:
    """The epilogue kernel's source (N = 65536) under the launch bound of ``blocks`` resident blocks."""
    (got, src), = epilogue_sources(expr, 16, True, EpilogueConfig(min_blocks=(blocks,),
                                                                  scalar_from=config.scalar_from))
    assert got == blocks
    return src


@pytest.mark.parametrize("f", range(1, epi.EPILOGUE_MAX + 1))
@pytest.mark.parametrize("blocks", [2, 3])
def test_staged_operands_fit_beside_the_tiles(f, blocks):
    """One group a block (F >= 5 at 8 warps): the first plain operands, as many as fit with ``blocks`` blocks on a
    multiprocessor; with several groups none."""
    plain = tuple(range(f, f + 20))
    staged = epi.epilogue_staged(tuple(range(f)), plain, blocks, DEFAULT)
    assert staged == plain[: len(staged)]
    if epi.epilogue_groups(f) > 1:
        assert staged == ()
        return
    if blocks * (epi.epilogue_smem(f, DEFAULT) + 1024) > SMEM_SM:  # the tiles alone do not fit so many blocks
        assert staged == ()
        return
    smem = epi.epilogue_smem(f, DEFAULT, len(staged))
    assert blocks * (smem + 1024) <= SMEM_SM
    assert len(staged) == len(plain) or blocks * (smem + 4096 + 1024) > SMEM_SM  # all, or one more would not fit


@pytest.mark.parametrize("scalar", [True, False])
@pytest.mark.parametrize("f,p,blocks", [(8, 6, 2), (5, 10, 3), (14, 18, 2), (16, 2, 2), (12, 4, 3)])
def test_source_copies_each_staged_operand_once_and_reads_it_from_shared_memory(f, p, blocks, scalar):
    config = EpilogueConfig(scalar_from=5 if scalar else 17)
    prog = program(f, p)
    staged = epi.epilogue_staged(prog.transformed, prog.plain(), blocks, config)
    src = source(prog, blocks, config)
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


@pytest.mark.parametrize("f", range(1, epi.EPILOGUE_MAX + 1))
def test_one_residue_a_thread_with_one_group(f):
    """With one group a block the program runs one residue a thread (4 passes over the group), else 16-byte words;
    with scalar_from past the most operands, always words."""
    src = source(program(f, 3), 2)
    scalar = epi.epilogue_groups(f) == 1
    assert epi.epilogue_scalar(f, DEFAULT) == scalar
    assert ("const int pe = 256 * c + threadIdx.x" in src) == scalar
    assert ("const int i = (G * tile + g) * 256 + e" in src) == (not scalar)
    assert "const int pe =" not in source(program(f, 3), 2, EpilogueConfig(scalar_from=epi.EPILOGUE_MAX + 1))


@pytest.mark.parametrize("f", range(1, epi.EPILOGUE_MAX + 1))
def test_shared_memory_layout(f):
    """tl, one table a group (copied by its first warp), one warp tile a row pass: the kernel's offsets and
    epilogue_smem agree; three blocks fit up to 16 transformed operands."""
    sf = split_stage(DEFAULT.split_from)
    wt = 4 * ((1 << min(sf, 6)) - 1) + 4 * (8 - sf)  # the kernel's WT
    assert warp_table_entries(sf) == wt
    g = epi.epilogue_groups(f)
    assert epi.epilogue_smem(f, DEFAULT) == 8 * 240 + g * 8 * wt + f * g * 16 * WPITCH
    assert epi.epilogue_smem(f, DEFAULT, 2) == epi.epilogue_smem(f, DEFAULT) + 8192
    assert epi.epilogue_fits(f, 3, DEFAULT) and epi.epilogue_fits(f, 2, DEFAULT)
    src = source(program(f, 3), 2)
    assert "wtile_table<WT>(wt, WARP_TABLE(tl_all, pi, G * tile + grp, WT), lane)" in src
    assert "u32* tbase = dyn + 480 + G * 2 * WT" in src


@pytest.mark.parametrize("f", range(1, epi.EPILOGUE_MAX + 1))
def test_row_pairs_dealt_over_the_warps(f):
    """With one group a block and F not a multiple of the warps, the kernel deals its 2 F row pairs over the warps;
    with several groups, each group's warps evaluate its rows on their own."""
    src = source(program(f, 3), 2)
    assert "constexpr bool BALANCE = G == 1 && S % 8 != 0;" in src and "constexpr bool APART = G > 1;" in src
    assert f"constexpr int G = {epi.epilogue_groups(f)}, S = F * G" in src and f"F = {f};" in src


def test_the_planners_limit_is_the_kernels():
    """The planner fuses at most MAX_TRANSFORMED operands into an epilogue: the kernel's two row passes a warp."""
    from caramel.expr import MAX_TRANSFORMED

    assert epi.EPILOGUE_MAX == MAX_TRANSFORMED == 2 * epi.EPILOGUE_WARPS


def test_launch_bounds_to_try():
    """An epilogue kernel tries the launch bounds whose blocks fit in shared memory, in order, and the last."""
    assert [b for b, _ in epilogue_sources(program(4, 3), 16, True)] == [4, 3, 2]
    assert [b for b, _ in epilogue_sources(program(16, 3), 16, True)] == [3, 2]  # four do not fit
    assert [b for b, _ in epilogue_sources(program(16, 3), 16, True, EpilogueConfig(min_blocks=(4,)))] == [4]
