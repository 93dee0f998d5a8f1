"""Drivers on the host: one device inline, or G devices in host threads under a watchdog.

:func:`run_plan` runs a whole plan as ONE device hosting every chip (its communication becomes
local copies and sums) on NumPy or any backend: the CPU plan engine. :class:`HostRun` (and
:func:`run_on_devices`, one run of it) runs a plan on G NumPy "devices", one host thread each, over
the in-process fabric (:mod:`caramel.execute.fabric.threads`): the CPU twin of the multi-GPU
executor, that CI runs. :func:`run_threads` is the watchdog of both drivers.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Mapping, Sequence

import numpy as np

from caramel.backends import Backend
from caramel.backends.numpy_backend import NumpyBackend
from caramel.errors import DeadlockError, ExecutionError
from caramel.execute.fabric.threads import FakeNetwork
from caramel.execute.memory import check_plan_memory
from caramel.execute.placement import device_programs
from caramel.execute.result import RunResult, merge_results
from caramel.execute.runner import DeviceRun
from caramel.execute.timing import Timing, time_wall
from caramel.plan.kernel import Plan
from caramel.plan.streams import happens_before_order
from caramel.program import Mem
from caramel.ring import Context, Mode


def run_plan(plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT, *,
             backend: Callable[[Context, int], Backend] | None = None,
             progress: Callable[[int, int], None] | None = None) -> RunResult:
    """Run ``plan`` over the read-only input image ``memory`` (checked first) in arithmetic
    ``mode`` as one device hosting every chip; ``backend`` builds the device's backend from
    (ctx, arena rows) (default: the NumPy backend); ``progress(done, total)``, if given, is called
    after each of the device's calls (kernels and local communication)."""
    check_plan_memory(plan, ctx, memory)
    prog = device_programs(plan, 1, ctx.primes)[0]
    run = DeviceRun(prog, plan, ctx, memory, Mode(mode), backend or NumpyBackend)
    total = len(run.calls)
    run.run(None if progress is None else lambda i: progress(i + 1, total))
    return merge_results(plan, memory, [(prog.chips, run.stores())])


