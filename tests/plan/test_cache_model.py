"""The cache model of a plan (caramel.plan.cache_model): an LRU cache of limbs over the plan's accesses, NTT
and INTT as two passes (on the CUDA target the NTT's as two kernels, the INTT's row by row)."""

from __future__ import annotations

import pytest

from caramel.backends.cuda.target import CUDA_TARGET as CUDA
from caramel.plan import build_plan, plan_report
from caramel.plan.cache_model import accesses, chip_traffic, plan_traffic
from caramel.plan.report import cache_model_stats
from caramel.target import NEUTRAL

from plan_helpers import load_corpus, program_from_text


def ntt_program(limbs: int = 4):
    """``limbs`` loads, one NTT of each, every result stored: one NTT kernel of ``limbs`` rows."""
    lines = [f"load r{l}: i1({l})" for l in range(limbs)]
    lines += [f"ntt r{10 + l}: r{l} | {l}" for l in range(limbs)]
    lines += [f"store r{10 + l}: v1({l})" for l in range(limbs)]
    return program_from_text("\n".join(lines))


def test_an_ntt_is_two_passes_over_its_outputs():
    chip = build_plan(ntt_program()).chips[0]
    (kernel,) = chip.kernels
    outs = [r.outs[0] for r in kernel.rows]
    seq = list(accesses(chip, CUDA))
    assert seq[:8] == [x for r in kernel.rows for x in ((False, r.ins[0]), (True, r.outs[0]))]
    assert seq[8:] == [x for b in outs[::-1] for x in ((False, b), (True, b))]
    # on a target that runs it as one kernel, each row's second pass follows its first
    assert list(accesses(chip, NEUTRAL)) == [x for r in kernel.rows for x in ((False, r.ins[0]), (True, r.outs[0]),
                                                                             (False, r.outs[0]), (True, r.outs[0]))]


def test_an_intt_is_one_kernel_row_by_row():
    """The CUDA backend runs the INTT as one kernel: each row's second pass follows its first (plan.order.write_order
    has the INTT finish its rows in order); with a cache of one limb beyond the row's input and output, every
    second-pass read hits."""
    lines = [f"load r{l}: i1({l})" for l in range(4)] + [f"int r{10 + l}: r{l} | {l}" for l in range(4)]
    chip = build_plan(program_from_text("\n".join(lines + [f"store r{10 + l}: v1({l})" for l in range(4)]))).chips[0]
    (kernel,) = chip.kernels
    assert kernel.kind.value == "intt"
    want = [x for r in kernel.rows for x in ((False, r.ins[0]), (True, r.outs[0]), (False, r.outs[0]),
                                             (True, r.outs[0]))]
    assert list(accesses(chip, CUDA)) == want
    assert chip_traffic(chip, 2, CUDA).hits == 4


def test_the_reversed_second_pass_finds_the_last_limbs_in_the_cache():
    """4 limbs, a cache of 3: after the first pass it holds X2, x3, X3. Read last-first, X3 and X2 hit (read
    oldest-first, every second-pass read would miss: each miss evicts the limb needed next but two)."""
    chip = build_plan(ntt_program()).chips[0]
    assert chip_traffic(chip, 3, CUDA).hits == 2
    # a cache that holds everything: the second pass hits throughout, and each output is written back once
    big = chip_traffic(chip, 100, CUDA)
    assert (big.reads, big.hits, big.writes, big.writebacks) == (8, 4, 8, 4)
    assert big.memory == 4 + 4


@pytest.mark.parametrize("epilogue", [True, False])
def test_no_cache_is_the_plan_model_plus_the_second_pass(epilogue):
    """Capacity 0: every access goes to memory; that is the plan's traffic model plus one read and one write of
    each NTT/INTT output (the second pass), but of a half NTT's (its reader runs the second pass)."""
    plan = build_plan(load_corpus("BootstrapModRaise_4L_2c"), fuse_epilogue=epilogue)
    assert any(k.half for c in plan.chips for k in c.kernels) == epilogue
    none = plan_traffic(plan, 0, CUDA)
    assert none.hits == 0 and none.writebacks == none.writes
    two_pass = sum(2 * len(k.rows) for c in plan.chips for k in c.kernels
                   if k.kind.value in ("ntt", "intt") and not k.half)
    model = sum(k.traffic() for c in plan.chips for k in c.kernels)
    assert none.memory == model + two_pass


@pytest.mark.parametrize("name", ["Mul_4L_1c", "BootstrapModRaise_4L_2c", "PolyX8_4L_1c"])
def test_a_larger_cache_serves_no_fewer_reads(name):
    """LRU is a stack algorithm: a larger cache holds every limb a smaller one holds."""
    plan = build_plan(load_corpus(name))
    hits = [plan_traffic(plan, c, CUDA).hits for c in (0, 1, 4, 16, 64, 256, 10**6)]
    assert hits == sorted(hits) and hits[-1] > 0


def test_the_report_prints_the_model():
    """For the target's last-level cache (the plan's own by default); a target without one (the neutral) has no
    cache-model line."""
    plan = build_plan(load_corpus("Mul_4L_1c"), target=CUDA)
    stats = cache_model_stats(plan, CUDA, n=65536)
    assert stats["cache_bytes"] == 50 * 2**20 and stats["hit_bytes"] <= stats["read_bytes"]
    assert "cache model (LRU of 50.0 MiB" in plan_report(plan, n=65536)
    assert "cache model" not in plan_report(plan, n=65536, target=NEUTRAL)
