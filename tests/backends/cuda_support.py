"""What the CUDA kernel test modules share (test_cuda_kernels.py, test_cuda_ntt_prologue.py): the
poison value, the ring degrees under test, the (CPU context, CUDA ring) pairs built once per session,
a freshly seeded generator (its seed printed, so a failure can be replayed) and int32 device arrays.
Import it after the module's CuPy and device skips: it needs CuPy."""

from __future__ import annotations

import os

import cupy as cp
import numpy as np
import pytest

from caramel.backends.cuda import CudaRing
from caramel.ring import Context

POISON = np.uint32(0xFFFFFFFF)  # never a residue: an output row still holding it was never written
SIZES = [int(s) for s in os.environ.get("CARAMEL_CUDA_TEST_N", "4096,65536").split(",")]
_RINGS: dict[int, tuple[Context, CudaRing]] = {}


def rings(n: int) -> tuple[Context, CudaRing]:
    """The (CPU context, CUDA ring) pair of degree n, built once per session."""
    if n not in _RINGS:
        ctx = Context(n)
        _RINGS[n] = (ctx, CudaRing(ctx))
    return _RINGS[n]


@pytest.fixture(params=SIZES, ids=lambda n: f"N={n}")
def pair(request):
    return rings(request.param)


@pytest.fixture
def rng():
    seed = int.from_bytes(os.urandom(8), "little")
    print(f"seed={seed}")
    return np.random.default_rng(seed)


def i32(a) -> object:
    return cp.asarray(np.ascontiguousarray(np.asarray(a, dtype=np.int32)))
