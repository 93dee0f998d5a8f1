"""Fixtures of the CKKS client tests; makes the helper modules of this folder importable."""

from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded by the test id: fixed per test, different between tests."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
