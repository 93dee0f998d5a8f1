"""Diagnostics through :mod:`logging` and progress bars through :mod:`tqdm`.

Every diagnostic line of caramel goes to the ``caramel`` logger (or a child such as
``caramel.distributed``); the library itself only attaches a :class:`logging.NullHandler`, so an
embedder silences, filters or redirects it with the standard library, e.g.
``logging.getLogger("caramel").setLevel(logging.WARNING)``. The ``caramel`` command attaches a
handler on stderr (:func:`configure`): INFO by default, DEBUG with ``-v``, WARNING with ``-q``.

Progress bars (:func:`progress`) are tqdm bars on stderr, shown when stderr is a terminal and the
``caramel`` logger is enabled for INFO (so ``-q`` or a WARNING level hides them);
``CARAMEL_PROGRESS=1`` forces them, ``CARAMEL_PROGRESS=0`` hides them.

:func:`nvtx_range` marks a phase for Nsight Systems (the ``nvtx`` package, else CuPy's
``cupyx.profiler.time_range``, else nothing: neither is required).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from contextlib import nullcontext
from typing import ContextManager, Iterable, Iterator

from tqdm import tqdm

LOGGER = logging.getLogger("caramel")
LOGGER.addHandler(logging.NullHandler())



def progress_enabled() -> bool:
    """Whether progress bars show now (see the module docstring)."""
    flag = os.environ.get("CARAMEL_PROGRESS")
    if flag is not None:
        return flag.lower() not in ("", "0", "false", "no")
    return LOGGER.isEnabledFor(logging.INFO) and sys.stderr.isatty()


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "", unit: str = "it",
             enabled: bool | None = None, position: int | None = None, bar_format: str | None = None,
             mininterval: float = 0.1) -> tqdm:
    """A tqdm bar on stderr (``enabled``: None = :func:`progress_enabled`); use it as tqdm:
    ``for x in progress(xs, desc="runs")`` or ``with progress(total=n) as bar: bar.update(k)``."""
    show = progress_enabled() if enabled is None else enabled
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not show, file=sys.stderr, leave=False,
                dynamic_ncols=True, position=position, bar_format=bar_format, mininterval=mininterval)


#: The bar of a run's phases (keys, encrypt, plan and run, check): steps of very unequal length,
#: so it shows where the run is and how long it has taken, never a rate or a time left.
PHASE_FORMAT = "{desc} [phase {n_fmt}/{total_fmt}, {elapsed}]"


def phases(total: int, desc: str) -> tqdm:
    """A bar of ``total`` phases of unequal length (:data:`PHASE_FORMAT`: no rate, no ETA), drawn at
    every phase however short (a few updates in all)."""
    return progress(total=total, desc=desc, bar_format=PHASE_FORMAT, mininterval=0)


class Counter:
    """A progress callback ``(done, total)`` for long work of many like steps (instructions run,
    kernels called, keys made, files written): a tqdm bar, made at the first call, below the
    phase bar, whose rate and time left come from the steps done (:func:`counter`)."""

    def __init__(self, desc: str, unit: str):
        self.desc, self.unit, self.bar = desc, unit, None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = progress(total=total, desc=self.desc, unit=self.unit, enabled=True, position=1)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def counter(desc: str, unit: str) -> Counter | None:
    """A :class:`Counter` when progress bars show (:func:`progress_enabled`), else None (the work
    then calls nothing at all)."""
    return Counter(desc, unit) if progress_enabled() else None


@contextlib.contextmanager
def configure(verbosity: int = 0) -> Iterator[None]:
    """The command line's logging while the ``with`` block runs: one stderr handler on the
    ``caramel`` logger at WARNING (``verbosity`` < 0, ``-q``), INFO (0) or DEBUG (> 0, ``-v``), not
    propagated to the root logger. The logger is left as it was found afterwards, so that calling
    :func:`caramel.cli.main` inside a program (a notebook, a test) changes nothing of its logging."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", datefmt="%H:%M:%S"))
    level, propagate = LOGGER.level, LOGGER.propagate
    LOGGER.addHandler(handler)
    LOGGER.setLevel(logging.WARNING if verbosity < 0 else logging.DEBUG if verbosity > 0 else logging.INFO)
    LOGGER.propagate = False
    try:
        yield
    finally:
        LOGGER.removeHandler(handler)
        LOGGER.setLevel(level)
        LOGGER.propagate = propagate


def nvtx_range(name: str) -> ContextManager:
    """An NVTX range named ``name`` around a ``with`` block, so that Nsight Systems shows caramel's
    phases and kernels by name; a no-op without the ``nvtx`` package and without CuPy."""
    try:
        import nvtx

        return nvtx.annotate(name, domain="caramel")
    except ImportError:
        pass
    if "cupy" in sys.modules:  # never import CuPy just for this
        try:
            from cupyx.profiler import time_range

            return time_range(name)
        except ImportError:
            pass
    return nullcontext()
