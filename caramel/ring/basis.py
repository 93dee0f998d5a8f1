"""RNS base conversion from an input basis S to an output basis (the base conversion unit, ISA 4.4).

Input: x of shape (|S|, N), coefficient form, row k modulo q_k = in_primes[k]. With Q_S = prod_k q_k and
Qhat_k = Q_S / q_k, the three modes (ISA decision 2) compute, for every output prime p:

* TEXTBOOK: t_k = [x_k * Qhat_k^-1]_{q_k};  out_p = sum_k t_k * [Qhat_k]_p mod p.
  The result is X + u * Q_S mod p with X the CRT value of x in [0, Q_S) and 0 <= u < |S|.
* EMULATOR: out_p = sum_k x_k * F_{k,p} mod p with F_{k,p} = [Qhat_k]_p * [Qhat_k^-1]_{q_k} mod p (the raw
  input times the combined factor, as the Cinnamon emulator and Cerium compute it).
* EXACT: t_k as in TEXTBOOK; f = float64 sum, in increasing k, of float64(t_k) * r_k with r_k = 1/q_k
  rounded to float64 once; v = floor(f + 1/2);  out_p = (sum_k t_k * [Qhat_k]_p - v * [Q_S]_p) mod p.
  sum_k t_k / q_k = X / Q_S + u, so v = u + round(X / Q_S) and out_p is the centred value of X modulo
  Q_S (in (-Q_S/2, Q_S/2)) reduced mod p, except when X / Q_S lies within float error of 1/2.

The float sum is sequential (no pairwise summation, no fused multiply-add) so that a GPU kernel that adds
in the same order reproduces it bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from caramel.ring.modes import Mode
from caramel.ring.modular import inv_mod
from caramel.errors import ArgumentError

_U64 = np.uint64


class BaseConverter:
    """BaseConverter precomputes the constants of the conversion from in_primes to out_primes.

    Attributes (row k = input prime, row j = output prime p_j):
      ``in_primes``, ``out_primes``: tuples of ints; ``product`` = Q_S (Python int);
      ``qhat_inv`` (|S|,) uint32: [Qhat_k^-1]_{q_k};
      ``qhat_mod_out`` (|out|, |S|) uint32: [Qhat_k]_{p_j};
      ``factors`` (|out|, |S|) uint32: F_{k,p_j} = [Qhat_k]_{p_j} * [Qhat_k^-1]_{q_k} mod p_j;
      ``product_mod_out`` (|out|,) uint32: [Q_S]_{p_j};
      ``product_inv_mod_out`` (|out|,) uint32: [Q_S^-1]_{p_j}, 0 where p_j divides Q_S (ModDown's factor);
      ``reciprocals`` (|S|,) float64: 1/q_k rounded once.
    """

    def __init__(self, in_primes: Sequence[int], out_primes: Sequence[int]):
        self.in_primes = tuple(int(q) for q in in_primes)
        self.out_primes = tuple(int(p) for p in out_primes)
        if not self.in_primes:
            raise ArgumentError("base conversion needs at least one input prime")
        if len(set(self.in_primes)) != len(self.in_primes):
            raise ArgumentError(f"input primes are not distinct: {self.in_primes}")
        for q in self.in_primes + self.out_primes:
            if not 2 <= q < 1 << 30:
                raise ArgumentError(f"modulus {q} is outside [2, 2^30)")
        self.product = math.prod(self.in_primes)
        qhats = [self.product // q for q in self.in_primes]
        self.qhat_inv = np.array([inv_mod(h % q, q) for h, q in zip(qhats, self.in_primes)], dtype=np.uint32)
        self.qhat_mod_out = np.array([[h % p for h in qhats] for p in self.out_primes], dtype=np.uint32)
        self.qhat_mod_out = self.qhat_mod_out.reshape(len(self.out_primes), len(self.in_primes))
        self.factors = np.array(
            [[(h % p) * int(c) % p for h, c in zip(qhats, self.qhat_inv)] for p in self.out_primes], dtype=np.uint32
        ).reshape(self.qhat_mod_out.shape)
        self.product_mod_out = np.array([self.product % p for p in self.out_primes], dtype=np.uint32)
        self.product_inv_mod_out = np.array(
            [pow(self.product, -1, p) if self.product % p else 0 for p in self.out_primes], dtype=np.uint32
        )
        self.reciprocals = np.array([1.0 / q for q in self.in_primes], dtype=np.float64)
        # How many products (q-1)(p-1) a uint64 accumulator (holding a value < p) can take.
        worst = (max(self.in_primes) - 1) * (max(self.out_primes, default=2) - 1)
        self._batch = max(1, ((1 << 64) - 1 - (1 << 30)) // max(worst, 1))
        self._in_col = np.array(self.in_primes, dtype=_U64).reshape(-1, 1)
        self._out_col = np.array(self.out_primes, dtype=_U64).reshape(-1, 1)

    def __repr__(self) -> str:
        return f"BaseConverter({list(self.in_primes)} -> {list(self.out_primes)})"

    def convert(self, x, mode: Mode | str = Mode.EXACT) -> np.ndarray:
        """convert returns the conversion of x (shape (|S|, N), coefficient form) to the output primes.

        Shape (|out|, N), uint32, canonical; the formula of ``mode`` is in the module docstring.
        """
        mode = Mode(mode)
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[0] != len(self.in_primes):
            raise ArgumentError(f"input of shape {x.shape}; want ({len(self.in_primes)}, N)")
        x = x.astype(_U64)
        if mode is Mode.EMULATOR:
            return self._dot(x, self.factors).astype(np.uint32)
        t = x * self.qhat_inv.astype(_U64)[:, None] % self._in_col
        acc = self._dot(t, self.qhat_mod_out)
        if mode is Mode.TEXTBOOK:
            return acc.astype(np.uint32)
        v = self.rounding(t)
        neg_q = (self._out_col - self.product_mod_out.astype(_U64)[:, None]) % self._out_col
        acc += v[None, :] * neg_q
        acc %= self._out_col
        return acc.astype(np.uint32)

    def rounding(self, t: np.ndarray) -> np.ndarray:
        """rounding returns v = floor(f + 1/2) (uint64, shape (N,)), f = sum_k float64(t_k) * r_k summed
        sequentially in increasing k, for t_k = [x_k * Qhat_k^-1]_{q_k} of shape (|S|, N)."""
        f = np.zeros(t.shape[1], dtype=np.float64)
        prod = np.empty_like(f)
        for k in range(t.shape[0]):
            np.multiply(t[k].astype(np.float64), self.reciprocals[k], out=prod)
            np.add(f, prod, out=f)
        np.add(f, 0.5, out=f)
        return np.floor(f).astype(_U64)

    def _dot(self, t: np.ndarray, mat: np.ndarray) -> np.ndarray:
        """_dot returns sum_k t[k] * mat[:, k] mod p_j as uint64 (|out|, N), reducing before overflow."""
        n_out = len(self.out_primes)
        acc = np.zeros((n_out, t.shape[1]), dtype=_U64)
        if n_out == 0:
            return acc
        tmp = np.empty_like(acc)
        cols = mat.astype(_U64)
        for k in range(t.shape[0]):
            np.multiply(cols[:, k : k + 1], t[k], out=tmp)
            np.add(acc, tmp, out=acc)
            if (k + 1) % self._batch == 0:
                np.remainder(acc, self._out_col, out=acc)
        np.remainder(acc, self._out_col, out=acc)
        return acc
