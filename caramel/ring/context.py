"""The ring context: N and the prime list, with lazily cached per-limb tables (ISA section 7).

A limb index L names the prime ``primes[L]``. Arrays of several limbs have shape (k, N) with a matching
sequence of k limb indices (row i is modulo primes[limbs[i]]). Every result is canonical np.uint32.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from caramel.ring import automorphism as _auto
from caramel.ring import crt as _crt
from caramel.ring.basis import BaseConverter
from caramel.ring.modes import Mode
from caramel.ring.ntt import NttTable, intt, ntt
from caramel.ring.primes import PRIMES, is_prime
from caramel.ring.rescale import sud_lift
from caramel.errors import ArgumentError

MIN_N = 16
MAX_PRIME = 1 << 30


class Context:
    """Context(n, primes) is the ring Z_q[X]/(X^n + 1) for every q in primes, with cached tables.

    Raises ValueError unless n is a power of two >= 16 and the primes are distinct primes < 2^30, each
    = 1 mod 2n. Tables (NTT per limb, permutation per Galois element, base converter per pair of limb
    lists) are built on first use and kept.
    """

    def __init__(self, n: int = 65536, primes: Sequence[int] = PRIMES):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise ArgumentError(f"ring degree N must be an integer, got {n!r}")
        n = int(n)
        if n < MIN_N or n & (n - 1):
            raise ArgumentError(f"ring degree N = {n} must be a power of two >= {MIN_N}")
        primes = tuple(primes)
        if not primes:
            raise ArgumentError("the prime list is empty")
        for i, q in enumerate(primes):
            if isinstance(q, bool) or not isinstance(q, (int, np.integer)):
                raise ArgumentError(f"prime {i} is not an integer: {q!r}")
            q = int(q)
            if not 2 < q < MAX_PRIME:
                raise ArgumentError(f"prime {i} = {q} is outside (2, 2^30)")
            if (q - 1) % (2 * n):
                raise ArgumentError(f"prime {i} = {q} is not 1 mod 2N = {2 * n}")
            if not is_prime(q):
                raise ArgumentError(f"prime {i} = {q} is not prime")
        primes = tuple(int(q) for q in primes)
        if len(set(primes)) != len(primes):
            dup = sorted({q for q in primes if primes.count(q) > 1})
            raise ArgumentError(f"the prime list repeats {dup}")
        self.n = n
        self.primes = primes
        self._lock = threading.Lock()
        self._ntt: dict[int, NttTable] = {}
        self._perm: dict[int, np.ndarray] = {}
        self._bconv: dict[tuple[tuple[int, ...], tuple[int, ...]], BaseConverter] = {}

    def __repr__(self) -> str:
        return f"Context(n={self.n}, primes={len(self.primes)} primes {self.primes[0]}..{self.primes[-1]})"

    # Primes and limbs.

    def q(self, limb: int) -> int:
        """q returns the prime of limb index ``limb``."""
        return self.primes[self._limb(limb)]

    def moduli(self, limbs: Sequence[int]) -> np.ndarray:
        """moduli returns the primes of ``limbs`` as a (k, 1) uint64 column (broadcasts against (k, N)); the errors of
        :meth:`q` for a bad limb (checked at once for an integer array, one by one otherwise)."""
        idx = np.asarray(limbs)
        checked = idx.ndim == 1 and idx.dtype.kind in "iu" and (idx.size == 0 or 0 <= idx.min() <= idx.max() <
                                                               len(self.primes))
        if not checked:
            return np.array([self.q(l) for l in limbs], dtype=np.uint64).reshape(-1, 1)
        return np.asarray(self.primes, dtype=np.uint64)[idx].reshape(-1, 1)

    def _limb(self, limb) -> int:
        if isinstance(limb, bool) or not isinstance(limb, (int, np.integer)):
            raise ArgumentError(f"limb index must be an integer, got {limb!r}")
        if not 0 <= limb < len(self.primes):
            raise ArgumentError(f"limb index {limb} is outside [0, {len(self.primes)})")
        return int(limb)

    def _limbs(self, a: np.ndarray, limbs) -> tuple[np.ndarray, list[int], bool]:
        """_limbs checks a against limbs: (N,) with an int, or (k, N) with k indices."""
        a = np.asarray(a)
        if isinstance(limbs, (int, np.integer)) and not isinstance(limbs, bool):
            if a.shape != (self.n,):
                raise ArgumentError(f"one limb must have shape ({self.n},), got {a.shape}")
            return a[None], [self._limb(limbs)], True
        limbs = [self._limb(l) for l in limbs]
        if a.shape != (len(limbs), self.n):
            raise ArgumentError(f"{len(limbs)} limbs must have shape ({len(limbs)}, {self.n}), got {a.shape}")
        return a, limbs, False

    # NTT.

    def ntt_table(self, limb: int) -> NttTable:
        """ntt_table returns the (cached) NttTable of limb ``limb``."""
        limb = self._limb(limb)
        table = self._ntt.get(limb)
        if table is None:
            with self._lock:
                table = self._ntt.get(limb)
                if table is None:
                    table = self._ntt[limb] = NttTable(self.primes[limb], self.n)
        return table

    def ntt(self, a, limbs) -> np.ndarray:
        """ntt returns NTT_{q_L}(a) per row (a: (N,) with an int limb, or (k, N) with k limbs), uint32."""
        rows, limbs, single = self._limbs(a, limbs)
        if not limbs:
            return np.empty((0, self.n), dtype=np.uint32)
        out = ntt(rows, [self.ntt_table(l) for l in limbs])
        return out[0] if single else out

    def intt(self, a, limbs) -> np.ndarray:
        """intt returns INTT_{q_L}(a) per row, the exact inverse of ntt (same shapes), uint32."""
        rows, limbs, single = self._limbs(a, limbs)
        if not limbs:
            return np.empty((0, self.n), dtype=np.uint32)
        out = intt(rows, [self.ntt_table(l) for l in limbs])
        return out[0] if single else out

    # Automorphisms.

    def galois_element(self, step: int) -> int:
        """galois_element returns 5^(step mod N/2) mod 2N, the Galois element of rotation by step."""
        return _auto.galois_element(step, self.n)

    @property
    def conjugation_element(self) -> int:
        """conjugation_element is 2N - 1, the Galois element of conjugation (a property, not a method)."""
        return _auto.conjugation_element(self.n)

    def permutation(self, g: int) -> np.ndarray:
        """permutation returns the (cached, read-only) NTT-form index permutation of X -> X^g."""
        g = int(g) % (2 * self.n)
        perm = self._perm.get(g)
        if perm is None:
            perm = _auto.automorphism_permutation(g, self.n)
            perm.flags.writeable = False
            self._perm[g] = perm
        return perm

    def automorphism(self, a, g: int) -> np.ndarray:
        """automorphism returns a(X^g) for a in NTT form: a[..., permutation(g)] (any leading shape), uint32."""
        a = np.asarray(a)
        if a.ndim == 0 or a.shape[-1] != self.n:
            raise ArgumentError(f"last axis must have length N = {self.n}, got shape {a.shape}")
        return _auto.apply_automorphism(a, self.permutation(g))

    # Base conversion, rescale, CRT.

    def base_converter(self, in_limbs: Sequence[int], out_limbs: Sequence[int]) -> BaseConverter:
        """base_converter returns the (cached) BaseConverter from the primes of in_limbs to out_limbs."""
        key = (tuple(self._limb(l) for l in in_limbs), tuple(self._limb(l) for l in out_limbs))
        conv = self._bconv.get(key)
        if conv is None:
            conv = BaseConverter([self.primes[l] for l in key[0]], [self.primes[l] for l in key[1]])
            self._bconv[key] = conv
        return conv

    def sud_lift(self, rb, t: int, l: int, mode: Mode | str = Mode.EXACT) -> np.ndarray:
        """sud_lift returns the lift of limb-t coefficients rb to limb l (rescale's y, ISA 4.3), uint32."""
        return sud_lift(rb, self.q(t), self.q(l), mode)

    def crt(self, residues, limbs: Sequence[int]) -> np.ndarray:
        """crt returns the CRT values in [0, Q) of residues (k, N) over limbs, as Python ints (object, (N,))."""
        return _crt.crt_reconstruct(residues, [self.q(l) for l in limbs])

    def rsv_accumulate(self, words, rs, basis_limbs: Sequence[int], limb: int) -> np.ndarray:
        """rsv_accumulate is crt.rsv_accumulate with the basis and the limb of rs given as limb indices."""
        basis_limbs = [self._limb(l) for l in basis_limbs]
        if limb not in basis_limbs:
            raise ArgumentError(f"limb {limb} is not in the rsv basis {basis_limbs}")
        return _crt.rsv_accumulate(words, rs, [self.primes[l] for l in basis_limbs], basis_limbs.index(limb))

    def mod_reduce(self, words, limb: int) -> np.ndarray:
        """mod_reduce returns X mod q_limb of the accumulator words (ISA `mod`), uint32."""
        return _crt.mod_reduce(words, self.q(limb))
