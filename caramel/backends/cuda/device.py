"""Which CUDA device a host thread works on.

CuPy's ``cupy.cuda.Device(i)`` makes device i current and, on exit, makes current again the device it found: in a
thread that has not used CUDA yet, device 0. Since CUDA 12, making a device current creates its primary context,
so a process working on GPU 1 alone (a rank of ``caramel launch``) would open a context, and its memory, on GPU 0
from every new thread that entered GPU 1. :func:`on_device` leaves such a thread on the device it entered.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


def _has_context(cp) -> bool:
    """Whether the calling thread has a current CUDA context."""
    try:
        return bool(cp.cuda.driver.ctxGetCurrent())
    except cp.cuda.driver.CUDADriverError:  # CUDA_ERROR_NOT_INITIALIZED: no CUDA call in this process yet
        return False


@contextlib.contextmanager
def on_device(index: int, cp=None) -> Iterator[None]:
    """CUDA device ``index`` current in the enclosed code; afterwards the device current before, unless the thread had
    no CUDA context before (then ``index`` stays current: see the module docstring). ``cp``: the CuPy module
    (default: imported)."""
    if cp is None:
        import cupy as cp
    if not _has_context(cp):
        cp.cuda.runtime.setDevice(index)
        yield
        return
    with cp.cuda.Device(index):
        yield


__all__ = ["on_device"]
