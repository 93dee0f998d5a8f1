"""Symmetric (secret-key) RLWE encryption and decryption of CKKS ciphertexts in RNS/NTT form.

Encryption of an integer plaintext polynomial m on limbs L (per limb l, NTT form, mod q_l):

    c1 = a   (uniform),      c0 = -a * s + m + e   (e ~ CBD(21), one polynomial for all limbs)

Decryption: per limb m_l = c0_l + c1_l * s (mod q_l), INTT, CRT-reconstruct X in [0, Q),
Q = prod_{l in L} q_l, take the centred representative [X]_Q and, optionally, reduce it centred
modulo a smaller modulus M (``modulus=``; BootstrapModRaise, ISA.md 5.5). Decoding the result at
the ciphertext's scale gives the slots (:mod:`caramel.ckks.encoding`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from caramel.ckks import device as devmod
from caramel.ckks.encoding import decode, encode
from caramel.ckks.keys import SecretKey
from caramel.ckks.plaintext import checked_limbs
from caramel.ckks.rns import from_residues
from caramel.ckks.sampling import rng_of
from caramel.errors import ArgumentError, MissingLimbError


@dataclass(frozen=True, eq=False)
class Ciphertext:
    """(c0, c1), each (len(limbs), N) uint32 in NTT form; row r is limb ``limbs[r]``.

    ``scale`` is the true scale of the encrypted message (None when unknown, e.g. read back from a
    program's outputs before a check assigns the expected scale).
    """

    c0: np.ndarray
    c1: np.ndarray
    limbs: tuple[int, ...]
    scale: float | None = None

    def __post_init__(self) -> None:
        k = len(self.limbs)
        if self.c0.shape != self.c1.shape or self.c0.ndim != 2 or self.c0.shape[0] != k:
            raise ArgumentError(f"c0 {self.c0.shape} and c1 {self.c1.shape} must both be ({k}, N)")

    @property
    def n(self) -> int:
        return int(self.c0.shape[1])

    def part(self, part: int | str) -> np.ndarray:
        """``c0`` or ``c1`` (0/1 or "c0"/"c1")."""
        h = {0: 0, 1: 1, "c0": 0, "c1": 1}.get(part)
        if h is None:
            raise ArgumentError(f"ciphertext part must be 0, 1, 'c0' or 'c1', got {part!r}")
        return (self.c0, self.c1)[h]

    def limb(self, part: int | str, limb: int) -> np.ndarray:
        """Row of ``part`` on ``limb``: (N,) uint32."""
        try:
            r = self.limbs.index(int(limb))
        except ValueError:
            raise MissingLimbError(f"ciphertext has no limb {limb} (limbs {list(self.limbs)})") from None
        return self.part(part)[r]

    def restrict(self, limbs) -> "Ciphertext":
        """The same ciphertext on a subset of its limbs (a ModSwitch when limbs = 0..l-2)."""
        rows = [self.limbs.index(int(l)) for l in limbs]
        return Ciphertext(self.c0[rows], self.c1[rows], tuple(int(l) for l in limbs), self.scale)

    def with_scale(self, scale: float | None) -> "Ciphertext":
        return Ciphertext(self.c0, self.c1, self.limbs, scale)


def encrypt(ctx, sk: SecretKey, coeffs, limbs, rng=None, scale: float | None = None, device=None) -> Ciphertext:
    """Encrypt integer plaintext coefficients (int64 or object) on ``limbs`` under ``sk``.

    Draws ``a`` (uniform on every limb) then ``e`` on the host; the products run on ``device``
    (:func:`caramel.ckks.device.chosen`, default the current client device). Returns host arrays (GPU
    arrays inside :func:`caramel.ckks.device.keeping_inputs`)."""
    dev = devmod.chosen(device)
    rng = rng_of(rng)
    limbs = checked_limbs(limbs)
    m = dev.to_ntt_rows(coeffs, ctx, limbs)
    s = dev.secret_rows(sk, ctx).take(limbs)
    c0, a = dev.encrypt_rows(ctx, limbs, m, s, rng)  # draws a, then e
    return Ciphertext(devmod.client_array(c0, dev), devmod.client_array(a, dev), limbs, scale)


def encrypt_values(ctx, sk: SecretKey, values, scale: float, limbs, rng=None) -> Ciphertext:
    """Encode N/2 slot values at ``scale`` and encrypt them on ``limbs``."""
    return encrypt(ctx, sk, encode(values, scale, ctx.n), limbs, rng, scale)


def decrypt(ctx, sk: SecretKey, ct: Ciphertext, modulus: int | None = None, device=None) -> np.ndarray:
    """Centred integer coefficients of c0 + c1*s (object array of Python ints), see module docstring."""
    dev = devmod.chosen(device)
    s = dev.secret_rows(sk, ctx).take(ct.limbs)
    coeff = dev.get(dev.decrypt_rows(ctx, ct.limbs, dev.put(ct.c0), dev.put(ct.c1), s))
    return from_residues(coeff, ctx, ct.limbs, modulus)


def decrypt_values(
    ctx, sk: SecretKey, ct: Ciphertext, scale: float | None = None, modulus: int | None = None
) -> np.ndarray:
    """Decrypt and decode: N/2 complex slots at ``scale`` (default: ``ct.scale``)."""
    scale = ct.scale if scale is None else scale
    if scale is None:
        raise ArgumentError("decrypt_values needs a scale (the ciphertext has none)")
    return decode(decrypt(ctx, sk, ct, modulus), scale, ctx.n)
