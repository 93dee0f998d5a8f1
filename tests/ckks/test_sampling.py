"""caramel.ckks.sampling: the PCG64 state a key store keeps (PcgState)."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from caramel.ckks import sampling
from caramel.ckks.sampling import PcgState, lemire_state_rows
from caramel.ring import Context

from ckks_helpers import context


def _generator(seed, kept: bool) -> np.random.Generator:
    """A PCG64 generator; ``kept``: after one bounded 32-bit draw, so that it keeps the other half of
    its 64-bit word for the next one."""
    rng = np.random.default_rng(seed)
    if kept:
        rng.integers(0, 5, dtype=np.uint32)
    return rng


@pytest.mark.parametrize("kept", [False, True])
def test_state_generator_draws_what_the_captured_one_draws(kept):
    rng = _generator(11, kept)
    st = PcgState.of(rng)
    assert st.has_uint32 == int(kept)
    again = st.generator()
    assert again.bit_generator.state == rng.bit_generator.state
    q = np.array([[268042241], [204865537]], dtype=np.int64)
    assert np.array_equal(again.integers(0, q, size=(2, 64)), rng.integers(0, q, size=(2, 64)))


def test_words_round_trip_and_refusals():
    st = PcgState.of(np.random.default_rng([3, 4]))
    w = st.words()
    assert w.dtype == np.uint64 and w.shape == (PcgState.WORDS,)
    assert PcgState.from_words(w) == st
    for bad in ([*w[:3], w[3] ^ np.uint64(1), *w[4:]],  # even increment
                [*w[:4], 2, w[5]],  # has_uint32 not 0/1
                list(w[:5])):  # too short
        with pytest.raises(ValueError, match="not a PCG64 state|a PCG64 state is 6 words"):
            PcgState.from_words(bad)


def test_other_generators_have_no_state():
    assert PcgState.of(np.random.Generator(np.random.Philox(1))) is None


# Bounded draws from a stored state (lemire_state_rows): the NumPy reference and the CUDA kernels.


def _draw_case(seed: int, kept: bool, step: int, n: int):
    rng = _generator(seed, kept)
    ctx = Context(n=n)
    qs = [ctx.q(l) for l in range(0, 64, step)]
    st = PcgState.of(rng)
    want = rng.integers(0, np.array(qs, dtype=np.int64)[:, None], size=(len(qs), n), dtype=np.int64)
    return qs, st, want.astype(np.uint32)


@pytest.mark.parametrize("seed, kept, step, n", [(0, False, 1, 1024), (1, True, 1, 1024), (2, True, 7, 4096),
                                                 (3, False, 64, 256)])
def test_state_rows_equal_numpy_integers(seed, kept, step, n):
    qs, st, want = _draw_case(seed, kept, step, n)
    out, status = lemire_state_rows(qs, n, st)
    assert status[0] == 0 and np.array_equal(out, want)
    rng = st.generator()
    rng.integers(0, np.array(qs, dtype=np.int64)[:, None], size=(len(qs), n), dtype=np.int64)
    again = st.generator()  # the words used leave a generator where NumPy's draw leaves it
    sampling._leave_generator_at(again.bit_generator, again.bit_generator.state, int(status[1]),
                                 lambda i: sampling._word_of(st, i))
    assert again.bit_generator.state == rng.bit_generator.state


@pytest.mark.parametrize("kept", [False, True])
def test_word_of_equals_the_words_numpy_hands_out(kept):
    rng = _generator(12, kept)
    st = PcgState.of(rng)
    words = sampling._next_words(rng.bit_generator, rng.bit_generator.state, 9)
    assert [sampling._word_of(st, i) for i in range(9)] == [int(w) for w in words[:9]]


def test_lemire_device_leaves_the_generator_as_numpy(monkeypatch):
    """The GPU path of uniform_residues (lemire_device), run on NumPy arrays: the same values and the
    generator where ``integers`` leaves it, also through the fallback when a window is missed."""
    ctx = Context(n=1024)
    qs = [ctx.q(l) for l in range(0, 64, 3)]
    for fail in (False, True):
        if fail:
            monkeypatch.setattr(sampling, "lemire_state_rows",
                                lambda qs, n, st, xp: (np.zeros((len(qs), n), np.uint32), np.array([1, 0])))
        a, b = np.random.default_rng(13), np.random.default_rng(13)
        a.integers(0, 5, dtype=np.uint32), b.integers(0, 5, dtype=np.uint32)
        got = sampling.lemire_device(qs, 1024, a, np)
        want = b.integers(0, np.array(qs, dtype=np.int64)[:, None], size=(len(qs), 1024), dtype=np.int64)
        assert np.array_equal(got, want) and a.bit_generator.state == b.bit_generator.state


def test_state_rows_report_a_window_too_short(monkeypatch):
    qs, st, _ = _draw_case(4, False, 1, 1024)
    monkeypatch.setattr(sampling, "_lemire_windows", lambda qs, n: (np.arange(len(qs), dtype=np.int64) * n, n))
    assert lemire_state_rows(qs, 1024, st)[1][0] == 1


_EMULATION = r"""
#include <barrier>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#define __restrict__
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
struct Dim { int x = 0, y = 0; };
static Dim blockIdx, blockDim;
thread_local Dim threadIdx;
static std::barrier<>* bar;
#define __syncthreads() bar->arrive_and_wait()
"""
_MAIN = r"""
int main(int argc, char** argv) {
    FILE* f = fopen(argv[1], "rb");
    long long hdr[6];  // raw words, first, has_first, k, width, n
    fread(hdr, 8, 6, f);
    const long long nraw = hdr[0], k = hdr[3], width = hdr[4], n = hdr[5];
    std::vector<unsigned> raw(nraw);
    std::vector<long long> p(3 * k);
    fread(raw.data(), 4, nraw, f);
    fread(p.data(), 8, 3 * k, f);
    fclose(f);
    std::vector<int> counts(k * width);
    std::vector<long long> starts(k), limits(k);
    std::vector<unsigned> out(k * n, 0);
    long long status[2] = {1, 0};
    const int threads = 8;  // emulated block of 8 threads (the kernel takes any block size up to 1024)
    blockDim.x = threads;
    std::barrier<> b(threads);
    bar = &b;
    for (int r = 0; r < k; ++r) {
        blockIdx.x = r;
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] { threadIdx.x = t; lemire_counts(raw.data(), (unsigned)hdr[1], (int)hdr[2], p.data(), (int)k, width, counts.data()); });
        for (auto& t : ts) t.join();
    }
    blockDim.x = 1; threadIdx.x = 0; blockIdx.x = 0;
    lemire_chain(counts.data(), p.data(), (int)k, width, (int)n, starts.data(), limits.data(), status);
    blockDim.x = 32;
    for (int r = 0; r < k; ++r)
        for (long long bx = 0; bx * 32 < width; ++bx)
            for (int t = 0; t < 32; ++t) {
                blockIdx.x = (int)bx; blockIdx.y = r; threadIdx.x = t;
                lemire_scatter(raw.data(), (unsigned)hdr[1], (int)hdr[2], p.data(), (int)k, width, (int)n, counts.data(),
                               starts.data(), limits.data(), status, out.data());
            }
    printf("%lld %lld\n", status[0], status[1]);
    fwrite(out.data(), 4, k * n, stdout);
    return 0;
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a host C++ compiler")
def test_kernel_source_equals_numpy_integers(tmp_path):
    """The CUDA kernels of lemire_state_rows compiled for the host (threads of a block as C++ threads
    with a barrier for __syncthreads), fed the same words, give NumPy's draw."""
    src = tmp_path / "lemire.cpp"
    src.write_text(_EMULATION + sampling._LEMIRE_SOURCE.replace('extern "C"', "") + _MAIN)
    exe = tmp_path / "lemire"
    got = subprocess.run(["g++", "-std=c++20", "-O1", "-pthread", "-o", str(exe), str(src)], capture_output=True, text=True)
    if got.returncode and "barrier" in got.stderr:
        pytest.skip("the host compiler has no std::barrier")
    assert got.returncode == 0, got.stderr
    for seed, kept, step, n in ((5, True, 1, 1024), (6, False, 5, 2048)):
        qs, st, want = _draw_case(seed, kept, step, n)
        lo, width = sampling._lemire_windows(qs, n)
        need = int(lo[-1]) + width
        raw = st.generator().bit_generator.random_raw((need - st.has_uint32 + 1) // 2).view(np.uint32)
        thr = [2**32 % q for q in qs]
        data = tmp_path / "in.bin"
        data.write_bytes(np.array([raw.size, st.uinteger if st.has_uint32 else 0, st.has_uint32, len(qs), width, n],
                                  dtype=np.int64).tobytes() + raw.tobytes()
                         + np.concatenate([lo, np.array(qs + thr, dtype=np.int64)]).tobytes())
        res = subprocess.run([str(exe), str(data)], check=True, capture_output=True).stdout
        head, body = res.split(b"\n", 1)
        assert head.split() == [b"0", str(int(lemire_state_rows(qs, n, st)[1][1])).encode()]
        assert np.array_equal(np.frombuffer(body, dtype=np.uint32).reshape(len(qs), n), want)


def test_state_rows_on_the_gpu_equal_numpy_integers():
    cupy = pytest.importorskip("cupy")
    from caramel.api import gpu_available

    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    for seed, kept, step, n in ((7, True, 1, 65536), (8, False, 3, 4096), (9, True, 64, 1024)):
        qs, st, want = _draw_case(seed, kept, step, n)
        out, status = lemire_state_rows(qs, n, st, cupy)
        assert status.get().tolist() == lemire_state_rows(qs, n, st)[1].tolist() and np.array_equal(out.get(), want)
        a = st.generator()
        got = sampling.lemire_device(qs, n, a, cupy)
        b = st.generator()
        b.integers(0, np.array(qs, dtype=np.int64)[:, None], size=(len(qs), n), dtype=np.int64)
        assert np.array_equal(got.get(), want) and a.bit_generator.state == b.bit_generator.state



_NO_CUPYX = r"""
import json, sys, traceback
import numpy as np

first = {}


def hook(event, args):
    if event == "import" and args[0].split(".")[0] == "cupyx" and "stack" not in first:
        first["stack"] = "".join(traceback.format_stack(limit=12)[:-1])


sys.addaudithook(hook)
import cupy
from caramel.ckks import device
from caramel.ckks.sampling import binomial_replay, lemire_rows
from caramel.ring import Context

ctx = Context(n=4096)
device.load_client_kernels(ctx, device.GPU)  # the warm-up's draws, products and transforms
a, b = np.random.default_rng(5), np.random.default_rng(5)
got = binomial_replay(4096, 21, a, cupy).get()
want = b.binomial(21, 0.5, 4096).astype(np.int64) - b.binomial(21, 0.5, 4096).astype(np.int64)
assert np.array_equal(got, want) and a.bit_generator.state == b.bit_generator.state
a, b = np.random.default_rng(6), np.random.default_rng(6)
qs = [ctx.q(l) for l in range(3)]
got = lemire_rows(qs, 4096, a, cupy).get()
want = b.integers(0, np.array(qs, dtype=np.int64)[:, None], size=(3, 4096), dtype=np.int64)
assert np.array_equal(got, want) and a.bit_generator.state == b.bit_generator.state
client = first.pop("stack", None)
from caramel.cli import main

code = main(["run", "programs/Mul_4L_1c", "--n", "4096", "--backend", "gpu", "-q"])
print(json.dumps({"client": client, "run": first.get("stack"), "code": code}))
"""


def test_gpu_client_and_run_import_no_cupyx():
    """The GPU client's draws, the warm-up and a whole ``caramel run`` on the GPU call CuPy's ufuncs
    directly: a CuPy operator whose right operand is a Python or NumPy scalar goes through NumPy's
    ufunc and CuPy's ``__array_ufunc__``, which imports cupyx.scipy.special and SciPy (a third of a
    second or more on the GPU machine, on the critical path of ``caramel run``)."""
    pytest.importorskip("cupy")
    from caramel.api import gpu_available

    if not gpu_available():
        pytest.skip("needs a CUDA GPU")
    import json
    import os
    import sys

    from tests.conftest import REPO

    env = {**os.environ, "CARAMEL_GPU_WARMUP": "0", "PYTHONPATH": str(REPO), "CARAMEL_PROGRESS": "0"}
    res = subprocess.run([sys.executable, "-c", _NO_CUPYX], capture_output=True, text=True, env=env, timeout=300,
                         cwd=REPO)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["client"] is None, "the client imported cupyx:\n" + got["client"]
    assert got["code"] == 0 and got["run"] is None, "the run imported cupyx:\n" + str(got["run"])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("buffered", [False, True])
def test_lemire_replay_equals_numpy(seed, buffered):
    """The device replay of bounded integers: same values and same generator state as rng.integers."""
    from caramel.ckks.sampling import lemire_rows

    ctx = context(2048)
    limbs = list(range(9)) + [62, 63]
    qs = np.array([ctx.q(l) for l in limbs], dtype=np.int64)
    r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
    if buffered:  # leave half a 64-bit word in the generator's buffer
        r1.integers(0, 5), r2.integers(0, 5)
    want = r1.integers(0, qs[:, None], size=(len(qs), ctx.n), dtype=np.int64).astype(np.uint32)
    got = lemire_rows([int(q) for q in qs], ctx.n, r2, np)
    assert np.array_equal(got, want)
    assert r1.bit_generator.state == r2.bit_generator.state
    assert np.array_equal(r1.integers(0, qs[:3, None], size=(3, 40)), r2.integers(0, qs[:3, None], size=(3, 40)))


def test_lemire_replay_declines_other_generators():
    from caramel.ckks.sampling import lemire_rows

    rng = np.random.Generator(np.random.MT19937(1))
    assert lemire_rows([268369921], 16, rng, np) is None


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_binomial_replay_equals_numpy(seed):
    """The device replay of the centred binomial error: same values and same generator state."""
    from caramel.ckks.sampling import binomial_replay

    r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
    r1.integers(0, 5), r2.integers(0, 5)
    want = sampling.cbd(4096, r1)
    got = binomial_replay(4096, 21, r2, np)
    assert np.array_equal(got, want)
    assert r1.bit_generator.state == r2.bit_generator.state


@pytest.mark.parametrize("seed", [0, 1])
def test_lemire_replay_serves_all_limbs(seed):
    """The replay's windows hold every row of a key on all 64 limbs (no fallback)."""
    from caramel.ckks.sampling import lemire_rows

    ctx = context(4096)
    assert lemire_rows([ctx.q(l) for l in range(64)], ctx.n, np.random.default_rng(seed), np) is not None


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("buffered", [False, True])
def test_compiled_host_replay_equals_numpy(seed, buffered):
    """The compiled host replay (Numba) of bounded integers: same values and generator state as
    rng.integers, also after a partial draw left half a word in the generator's buffer."""
    pytest.importorskip("numba")
    from caramel.ckks.arith import jit as ntt_jit
    from caramel.ckks.sampling import lemire_host

    assert ntt_jit.enabled()  # compiled now (else the replay waits for a background compilation)

    ctx = context(2048)
    limbs = list(range(9)) + [62, 63]
    qs = np.array([ctx.q(l) for l in limbs], dtype=np.int64)
    r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
    if buffered:
        r1.integers(0, 5), r2.integers(0, 5)
    want = r1.integers(0, qs[:, None], size=(len(qs), ctx.n), dtype=np.int64).astype(np.uint32)
    got = lemire_host([int(q) for q in qs], ctx.n, r2)
    assert np.array_equal(got, want)
    assert r1.bit_generator.state == r2.bit_generator.state
    assert np.array_equal(r1.integers(0, qs[:3, None], size=(3, 40)), r2.integers(0, qs[:3, None], size=(3, 40)))


def test_compiled_host_replay_declines(monkeypatch):
    """No replay (generator untouched) for another generator, when disabled, or when words run out."""
    pytest.importorskip("numba")
    from caramel.ckks.arith import jit as ntt_jit

    assert sampling.lemire_host([268369921], 16, np.random.Generator(np.random.MT19937(1))) is None
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    monkeypatch.setenv(ntt_jit.ENV, "0")
    assert sampling.lemire_host([268369921], 16, rng) is None
    monkeypatch.delenv(ntt_jit.ENV)
    assert ntt_jit.enabled()
    monkeypatch.setattr(ntt_jit, "lemire_fill", lambda *a: -1)
    assert sampling.lemire_host([268369921], 16, rng) is None
    assert rng.bit_generator.state == before


@pytest.mark.parametrize(("seed", "n"), [(0, 4096), (1, 65536), (2, 1000)])
def test_binomial_replay_on_the_gpu_equals_numpy(seed, n):
    """The device replay (one kernel: BINOMIAL_SOURCE) gives NumPy's centred binomial bit for bit and leaves the
    generator where NumPy does."""
    cp = pytest.importorskip("cupy")
    from caramel.api import gpu_available
    from caramel.ckks.sampling import binomial_replay

    if not gpu_available():
        pytest.skip("no CUDA device")
    r1, r2 = np.random.default_rng(seed), np.random.default_rng(seed)
    want = r1.binomial(21, 0.5, n).astype(np.int64) - r1.binomial(21, 0.5, n).astype(np.int64)
    got = binomial_replay(n, 21, r2, cp)
    assert got.dtype == np.int64 and np.array_equal(got.get(), want)
    assert r1.bit_generator.state == r2.bit_generator.state


@pytest.mark.parametrize("where", ["host", "gpu"])
def test_binomial_replay_declines_a_value_past_the_bound(where, monkeypatch):
    """A value NumPy would draw again (still above px after ``bound`` steps): no replay, the generator untouched."""
    from caramel.ckks import sampling

    xp = np
    if where == "gpu":
        xp = pytest.importorskip("cupy")
        from caramel.api import gpu_available

        if not gpu_available():
            pytest.skip("no CUDA device")
    px, _ = sampling.binomial_steps(21)
    monkeypatch.setattr(sampling, "binomial_steps", lambda k: (px[:2], 1))  # one step: most values pass it
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    assert sampling.binomial_replay(4096, 21, rng, xp) is None
    assert rng.bit_generator.state == before


def test_binomial_steps_follow_numpys_recurrence():
    """px from q^k as NumPy computes it (exp(k log q), not 0.5 ** 21 exactly), then its recurrence."""
    import math

    from caramel.ckks.sampling import binomial_steps

    px, bound = binomial_steps(21)
    want = math.exp(21 * math.log(0.5))
    assert bound == 21 and len(px) == 22 and px[0] == want != 0.5 ** 21
    for step in range(1, 22):
        want = ((21 - step + 1) * 0.5 * want) / (step * 0.5)
        assert px[step] == want
