"""The CUDA ring's twiddle tables computed by arrays (:func:`caramel.backends.cuda.context.twiddle_tables`)
against the host tables (:meth:`CudaRing.host_twiddles`, from ``ring.ntt.NttTable``): on the host with
NumPy always, on the GPU (``CudaRing.twiddles``) when one is there."""

from __future__ import annotations

import numpy as np
import pytest

from caramel.backends.cuda import CudaRing, available
from caramel.backends.cuda.context import primitive_root, shoup_constant, twiddle_tables
from caramel.ring import Context
from caramel.ring.ntt import NttTable


@pytest.mark.parametrize("n", [16, 1024, 4096])
def test_array_tables_equal_the_host_tables_for_every_prime(n):
    ring = CudaRing(Context(n=n))
    got = twiddle_tables(ring.primes, n, np)
    for want, have in zip(ring.host_twiddles(), got):
        assert have.dtype == np.uint32 and have.shape == (len(ring.primes), n, 2)
        assert np.array_equal(have, want)


def test_array_tables_at_65536_equal_ntt_table():
    n = 65536
    primes = Context(n=n).primes[::21]  # three primes: the whole table is the same loop
    fwd, inv = twiddle_tables(primes, n, np)
    for i, q in enumerate(primes):
        table = NttTable(q, n)
        assert np.array_equal(fwd[i, :, 0], table.psi_powers) and np.array_equal(inv[i, :, 0], table.psi_inv_powers)
        assert np.array_equal(fwd[i, :, 1], shoup_constant(table.psi_powers, q))
        assert np.array_equal(inv[i, :, 1], shoup_constant(table.psi_inv_powers, q))


def test_primitive_root_has_order_2n_or_is_none():
    q, n = Context(n=4096).primes[0], 4096
    r = primitive_root(q, n)
    assert pow(r, n, q) == q - 1 and pow(r, 2 * n, q) == 1
    assert primitive_root(q, 2 * q) is None  # q != 1 mod 2n
    assert primitive_root(97, 64) is None  # 97 - 1 = 96 is not a multiple of 128


def test_no_tables_where_a_prime_has_no_root():
    """The caller (``CudaRing.twiddles``) then takes the host tables, which raise the reference's error."""
    assert twiddle_tables([97], 64, np) is None
    assert twiddle_tables([], 64, np) is None
    with pytest.raises(ValueError):
        NttTable(97, 64)


@pytest.mark.skipif(not available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("n", [4096, 65536])
def test_gpu_twiddles_equal_the_host_tables(n):
    ring = CudaRing(Context(n=n))
    for want, have in zip(ring.host_twiddles(), ring.twiddles):
        assert np.array_equal(have.get(), want)
