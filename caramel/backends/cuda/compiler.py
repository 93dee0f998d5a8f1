"""Compiled CUDA modules, one cache for every kernel family, keyed by the module's source text, compiled on one pool.

A kernel's source is a pure function of its settings and the ring (:mod:`caramel.backends.cuda.config`), so the
text says everything that the machine code depends on besides the compile options and the device: a module is
compiled once per (device, options, source) in a process, whoever asks (two rings or two configurations that
generate the same text share it; the executor's kernels, the client's random-word and Lemire kernels, the NTT that
both use), and CuPy's disk cache (``~/.cupy/kernel_cache``, keyed by the text, the options and the architecture)
keeps the binary across processes. Concurrent requests for one module compile it once (the others wait for it).

Compiling is a *job*: a callable that compiles what it needs through :func:`module` or :func:`function` (or, for
the array kernels that CuPy generates itself, calls the CuPy operation once on tiny arrays: those compile through
CuPy's own cache, keyed by their generated source the same way). :func:`schedule` queues jobs on the process's one
compile pool (:data:`default_workers` threads: NVRTC is thread-safe and releases the GIL) and returns at once, a
:class:`Batch` to wait for; :func:`compile_sources` schedules and waits, with a progress bar. Every caller shares the
pool, so the GPU warm-up's jobs (:func:`caramel.ckks.device.warm_up`) and a plan's precompile
(:mod:`caramel.execute.precompile`) never run more compiles at once than the machine has cores. A free thread takes
the heaviest job pending (a job's ``weight`` attribute, default 1; ties in queueing order), whichever call queued it,
so that a long module (the NTT, a base conversion) queued late does not finish last. A job queued again while an
equal one (a :class:`~caramel.backends.cuda.kernel_set.Module` is a value) is queued or done on that device is not
run twice: the later batch waits for the earlier job, and no thread of the pool blocks on it.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import concurrent.futures
import functools
import heapq
import importlib.resources
import itertools
import os
import threading
import time
from typing import Callable, Iterable, Sequence

from caramel import cores
from caramel.backends.cuda.device import on_device

#: Options passed to NVRTC for every module (CuPy adds the device's own architecture, sm_90 on Hopper). No fused
#: multiply-add, so that the float64 sums of exact base conversion round exactly like the CPU reference (the kernels
#: also use __dmul_rn/__dadd_rn explicitly).
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")

_lock = threading.Lock()
_modules: dict[tuple, concurrent.futures.Future] = {}  # (device, options, code) -> the module, once compiled
_functions: dict[tuple, object] = {}  # (device, options, code, name) -> the kernel
_pools: dict[int, "_Pool"] = {}  # threads -> the compile pool of that many
_queued: dict[tuple, concurrent.futures.Future] = {}  # (device, job) -> its future, for hashable jobs


def _forget_pools() -> None:  # a forked child has none of the parent's threads, nor their jobs
    _pools.clear()
    _queued.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


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


def loaded() -> int:
    """How many modules this process has compiled (or loaded from CuPy's disk cache) through :func:`module`, on
    every device, or is compiling now."""
    with _lock:
        return len(_modules)


def read_cuh(package: str, name: str) -> str:
    """The text of the CUDA header ``name`` shipped beside the modules of ``package`` (package data)."""
    return importlib.resources.files(package).joinpath(name).read_text()


def default_workers() -> int:
    """Threads of the compile pool by default: the cores this process may use."""
    return cores.available()


class _Pool:
    """``workers`` threads, each taking the heaviest job pending when it is free (ties in queueing order): every
    job queued adds one task to a thread pool, and the task runs whichever job then weighs most."""

    def __init__(self, workers: int):
        self.threads = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="caramel-compile")
        self.pending: list[tuple] = []  # heap of (-weight, order, call, future)
        self.order = itertools.count()
        self.lock = threading.Lock()

    def submit(self, call: Callable[[], object], weight: float) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self.lock:
            heapq.heappush(self.pending, (-weight, next(self.order), call, future))
        self.threads.submit(self._run_heaviest)
        return future

    def _run_heaviest(self) -> None:
        with self.lock:
            _, _, call, future = heapq.heappop(self.pending)
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 (the batch's wait raises it)
                future.set_exception(exc)


def _pool(workers: int) -> _Pool:
    """The process's compile pool of ``workers`` threads (made on first use, kept: its threads idle between jobs)."""
    with _lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = _Pool(workers)
        return pool


def _identity(device: int, job) -> tuple | None:
    """What makes ``job`` the same job on ``device`` (None for an unhashable job: never deduplicated)."""
    try:
        hash(job)
    except TypeError:
        return None
    return device, job


def weight(job) -> float:
    """A job's relative compile time (its ``weight`` attribute; 1 without one): :func:`schedule` starts the
    heaviest first."""
    return float(getattr(job, "weight", 1.0))


class Batch:
    """Jobs queued on the compile pool by :func:`schedule`: :meth:`wait` for them (or :meth:`done` to ask)."""

    def __init__(self, futures: Sequence[concurrent.futures.Future], started: float):
        self.futures, self.started = list(futures), started
        self._ended: float | None = None if futures else started

    def __len__(self) -> int:
        return len(self.futures)

    def done(self) -> bool:
        """Whether every job has ended (compiled or failed)."""
        return all(f.done() for f in self.futures)

    def wait(self, progress: bool | None = None, desc: str = "compiling kernels") -> int:
        """Wait for every job, with a progress bar (:func:`caramel.logs.progress`; ``progress`` None: shown when
        bars are); returns how many jobs. The first error (in scheduling order) is raised after every job ended."""
        from caramel.logs import progress as bar

        pending = [f for f in self.futures if not f.done()]
        if pending:
            with bar(total=len(self.futures), desc=desc, unit="kernel", enabled=progress) as shown:
                shown.update(len(self.futures) - len(pending))
                for _ in concurrent.futures.as_completed(pending):
                    shown.update(1)
        if self._ended is None:
            self._ended = time.perf_counter()
        errors = [f.exception() for f in self.futures if f.exception() is not None]
        if errors:
            raise errors[0]
        return len(self.futures)

    @property
    def seconds(self) -> float | None:
        """Wall-clock seconds from scheduling to the end of :meth:`wait` (None before)."""
        return None if self._ended is None else self._ended - self.started


def schedule(jobs: Iterable[Callable[[], object]], *, workers: int | None = None) -> Batch:
    """Queue ``jobs`` on the compile pool of ``workers`` threads (default :func:`default_workers`), each run with the
    CUDA device current here made current in its thread, and return at once. The heaviest job pending starts first,
    whichever call queued it (:func:`weight`; ties in queueing order, here the given order). A job equal to one
    queued before on this device (and not failed or cancelled) is not queued again: the batch holds the earlier job's
    future."""
    jobs = list(jobs)
    started = time.perf_counter()
    if not jobs:
        return Batch([], started)
    device = _cupy().cuda.runtime.getDevice()

    def run(job):
        with on_device(device, _cupy()):
            return job()

    pool = _pool(max(1, workers or default_workers()))
    futures = []
    with _lock:
        for job in jobs:
            ident = _identity(device, job)
            future = _queued.get(ident) if ident is not None else None
            if future is None or (future.done() and (future.cancelled() or future.exception() is not None)):
                future = pool.submit(functools.partial(run, job), weight(job))
                if ident is not None:
                    _queued[ident] = future
            futures.append(future)
    return Batch(futures, started)


def compile_sources(jobs: Iterable[Callable[[], object]], *, workers: int | None = None,
                    progress: bool | None = None, desc: str = "compiling kernels") -> int:
    """Run ``jobs`` (each compiles what it needs, through :func:`module` or :func:`function`, on the device current
    here) on the compile pool (:func:`schedule`) and wait for them with a progress bar (:meth:`Batch.wait`); returns
    how many ran. The first error is raised after every job has ended."""
    return schedule(jobs, workers=workers).wait(progress, desc)


__all__ = ["NVRTC_OPTIONS", "Batch", "compile_sources", "default_workers", "function", "loaded", "module", "read_cuh",
           "schedule", "weight"]
