"""Device-side ring context shared by every CUDA kernel wrapper.

A :class:`CudaRing` holds, for one ring degree N, everything the kernels read besides the arena:

* the prime table, one row of 8 uint32 words per prime index (0..63):
  ``[q, 2q, N^-1 mod q, shoup(N^-1), mu_lo, mu_hi, 0, 0]`` with ``mu = floor(2^64 / q)`` the
  64-bit Barrett constant of :func:`reduce64` (CUDA source :data:`COMMON_SRC`);
* the NTT twiddle tables (built on first use): for every prime, ``psi^br(k)`` and
  ``psi^-br(k)`` for k < N (SEAL order, br = bit reversal on log2 N bits), each stored as a
  ``uint2`` pair ``(w, floor(w * 2^32 / q))`` for Shoup products;
* a cache of compiled ``cupy.RawModule`` objects keyed by name.

The arena is a C-contiguous ``cupy`` uint32 array of shape (S, N); a limb is a row (slot) index.
Kernels take small int32 device arrays of slot and prime indices, never allocate and never
synchronise, so a sequence of launches can be captured into a CUDA graph.

CuPy is imported lazily: this module imports without it.
"""

from __future__ import annotations

import numpy as np

#: Options passed to NVRTC for every module (CuPy adds the device's own architecture, sm_90 on
#: Hopper). No fused multiply-add, so that the float64 sums of exact base conversion round exactly
#: like the CPU reference (the kernels also use __dmul_rn/__dadd_rn explicitly).
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")

#: Prime table row width (uint32 words).
PRIME_ROW = 8

#: CUDA helpers included at the top of every module. Residues are canonical in [0, q) with
#: q < 2^28 unless a name says otherwise ("lazy" values lie in [0, 2q) or [0, 4q)).
COMMON_SRC = r"""
typedef unsigned int u32;
typedef unsigned long long u64;

// x mod q for any 64-bit x (Barrett with mu = floor(2^64 / q); the quotient estimate is at most
// one short, so one conditional subtraction suffices).
__device__ __forceinline__ u32 reduce64(u64 x, u32 q, u64 mu) {
    const u64 qh = __umul64hi(x, mu);
    const u32 r = (u32)x - (u32)qh * q;
    return r >= q ? r - q : r;
}
__device__ __forceinline__ u32 mul_mod(u32 a, u32 b, u32 q, u64 mu) {
    return reduce64((u64)a * b, q, mu);
}
__device__ __forceinline__ u32 add_mod(u32 a, u32 b, u32 q) {
    const u32 s = a + b;
    return s >= q ? s - q : s;
}
__device__ __forceinline__ u32 sub_mod(u32 a, u32 b, u32 q) {
    return a >= b ? a - b : a + q - b;
}
__device__ __forceinline__ u32 neg_mod(u32 a, u32 q) {
    return a ? q - a : 0u;
}
// a * w mod q in [0, 2q) for any a < 2^32, with w < q and wp = floor(w * 2^32 / q) (Shoup).
__device__ __forceinline__ u32 shoup_lazy(u32 a, u32 w, u32 wp, u32 q) {
    return a * w - __umulhi(a, wp) * q;
}
__device__ __forceinline__ u32 shoup(u32 a, u32 w, u32 wp, u32 q) {
    const u32 r = shoup_lazy(a, w, wp, q);
    return r >= q ? r - q : r;
}
__device__ __forceinline__ u32 prime_q(const u32* __restrict__ pt, int p) { return __ldg(pt + 8 * p); }
__device__ __forceinline__ u64 prime_mu(const u32* __restrict__ pt, int p) {
    return ((u64)__ldg(pt + 8 * p + 5) << 32) | (u64)__ldg(pt + 8 * p + 4);
}
"""


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


