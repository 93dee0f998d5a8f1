"""Device-side ring context shared by every CUDA kernel wrapper.

A :class:`CudaRing` holds, for one ring degree N, everything the kernels read besides the arena:

* the prime table, one row of 8 uint32 words per prime index (0..63):
  ``[q, 2q, N^-1 mod q, shoup(N^-1), mu_lo, mu_hi, 8q mod 2^32, 4q mod 2^32]`` with ``mu = floor(2^64 / q)`` the
  64-bit Barrett constant of :func:`reduce64` (CUDA source :data:`COMMON_SRC`; ``mu_hi = floor(2^32 / q)``, the
  forward NTT's final reduction), 8q and 4q the lazy NTT butterflies' bounds (below 2^32 for q < 2^29: only rings of
  primes below 2^28 run lazily);
* the NTT twiddle tables (built on first use): for every prime, ``psi^br(k)`` and
  ``psi^-br(k)`` for k < N (SEAL order, br = bit reversal on log2 N bits), each stored as a
  ``uint2`` pair ``(w, floor(w * 2^32 / q))`` for Shoup products.

The arena is a C-contiguous ``cupy`` uint32 array of shape (S, N); a limb is a row (slot) index.
Kernels take small int32 device arrays of slot and prime indices, never allocate and never
synchronise, so a sequence of launches can be captured into a CUDA graph.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import numpy as np

from caramel.backends.cuda.compiler import function, read_cuh
from caramel.backends.cuda.transfer import settled

#: Prime table row width (uint32 words).
PRIME_ROW = 8

#: CUDA helpers included at the top of every module (common.cuh, package data): the modular arithmetic of
#: canonical residues and the prime table's fields.
COMMON_SRC = read_cuh(__package__, "common.cuh")


def cupy():
    """Return the ``cupy`` module (imported on first use)."""
    import cupy as cp

    return cp


def shoup_constant(w: np.ndarray | int, q: int):
    """floor(w * 2^32 / q) for residues w < q (the Shoup companion of w)."""
    if isinstance(w, (int, np.integer)):
        return (int(w) << 32) // q
    return ((np.asarray(w, dtype=np.uint64) << np.uint64(32)) // np.uint64(q)).astype(np.uint32)


def primitive_root(q: int, n: int) -> int | None:
    """Some primitive 2n-th root of unity modulo q (x^((q-1)/2n) for the first x = 2, 3, ... whose power
    has r^n = -1), or None when q != 1 mod 2n or no x below 1000 gives one. Which root it is does not
    matter: its odd powers are all the primitive 2n-th roots, whatever r is."""
    if q < 3 or (q - 1) % (2 * n):
        return None
    for x in range(2, min(q, 1000)):
        r = pow(x, (q - 1) // (2 * n), q)
        if pow(r, n, q) == q - 1:
            return r
    return None


#: Odd exponents whose powers one thread of ``twiddle_psi`` (and :func:`twiddle_tables`'s twin) takes.
TWIDDLE_CHUNK = 64

#: The CUDA ring's twiddle tables in two kernels (one module, after :data:`COMMON_SRC`'s typedefs).
#: ``p`` holds q[0..P), then r[0..P) (a primitive 2N-th root of each prime), then psi[0..P), all ones
#: on entry. Products of residues below 2^30 fit 64 bits; ``%`` reduces them exactly.
TWIDDLE_SRC = read_cuh(__package__, "twiddles.cuh")


def _pow_rows(base, exps, q):
    """base^exps mod q elementwise (uint64 arrays broadcasting, residues below 2^30), by squaring:
    the loop of ``pow_mod`` in :data:`TWIDDLE_SRC`."""
    u64 = np.uint64
    e = np.asarray(exps, dtype=u64)
    out = np.ones(np.broadcast_shapes(np.shape(base), e.shape), dtype=u64)
    b = np.broadcast_to(base, out.shape).astype(u64)
    for bit in range(int(e.max()).bit_length() if e.size else 0):
        out = np.where((e >> u64(bit)) & u64(1) == u64(1), out * b % q, out)
        b = b * b % q
    return out


def twiddle_tables(primes, n: int, xp=np):
    """(forward, inverse): (P, N, 2) uint32 arrays of ``xp`` (NumPy or CuPy), entry m of prime i
    (psi^br(m), shoup) and (psi^-br(m), shoup), from one primitive 2N-th root r of each prime
    (:func:`primitive_root`); None where a prime has none (not 1 mod 2N, or not prime). The same
    tables as :meth:`CudaRing.host_twiddles`, bit for bit. Two steps, the same on both devices (on
    the GPU the two kernels of :data:`TWIDDLE_SRC`, one module; on the host their NumPy twin):

        psi = min over odd j < 2N of r^j mod q (the least primitive 2N-th root: ring.ntt's psi;
              thread t takes j = 2 (t C + c) + 1, c < C = min(TWIDDLE_CHUNK, N); 0: q is not prime),
        psi^br(m) mod q,  psi^-br(m) = psi^(2N - br(m)) mod q   (psi^2N = 1),
        shoup(w) = floor(w 2^32 / q),

    powers by squaring, br the bit reversal on log2 N bits. On the GPU the caller's stream waits
    once, for the psi check."""
    roots = [primitive_root(int(q), n) for q in primes]
    if not primes or None in roots or n < 2 or n & (n - 1):
        return None
    u64 = np.uint64
    k, chunk, logn = len(primes), min(TWIDDLE_CHUNK, n), n.bit_length() - 1
    if xp is np:
        from caramel.ring.ntt import bit_reverse

        q = np.array(primes, dtype=u64)[:, None]
        r = np.array(roots, dtype=u64)[:, None]
        x = _pow_rows(r, 2 * np.arange(n // chunk, dtype=u64)[None, :] * u64(chunk) + u64(1), q)
        least, r2 = x.copy(), r * r % q
        for _ in range(1, chunk):
            x = x * r2 % q
            least = np.minimum(least, x)
        psi = least.min(axis=1, keepdims=True)
        if bool((psi == 0).any()):
            return None
        br = bit_reverse(n).astype(u64)[None, :]
        out = []
        for w in (_pow_rows(psi, br, q), _pow_rows(psi, u64(2 * n) - br, q)):
            out.append(np.stack([w.astype(np.uint32), ((w << u64(32)) // q).astype(np.uint32)], axis=-1))
        return out[0], out[1]
    cp = xp
    p = cp.asarray(np.concatenate([np.array(primes, dtype=u64), np.array(roots, dtype=u64),
                                   np.full(k, np.iinfo(u64).max, dtype=u64)]))
    fwd, inv = cp.empty((k, n, 2), dtype=np.uint32), cp.empty((k, n, 2), dtype=np.uint32)
    threads = n // chunk
    source = COMMON_SRC + TWIDDLE_SRC
    function(source, "twiddle_psi")(((threads + 255) // 256, k), (256,),
                                    (p, np.int32(k), np.int32(n), np.int32(chunk)))
    function(source, "twiddle_fill")(((n + 255) // 256, k), (256,), (p, np.int32(k), np.int32(n), np.int32(logn),
                                                                      fwd, inv))
    if bool((p[2 * k:].get() == 0).any()):  # q not prime
        return None
    return fwd, inv


class CudaRing:
    """Device constants for the ring of a :class:`caramel.ring.Context` (compiled kernels:
    :mod:`caramel.backends.cuda.compiler`).

    The primes, psi and the twiddles are the context's own (``ctx.ntt_table(l)``; the device twiddles
    are computed on the device, equal bit for bit, :func:`twiddle_tables`), so the kernels compute
    exactly the reference's functions. The kernels need q < 2^30 (lazy NTT values stay
    below 4q < 2^32). The twiddle tables take 16 N bytes per prime on the device (64 MiB for the
    64 primes at N = 65536).
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.n = int(ctx.n)
        self.logn = self.n.bit_length() - 1
        if self.n > 65536:
            raise ValueError(f"the CUDA kernels support N <= 65536, got {self.n}")
        self.primes = tuple(int(q) for q in ctx.primes)
        rows = np.zeros((len(self.primes), PRIME_ROW), dtype=np.uint32)
        for i, q in enumerate(self.primes):
            ninv = pow(self.n, q - 2, q)
            mu = (1 << 64) // q
            rows[i] = [q, 2 * q, ninv, shoup_constant(ninv, q), mu & 0xFFFFFFFF, mu >> 32, (8 * q) & 0xFFFFFFFF,
                       (4 * q) & 0xFFFFFFFF]
        self.prime_rows = rows
        self._prime_table = None
        self._twiddles = None

    # ----------------------------------------------------------------- device tables
    @property
    def prime_table(self):
        """Device uint32 array (P, 8) of per-prime constants (see the module docstring)."""
        if self._prime_table is None:
            self._prime_table = settled(cupy().asarray(self.prime_rows))
        return self._prime_table

    def host_twiddles(self) -> tuple[np.ndarray, np.ndarray]:
        """Host tables (P, N, 2) uint32 of forward and inverse twiddles with Shoup companions:
        entry k of prime i is (psi^br(k), shoup) and (psi^-br(k), shoup), psi of ``ctx.ntt_table(i)``."""
        fwd = np.empty((len(self.primes), self.n, 2), dtype=np.uint32)
        inv = np.empty_like(fwd)
        for i, q in enumerate(self.primes):
            table = self.ctx.ntt_table(i)
            for out, w in ((fwd, table.psi_powers), (inv, table.psi_inv_powers)):
                out[i, :, 0] = w
                out[i, :, 1] = shoup_constant(w, q)
        return fwd, inv

    @property
    def twiddles(self):
        """Device (forward, inverse) twiddle tables, each uint32 (P, N, 2), built on first use on the
        device (:func:`twiddle_tables`: two kernels of one module, no host NTT table), else from
        :meth:`host_twiddles`."""
        if self._twiddles is None:
            cp = cupy()
            tables = twiddle_tables(self.primes, self.n, cp)
            if tables is None:  # a prime without a root: the host tables raise the reference's error
                tables = tuple(cp.asarray(t) for t in self.host_twiddles())
            self._twiddles = settled(tuple(tables))
        return self._twiddles

    # ----------------------------------------------------------------- checks
    def check_arena(self, arena) -> None:
        """Raise ValueError unless ``arena`` is a C-contiguous uint32 (S, N) device array."""
        cp = cupy()
        if not isinstance(arena, cp.ndarray) or arena.dtype != cp.uint32 or arena.ndim != 2:
            raise ValueError("arena must be a cupy uint32 array of shape (S, N)")
        if arena.shape[1] != self.n or not arena.flags.c_contiguous:
            raise ValueError(f"arena must be C-contiguous with N = {self.n} columns, got {arena.shape}")


def index_array(x, rows: int | None = None, cols: int | None = None, name: str = "index"):
    """Check that ``x`` is a C-contiguous int32 device array of shape (rows,) or (rows, cols)."""
    cp = cupy()
    if not isinstance(x, cp.ndarray) or x.dtype != cp.int32 or not x.flags.c_contiguous:
        raise ValueError(f"{name} must be a C-contiguous cupy int32 array")
    if cols is None:
        if x.ndim != 1 or (rows is not None and x.shape[0] != rows):
            raise ValueError(f"{name} must have shape ({rows},), got {x.shape}")
    elif x.ndim != 2 or x.shape[1] != cols or (rows is not None and x.shape[0] != rows):
        raise ValueError(f"{name} must have shape ({rows}, {cols}), got {x.shape}")
    return x
