"""Every kernel a plan needs, found without a GPU (caramel.execute.precompile, caramel.backends.cuda.kernel_set), and
``caramel compile`` without a GPU: the load and plan caches warmed, the kernels skipped, exit 0."""

from __future__ import annotations

import os
import types

import numpy as np
import pytest

from caramel.backends.cuda import elementwise
from caramel.backends.cuda.config import KernelConfig
from caramel.backends.cuda.kernel_set import KernelSet
from caramel.backends.cuda.ntt.transform import transform_source
from caramel.backends.cuda.target import CUDA_TARGET
from caramel.execute.placement import device_programs
from caramel.execute.runner import lower_kernel
from caramel.execute.precompile import device_calls, needed_modules, plan_modules
from caramel.expr import Expr, ExprOp
from caramel.plan import Kind, build_plan
from caramel.ring import Context, Mode

from tests.backends.test_config import fake  # noqa: F401 (the fixture, shared)
from tests.conftest import REPO, caramel_cli
from tests.plan.plan_helpers import load_corpus


def modules_of(name: str, n: int, modes=(Mode.EXACT,), kernels=None, gpus=None):
    program = load_corpus(name)
    plan = build_plan(program, target=CUDA_TARGET)
    ctx = Context(n)
    progs = device_programs(plan, gpus or len(plan.chips), ctx.primes, keep_inputs=True)
    return plan, {m.key: m for m in needed_modules(progs, plan, ctx, modes, kernels)}


def test_a_plans_modules():
    """Mul_4L_2c at N = 65536: the ring's twiddle kernels, the row upload's gather, one transform module, the
    elementwise programs of its kernels and of its communication's local sums and copies (2 devices), each once."""
    plan, found = modules_of("Mul_4L_2c", 65536)
    assert {"twiddle", "gather", "ntt", "elementwise"} <= {key[0] for key in found}
    assert found[("ntt", 65536, True)].candidates[0][0] == transform_source(16, True, KernelConfig().ntt)
    exprs = {k.expr for c in plan.chips for k in c.kernels if k.kind is Kind.ELEMENTWISE and not k.expr.transformed}
    sums = {key for key in found if key[0] == "elementwise"} - {("elementwise", e) for e in exprs}
    assert exprs and sums  # the plan's programs, and the communication's sums (not in the plan's kernels)
    assert all(not k[1].ops or {o.op for o in k[1].ops} == {"add"} for k in sums)


@pytest.mark.parametrize("name", ["Mul_4L_2c", "BootstrapModRaise_4L_2c", "PolyX8_4L_4c"])
def test_the_plans_modules_cover_every_placement(name):
    """What a first run queues from the plan alone (plan_modules: its kernels and every local sum, copy and % q its
    communication may make) holds every module that its device programs load on 1, 2 or as many devices as chips;
    without the communication's local work it would not (those are the placement's)."""
    program = load_corpus(name)
    plan = build_plan(program, target=CUDA_TARGET)
    ctx = Context(65536)
    early = {m.key for m in plan_modules(plan, ctx, [Mode.EXACT])}
    kernels_only = set()
    for chip in plan.chips:
        found = KernelSet(ctx)
        for kernel in chip.kernels:
            if kernel.kind is not Kind.COMM:
                lower_kernel(kernel, np.zeros(max(1, chip.n_buffers), dtype=np.int64), ctx, Mode.EXACT)(found)
        kernels_only |= set(found.modules)
    for gpus in sorted({1, 2, len(plan.chips)}):
        progs = device_programs(plan, gpus, ctx.primes, keep_inputs=True)
        needed = {m.key for m in needed_modules(progs, plan, ctx, [Mode.EXACT])}
        assert needed <= early, (gpus, needed - early)
        if gpus < len(plan.chips):
            assert needed - kernels_only  # the local sums of chips that share a device


def test_a_plans_programs_queued_while_it_is_built_are_not_queued_again(fake, monkeypatch):
    """What a first run queues from build_plan's ``fused`` (schedule_programs: the modules of the plan's elementwise
    programs, its epilogues among them) the plan then needs, and schedule_plan, once the plan exists, holds those
    jobs' futures rather than queueing them again; every module compiles once."""
    from caramel.execute import precompile

    class Loaded(fake.RawModule):
        def get_function(self, name):
            return types.SimpleNamespace(local_size_bytes=0)

    fake.RawModule = Loaded
    monkeypatch.setattr(precompile, "_multiprocessors", lambda: 132)
    seen, ctx = [], Context(65536)
    plan = build_plan(load_corpus("BootstrapModRaise_4L_2c"), target=CUDA_TARGET, fused=seen.append)
    early = precompile.schedule_programs(seen[0], ctx)
    later = precompile.schedule_plan(plan, ctx, [Mode.EXACT])
    early.wait(progress=False)
    later.wait(progress=False)
    modules = plan_modules(plan, ctx, [Mode.EXACT])
    assert any(e.transformed for e in seen[0]) and len(early) > 2  # epilogues, beside the ring's two modules
    assert {id(f) for f in early.futures} < {id(f) for f in later.futures}  # the plan's batch holds them all
    assert len(fake.compiles) == len(set(fake.compiles)) == len(modules)