def twiddle_tables(primes, n: int, xp=np):
    """(forward, inverse): (P, N, 2) uint32 arrays of ``xp`` (NumPy or CuPy), entry k of prime i
    (psi^br(k), shoup) and (psi^-br(k), shoup), computed where ``xp`` computes, from one primitive 2N-th
    root r of each prime (:func:`primitive_root`); None where a prime has none (not 1 mod 2N, or not
    prime). The same tables as :meth:`CudaRing.host_twiddles`, bit for bit:

        r_pow[j] = r^j mod q (j < 2N, by squaring: bit b of j multiplies r^(2^b) in),
        psi = min over odd j of r_pow[j] = r_pow[k] (the least primitive 2N-th root: ring.ntt's psi),
        psi^br(m) = r_pow[k br(m) mod 2N],  psi^-br(m) = r_pow[-k br(m) mod 2N],
        shoup(w) = floor(w 2^32 / q).
    """
    from caramel.ring.ntt import bit_reverse

    roots = [primitive_root(int(q), n) for q in primes]
    if not primes or None in roots or n < 2 or n & (n - 1):
        return None
    u64 = np.uint64
    q = xp.asarray(np.array(primes, dtype=u64))[:, None]
    base = xp.asarray(np.array(roots, dtype=u64))[:, None]
    j = xp.arange(2 * n, dtype=u64)[None, :]
    r_pow = xp.ones((len(primes), 2 * n), dtype=u64)
    for b in range((2 * n - 1).bit_length()):  # products of residues below 2^30 fit 64 bits
        r_pow = xp.where((j >> u64(b)) & u64(1) == u64(1), r_pow * base % q, r_pow)
        base = base * base % q
    odd = r_pow[:, 1::2]
    if bool(xp.any(odd == 0)):  # q not prime
        return None
    k = 2 * xp.argmin(odd, axis=1).astype(np.int64) + 1
    kbr = k[:, None] * xp.asarray(bit_reverse(n))[None, :]
    mask = 2 * n - 1
    out = []
    for idx in (kbr & mask, -kbr & mask):
        w = r_pow[xp.arange(len(primes))[:, None], idx]
        out.append(xp.stack([w.astype(np.uint32), ((w << u64(32)) // q).astype(np.uint32)], axis=-1))
    return out[0], out[1]


class CudaRing:
    """Device constants and compiled-module cache for the ring of a :class:`caramel.ring.Context`.

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
            rows[i, :6] = [q, 2 * q, ninv, shoup_constant(ninv, q), mu & 0xFFFFFFFF, mu >> 32]
        self.prime_rows = rows
        self._prime_table = None
        self._twiddles = None
        self._modules: dict[str, object] = {}
        self._functions: dict[tuple[str, str], object] = {}

    # ----------------------------------------------------------------- device tables
    @property
    def prime_table(self):
        """Device uint32 array (P, 8) of per-prime constants (see the module docstring)."""
        if self._prime_table is None:
            self._prime_table = cupy().asarray(self.prime_rows)
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
        device (:func:`twiddle_tables`: no host NTT table is built), else from :meth:`host_twiddles`."""
        if self._twiddles is None:
            cp = cupy()
            tables = twiddle_tables(self.primes, self.n, cp)
            if tables is None:  # a prime without a root: the host tables raise the reference's error
                tables = tuple(cp.asarray(t) for t in self.host_twiddles())
            self._twiddles = tuple(tables)
        return self._twiddles

    # ----------------------------------------------------------------- modules
    def module(self, key: str, source_fn):
        """The compiled ``cupy.RawModule`` for ``key``; ``source_fn()`` gives its source once."""
        mod = self._modules.get(key)
        if mod is None:
            mod = cupy().RawModule(code=COMMON_SRC + source_fn(), options=NVRTC_OPTIONS)
            self._modules[key] = mod
        return mod

    def kernel(self, key: str, source_fn, name: str):
        """Function ``name`` of the module ``key`` (see :meth:`module`), cached."""
        fn = self._functions.get((key, name))
        if fn is None:
            fn = self._functions[(key, name)] = self.module(key, source_fn).get_function(name)
        return fn

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
