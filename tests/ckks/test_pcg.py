"""caramel.ckks.pcg: NumPy's PCG64 raw words by jump-ahead, on the host and (compiled by the host's
C++ compiler) the GPU kernel's own source, against ``bit_generator.random_raw``."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from caramel.ckks import pcg

_MASK64 = (1 << 64) - 1


@pytest.mark.parametrize("seed", [0, 7, [3, 0x6B6579], 2**63 + 5])
def test_host_words_equal_random_raw(seed):
    rng = np.random.default_rng(seed)
    rng.random(5)  # not at the start of the stream
    state, inc = pcg.pcg64_state(rng.bit_generator)
    want = rng.bit_generator.random_raw(400)
    assert np.array_equal(pcg.host_words(state, inc, 0, 400), want)
    assert np.array_equal(pcg.host_words(state, inc, 257, 143), want[257:])


def test_advance_equals_numpy_advance():
    rng = np.random.default_rng(11)
    state, inc = pcg.pcg64_state(rng.bit_generator)
    rng.bit_generator.advance(123_456_789)
    assert pcg.advance(state, inc, 123_456_789) == rng.bit_generator.state["state"]["state"]


def test_other_generators_have_no_pcg64_state():
    assert pcg.pcg64_state(np.random.MT19937(1)) is None


_HOST = r"""
#include <stdio.h>
#include <stdlib.h>
#define WORDS 64
#define __restrict__
static unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
struct Dim { int x; };
static Dim blockIdx, blockDim, threadIdx;
"""
_MAIN = r"""
static u64 out[1 << 16];
int main(int argc, char** argv) {
    u64 s_hi = strtoull(argv[1], 0, 10), s_lo = strtoull(argv[2], 0, 10);
    u64 c_hi = strtoull(argv[3], 0, 10), c_lo = strtoull(argv[4], 0, 10);
    long long count = atoll(argv[5]);
    blockDim.x = 3;
    for (int b = 0; (long long)b * 3 * WORDS < count; ++b)
        for (int t = 0; t < 3; ++t) {
            blockIdx.x = b; threadIdx.x = t;
            pcg64_words(s_hi, s_lo, c_hi, c_lo, MHI, MLO, count, out);
        }
    for (long long i = 0; i < count; ++i) printf("%llu\n", out[i]);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_kernel_source_equals_random_raw(tmp_path):
    """The CUDA kernel's source, compiled for the host (blocks and threads run one by one)."""
    body = pcg._SOURCE.replace('extern "C" __global__', "").replace("__device__ __forceinline__", "static inline")
    main = _MAIN.replace("MHI", f"{pcg.MULTIPLIER >> 64}ull").replace("MLO", f"{pcg.MULTIPLIER & _MASK64}ull")
    src = tmp_path / "pcg.cpp"
    src.write_text(_HOST + body + main)
    exe = tmp_path / "pcg"
    subprocess.run(["g++", "-O1", "-o", str(exe), str(src)], check=True, capture_output=True)
    for seed in (1, 2**40 + 3):
        rng = np.random.default_rng(seed)
        rng.random(3)
        state, inc = pcg.pcg64_state(rng.bit_generator)
        count = 1000  # not a multiple of the words per thread
        text = subprocess.run([str(exe), str(state >> 64), str(state & _MASK64), str(inc >> 64), str(inc & _MASK64),
                               str(count)], check=True, capture_output=True, text=True).stdout
        got = np.array([int(x) for x in text.split()], dtype=np.uint64)
        assert np.array_equal(got, rng.bit_generator.random_raw(count))


def test_device_words_on_gpu():
    cupy = pytest.importorskip("cupy")
    from caramel.api import gpu_available

    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    rng = np.random.default_rng(21)
    rng.random(1)
    state, inc = pcg.pcg64_state(rng.bit_generator)
    count = 3 * pcg.WORDS_PER_THREAD * 256 + 17
    got = pcg.device_words(state, inc, count, cupy).get()
    halves = pcg.device_words(state, inc, count, cupy, np.uint32).get()
    want = rng.bit_generator.random_raw(count)
    assert np.array_equal(got, want) and np.array_equal(halves, want.view(np.uint32))


class _FakeDevice:
    """An array module that is not NumPy (the GPU branch of ``sampling.raw_words``)."""

    @staticmethod
    def asarray(a):
        return np.asarray(a)


@pytest.mark.parametrize("buffered", [False, True])
@pytest.mark.parametrize("dtype", [np.uint64, np.uint32])
def test_raw_words_device_branch_leaves_the_generator_as_random_raw(monkeypatch, buffered, dtype):
    """The words drawn 'on the device' and the generator afterwards, buffered 32-bit half included
    (``advance`` alone drops it: a later bounded draw would then differ)."""
    from caramel.ckks import sampling

    monkeypatch.setattr(pcg, "device_words",
                        lambda state, inc, count, xp, dtype: pcg.host_words(state, inc, 0, count).view(dtype))
    a, b = np.random.default_rng(4), np.random.default_rng(4)
    if buffered:  # one 32-bit half drawn: the other is kept in the generator
        a.integers(0, 7, dtype=np.uint32)
        b.integers(0, 7, dtype=np.uint32)
        assert a.bit_generator.state["has_uint32"] == 1
    got = sampling.raw_words(a.bit_generator, 333, _FakeDevice, dtype)
    want = b.bit_generator.random_raw(333).view(dtype)
    assert np.array_equal(got, want) and a.bit_generator.state == b.bit_generator.state
    assert np.array_equal(a.integers(0, 1000, size=50, dtype=np.uint32), b.integers(0, 1000, size=50, dtype=np.uint32))
