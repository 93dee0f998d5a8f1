"""Arithmetic modes: how base conversion and the register form of ``sud`` round (ISA decision 2)."""

from __future__ import annotations

import enum


class Mode(enum.Enum):
    """Mode selects the rounding of base conversion and rescale; every mode is bit-exact CPU vs GPU.

    * ``EXACT`` (default): centred ``sud`` lift and the exact centred base conversion (float64 correction).
    * ``TEXTBOOK``: unsigned ``sud`` lift, textbook fast base conversion (rounding-free).
    * ``EMULATOR``: unsigned ``sud`` lift, raw-input conversion of the Cinnamon emulator (ISA 4.4).
    """

    EXACT = "exact"
    TEXTBOOK = "textbook"
    EMULATOR = "emulator"


DEFAULT_MODE = Mode.EXACT
