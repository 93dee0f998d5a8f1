"""The interface of the client's arithmetic and its formulas, each written once against an array module.

A :class:`ClientArith` supplies three primitives: its array module ``xp``, a map over slices of
rows (:meth:`~ClientArith.rows`) and the NTT of rows (:meth:`~ClientArith.transform`); copies to
and from the host and the draws (:meth:`~ClientArith.uniform`, :meth:`~ClientArith.error`,
replayed on the device for the GPU) follow from ``xp``. The formulas below are written on those
only, so that the host (:class:`~caramel.ckks.arith.host.HostArith`) and the GPU
(:class:`~caramel.ckks.arith.gpu.GpuArith`) compute them with the same code. Rows r of a (k, N)
array belong to limbs l_r, q = q_{l_r}; polynomials are in NTT form unless said otherwise:

    encoding:        NTT(c mod q)                         c integer coefficients
    secret rows:     NTT(s mod q) on every limb           s small (|s| < q), s mod q = s + q [s < 0]
    RLWE sample:     c1 = a,  c0 = -a s + f m + e          (mod q)    e small, f per row
    encryption:      m the message (f = 1)
    evaluation key:  s = s_old, m = s_new, f = [l in D] (P mod q)   (ISA.md 5.3)
    decryption:      INTT(c0 + c1 s)                       (mod q)

Every step after the draws is exact integer arithmetic modulo primes below 2^30, and the draws are
the same generator calls in the same order on both, so both give the same bits.
"""

from __future__ import annotations

import abc
import enum
import threading
from typing import Any, Callable, ClassVar

import numpy as np

from caramel.arrays import is_device_array
from caramel.ckks.rns import mulmod, prime_column, to_residues
from caramel.ckks.sampling import cbd, uniform_residues
from caramel.errors import ArgumentError, CaramelError

_U64 = np.uint64
_rows_kept = threading.local()  # per thread: the float64 buffer of ClientArith.host_rows


class ClientDeviceError(CaramelError, ValueError):
    """An unknown client device, or a GPU client without CuPy."""


class DeviceKind(str, enum.Enum):
    """Where client arithmetic runs."""

    CPU = "cpu"
    GPU = "gpu"


def small_residues(coeffs, qcol, xp=np):
    """[c mod q] for small signed integers c (|c| < q), rows per prime of ``qcol``: c + q [c < 0].

    Computed as x = uint64(c) + q (wrapping), then min(x, x - q) (uint32 result)."""
    x = coeffs.astype(_U64)[None, :] + qcol
    return xp.minimum(x, x - qcol).astype(np.uint32)


