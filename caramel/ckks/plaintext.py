"""Plaintext polynomials and scalars as the program's memory holds them.

* A :class:`Plaintext` is an integer polynomial m (e.g. ``encode(values, scale, N)``) stored limb-wise
  in NTT form: row r = NTT_{q_l}(m mod q_l) for l = limbs[r]. ``mup`` multiplies a ciphertext limb
  by such a row.
* A :class:`Scalar` is one constant c at a scale: the integer v = round(c * scale) (computed exactly
  with rationals, so scales beyond 2^53 are fine), stored per limb as the residue v mod q_l. Adding v
  to every NTT slot (``ads``) adds the constant polynomial v, i.e. adds c to every slot; ``mus``
  multiplies every slot by c at the given scale. Only real constants are representable this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from caramel.ckks.encoding import INT64_LIMIT, encode
from caramel.ckks.device import chosen, client_array, to_ntt
from caramel.errors import ArgumentError, MissingLimbError


@dataclass(frozen=True, eq=False)
class Plaintext:
    """NTT-form plaintext: ``data`` (len(limbs), N) uint32; ``scale`` the encoding scale (or None)."""

    data: np.ndarray
    limbs: tuple[int, ...]
    scale: float | None = None

    def limb(self, limb: int) -> np.ndarray:
        return self.data[_row(self.limbs, limb, "plaintext")]


@dataclass(frozen=True, eq=False)
class Scalar:
    """A constant: ``value`` = round(c * scale) as a Python int, ``residues[r]`` = value mod q_{limbs[r]}."""

    value: int
    residues: np.ndarray
    limbs: tuple[int, ...]
    scale: float | None = None

    def limb(self, limb: int) -> np.ndarray:
        """The residue on ``limb`` as a 0-d uint32 array (the memory-image form of a scalar)."""
        return np.array(self.residues[_row(self.limbs, limb, "scalar")], dtype=np.uint32)


def checked_limbs(limbs) -> tuple[int, ...]:
    """``limbs`` as a tuple of distinct integers, at least one (their range: the context's check);
    ArgumentError otherwise (an empty list used to encrypt to nothing and decrypt to 0). Every
    ciphertext, plaintext and scalar made from the user's limbs goes through here."""
    if type(limbs) is tuple and limbs and set(map(type, limbs)) == {int} and len(set(limbs)) == len(limbs):
        return limbs  # already the answer (a plan's limbs): checked without a Python loop
    try:
        items = list(limbs)
    except TypeError:
        raise ArgumentError(f"limbs must be a sequence of limb indices, got {limbs!r}") from None
    if any(isinstance(l, bool) or not isinstance(l, (int, np.integer)) for l in items):
        raise ArgumentError(f"limbs must be integer limb indices, got {items!r}")
    out = tuple(int(l) for l in items)
    if not out:
        raise ArgumentError("limbs is empty: a ciphertext needs at least one limb")
    if len(set(out)) != len(out):
        raise ArgumentError(f"limbs {list(out)} name a limb twice")
    return out


def _row(limbs: tuple[int, ...], limb: int, what: str) -> int:
    try:
        return limbs.index(int(limb))
    except ValueError:
        raise MissingLimbError(f"{what} has no limb {limb} (limbs {list(limbs)})") from None


def plaintext_from_coeffs(ctx, coeffs, limbs, scale: float | None = None) -> Plaintext:
    """NTT-form plaintext of integer coefficients (int64 or Python-int object array) on ``limbs`` (its
    data stays on the GPU inside :func:`caramel.ckks.device.keeping_inputs`)."""
    limbs = checked_limbs(limbs)
    data = to_ntt(coeffs, ctx, limbs, keep=True)
    if isinstance(data, np.ndarray):
        data.setflags(write=False)
    return Plaintext(data, limbs, scale)


def plaintexts_from_coeffs(ctx, coeffs, limbs, scales) -> list[Plaintext]:
    """``[plaintext_from_coeffs(ctx, coeffs[p], limbs[p], scales[p]) for p ...]`` for int64
    coefficients ``coeffs`` (P, N; on the host or the current client device), the same bits from one
    batched encoding on the current client device (:meth:`~caramel.ckks.arith.ClientArith.plaintext_rows`):
    the plaintexts' data are consecutive rows of one array (on the GPU inside
    :func:`caramel.ckks.device.keeping_inputs`)."""
    groups = [checked_limbs(l) for l in limbs]
    dev = chosen()
    rows = client_array(dev.plaintext_rows(coeffs, ctx, groups), dev)
    if isinstance(rows, np.ndarray):
        rows.setflags(write=False)
    out, r = [], 0
    for g, scale in zip(groups, scales):
        out.append(Plaintext(rows[r : r + len(g)], g, scale))
        r += len(g)
    return out


def encode_plaintext(ctx, values, scale: float, limbs) -> Plaintext:
    """Encode N/2 slot values at ``scale`` (:func:`caramel.ckks.encoding.encode`) into NTT limbs."""
    return plaintext_from_coeffs(ctx, encode(values, scale, ctx.n), limbs, scale)


def round_product(x: float, scale) -> int:
    """round(x * scale) of the exact product, ties to even: ``round(Fraction(x) * Fraction(scale))``. For binary
    floats (and ints) x = a / b and scale = c / d exactly, so the product is (a c) / (b d): floor and remainder
    from one ``divmod``, then the tie rule, without building Fractions."""
    if not isinstance(scale, (int, float)):
        return round(Fraction(x) * Fraction(scale))
    a, b = x.as_integer_ratio()
    c, d = scale.as_integer_ratio()
    den = b * d
    q, r = divmod(a * c, den)
    return q + 1 if 2 * r > den or (2 * r == den and q & 1) else q


def encode_scalar(ctx, value, scale: float, limbs) -> Scalar:
    """The scalar round(value * scale) (exact, :func:`round_product`) reduced into every limb (uint32 residues,
    shape (k,))."""
    c = complex(value)
    if c.imag != 0:
        raise ArgumentError(f"a scalar input must be real (constant polynomial), got {value!r}")
    v = round_product(c.real, scale)
    limbs = checked_limbs(limbs)
    q = ctx.moduli(limbs).reshape(-1)
    if -INT64_LIMIT < v < INT64_LIMIT:  # exact in int64: one NumPy remainder for every limb
        res = np.remainder(np.int64(v), q.astype(np.int64)).astype(np.uint32)  # the sign of the divisor, as %
    else:
        res = np.array([v % int(p) for p in q], dtype=np.uint32)
    res.setflags(write=False)
    return Scalar(int(v), res, limbs, float(scale))
