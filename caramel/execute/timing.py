"""Timing of repeated runs: :class:`Timing`, by CUDA events (:func:`time_runs`) or the wall clock
(:func:`time_wall`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


@dataclass
class Timing:
    """Milliseconds per run over ``repeats`` timed runs (after warm-up)."""

    median_ms: float
    min_ms: float
    max_ms: float
    repeats: int

    @classmethod
    def of(cls, times: Sequence[float]) -> "Timing":
        """The median, min and max of ``times`` (milliseconds)."""
        return cls(float(np.median(times)), float(min(times)), float(max(times)), len(times))

    def __str__(self) -> str:
        return f"median {self.median_ms:.3f} ms, min {self.min_ms:.3f}, max {self.max_ms:.3f} ({self.repeats} runs)"


def time_runs(fn: Callable[[], None], stream, repeats: int = 10, warmup: int = 1) -> Timing:
    """Time ``fn`` (which launches work on ``stream``) with CUDA events, each run separately."""
    import cupy as cp

    for _ in range(warmup):
        fn()
    stream.synchronize()
    times = []
    for _ in range(max(1, repeats)):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record(stream)
        fn()
        stop.record(stream)
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop))
    return Timing.of(times)


def time_wall(fn: Callable[[], None], repeats: int = 10, warmup: int = 1) -> Timing:
    """Time ``fn`` (which returns when its work is done) with the wall clock, each run separately."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return Timing.of(times)


__all__ = ["Timing", "time_runs", "time_wall"]
