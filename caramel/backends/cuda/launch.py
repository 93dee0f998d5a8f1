"""How the plan's kernels are launched: programmatic dependent launch (PDL, compute capability 9.0+).

Every kernel of a module that :meth:`~caramel.backends.cuda.context.CudaRing.module` builds starts
with ``CARAMEL_KERNEL_ENTRY()`` (:data:`ENTRY_SRC`, inserted by :func:`with_entry`):

* ``griddepcontrol.wait``: the kernel before it on its stream has completed and its writes are
  visible (nothing of this kernel reads or writes memory before);
* ``griddepcontrol.launch_dependents``: the kernel after it may be launched as soon as every block
  of this one has started.

:class:`Kernel` launches such a kernel with the programmatic-stream-serialization attribute
(``cuLaunchKernelEx``), so on a stream, and in a CUDA graph captured from it, the next kernel's
launch and block scheduling overlap this one's last wave instead of following it. Both
instructions do nothing in a kernel launched without the attribute, so one module serves both kinds
of launch: plain launches when :data:`ENABLED` is false (environment ``CARAMEL_PDL=0``) or the GPU
is older than Hopper.
"""

from __future__ import annotations

import ctypes
import os
import re

import numpy as np

#: Launch the plan's kernels with PDL where the GPU has it (``CARAMEL_PDL=0``: plain launches).
ENABLED = os.environ.get("CARAMEL_PDL", "1") != "0"

#: The first statement of every kernel built by CudaRing.module (see the module docstring).
ENTRY_SRC = r"""
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CARAMEL_KERNEL_ENTRY() do { asm volatile("griddepcontrol.wait;" ::: "memory"); \
                                    asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); } while (0)
#else
#define CARAMEL_KERNEL_ENTRY() do { } while (0)
#endif
"""

_KERNEL_OPEN = re.compile(r'(extern "C" __global__[^{;]*\{)')


def with_entry(source: str) -> str:
    """``source`` with ``CARAMEL_KERNEL_ENTRY();`` right after the opening brace of every
    ``extern "C" __global__`` function (macro bodies included: the statement stays on the brace's line)."""
    out, count = _KERNEL_OPEN.subn(r"\1 CARAMEL_KERNEL_ENTRY();", source)
    if count != source.count('extern "C" __global__'):
        raise ValueError("a kernel's opening brace was not found")
    return out


class _Value(ctypes.Union):
    _fields_ = [("flag", ctypes.c_int), ("raw", ctypes.c_char * 64)]


class _Attribute(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _Value)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_Attribute)), ("count", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_SCALARS = {np.dtype(t): c for t, c in ((np.int32, ctypes.c_int32), (np.uint32, ctypes.c_uint32),
                                        (np.int64, ctypes.c_int64), (np.uint64, ctypes.c_uint64),
                                        (np.float32, ctypes.c_float), (np.float64, ctypes.c_double))}
_driver = None
_capable: dict[int, bool] = {}


def _cuda():
    global _driver
    if _driver is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p] * 4
        lib.cuLaunchKernelEx.restype = ctypes.c_int
        _driver = lib
    return _driver


def argument(value):
    """A kernel argument as the ctypes value whose address goes into ``kernelParams``: a device
    array's pointer, or a NumPy scalar of its own C type (what CuPy's launches take)."""
    data = getattr(value, "data", None)
    if data is not None and hasattr(data, "ptr"):
        return ctypes.c_void_p(data.ptr)
    if isinstance(value, np.generic) and value.dtype in _SCALARS:
        return _SCALARS[value.dtype](value.item())
    raise TypeError(f"kernel argument of type {type(value).__name__} (a device array or a NumPy scalar expected)")


def pdl_available() -> bool:
    """:data:`ENABLED` and the current GPU has compute capability 9.0 or more."""
    if not ENABLED:
        return False
    from caramel.backends.cuda.context import cupy

    cp = cupy()
    dev = cp.cuda.Device().id
    if dev not in _capable:
        _capable[dev] = int(cp.cuda.Device(dev).compute_capability) >= 90
    return _capable[dev]


class Kernel:
    """A compiled CuPy function, called as one (``kernel(grid, block, args, shared_mem=0)``; its
    attributes are the function's), launched with programmatic stream serialization when
    :func:`pdl_available`, on the current stream."""

    __slots__ = ("fn",)

    def __init__(self, fn):
        object.__setattr__(self, "fn", fn)

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __setattr__(self, name, value):
        setattr(self.fn, name, value)

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        if not pdl_available():
            self.fn(grid, block, args, shared_mem=shared_mem)
            return
        from caramel.backends.cuda.context import cupy

        values = [argument(a) for a in args]
        params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        attr = _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        attr.value.flag = 1
        dims = [tuple(int(x) for x in d) + (1,) * (3 - len(d)) for d in (grid, block)]
        config = _Config((ctypes.c_uint * 3)(*dims[0]), (ctypes.c_uint * 3)(*dims[1]), int(shared_mem),
                         ctypes.c_void_p(cupy().cuda.get_current_stream().ptr), ctypes.pointer(attr), 1)
        rc = _cuda().cuLaunchKernelEx(ctypes.byref(config), ctypes.c_void_p(self.fn.ptr), params, None)
        if rc:
            raise RuntimeError(f"cuLaunchKernelEx: CUresult {rc}")
