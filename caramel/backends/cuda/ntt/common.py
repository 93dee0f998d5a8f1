"""What every NTT kernel module shares: the shape constants, the lazy bound, the CUDA C of butterflies.cuh,
passes.cuh and warp_tiles.cuh (package data) behind the per-module ``#define`` s, and the calls of the passes."""

from __future__ import annotations

import re

from caramel.backends.cuda.compiler import read_cuh
from caramel.backends.cuda.context import COMMON_SRC, CudaRing

THREADS = 256  # threads a block of the column kernels, the small transform and the one-kernel transforms
COLS = 32  # columns per block in the column kernel
RADIX_LOG = 4  # stages per pass held in registers (2^RADIX_LOG points per virtual thread)
ROW_LOG = 8  # log2 of the row length
WPITCH = 272  # words between two rows of a warp tile (warp_tiles.cuh: wsidx)
SMEM_SM = 228 * 1024  # shared memory of a multiprocessor (H100, H200); each resident block also reserves 1 KiB

_SHARED = "".join(read_cuh(__package__, name) for name in ("butterflies.cuh", "passes.cuh", "warp_tiles.cuh"))


def fill(template: str, **values) -> str:
    """``template`` with each ``{name}`` of ``values`` replaced by its text, in one pass (every other brace is
    CUDA's); a name that the template lacks is an error."""
    used = set()

    def value(m: re.Match) -> str:
        if m.group(1) not in values:
            return m.group(0)
        used.add(m.group(1))
        return str(values[m.group(1)])

    out = re.sub(r"\{(\w+)\}", value, template)
    if used != set(values):
        raise KeyError(f"no {sorted(set(values) - used)} in the template")
    return out


def ring_lazy(ring: CudaRing) -> bool:
    """Whether ``ring``'s transforms reduce lazily: every prime below 2^28 (the lazy bound 16q must fit in 32 bits;
    butterflies.cuh). The column kernel's intermediate depends on it, so every kernel that reads one asks this."""
    return max(ring.primes) < 1 << 28


def header(logn: int, a_bits: int, lazy: bool) -> str:
    """The start of every NTT kernel module: COMMON_SRC, the ring's ``#define`` s (N = 2^logn, 2^a_bits rows of 256
    points at N >= 8192, LAZY) and the shared device functions."""
    return (COMMON_SRC + f"#define LOGN {logn}\n#define NN (1 << LOGN)\n#define A_BITS {a_bits}\n#define LAZY {int(lazy)}\n"
            + _SHARED)


def pass_calls(logm: int, g: int, mode: int, inverse: bool, canonical: bool = False) -> str:
    """The ntt_pass calls of a 2^logm-point transform of g sub-transforms in layout ``mode`` (passes of RADIX_LOG
    stages, the last one shorter; reversed for the inverse). ``canonical`` (forward): the first pass's inputs are
    canonical (ntt_pass's CANON)."""
    plan, s = [], 0
    while s < logm:
        r = min(RADIX_LOG, logm - s)
        plan.append((s, r))
        s += r
    if inverse:
        plan.reverse()
    inv = "true" if inverse else "false"
    calls = [f"    ntt_pass<{logm}, {g}, {mode}, {s0}, {r}, {inv}{', true' if canonical and s0 == 0 else ''}>"
             "(sm, tw, q, two_q, four_q, eight_q);" for s0, r in plan]
    return "\n    __syncthreads();\n".join(calls)
