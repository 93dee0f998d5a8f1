"""Batched NTT: many rows of different primes at once equal one row at a time, for any thread count."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from caramel.ring import PRIMES, NttTable, intt, ntt

ntt_mod = importlib.import_module("caramel.ring.ntt")  # the module (caramel.ring.ntt is also the function)


@pytest.mark.parametrize("threads", ["1", "2", "4"])
@pytest.mark.parametrize("n", [64, 2048])
def test_batched_rows_equal_single_rows(monkeypatch, threads, n):
    monkeypatch.setenv(ntt_mod.THREADS_ENV, threads)
    monkeypatch.setattr(ntt_mod, "_CHUNK_RESIDUES", 2 * n)  # two rows per chunk: several chunks
    tables = [NttTable(q, n) for q in PRIMES[:7]] + [NttTable(PRIMES[3], n)]
    rng = np.random.default_rng(n)
    a = np.stack([rng.integers(0, t.q, n) for t in tables]).astype(np.uint32)
    fwd = ntt(a, tables)
    for r, t in enumerate(tables):
        assert np.array_equal(fwd[r], ntt(a[r], t))
    assert np.array_equal(intt(fwd, tables), a)


def test_client_threads_env(monkeypatch):
    monkeypatch.setenv(ntt_mod.THREADS_ENV, "3")
    assert ntt_mod.client_threads() == 3
    monkeypatch.setenv(ntt_mod.THREADS_ENV, "zero")
    assert ntt_mod.client_threads() == 1


def test_map_chunks_covers_range(monkeypatch):
    monkeypatch.setenv(ntt_mod.THREADS_ENV, "2")
    seen = np.zeros(23, dtype=int)

    def mark(c0, c1):
        seen[c0:c1] += 1

    ntt_mod.map_chunks(mark, 23, 4)
    assert np.all(seen == 1)
