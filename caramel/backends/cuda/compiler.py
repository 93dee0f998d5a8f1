"""Compiled CUDA modules, one cache for every kernel family, keyed by the module's source text.

A kernel's source is a pure function of its settings and the ring (:mod:`caramel.backends.cuda.config`), so the
text says everything that the machine code depends on besides the compile options and the device: a module is
compiled once per (device, options, source) in a process, whoever asks (two rings or two configurations that
generate the same text share it), and CuPy's disk cache (``~/.cupy/kernel_cache``, keyed by the text, the options
and the architecture) keeps the binary across processes. Concurrent requests for one module compile it once;
:func:`compile_sources` compiles many on a thread pool (NVRTC is thread-safe) with a progress bar.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import concurrent.futures
import importlib.resources
import os
import threading
from typing import Callable, Iterable

#: Options passed to NVRTC for every module (CuPy adds the device's own architecture, sm_90 on Hopper). No fused
#: multiply-add, so that the float64 sums of exact base conversion round exactly like the CPU reference (the kernels
#: also use __dmul_rn/__dadd_rn explicitly).
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")

_lock = threading.Lock()
_modules: dict[tuple, concurrent.futures.Future] = {}  # (device, options, code) -> the module, once compiled
_functions: dict[tuple, object] = {}  # (device, options, code, name) -> the kernel


def _cupy():
    import cupy

    return cupy


def module(code: str, options: tuple[str, ...] = NVRTC_OPTIONS):
    """The ``cupy.RawModule`` of CUDA source ``code`` compiled and loaded on the current device (once)."""
    cp = _cupy()
    key = (cp.cuda.runtime.getDevice(), options, code)
    with _lock:
        done = _modules.get(key)
        mine = done is None
        if mine:
            done = _modules[key] = concurrent.futures.Future()
    if mine:
        try:
            mod = cp.RawModule(code=code, options=options)
            mod.compile()
            done.set_result(mod)
        except BaseException as exc:
            with _lock:
                del _modules[key]  # a later request tries again
            done.set_exception(exc)
            raise
    return done.result()


def function(code: str, name: str, options: tuple[str, ...] = NVRTC_OPTIONS):
    """Kernel ``name`` of the module of ``code`` (:func:`module`) on the current device."""
    key = (_cupy().cuda.runtime.getDevice(), options, code, name)
    fn = _functions.get(key)
    if fn is None:
        fn = _functions[key] = module(code, options).get_function(name)
    return fn


def read_cuh(package: str, name: str) -> str:
    """The text of the CUDA header ``name`` shipped beside the modules of ``package`` (package data)."""
    return importlib.resources.files(package).joinpath(name).read_text()


def default_workers() -> int:
    """Threads of :func:`compile_sources` by default: the cores this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def compile_sources(jobs: Iterable[Callable[[], object]], *, workers: int | None = None,
                    progress: bool | None = None, desc: str = "compiling kernels") -> int:
    """Run ``jobs`` (each compiles what it needs, through :func:`module` or :func:`function`, on the device current
    here) on ``workers`` threads (default :func:`default_workers`) with a progress bar
    (:func:`caramel.logs.progress`); returns how many ran. The first error is raised after every job has ended."""
    from caramel.logs import progress as bar

    jobs = list(jobs)
    if not jobs:
        return 0
    device = _cupy().cuda.runtime.getDevice()

    def run(job):
        with _cupy().cuda.Device(device):
            return job()

    with concurrent.futures.ThreadPoolExecutor(max(1, workers or default_workers())) as pool, \
            bar(total=len(jobs), desc=desc, unit="kernel", enabled=progress) as shown:
        futures = [pool.submit(run, job) for job in jobs]
        for f in concurrent.futures.as_completed(futures):
            shown.update(1)
        errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]
    return len(jobs)


__all__ = ["NVRTC_OPTIONS", "compile_sources", "default_workers", "function", "module", "read_cuh"]
