"""Shared fixtures of the ring tests: a per-test seeded generator and a want/have array comparison."""

from __future__ import annotations

import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request) -> np.random.Generator:
    """rng is a NumPy generator seeded by the test's id (fixed per test, different between tests)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _expect_equal(have, want, what: str = "") -> None:
    have_a = np.asarray(have)
    want_a = np.asarray(want)
    assert have_a.shape == want_a.shape, f"{what}: shape: want {want_a.shape}, have {have_a.shape}"
    bad = np.argwhere(np.asarray(have_a != want_a, dtype=bool).reshape(have_a.shape))
    if len(bad):
        idx = tuple(int(i) for i in bad[0])
        raise AssertionError(
            f"{what}: {len(bad)} of {have_a.size} entries differ; first at {idx}: "
            f"want {want_a[idx]!r}, have {have_a[idx]!r}"
        )


@pytest.fixture
def expect_equal():
    """expect_equal(have, want, what) fails with the first differing entry, showing want and have."""
    return _expect_equal


def random_residues(rng: np.random.Generator, primes, n: int) -> np.ndarray:
    """random_residues returns a (len(primes), n) uint32 array, row k uniform in [0, primes[k])."""
    return np.stack([rng.integers(0, q, n, dtype=np.uint64) for q in primes]).astype(np.uint32)


@pytest.fixture
def residues():
    """residues(rng, primes, n) -> (len(primes), n) uint32 uniform canonical residues."""
    return random_residues
