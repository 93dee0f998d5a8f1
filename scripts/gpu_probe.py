"""Launch one NTT, one INTT and base conversions (13 -> 50) at N = 65536 (for ncu: which limit binds).

    ncu --clock-control none --section SpeedOfLight --section WarpStateStats python3 scripts/gpu_probe.py
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    import cupy as cp

    from caramel.backends.cuda import CudaRing
    from caramel.backends.cuda import basis as dbasis
    from caramel.backends.cuda import ntt as dntt
    from caramel.ring import Context, Mode

    n, rows = 65536, 512
    ring = CudaRing(Context(n))
    rng = np.random.default_rng(1)
    arena = cp.asarray(rng.integers(0, 2**27, (2 * rows, n), dtype=np.uint32))
    i32 = lambda a: cp.asarray(np.asarray(a, dtype=np.int32))  # noqa: E731
    primes = i32(np.arange(rows) % 64)
    dntt.ntt(ring, arena, i32(range(rows)), i32(range(rows, 2 * rows)), primes)
    dntt.intt(ring, arena, i32(range(rows)), i32(range(rows, 2 * rows)), primes)
    for tensor, build in ((True, None), (True, (1, 4)), (False, None)):  # tensor-core builds, then the tiled kernel
        conv = dbasis.BaseConversion(ring, list(range(13)), list(range(13, 63)), tensor=tensor)
        conv.convert(arena, i32(np.arange(13)[None]), i32(np.arange(13, 63)[None] + 100), Mode.EXACT, build=build)
    cp.cuda.Device().synchronize()


if __name__ == "__main__":
    main()
