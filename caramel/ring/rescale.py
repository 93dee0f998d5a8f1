"""Subtract-and-divide (`sud`, ISA 4.3): rescale by a dropped limb and ModDown by an extension basis.

Rescale by q_t on limb l: rD = (rA - NTT_{q_l}(y)) * q_t^-1 mod q_l, with y the lift of the dropped limb's
coefficients rB (in [0, q_t)) to q_l. ModDown uses y = a base-conversion output and the factor P^-1 mod q_l.
"""

from __future__ import annotations

import numpy as np

from caramel.ring.modes import Mode

_U64 = np.uint64


def sud_lift(rb, q_t: int, q_l: int, mode: Mode | str = Mode.EXACT) -> np.ndarray:
    """sud_lift returns y, the lift of coefficients rb (mod q_t) to q_l, as uint32 in [0, q_l).

    EXACT (centred): y = rb if rb <= (q_t - 1)/2 else rb - q_t, then reduced mod q_l.
    TEXTBOOK, EMULATOR (unsigned): y = rb mod q_l.
    """
    mode = Mode(mode)
    rb = np.asarray(rb).astype(_U64)
    ql = _U64(q_l)
    y = rb % ql
    if mode is Mode.EXACT:
        shift = _U64((q_l - q_t % q_l) % q_l)  # -q_t mod q_l
        upper = rb > _U64((q_t - 1) // 2)
        y = np.where(upper, (y + shift) % ql, y)
    return y.astype(np.uint32)


def sud(ra, y, factor: int, q: int) -> np.ndarray:
    """sud returns (ra - y) * factor mod q (uint32) for canonical ra, y mod q (both NTT form)."""
    qq = _U64(q)
    d = np.asarray(ra).astype(_U64) + qq - np.asarray(y).astype(_U64)
    return (d * _U64(int(factor) % q) % qq).astype(np.uint32)
