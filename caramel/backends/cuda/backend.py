"""CupyBackend: the :class:`caramel.backends.Backend` interface on one CUDA device arena.

Each method is one call of the kernels of :mod:`caramel.backends.cuda`. The arena, an (S, N)
uint32 array, is allocated once; device copies of the host index arrays are cached by the id of
the NumPy array (the plan engine's lowered closures keep those arrays alive), so that a replay of
the same lowered kernels does no host-to-device copies and can be captured into a CUDA graph.
CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import numpy as np

from caramel.backends import Backend
from caramel.backends.cuda.config import KernelConfig
from caramel.backends.cuda.target import CUDA_TARGET
from caramel.errors import DeviceMemoryError

_RINGS: dict = {}


def _cp():
    import cupy

    return cupy


def cuda_ring(ctx):
    """The compiled-kernel ring of ``ctx`` on the current device (one per device and N, shared
    by every backend on that device; its tables live on that device)."""
    from caramel.backends.cuda import CudaRing

    key = (_cp().cuda.runtime.getDevice(), ctx.n, tuple(int(q) for q in ctx.primes))
    ring = _RINGS.get(key)
    if ring is None:
        ring = _RINGS[key] = CudaRing(ctx)
    return ring


def available_bytes() -> tuple[int, int]:
    """(bytes an allocation on the current CUDA device can take: its free memory and the free blocks of CuPy's
    pool, the device's total memory)."""
    cp = _cp()
    free, total = cp.cuda.runtime.memGetInfo()
    pool = cp.get_default_memory_pool()
    return int(free + pool.total_bytes() - pool.used_bytes()), int(total)


class CupyBackend(Backend):
    """One chip's arena of ``rows`` limbs on the current CUDA device, its kernels built under ``kernels`` (default
    ``KernelConfig()``, :mod:`caramel.backends.cuda.config`); :attr:`target` describes them to the planner."""

    target = CUDA_TARGET

    def __init__(self, ctx, rows: int, kernels: KernelConfig | None = None):
        cp = _cp()
        self.ctx = ctx
        self.kernels = kernels or KernelConfig()
        self.ring = cuda_ring(ctx)
        rows = max(int(rows), 1)
        need = rows * ctx.n * 4
        avail, total = available_bytes()
        if need > avail:
            raise DeviceMemoryError(
                f"the arena of {rows} limbs x N = {ctx.n} needs {need} bytes of GPU memory; "
                f"{avail} bytes are available (device total {total})")
        try:
            self.arena = cp.zeros((rows, ctx.n), dtype=cp.uint32)
        except cp.cuda.memory.OutOfMemoryError as e:
            raise DeviceMemoryError(
                f"the arena of {rows} limbs x N = {ctx.n} needs {need} bytes of GPU memory; "
                f"{avail} bytes are available (device total {total})") from e
        self.scalars = cp.zeros(1, dtype=cp.uint32)
        self._dev: dict[int, tuple] = {}
        self._convs: dict = {}  # key -> tables (_shared), as _crt
        self._crt: dict = {}
        self._rsv_extra: dict[int, tuple] = {}
        self._counters: dict[int, tuple] = {}

    @property
    def nbytes(self) -> int:
        return int(self.arena.nbytes)

    @staticmethod
    def _shared(cache: dict, key, make):
        """``make()``, device tables that every stream of the device reads, made once on the current stream and
        cached only once that stream has finished them (:func:`~caramel.backends.cuda.transfer.settled`)."""
        got = cache.get(key)
        if got is None:
            from caramel.backends.cuda.transfer import settled

            got = cache[key] = settled(make())
        return got

    def d(self, x: np.ndarray):
        """The cached device int32 copy of host index array ``x``."""
        got = self._dev.get(id(x))
        if got is None or got[0] is not x:
            got = self._dev[id(x)] = (x, _cp().asarray(np.ascontiguousarray(x, dtype=np.int32)))
        return got[1]

    def counters(self, outs: np.ndarray):
        """The one-kernel transforms' counters of the launches that write rows ``outs`` (a host index array; see
        :func:`caramel.backends.cuda.ntt.launch`): one zeroed array per array ``outs``, as :meth:`d`. Two launches
        that run at once never share them: they would write the same rows."""
        from caramel.backends.cuda import ntt as dntt

        got = self._counters.get(id(outs))
        if got is None or got[0] is not outs:
            got = self._counters[id(outs)] = (outs, _cp().zeros(dntt.counter_words(len(outs)), dtype=np.int32))
        return got[1]

    def write(self, rows, data) -> None:
        from caramel.backends.cuda.transfer import upload_rows

        upload_rows(self.arena, rows, data if isinstance(data, (list, tuple)) else np.asarray(data, dtype=np.uint32))

    def read(self, rows) -> np.ndarray:
        """Arena rows ``rows`` as a host (k, N) array: gathered on the device, then copied down through
        the pinned staging buffers (:func:`~caramel.backends.cuda.transfer.download`: a run's stores
        can be hundreds of MB, which a pageable copy moves slowly)."""
        from caramel.backends.cuda.transfer import download

        cp = _cp()
        return download(self.arena[cp.asarray(np.asarray(rows, dtype=np.int64))])

    def set_scalars(self, values) -> None:
        """The scalar table; rewritten in place when its size is unchanged, so that a captured
        graph (which holds the table's address) reads the new values."""
        if len(values):
            values = np.asarray(values, dtype=np.uint32)
            old = getattr(self, "scalars", None)
            if old is not None and old.shape == values.shape:
                old.set(values, stream=_cp().cuda.get_current_stream())
            else:
                self.scalars = _cp().asarray(values)

    def elementwise(self, expr, ins, outs, primes, scalars, galois=None) -> None:
        from caramel.backends.cuda import elementwise as dew

        dew.fused(self.ring, expr, self.arena, self.d(outs), self.d(ins), self.d(primes), self.scalars,
                  self.d(scalars), None if galois is None else self.d(galois), self.kernels)

    def ntt(self, ins, outs, primes, half: bool = False) -> None:
        from caramel.backends.cuda import ntt as dntt

        dntt.ntt(self.ring, self.arena, self.d(ins), self.d(outs), self.d(primes), half, self.kernels)

    def ntt_prologue(self, prologue, ins, outs, primes, args, mode, half: bool = False) -> None:
        from caramel.backends.cuda import ntt as dntt

        tables = None
        if prologue.kind.value == "baseconv":
            tables = self._shared(self._convs, ("ntt-load", tuple(prologue.in_limbs)),
                                  lambda: dntt.PrologueTables(self.ring, prologue.in_limbs))
        dntt.ntt_prologue(self.ring, self.arena, prologue.kind.value, self.d(ins), self.d(outs), self.d(primes),
                          self.d(args), mode, tables, half, self.kernels)

    def intt(self, ins, outs, primes) -> None:
        from caramel.backends.cuda import ntt as dntt

        dntt.intt(self.ring, self.arena, self.d(ins), self.d(outs), self.d(primes), self.counters(outs), self.kernels)

    def automorphism(self, ins, outs, galois) -> None:
        from caramel.backends.cuda import automorphism as dauto

        dauto.automorphism(self.ring, self.arena, self.d(ins), self.d(outs), self.d(galois))

    def base_convert(self, in_limbs, out_limbs, ins, outs, mode) -> None:
        from caramel.backends.cuda import basis as dbasis

        conv = self._shared(self._convs, (tuple(in_limbs), tuple(out_limbs)),
                            lambda: dbasis.BaseConversion(self.ring, in_limbs, out_limbs))
        conv.convert(self.arena, self.d(ins), self.d(outs), mode)

    def sud_lift(self, ins, outs, src_primes, dst_primes, mode) -> None:
        from caramel.backends.cuda import basis as dbasis

        dbasis.sud_lift(self.ring, self.arena, self.d(ins), self.d(outs), self.d(src_primes), self.d(dst_primes), mode)

    def rsv(self, basis, ins, outs, primes) -> None:
        # The CUDA rsv accumulates in place: copy the words to their new rows, then accumulate.
        from caramel.backends.cuda import crt as dcrt

        basis = tuple(basis)
        crt = self._shared(self._crt, basis, lambda: dcrt.CrtBasis(self.ring, basis))
        m = len(basis)
        extra = self._rsv_extra.get(id(ins))
        if extra is None or extra[0] is not ins:
            cp = _cp()
            words = cp.asarray(np.ascontiguousarray(ins[:, :m], dtype=np.int32).ravel())
            rs = cp.asarray(np.ascontiguousarray(ins[:, m:], dtype=np.int32))
            pos = cp.asarray(np.array([[basis.index(int(p))] for p in primes], dtype=np.int32))
            buf = cp.empty((words.size, self.ring.n), dtype=np.uint32)  # allocated before any capture
            extra = self._rsv_extra[id(ins)] = (ins, words, rs, pos, buf)
        _, words, rs, pos, buf = extra
        acc = self.d(outs)
        dcrt.move_rows(self.ring, self.arena, words, acc.ravel(), buf)
        crt.rsv(self.arena, acc, rs, pos)

    def mod(self, ins, outs, primes) -> None:
        from caramel.backends.cuda import crt as dcrt

        dcrt.mod(self.ring, self.arena, self.d(ins), self.d(outs), self.d(primes))


__all__ = ["CupyBackend", "available_bytes", "cuda_ring"]