class ClientArith(abc.ABC):
    """Where and how the client computes: the primitives (abstract) and the formulas of the module
    docstring on them. Arrays handed in and out are arrays of :attr:`xp` unless said otherwise."""

    kind: ClassVar[DeviceKind]

    @property
    @abc.abstractmethod
    def xp(self) -> Any:
        """The array module (NumPy, or CuPy for the GPU)."""

    @abc.abstractmethod
    def rows(self, fn: Callable[[int, int], None], total: int, n: int) -> None:
        """Call fn(r0, r1) over slices of range(total) rows of N = ``n`` that together cover it once
        (fn writes disjoint outputs)."""

    @abc.abstractmethod
    def transform(self, res, ctx, limbs, inverse: bool = False):
        """NTT (INTT with ``inverse``) of canonical residues ``res`` (k, N) uint32, row r modulo
        q_{limbs[r]}: :func:`caramel.ring.ntt.ntt` (``intt``), bit for bit."""

    @property
    def on_gpu(self) -> bool:
        return self.kind == DeviceKind.GPU

    def uniform(self, ctx, limbs, rng: np.random.Generator):
        """a: (k, N) uint32, row r uniform in [0, q_{limbs[r]}): the draw of
        :func:`~caramel.ckks.sampling.uniform_residues` (replayed on the device for the GPU)."""
        return uniform_residues(ctx, limbs, rng, self.xp, on_device=self.on_gpu)

    def error(self, n: int, rng: np.random.Generator):
        """e: N centred-binomial coefficients (int64): the draw of :func:`~caramel.ckks.sampling.cbd`
        (replayed on the device for the GPU)."""
        return cbd(n, rng, xp=self.xp, on_device=self.on_gpu)

    def put(self, a, dtype=None):
        """``a`` as an array of :attr:`xp` (a copy to the device when needed)."""
        return self.xp.asarray(a, dtype=dtype)

    def get(self, a) -> np.ndarray:
        """``a`` as a host NumPy array (a GPU array copied down through pinned staging buffers)."""
        if is_device_array(a):
            from caramel.backends.cuda.transfer import download

            return download(a)
        return np.asarray(a)

    def host_rows(self, rows: int, n: int) -> np.ndarray:
        """A (rows, n) float64 host array to fill with rows for :meth:`encode_rows`: the calling thread's buffer,
        valid until its next call (kept, and grown when a call needs more, so that an instance's rows touch no fresh
        pages)."""
        size = rows * n
        kept = getattr(_rows_kept, "buffer", None)
        if kept is None or kept.size < size:
            kept = _rows_kept.buffer = np.empty(size)
        return kept[:size].reshape(rows, n)

    def place(self):
        """Where this implementation's arrays are made now (a key of the caches of device arrays): None on the
        host."""
        return None

    def prime_column(self, ctx, limbs):
        """The primes of ``limbs`` as a (k, 1) uint64 column."""
        return prime_column(ctx, limbs, self.xp)

    def mulmod(self, a, b, q):
        """(a * b) mod q as uint32 rows: ``a`` (k, N) uint32, ``b`` (k, N) uint32 or a (k, 1) uint64 column, ``q`` the
        (k, 1) uint64 column of the primes (:meth:`prime_column`)."""
        return mulmod(a, b, q, self.xp).astype(np.uint32)

    def to_ntt_rows(self, coeffs, ctx, limbs):
        """Encoding: NTT(c mod q) of integer coefficients ``coeffs`` (host int64 or Python ints) on
        ``limbs``, (k, N) uint32. A row of N int64 coefficients is one plaintext of :meth:`plaintext_rows`
        (an implementation's fast path, the same bits)."""
        c = coeffs if is_device_array(coeffs) else np.asarray(coeffs)
        if c.dtype == np.int64 and c.shape == (ctx.n,):
            return self.plaintext_rows(c[None], ctx, [limbs])
        limbs = [int(l) for l in limbs]
        return self.transform(to_residues(coeffs, ctx, limbs, self.xp), ctx, limbs)

    def encode_rows(self, parts, scales, n: int, out) -> list:
        """:func:`caramel.ckks.encoding.encode_rows` of P vectors on this implementation: host float64 rows
        ``parts`` (P, N) [re | im] at ``scales``; an int64 row is written into ``out`` ((P, N) of :attr:`xp`) and
        returned as its view, a row with a coefficient of 2^62 or more as a host object array. The encoding is
        whole-array IEEE operations of :attr:`xp` in one order, so every implementation gives the same bits. Here on
        the host's tables (:func:`~caramel.ckks.encoding.encode_tables`): an implementation on another array module
        copies them there (:meth:`GpuArith.encode_rows <caramel.ckks.arith.gpu.GpuArith.encode_rows>`)."""
        from caramel.ckks.encoding import encode_rows

        return encode_rows(self.put(parts), scales, n, out, xp=self.xp)

    def plaintext_rows(self, coeffs, ctx, groups):
        """Encoding of P plaintexts at once: :meth:`to_ntt_rows` of row p of ``coeffs`` ((P, N) host
        int64) on the limbs ``groups[p]``, stacked in order into one (sum_p len(groups[p]), N) uint32
        array (plaintext p's rows follow those of plaintexts 0 .. p-1)."""
        xp = self.xp
        coeffs = self.get(coeffs) if not isinstance(coeffs, np.ndarray) else coeffs
        flat = [int(l) for g in groups for l in g]
        res = xp.empty((len(flat), ctx.n), dtype=np.uint32)
        r = 0
        for p, g in enumerate(groups):
            res[r : r + len(g)] = to_residues(coeffs[p], ctx, [int(l) for l in g], xp)
            r += len(g)
        return self.transform(res, ctx, flat)

    def small_rows(self, coeffs, ctx, limbs):
        """NTT(s mod q) of small signed coefficients ``coeffs`` (|s| < q, e.g. a secret) on ``limbs``."""
        limbs = [int(l) for l in limbs]
        return self.transform(small_residues(self.put(coeffs), self.prime_column(ctx, limbs), self.xp), ctx, limbs)

    def secret_rows(self, sk, ctx) -> "SecretRows":
        """The :class:`SecretRows` of secret key ``sk`` (a :class:`~caramel.ckks.keys.SecretKey`) for
        ``ctx``, cached on the key per context, implementation and :meth:`place` (each GPU its own rows)."""
        if ctx.n != sk.n:
            raise ArgumentError(f"secret has N = {sk.n}, context has N = {ctx.n}")
        cache = sk.__dict__.setdefault("_rows", {})
        key = (id(ctx), self, self.place())
        hit = cache.get(key)
        if hit is None or hit.ctx is not ctx:
            hit = cache[key] = SecretRows(sk.coeffs, ctx, self)
        return hit

    def take_rows(self, rows, limbs):
        """Rows ``limbs`` of ``rows`` (an (L, N) array of :attr:`xp`), a new (k, N) array."""
        return rows[self.put(np.asarray(list(limbs), dtype=np.int64))]

    def rlwe_c0(self, ctx, limbs, a, s, e, m, factor=None, perm=None):
        """c0 = -a s + f m + e (mod q) per row (module docstring): ``a``, ``s``, ``m`` (k, N) uint32
        rows, ``e`` (N,) small int64 coefficients (NTT(e mod q) per row); ``factor`` f a (k, 1) host
        uint64 column (None: f = 1); with ``perm`` (host int64 indices), m[:, perm] stands for m
        (an automorphism of s_new). Returns (k, N) uint32."""
        xp = self.xp
        limbs = [int(l) for l in limbs]
        qcol = self.prime_column(ctx, limbs)
        if perm is not None:
            m = xp.take(m, self.put(perm), axis=1)
        f = None if factor is None else self.put(factor)
        out = xp.empty(a.shape, dtype=np.uint32)

        def run(r0: int, r1: int) -> None:
            q = qcol[r0:r1]
            c = xp.add(self.transform(small_residues(e, q, xp), ctx, limbs[r0:r1]), q, dtype=_U64)  # e + q
            c -= mulmod(a[r0:r1], s[r0:r1], q, xp)  # in (0, 2q)
            if f is None:
                c += m[r0:r1]
            elif factor[r0:r1].any():
                c += mulmod(m[r0:r1], f[r0:r1], q, xp)  # in (0, 3q)
            out[r0:r1] = xp.remainder(c, q, out=c)

        self.rows(run, len(limbs), ctx.n)
        return out

    def encrypt_rows(self, ctx, limbs, m, s, rng: np.random.Generator):
        """(c0, c1 = a) encrypting the NTT-form rows ``m`` under the secret's rows ``s`` (both (k, N)):
        draws ``a`` (uniform on every limb), then ``e``, from ``rng``; c0 by :meth:`rlwe_c0`."""
        a = self.uniform(ctx, limbs, rng)
        e = self.error(ctx.n, rng)
        return self.rlwe_c0(ctx, limbs, a, s, e, m), a

    def decrypt_rows(self, ctx, limbs, c0, c1, s):
        """Decryption: coefficient-form residues INTT(c0 + c1 s mod q), (k, N) uint32."""
        xp = self.xp
        qcol = self.prime_column(ctx, limbs)
        m = mulmod(c1, s, qcol, xp)
        m += c0
        return self.transform(xp.remainder(m, qcol, out=m).astype(np.uint32), ctx, limbs, inverse=True)


class SecretRows:
    """A secret's NTT form on every limb of a context, on one implementation: ``rows[l]`` is
    NTT_{q_l}(s mod q_l), built with one batched transform for all limbs."""

    def __init__(self, coeffs: np.ndarray, ctx, arith: ClientArith):
        self.rows = arith.small_rows(coeffs, ctx, range(len(ctx.primes)))
        self.ctx = ctx
        self.arith = arith

    def take(self, limbs):
        """Rows of ``limbs``, (k, N) uint32."""
        return self.arith.take_rows(self.rows, limbs)