def run_threads(workers: Sequence[Callable[[], object]], timeout: float, abort: Callable[[BaseException], None],
                describe: Callable[[int], str]) -> list[object]:
    """Run one host thread per device and wait for all: the watchdog. A worker that raises, or
    a run still unfinished after ``timeout`` seconds, aborts the fabric (so that every blocked
    device returns) and raises: a :class:`DeadlockError` naming the unfinished devices and where
    they wait (``describe(d)``), or the first worker's error. Threads are daemons: an
    interpreter exit never waits for a stuck device."""
    results: list[object] = [None] * len(workers)
    errors: list[BaseException | None] = [None] * len(workers)
    done = threading.Semaphore(0)

    def body(i: int) -> None:
        try:
            results[i] = workers[i]()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors[i] = e
            abort(e)
        finally:
            done.release()

    threads = [threading.Thread(target=body, args=(i,), daemon=True, name=f"caramel-device-{i}")
               for i in range(len(workers))]
    for t in threads:
        t.start()
    finished = 0
    deadline = time.monotonic() + timeout
    while finished < len(workers):
        try:
            got = done.acquire(timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:  # Ctrl-C: unblock every device, then let the interrupt through
            abort(ExecutionError("interrupted"))
            raise
        if not got:
            stuck = [i for i, t in enumerate(threads) if t.is_alive()]
            err = DeadlockError(f"watchdog: no progress after {timeout:g} s; unfinished device(s):\n  "
                                + "\n  ".join(f"device {i}: {describe(i)}" for i in stuck))
            abort(err)
            for t in threads:
                t.join(5.0)
            raise err
        finished += 1
    failed = [e for e in errors if e is not None]
    if failed:  # the first error that is not a device's "stopped, another device failed"
        raise min(failed, key=lambda e: isinstance(e, ExecutionError) and "another device failed" in str(e))
    return results


class HostRun:
    """The CPU twin of :class:`~caramel.execute.cuda_graph.MultiGpuRun`: a plan's device programs
    on NumPy (or ``backend``) devices, one host thread each, over a :class:`FakeNetwork` (a fresh
    one per run unless given), under the watchdog (``timeout``); timed with the wall clock.
    ``streams`` > 1 stands in for the GPU's streams: each device's tasks are scheduled as on the GPU
    and run in a random order that the schedule's happens-before allows (a new one per run, from
    ``seed``); any such order must give the single-stream result."""

    def __init__(self, plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                 gpus: int | None = None, *, backend=None, timeout: float = 120.0, streams: int = 1,
                 seed: int | None = None):
        check_plan_memory(plan, ctx, memory)
        self.plan, self.memory, self.timeout = plan, memory, timeout
        self.progs = device_programs(plan, gpus or len(plan.chips), ctx.primes,
                                     reuse="fifo" if streams > 1 else "lifo")
        self.runs = [DeviceRun(p, plan, ctx, memory, Mode(mode), backend or NumpyBackend) for p in self.progs]
        self.schedules = [r.schedule(streams) for r in self.runs] if streams > 1 else None
        self.seed = np.random.SeedSequence(seed).entropy
        self.count = 0  # runs so far: each run draws new orders

    def _run(self, r: DeviceRun) -> None:
        """One run of device ``r``: in order, or in a random happens-before order of its schedule."""
        if self.schedules is None:
            r.run()
            return
        rng = np.random.default_rng((self.seed, self.count, r.prog.device))
        for t in happens_before_order(self.schedules[r.prog.device], rng):
            r.run_task(t)
        r.pc = len(r.calls)

    def _all(self, body: Callable[[DeviceRun], object], network: FakeNetwork | None = None) -> list:
        """``body(run)`` on every device (inputs restored first), in host threads."""
        net = network or FakeNetwork(len(self.runs), self.timeout)
        self.count += 1
        for r in self.runs:
            r.fabric = net.fabric(r.prog.device)
            r.restore()
        return run_threads([lambda r=r: body(r) for r in self.runs], self.timeout, net.abort,
                           lambda d: self.runs[d].position)

    def time(self, repeats: int = 10, warmup: int = 1) -> Timing:
        """Wall-clock milliseconds per whole run (all devices)."""
        return time_wall(lambda: self._all(self._run), repeats, warmup)

    def instrument(self) -> list[list[tuple[int, float, float]]]:
        """One run with the wall clock read after every call: per device, (call index, start ms,
        duration ms), like :meth:`MultiGpuRun.instrument`."""
        def body(r: DeviceRun):
            marks: list[float] = []
            t0 = time.perf_counter()
            r.run(lambda i: marks.append((time.perf_counter() - t0) * 1e3))
            starts = [0.0] + marks[:-1]
            return [(i, a, b - a) for i, (a, b) in enumerate(zip(starts, marks))]
        return self._all(body)

    def result(self, network: FakeNetwork | None = None) -> RunResult:
        """Run once and return every chip's outputs."""
        def body(r: DeviceRun):
            self._run(r)
            return r.prog.chips, r.stores()
        return merge_results(self.plan, self.memory, self._all(body, network))

    def close(self) -> None:
        """Nothing to release (the interface of MultiGpuRun)."""


def run_on_devices(plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                   gpus: int | None = None, *, backend=None, timeout: float = 120.0,
                   network: FakeNetwork | None = None, streams: int = 1, seed: int | None = None) -> RunResult:
    """Run ``plan`` once on ``gpus`` (default: one per chip) host-thread devices
    (:class:`HostRun`, ``streams`` and ``seed`` as there); bit-identical to the reference."""
    return HostRun(plan, ctx, memory, mode, gpus, backend=backend, timeout=timeout, streams=streams,
                   seed=seed).result(network)


__all__ = ["HostRun", "run_on_devices", "run_plan", "run_threads"]
