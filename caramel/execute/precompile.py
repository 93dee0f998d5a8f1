"""Every CUDA kernel a plan needs, found without a GPU and compiled at once, in parallel.

A first run used to compile its kernels one at a time as it met them (NVRTC takes from a tenth of a second to
seconds a module). :func:`needed_modules` lowers every kernel of a plan's device programs (and their communication
steps' local sums, copies and ``% q``) to its backend call, exactly as :class:`~caramel.execute.runner.DeviceRun`
does, and runs the calls on a :class:`~caramel.backends.cuda.kernel_set.KernelSet`, which records the module each
one loads; :func:`precompile` compiles them on the compile pool (NVRTC is thread-safe), each distinct source once in
the process (:mod:`caramel.backends.cuda.compiler`) and in CuPy's disk cache across processes. The GPU executors call
it before their first launch; ``caramel compile`` calls it ahead of a run. :func:`schedule_programs` queues the
modules of a plan's elementwise programs (most of its compiles: the NTT epilogues) as soon as fusion has fixed them,
and :func:`schedule_plan` the rest of its kernels' and of its communication's local work (:func:`plan_modules`, no
device program needed) once the plan exists; both return at once (:class:`caramel.Executor` calls them from the
thread that builds the plan, while the keys are made): the executor's precompile then finds them compiled or
compiling, and waits for them (the compile pool queues a module once).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Sequence

import numpy as np

from caramel.execute.placement import CommStep, DeviceProgram
from caramel.execute.runner import _copy_calls, _local_calls, _packed, local_work_calls, lower_kernel
from caramel.expr import Expr
from caramel.plan.kernel import Kind, Plan
from caramel.ring import Context, Mode

logger = logging.getLogger(__name__)


def device_calls(prog: DeviceProgram, plan: Plan, ctx: Context, mode: Mode) -> list[Callable]:
    """The backend calls of one device program, as its run makes them, but the collectives themselves."""
    calls: list[Callable] = []
    for step in prog.steps:
        if isinstance(step, CommStep):
            calls += _local_calls(prog, step.before) + _local_calls(prog, step.after)
            if step.ops:
                gather, _, scatter, _ = _packed(prog, step.ops)
                calls += _copy_calls(gather) + _copy_calls(scatter)
        else:
            c, _, kernel = step
            calls.append(lower_kernel(kernel, prog.rows_of[c], ctx, mode, prog.scalar_base[c]))
    return calls


def needed_modules(progs: Sequence[DeviceProgram], plan: Plan, ctx: Context, modes: Iterable[Mode],
                   kernels=None, multiprocessors: int | None = None) -> list:
    """The CUDA modules (:class:`~caramel.backends.cuda.kernel_set.Module`) that running ``progs`` (the device
    programs of ``plan``) in each arithmetic mode of ``modes`` loads, under ``kernels`` (a
    :class:`~caramel.backends.cuda.config.KernelConfig`; None: the defaults), on a device of ``multiprocessors``
    (None: an H200's). Needs no GPU."""
    from caramel.backends.cuda.kernel_set import MULTIPROCESSORS, KernelSet

    found = KernelSet(ctx, kernels, multiprocessors or MULTIPROCESSORS)
    for mode in modes:
        for prog in progs:
            for call in device_calls(prog, plan, ctx, Mode(mode)):
                call(found)
    return list(found.modules.values())


def plan_modules(plan: Plan, ctx: Context, modes: Iterable[Mode], kernels=None,
                 multiprocessors: int | None = None) -> list:
    """The modules of ``plan``'s kernels and of every local sum, copy and ``% q`` that its communication steps may
    make on any placement (:func:`caramel.execute.runner.local_work_calls`): found from the plan alone, before any
    device program, so that a first run compiles them while its keys are made; a superset of :func:`needed_modules`
    for any number of devices. Needs no GPU."""
    from caramel.backends.cuda.kernel_set import MULTIPROCESSORS, KernelSet

    found = KernelSet(ctx, kernels, multiprocessors or MULTIPROCESSORS)
    for mode in modes:
        for chip in plan.chips:
            rows_of = np.zeros(max(1, chip.n_buffers), dtype=np.int64)  # any rows: a module depends on none
            for kernel in chip.kernels:
                if kernel.kind is not Kind.COMM:
                    lower_kernel(kernel, rows_of, ctx, Mode(mode))(found)
    if any(kernel.kind is Kind.COMM for chip in plan.chips for kernel in chip.kernels):
        for call in local_work_calls(len(plan.chips)):
            call(found)
    return list(found.modules.values())


def _multiprocessors() -> int:
    import cupy as cp

    return int(cp.cuda.Device().attributes["MultiProcessorCount"])


def schedule_programs(exprs: Iterable[Expr], ctx: Context, kernels=None):
    """Queue on the compile pool, for the current CUDA device, the module of each elementwise program of ``exprs``
    (its plain or epilogue kernel) and return at once (a :class:`~caramel.backends.cuda.compiler.Batch`): a plan's,
    from :func:`caramel.plan.build_plan`'s ``fused``, before the plan exists."""
    from caramel.backends.cuda.compiler import schedule
    from caramel.backends.cuda.kernel_set import KernelSet

    t0 = time.perf_counter()
    found = KernelSet(ctx, kernels, _multiprocessors())
    for expr in exprs:
        found.elementwise(expr, None, None, None, None)
    batch = schedule(found.modules.values())
    logger.debug("cold path: %d kernel modules of elementwise programs queued %.2f s", len(batch),
                 time.perf_counter() - t0)
    return batch


def schedule_plan(plan: Plan, ctx: Context, modes: Iterable[Mode], kernels=None):
    """Queue on the compile pool every module of :func:`plan_modules` for the current CUDA device and return at once
    (a :class:`~caramel.backends.cuda.compiler.Batch`)."""
    from caramel.backends.cuda.compiler import schedule

    t0 = time.perf_counter()
    modules = plan_modules(plan, ctx, modes, kernels, _multiprocessors())
    batch = schedule(modules)
    logger.debug("cold path: %d kernel modules of %s found and queued %.2f s", len(modules), plan.name,
                 time.perf_counter() - t0)
    return batch


def precompile(progs: Sequence[DeviceProgram], plan: Plan, ctx: Context, modes: Iterable[Mode], kernels=None, *,
               workers: int | None = None, progress: bool | None = None) -> int:
    """Compile and load on the current CUDA device every module that :func:`needed_modules` finds, on the compile
    pool (``workers`` threads, default the cores) with a progress bar; returns how many modules. Those already
    compiled or compiling (:func:`schedule_plan`, the GPU warm-up) are not compiled again: they are waited for."""
    from caramel.backends.cuda.compiler import compile_sources, loaded

    t0 = time.perf_counter()
    before = loaded()
    modules = needed_modules(progs, plan, ctx, modes, kernels, _multiprocessors())
    compile_sources(modules, workers=workers, progress=progress)
    logger.debug("cold path: precompile of %s: %d kernel modules ready (%d new since it started) %.2f s", plan.name,
                 len(modules), loaded() - before, time.perf_counter() - t0)
    return len(modules)


__all__ = ["device_calls", "needed_modules", "plan_modules", "precompile", "schedule_plan", "schedule_programs"]
