"""Every CUDA kernel a plan needs, found without a GPU and compiled at once, in parallel.

A first run used to compile its kernels one at a time as it met them (NVRTC takes from a tenth of a second to
seconds a module). :func:`needed_modules` lowers every kernel of a plan's device programs (and their communication
steps' local sums, copies and ``% q``) to its backend call, exactly as :class:`~caramel.execute.runner.DeviceRun`
does, and runs the calls on a :class:`~caramel.backends.cuda.kernel_set.KernelSet`, which records the module each
one loads; :func:`precompile` compiles them on a thread pool (NVRTC is thread-safe), each distinct source once in the
process (:mod:`caramel.backends.cuda.compiler`) and in CuPy's disk cache across processes. The GPU executors call it
before their first launch; ``caramel compile`` calls it ahead of a run.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Iterable, Sequence

from caramel.execute.placement import CommStep, DeviceProgram
from caramel.execute.runner import _copy_calls, _local_calls, _packed, lower_kernel
from caramel.plan.kernel import Plan
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


def precompile(progs: Sequence[DeviceProgram], plan: Plan, ctx: Context, modes: Iterable[Mode], kernels=None, *,
               workers: int | None = None, progress: bool | None = None) -> int:
    """Compile and load on the current CUDA device every module that :func:`needed_modules` finds, on ``workers``
    threads (default: the cores) with a progress bar; returns how many modules."""
    import cupy as cp

    from caramel.backends.cuda.compiler import compile_sources

    t0 = time.perf_counter()
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    modules = needed_modules(progs, plan, ctx, modes, kernels, sms)
    compile_sources([m.compile for m in modules], workers=workers, progress=progress)
    logger.debug("%d kernel modules of %s ready in %.2f s", len(modules), plan.name, time.perf_counter() - t0)
    return len(modules)


__all__ = ["device_calls", "needed_modules", "precompile"]
