"""CUDA kernels of caramel (CuPy, NVRTC): batched limb operations over a device arena.

Every kernel works on an arena, a C-contiguous cupy uint32 array of shape (S, N) whose rows (slots)
hold limbs, and takes small int32 device arrays of slot and prime indices, so that one launch covers
many limbs with different primes. Nothing here allocates device memory during a launch or
synchronises, so a plan of launches can be captured into a CUDA graph.

Modules (CUDA source next to each wrapper, shared CUDA C in ``.cuh`` files): ``config`` (the kernels' settings,
:class:`KernelConfig`), ``compiler`` (compiled modules, cached by their source text), ``context``
(:class:`CudaRing`: per-N device constants), ``ntt`` (the NTT package: transforms, prologues, epilogues),
``elementwise`` (elementwise programs, :class:`caramel.expr.Expr`), ``automorphism``, ``basis`` (base conversion,
``sud`` lift), ``crt`` (rsv/mod), ``transfer`` (host <-> device copies), ``target`` (what the planner knows of
these kernels), ``backend`` (:class:`~caramel.backends.cuda.backend.CupyBackend`).
This package imports without CuPy; CuPy is imported when a kernel is first used.
Functions are reached through their modules (``ntt.ntt``, ``elementwise.add``, ...); the package
exports the classes only, so that module names are not shadowed.
"""

from caramel.backends.cuda.basis import BaseConversion
from caramel.backends.cuda.config import KernelConfig
from caramel.backends.cuda.context import CudaRing
from caramel.backends.cuda.crt import CrtBasis


def available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return False


__all__ = ["BaseConversion", "CrtBasis", "CudaRing", "KernelConfig", "available"]
