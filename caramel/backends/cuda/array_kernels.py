"""The kernels that CuPy generates for array operations, compiled ahead as jobs of the compile pool.

An array operation on CuPy arrays (a ufunc, a cast, an index, a reduction) runs a kernel that CuPy generates from the
operation and its operands' types and layout (dtype, dimensions after merging contiguous ones, contiguity; for a
CUB reduction also the reduced length), compiles with NVRTC on first use and keeps in its own caches (in memory,
and on disk keyed by the generated source, as :mod:`caramel.backends.cuda.compiler` keys caramel's). caramel cannot
compile those itself, but it can make the same call earlier: an :class:`ArrayKernel` is one such call, the very
expression of the code that needs it, made once on small arrays of the same types and layout at the run's ring
degree. Scheduled on the compile pool (:func:`caramel.backends.cuda.compiler.schedule`) at the GPU warm-up, they
compile in parallel with everything else instead of one at a time in the middle of the run.

:data:`BACKEND_KERNELS` are those of the executor's host-side helpers (a run's upload and range check, its reads);
the GPU client makes none (:mod:`caramel.ckks.gpu_kernels`). CuPy is imported lazily.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

#: Rows of the small arrays an array kernel is made on (more than one: a single row merges with the columns).
ROWS = 2


class ArrayKernel(NamedTuple):
    """The CuPy kernel that ``launch(cp, n)`` makes CuPy compile: the call at ``site`` (where the code makes it), on
    small arrays at ring degree ``n``. Calling it (a job of the compile pool) launches it once on a stream of its
    own and waits for it."""

    site: str
    launch: Callable[[object, int], object]
    weight: float = 0.5

    def __call__(self, n: int = 4096) -> None:
        import cupy as cp

        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            self.launch(cp, n)
        stream.synchronize()

    def at(self, n: int) -> "SizedKernel":
        """This kernel at ring degree ``n`` (a job without arguments)."""
        return SizedKernel(self, n)


class SizedKernel(NamedTuple):
    """An :class:`ArrayKernel` at ring degree ``n``: a job of the compile pool."""

    kernel: ArrayKernel
    n: int

    @property
    def weight(self) -> float:
        return self.kernel.weight

    def __call__(self) -> None:
        self.kernel(self.n)


def rows(cp, n: int, dtype=np.uint32, k: int = ROWS):
    """A (k, n) array of zeros."""
    return cp.zeros((k, n), dtype=dtype)


def index(cp, values, dtype=np.int64):
    """A device index array."""
    return cp.asarray(np.asarray(values, dtype=dtype))


#: The array kernels of the executor's helpers on a CUDA device (:mod:`caramel.backends.cuda.backend`,
#: :mod:`caramel.backends.cuda.transfer`).
BACKEND_KERNELS = (
    ArrayKernel("CupyBackend.read: arena[int64 rows]",
                lambda cp, n: rows(cp, n, k=4)[index(cp, [0, 2])]),
)


def backend_jobs(n: int) -> list:
    """The compile jobs of the executor's helpers at ring degree ``n``: :data:`BACKEND_KERNELS` and the raw kernel
    of :func:`caramel.backends.cuda.transfer.row_maxima` and of the uploads' scatter
    (:data:`~caramel.backends.cuda.transfer.GATHER_SRC`)."""
    from caramel.backends.cuda.compiler import NVRTC_OPTIONS
    from caramel.backends.cuda.kernel_set import Module
    from caramel.backends.cuda.transfer import GATHER_SRC, ROW_MAXIMA_SRC

    return [k.at(n) for k in BACKEND_KERNELS] + [
        Module(("row_maxima",), ((ROW_MAXIMA_SRC, ("row_maxima",), NVRTC_OPTIONS),)),
        Module(("gather",), ((GATHER_SRC, ("gather_rows",), ()),))]


__all__ = ["ArrayKernel", "BACKEND_KERNELS", "ROWS", "SizedKernel", "backend_jobs", "index", "rows"]
