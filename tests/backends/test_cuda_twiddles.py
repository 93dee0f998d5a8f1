"""The CUDA ring's twiddle tables (:func:`caramel.backends.cuda.context.twiddle_tables`) against the host
tables (:meth:`CudaRing.host_twiddles`, from ``ring.ntt.NttTable``): the NumPy twin of its kernels and the
kernels' source compiled for the host always, the kernels on the GPU (``CudaRing.twiddles``) when one is there."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from caramel.backends.cuda import CudaRing, available
from caramel.backends.cuda.context import TWIDDLE_CHUNK, TWIDDLE_SRC, primitive_root, shoup_constant, twiddle_tables
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


_EMULATION = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
typedef unsigned int u32;
typedef unsigned long long u64;
#define __restrict__
#define __global__
#define __device__
#define __forceinline__ inline
struct Dim { int x = 0, y = 0; };
static Dim blockIdx, blockDim, threadIdx;
static u32 __brev(u32 x) {
    u32 r = 0;
    for (int b = 0; b < 32; ++b) r |= ((x >> b) & 1u) << (31 - b);
    return r;
}
static u64 atomicMin(u64* a, u64 v) { const u64 old = *a; if (v < old) *a = v; return old; }
"""
_MAIN = r"""
int main(int argc, char** argv) {  // argv: P N chunk logn; stdin: q[P], r[P]; stdout: psi[P], fwd, inv
    const int k = atoi(argv[1]), n = atoi(argv[2]), chunk = atoi(argv[3]), logn = atoi(argv[4]);
    std::vector<u64> p(3 * k, ~0ull);
    if (fread(p.data(), 8, 2 * k, stdin) != (size_t)(2 * k)) return 1;
    std::vector<u32> fwd(2LL * k * n), inv(2LL * k * n);
    blockDim.x = 256;
    for (int i = 0; i < k; ++i) {
        blockIdx.y = i;
        for (blockIdx.x = 0; blockIdx.x * 256 < n / chunk; ++blockIdx.x)
            for (threadIdx.x = 0; threadIdx.x < 256; ++threadIdx.x) twiddle_psi(p.data(), k, n, chunk);
        for (blockIdx.x = 0; blockIdx.x * 256 < n; ++blockIdx.x)
            for (threadIdx.x = 0; threadIdx.x < 256; ++threadIdx.x) twiddle_fill(p.data(), k, n, logn, fwd.data(), inv.data());
    }
    fwrite(p.data() + 2 * k, 8, k, stdout);
    fwrite(fwd.data(), 4, fwd.size(), stdout);
    fwrite(inv.data(), 4, inv.size(), stdout);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_kernel_source_on_the_host_equals_the_host_tables(tmp_path):
    """The two CUDA kernels of the GPU tables (TWIDDLE_SRC) compiled for the host (a grid as loops),
    given each prime's root, give psi and the host tables bit for bit: every prime at N = 16, 4096,
    three primes at 65536."""
    src = tmp_path / "twiddles.cpp"
    src.write_text(_EMULATION + TWIDDLE_SRC.replace('extern "C"', "static") + _MAIN)
    exe = tmp_path / "twiddles"
    got = subprocess.run(["g++", "-std=c++17", "-O2", "-o", str(exe), str(src)],
                         capture_output=True, text=True)
    assert got.returncode == 0, got.stderr
    for n, step in ((16, 1), (4096, 1), (65536, 21)):
        ring = CudaRing(Context(n=n))
        primes = ring.primes[::step]
        k = len(primes)
        roots = np.array([primitive_root(q, n) for q in primes], dtype=np.uint64)
        res = subprocess.run([str(exe), str(k), str(n), str(min(TWIDDLE_CHUNK, n)), str(n.bit_length() - 1)],
                             input=np.array(primes, dtype=np.uint64).tobytes() + roots.tobytes(),
                             check=True, capture_output=True).stdout
        psi = np.frombuffer(res[: 8 * k], dtype=np.uint64)
        fwd, inv = np.frombuffer(res[8 * k :], dtype=np.uint32).reshape(2, k, n, 2)
        for i, q in enumerate(primes):
            table = NttTable(q, n)
            assert int(psi[i]) == table.psi
            assert np.array_equal(fwd[i, :, 0], table.psi_powers) and np.array_equal(inv[i, :, 0], table.psi_inv_powers)
            assert np.array_equal(fwd[i, :, 1], shoup_constant(table.psi_powers, q))
            assert np.array_equal(inv[i, :, 1], shoup_constant(table.psi_inv_powers, q))


@pytest.mark.skipif(not available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("n", [16, 4096, 65536])
def test_gpu_twiddles_equal_the_host_tables(n):
    ring = CudaRing(Context(n=n))
    for want, have in zip(ring.host_twiddles(), ring.twiddles):
        assert np.array_equal(have.get(), want)
