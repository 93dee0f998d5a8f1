"""Fusion across NTT boundaries (issue 14 item 3, :func:`caramel.plan.fusion.fuse_ntt_loads`): which
NTT rows compute their input in the load, what disappears from the plan and the traffic model, the
off switch, the plan cache, and the fused plan on the NumPy backend against the unfused plan and the
reference interpreter in every arithmetic mode."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np
import pytest

from caramel.backends.numpy_backend import NumpyBackend, prologue_limbs
from caramel.execute.drive import run_plan
from caramel.execute.reference import run_reference
from caramel.plan import Kind, Row, build_plan, plan_report, plan_stats
from caramel.errors import ArgumentError
from caramel.plan.fusion import DEFAULT_NTT_LOADS, Unit, fuse_ntt_loads, ntt_load_kinds
from caramel.plan.kernel import Kernel, Prologue
from caramel.ring import Context, Mode

from plan_helpers import PROGRAMS, corpus, load_corpus, random_memory, store_mismatches

GIB = 2**30
FUSED_CORPUS = ["Mul_4L_1c", "Relin2_10L_2c", "BootstrapModRaise_10L_1c", "MulRotate_10L_8c", "PolyX8_4L_4c"]


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


def fused_rows(plan) -> Counter:
    return Counter(k.prologue.kind for c in plan.chips for k in c.kernels if k.prologue is not None
                   for _ in k.rows)


# --------------------------------------------------------------------------- the pass on units


def conv_unit(ins, outs, out_limbs, index=0) -> Unit:
    key = ((1, 2, 3), tuple(out_limbs))
    return Unit(Kind.BASECONV, key, Row(-1, tuple(ins), tuple(outs)), tuple(ins), tuple(outs), (index,))


def ntt_unit(src: int, dst: int, prime: int, index: int) -> Unit:
    return Unit(Kind.NTT, None, Row(prime, (src,), (dst,)), (src,), (dst,), (index,))


def test_only_limbs_read_once_and_not_stored_are_fused():
    e = Unit(Kind.ELEMENTWISE, "expr", Row(7, (11,), (30,)), (11,), (30,), (5,))
    units = [
        conv_unit((0, 1, 2), (10, 11, 12, 13), (7, 7, 8, 9)),
        ntt_unit(10, 20, 7, 1),  # read once: fused
        ntt_unit(11, 21, 7, 2),  # also read by the elementwise row: kept
        e,
        ntt_unit(12, 22, 8, 3),  # stored (pinned): kept
        ntt_unit(13, 23, 5, 4),  # on another prime than the conversion's output: kept
        Unit(Kind.SUD_LIFT, None, Row(4, (3,), (14,), (), 9), (3,), (14,), (6,)),
        ntt_unit(14, 24, 4, 7),  # the lift: fused, with its source prime
    ]
    out = fuse_ntt_loads(units, pinned={12})
    kinds = [u.kind for u in out]
    assert kinds.count(Kind.SUD_LIFT) == 0 and kinds.count(Kind.BASECONV) == 1
    conv = next(u for u in out if u.kind is Kind.BASECONV)
    assert conv.outs == (11, 12, 13) and conv.key == ((1, 2, 3), (7, 8, 9))  # output 10 left the conversion
    fused = {u.outs[0]: u for u in out if u.kind is Kind.NTT and u.key is not None}
    assert set(fused) == {20, 24}
    assert fused[20].key == Prologue(Kind.BASECONV, 3, (1, 2, 3)) and fused[20].ins == (0, 1, 2)
    assert fused[20].index == (0, 1)
    assert fused[24].key == Prologue(Kind.SUD_LIFT, 1) and fused[24].row.arg == 9 and fused[24].ins == (3,)
    plain = [u for u in out if u.kind is Kind.NTT and u.key is None]
    assert sorted(u.ins[0] for u in plain) == [11, 12, 13]


def test_a_conversion_whose_outputs_are_all_fused_disappears():
    units = [conv_unit((0, 1, 2), (10, 11), (4, 5)), ntt_unit(10, 20, 4, 1), ntt_unit(11, 21, 5, 2)]
    out = fuse_ntt_loads(units, pinned=set())
    assert [u.kind for u in out] == [Kind.NTT, Kind.NTT] and all(u.ins == (0, 1, 2) for u in out)


def test_a_limb_sent_to_another_chip_is_not_fused():
    from caramel.plan.kernel import Comm
    from caramel.program import Opcode

    comm = Comm(Opcode.DIS, 1, 2, 10, -1, 4)
    units = [conv_unit((0, 1, 2), (10,), (4,)), ntt_unit(10, 20, 4, 1),
             Unit(Kind.COMM, None, comm, (10,), (), (2,))]
    assert fuse_ntt_loads(units, pinned=set()) == units


def test_converting_load_traffic_counts_each_input_once():
    pro = Prologue(Kind.BASECONV, 3, (1, 2, 3))
    rows = tuple(Row(p, (0, 1, 2), (10 + p,)) for p in range(4))
    assert Kernel(Kind.NTT, rows, prologue=pro).traffic() == 3 + 4
    lift = Kernel(Kind.NTT, (Row(1, (0,), (5,), (), 2), Row(2, (1,), (6,), (), 2)), prologue=Prologue(Kind.SUD_LIFT, 1))
    assert lift.traffic() == 4


# --------------------------------------------------------------------------- whole plans


@pytest.mark.parametrize("name", FUSED_CORPUS)
def test_removed_limbs_were_written_once_read_once_and_not_stored(name):
    program = load_corpus(name)
    fused, plain = build_plan(program, fuse_ntt="all"), build_plan(program, fuse_ntt=False)
    assert fused_rows(fused), f"{name}: nothing fused"
    assert not fused_rows(plain)
    for cf, cp in zip(fused.chips, plain.chips):
        def buffers(chip):
            return {b for k in chip.kernels for b in k.reads() + k.writes()}

        gone = buffers(cp) - buffers(cf)
        assert gone and not gone & set(cp.stores.values())
        writer = {b: k for k in cp.kernels for b in k.writes()}
        readers = Counter(b for k in cp.kernels for r in (k.rows or ()) for b in set(r.ins))
        readers.update(c.src for k in cp.kernels for c in k.comms if c.src >= 0)
        ntt_inputs = {r.ins[0] for k in cp.kernels if k.kind is Kind.NTT for r in k.rows}
        for b in gone:
            assert writer[b].kind in (Kind.SUD_LIFT, Kind.MOD, Kind.BASECONV)
            assert readers[b] == 1 and b in ntt_inputs
        n_fused = sum(len(k.rows) for k in cf.kernels if k.prologue is not None)
        assert n_fused == len(gone)  # one limb less per fused row
        assert sum(len(k.rows) for k in cf.kernels if k.kind is Kind.NTT) == \
            sum(len(k.rows) for k in cp.kernels if k.kind is Kind.NTT)


def test_off_switch_and_unfused_plans_have_no_prologue():
    program = load_corpus("Mul_4L_1c")
    assert set(fused_rows(build_plan(program, fuse_ntt="all"))) == {Kind.BASECONV, Kind.SUD_LIFT}
    assert set(fused_rows(build_plan(program))) == {Kind.SUD_LIFT}  # the default loads: no conversion
    assert set(fused_rows(build_plan(program, fuse_ntt="baseconv"))) == {Kind.BASECONV}
    assert not fused_rows(build_plan(program, fuse_ntt=False))
    assert not fused_rows(build_plan(program, fuse_ntt="none"))
    assert not fused_rows(build_plan(program, fuse=False, fuse_ntt="all"))


def test_load_kinds_option():
    assert ntt_load_kinds(True) == DEFAULT_NTT_LOADS == {Kind.SUD_LIFT, Kind.MOD}
    assert ntt_load_kinds("all") == {Kind.SUD_LIFT, Kind.MOD, Kind.BASECONV}
    assert ntt_load_kinds(False) == ntt_load_kinds("none") == ntt_load_kinds("") == frozenset()
    assert ntt_load_kinds("mod, baseconv") == ntt_load_kinds([Kind.MOD, "baseconv"]) == {Kind.MOD, Kind.BASECONV}
    for bad in ("ntt", ["elementwise"], [Kind.INTT], 3):
        with pytest.raises(ArgumentError):
            ntt_load_kinds(bad)


def test_report_prints_the_fused_rows_and_lower_traffic():
    program = load_corpus("Relin2_10L_2c")
    fused, plain = build_plan(program, fuse_ntt="all"), build_plan(program, fuse_ntt=False)
    sf, sp = plan_stats(fused), plan_stats(plain)
    assert sf["plan_bytes"] < sp["plan_bytes"] and sp["ntt_prologue_rows"] == {}
    assert sum(sf["ntt_prologue_rows"].values()) == sum(fused_rows(fused).values())
    text = plan_report(fused)
    assert "NTT rows computing their input in the load" in text
    assert "NTT rows computing" not in plan_report(plain)
    assert '"prologue"' in fused.to_json() and '"prologue"' not in plain.to_json()


def test_bootstraplike_51_traffic_target():
    """Issue 14: `caramel plan` of BootstrapLike_51L_1c reports <= 40.6 GiB (45.1 without), with
    NTT loads alone (the session 7 plan: trees of at most 16 inputs, no sibling rows)."""
    if not (PROGRAMS / "BootstrapLike_51L.tar.xz").exists():
        pytest.skip("BootstrapLike_51L.tar.xz not found")
    program = load_corpus("BootstrapLike_51L_1c")
    old = {"max_inputs": 16, "max_outputs": 1, "fuse_automorphism": False}  # the session 7 plan
    plain = plan_stats(build_plan(program, fuse_ntt=False, **old))
    fused = plan_stats(build_plan(program, fuse_ntt="all", **old))
    default = plan_stats(build_plan(program, **old))
    assert round(plain["plan_bytes"] / GIB, 1) == 45.1
    assert fused["plan_bytes"] / GIB <= 40.6
    assert fused["ntt_prologue_rows"] == {"baseconv": 13095, "sud_lift": 3906, "mod": 106}
    assert default["ntt_prologue_rows"] == {"sud_lift": 3906, "mod": 106}
    assert round(default["plan_bytes"] / GIB, 1) == 43.2


# --------------------------------------------------------------------------- the same bits


@pytest.mark.parametrize("mode", ["exact", "textbook", "emulator"])
@pytest.mark.parametrize("name", FUSED_CORPUS)
def test_fused_plan_equals_unfused_plan_and_reference(name, mode):
    program = load_corpus(name)
    ctx = context(1024)
    memory = random_memory(program, ctx, seed=3)
    fused = run_plan(build_plan(program, fuse_ntt="all"), ctx, memory, mode)
    plain = run_plan(build_plan(program, fuse_ntt=False), ctx, memory, mode)
    assert not store_mismatches(plain, fused)
    assert not store_mismatches(run_reference(program, ctx, memory, mode), fused)


@pytest.mark.parametrize("mode", list(Mode))
def test_numpy_prologues_are_the_kernels_they_replace(mode):
    """ntt_prologue = (sud_lift | mod | base_convert) then ntt on the same arena, for every kind."""
    ctx = context(256)
    rng = np.random.default_rng(5)
    b = NumpyBackend(ctx, 40)
    b.arena[:] = rng.integers(0, 1 << 32, b.arena.shape, dtype=np.uint64).astype(np.uint32)
    for r, l in enumerate(range(20)):
        b.arena[r] %= np.uint32(ctx.q(l))
    i32 = lambda x: np.asarray(x, dtype=np.int32)  # noqa: E731
    cases = [
        (Prologue(Kind.SUD_LIFT, 1), i32([[3], [4]]), i32([7, 8]), i32([3, 4]),
         lambda: b.sud_lift(i32([3, 4]), i32([30, 31]), i32([3, 4]), i32([7, 8]), mode)),
        (Prologue(Kind.MOD, 3), i32([[20, 21, 22], [23, 24, 25]]), i32([5, 9]), i32([0, 0]),
         lambda: b.mod(i32([[20, 21, 22], [23, 24, 25]]), i32([30, 31]), i32([5, 9]))),
        (Prologue(Kind.BASECONV, 4, (0, 1, 2, 3)), i32([[0, 1, 2, 3], [0, 1, 2, 3]]), i32([9, 12]), i32([0, 0]),
         lambda: b.base_convert((0, 1, 2, 3), (9, 12), i32([[0, 1, 2, 3]]), i32([[30, 31]]), mode)),
    ]
    for pro, ins, primes, args, unfused in cases:
        unfused()
        want = ctx.ntt(b.arena[[30, 31]], [int(p) for p in primes])
        b.ntt_prologue(pro, ins, i32([32, 33]), primes, args, mode)
        assert np.array_equal(b.arena[[32, 33]], want), pro.kind
        assert np.array_equal(prologue_limbs(ctx, b.arena, pro, ins, primes, args, mode), b.arena[[30, 31]])


def test_plan_cache_keys_on_the_switch(fresh_cache):
    import caramel.plan_cache as pc

    from tests.test_plan_cache import same_types

    program = load_corpus("BootstrapModRaise_10L_1c", progress=False)
    on, off, every = (pc.cached_plan(program), pc.cached_plan(program, fuse_ntt=False),
                      pc.cached_plan(program, fuse_ntt="all"))
    assert fused_rows(on) and not fused_rows(off) and fused_rows(every) != fused_rows(on)
    assert len(list(fresh_cache.glob(f"*{pc.SUFFIX}"))) == 3
    assert same_types(pc.cached_plan(program), build_plan(program))
    assert same_types(pc.cached_plan(program, fuse_ntt=False), build_plan(program, fuse_ntt=False))
    assert same_types(pc.cached_plan(program, fuse_ntt="all"), build_plan(program, fuse_ntt="all"))
    assert len(list(fresh_cache.glob(f"*{pc.SUFFIX}"))) == 3  # hits, no new entries


def test_cached_entry_with_a_prologue_on_another_kind_is_refused():
    import caramel.plan_cache as pc

    program = load_corpus("Mul_4L_1c")
    plan = build_plan(program, fuse_ntt="all")
    meta = pc._meta("k", True, 16, "all")
    arrays = pc.encode(plan, meta)
    pro = arrays["k_pro_kind"]
    assert (pro >= 0).any()
    bad = dict(arrays)
    bad["k_pro_kind"] = np.where(pro >= 0, list(Kind).index(Kind.AUTOMORPHISM), pro)
    import json

    header = json.loads(bytes(arrays["header"]).decode())
    with pytest.raises(pc.PlanEntryError):
        pc.decode(bad, header, program.name)
    assert pc.decode(arrays, header, program.name).chips[0].kernels == plan.chips[0].kernels


def test_cli_plan_ntt_loads():
    from tests.conftest import caramel_cli

    every = caramel_cli("plan", "programs/Mul_4L_1c", "--ntt-loads", "all")
    assert every.returncode == 0 and "baseconv 12, sud_lift 6" in every.stdout
    assert "with every NTT load" not in every.stdout
    default = caramel_cli("plan", "programs/Mul_4L_1c")
    assert default.returncode == 0 and "sud_lift 6" in default.stdout and "baseconv 12" not in default.stdout
    assert "with every NTT load (--ntt-loads all" in default.stdout
    off = caramel_cli("plan", "programs/Mul_4L_1c", "--no-ntt-fuse")
    assert off.returncode == 0 and "NTT rows computing" not in off.stdout
    bad = caramel_cli("plan", "programs/Mul_4L_1c", "--ntt-loads", "ntt")
    assert bad.returncode == 2 and "NTT loads must be" in bad.stderr and "Traceback" not in bad.stderr
