"""The client's arithmetic on the host: NumPy, with Numba's compiled kernels where installed.

Rows run in chunks of about :attr:`HostArith.chunk_residues` residues (a core's L2 cache) on the
thread pool of :func:`caramel.ring.ntt.map_chunks` (``CARAMEL_CLIENT_THREADS``). The NTT and the
c0 of an RLWE sample run compiled (:mod:`caramel.ckks.arith.jit`) once :func:`~caramel.ckks.arith.jit.ready`
says so, else as the NumPy code of :mod:`caramel.ring.ntt` and :meth:`ClientArith.rlwe_c0`: the
same bits either way (exact integer arithmetic, fully reduced results).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from caramel.ckks.arith import jit
from caramel.ckks.arith.base import ClientArith, DeviceKind
from caramel.ring.ntt import intt, map_chunks, ntt


@dataclass(frozen=True)
class HostArith(ClientArith):
    """The host implementation of :class:`~caramel.ckks.arith.base.ClientArith` (``chunk_residues``:
    rows are handed to the thread pool in chunks of about this many residues)."""

    chunk_residues: int = 1 << 16
    kind: ClassVar[DeviceKind] = DeviceKind.CPU

    @property
    def xp(self):
        return np

    def rows(self, fn, total: int, n: int) -> None:
        map_chunks(fn, total, max(1, self.chunk_residues // n))

    def transform(self, res, ctx, limbs, inverse: bool = False):
        tabs = [ctx.ntt_table(int(l)) for l in limbs]
        if not jit.ready(ctx.n):
            return (intt if inverse else ntt)(res, tabs)
        res = np.asarray(res)
        out = np.empty(res.shape, dtype=np.uint32)
        kernel = jit.inverse_rows if inverse else jit.forward_rows

        def run(r0: int, r1: int) -> None:
            for r in range(r0, r1):
                kernel(res[r : r + 1], out[r : r + 1], tabs[r])

        self.rows(run, len(tabs), ctx.n)
        return out

    def encode_rows(self, parts, scales, n: int, out) -> list:
        """:meth:`ClientArith.encode_rows` with the rows in chunks on the thread pool (NumPy's array operations
        run without the GIL)."""
        from caramel.ckks.encoding import encode_rows

        got: list = [None] * len(parts)
        scales = list(scales)

        def run(r0: int, r1: int) -> None:
            got[r0:r1] = encode_rows(parts[r0:r1], scales[r0:r1], n, out[r0:r1])

        self.rows(run, len(parts), n)
        return got

    def plaintext_rows(self, coeffs, ctx, groups):
        """:meth:`ClientArith.plaintext_rows`, each row's residues and NTT in one compiled kernel
        (:func:`jit.encode_row`) when the kernels are ready, rows in chunks on the thread pool."""
        coeffs = np.asarray(coeffs)
        if not (jit.ready(ctx.n) and coeffs.dtype == np.int64 and coeffs.ndim == 2 and coeffs.shape[1] == ctx.n):
            return super().plaintext_rows(coeffs, ctx, groups)
        flat = [int(l) for g in groups for l in g]
        source = [p for p, g in enumerate(groups) for _ in g]
        tabs = [ctx.ntt_table(l) for l in flat]
        out = np.empty((len(flat), ctx.n), dtype=np.uint32)

        def run(r0: int, r1: int) -> None:
            for r in range(r0, r1):
                jit.encode_row(coeffs[source[r]], tabs[r], out[r])

        self.rows(run, len(flat), ctx.n)
        return out

    def rlwe_c0(self, ctx, limbs, a, s, e, m, factor=None, perm=None):
        """:meth:`ClientArith.rlwe_c0`, row by row in one compiled kernel (:func:`jit.c0_row`: the
        error's NTT, the products and the gather) when the kernels are ready and the rows uint32."""
        if not (jit.ready(ctx.n) and e.dtype == np.int64 and all(x.dtype == np.uint32 for x in (a, s, m))):
            return super().rlwe_c0(ctx, limbs, a, s, e, m, factor, perm)
        tabs = [ctx.ntt_table(int(l)) for l in limbs]
        f = np.ones(len(tabs), dtype=np.uint64) if factor is None else np.asarray(factor, dtype=np.uint64)[:, 0]
        gather = None if perm is None else np.ascontiguousarray(perm, dtype=np.int64)
        out = np.empty(a.shape, dtype=np.uint32)

        def run(r0: int, r1: int) -> None:
            for r in range(r0, r1):
                jit.c0_row(e, a[r], s[r], m[r], int(f[r]), tabs[r], out[r], gather)

        self.rows(run, len(tabs), ctx.n)
        return out


#: The host client.
HOST = HostArith()
