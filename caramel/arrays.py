"""What kind of array a value is, asked by every layer (the client, the backends, the executors) without importing
CuPy."""

from __future__ import annotations

import sys

import numpy as np


def is_device_array(a) -> bool:
    """Whether ``a`` is a GPU array: a CuPy array, known by its type (its ``__cuda_array_interface__``
    builds a dict on every look: thousands of key rows), or anything else exporting that interface.
    CuPy is not imported here: an array of it exists only once something imported it."""
    if isinstance(a, np.ndarray):
        return False
    cp = sys.modules.get("cupy")
    return (cp is not None and isinstance(a, cp.ndarray)) or hasattr(a, "__cuda_array_interface__")


def to_host(a) -> np.ndarray:
    """``a`` as a host NumPy array: a GPU array copied down (its ``get``, which waits for the stream), anything
    else as :func:`numpy.asarray` gives it. For small arrays (flags, a row); the client copies large ones through
    pinned buffers (:meth:`caramel.ckks.arith.ClientArith.get`)."""
    return a.get() if is_device_array(a) else np.asarray(a)


__all__ = ["is_device_array", "to_host"]