def test_epilogues_carry_their_launch_bounds():
    """An epilogue module lists its sources under each launch bound its launch may take, in order."""
    plan, found = modules_of("BootstrapModRaise_4L_2c", 65536)
    epilogues = [m for k, m in found.items() if k[0] == "epilogue"]
    assert epilogues
    for m in epilogues:
        expr = m.key[3]
        want = [code for _, code in elementwise.epilogue_sources(expr, 16, True)]
        assert [code for code, _, _ in m.candidates] == want
        assert all(names == (elementwise.kernel_name(expr),) for _, names, _ in m.candidates)


def test_n_4096_has_no_epilogues_and_settings_change_the_sources():
    """Below N = 8192 the transforms run whole (no epilogue kernel); another configuration is other sources."""
    _, small = modules_of("BootstrapModRaise_4L_2c", 4096)
    assert not any(k[0] == "epilogue" for k in small)
    _, default = modules_of("Mul_4L_1c", 65536)
    _, other = modules_of("Mul_4L_1c", 65536, kernels=KernelConfig().with_settings(["ntt.warps=2"]))
    code = {k: m.candidates[0][0] for k, m in default.items()}
    changed = {k for k, m in other.items() if m.candidates[0][0] != code.get(k)}
    assert changed == {k for k in default if k[0] == "ntt"}


def test_modes_and_conversions():
    """Every arithmetic mode's kernels: a prologue or conversion module per mode where the program has them."""
    _, one = modules_of("BootstrapModRaise_4L_2c", 65536)
    _, three = modules_of("BootstrapModRaise_4L_2c", 65536, modes=list(Mode))
    assert set(one) <= set(three)
    assert len([k for k in three if k[0] in ("prologue", "basis")]) > len([k for k in one if k[0] in
                                                                            ("prologue", "basis")])


def test_device_calls_skip_only_the_collectives():
    """The calls of a device program are its kernels and its communication steps' local work, no collective."""
    program = load_corpus("Mul_4L_2c")
    plan = build_plan(program, target=CUDA_TARGET)
    ctx = Context(4096)
    (prog, *_) = device_programs(plan, 2, ctx.primes, keep_inputs=True)
    found = KernelSet(ctx)
    calls = device_calls(prog, plan, ctx, Mode.EXACT)
    kernels = sum(1 for step in prog.steps if not hasattr(step, "ops"))
    assert len(calls) >= kernels
    for call in calls:
        call(found)  # every call is a backend method: none needs the fabric


def test_the_kernel_set_is_a_backend():
    """KernelSet answers every Backend method without a device (writes and reads do nothing)."""
    found = KernelSet(Context(4096))
    found.write([0], [[0] * 4096])
    found.set_scalars([1, 2])
    assert found.read([0, 1]).shape == (2, 4096)
    found.elementwise(Expr(2, 0, (ExprOp("add", (0, 1)),), (2,)), None, None, None, None)
    found.rsv((0, 1, 2), None, None, None)
    assert ("crt",) not in found.modules or found.modules[("crt",)].candidates[0][1] == ("rsv_3",)
    assert len(found.modules) == 4  # twiddle, gather, the program, crt


def test_caramel_compile_without_a_gpu(tmp_path):
    """The load and plan caches warmed (a plan entry for the CUDA target), the kernels skipped, exit 0; a second
    run reads both caches; --gpus beyond the chips is refused (exit 2)."""
    env = {"CARAMEL_CACHE": str(tmp_path / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    first = caramel_cli("compile", "programs/Mul_4L_2c", "--n", "4096", env=env)
    assert first.returncode == 0, first.stderr
    assert "load and plan caches ready" in first.stdout and "kernels skipped" in first.stdout
    entries = sorted(p.suffix for p in (tmp_path / "cache").iterdir())
    assert entries.count(".plan") == 1 and ".entry" in entries
    stamp = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()}
    again = caramel_cli("compile", "programs/Mul_4L_2c", "--n", "4096", env=env)
    assert again.returncode == 0 and {p.name: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()} == stamp
    bad = caramel_cli("compile", "programs/Mul_4L_2c", "--gpus", "3", env=env)
    assert bad.returncode == 2 and "at most 2" in bad.stderr
