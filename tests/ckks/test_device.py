"""Batched client arithmetic (caramel.ckks.device) against the per-limb formulas, draw for draw.

The reference functions below are the pre-batching implementations (one limb at a time through the
context's NTT, products with ``%``); the batched code must give the same bits for the same draws.
"""

from __future__ import annotations

import numpy as np
import pytest

import caramel
from caramel.ckks import Secrets, generate_evalkey
from caramel.ckks import device as devmod
from caramel.ckks.encrypt import decrypt, encrypt
from caramel.ckks.keys import extension_modulus, generate_evalkeys, key_limbs, key_secrets
from caramel.ckks.keyset import generate_keyset
from caramel.ckks.rns import from_residues, mulmod, prime_column, to_ntt
from caramel.ckks.sampling import cbd, uniform_residues
from caramel.program import EvalKeyId, KeyType

from ckks_helpers import context

N = 256

KEY_IDS = [
    EvalKeyId(KeyType.RELIN, 4, ext=2, rot=0, digits=(0, 1, 2, 3)),
    EvalKeyId(KeyType.ROTATION, 4, ext=2, rot=3, digits=(0, 2)),
    EvalKeyId(KeyType.ROTATION, 3, ext=1, rot=-5, digits=(1,)),
    EvalKeyId(KeyType.CONJUGATION, 4, ext=1, rot=0, digits=(0, 1, 2, 3)),
    EvalKeyId(KeyType.EPHEMERAL, 3, ext=1, rot=0, digits=(0,)),
    EvalKeyId(KeyType.BOOTSTRAP, 5, ext=3, rot=4, digits=(0, 1, 2, 3, 4)),
    EvalKeyId(KeyType.BOOTSTRAP2, 4, ext=2, rot=3, digits=(1, 3)),
]


def reference_evalkey(ctx, key_id, secrets, rng):
    """c0, c1 of ISA.md 5.3 computed limb by limb (the pre-batching code path)."""
    limbs = key_limbs(key_id)
    qcol = prime_column(ctx, limbs)
    a = uniform_residues(ctx, limbs, rng)
    e_coeffs = cbd(ctx.n, rng)
    e = np.stack([to_ntt(e_coeffs, ctx, [l])[0] for l in limbs])
    s_old, s_new = key_secrets(ctx, key_id, secrets, limbs)
    big_p = extension_modulus(ctx, key_id.ext)
    p_mod = np.array([big_p % ctx.q(l) if l in key_id.digits else 0 for l in limbs], dtype=np.uint64)[:, None]
    c0 = (qcol - mulmod(a, s_old, qcol) + e.astype(np.uint64) + mulmod(s_new, p_mod, qcol)) % qcol
    return c0.astype(np.uint32), a


@pytest.mark.parametrize("key_id", KEY_IDS, ids=str)
def test_batched_evalkey_equals_per_limb(key_id):
    ctx = context(N)
    sec = Secrets.generate(N, 11)
    want_c0, want_c1 = reference_evalkey(ctx, key_id, sec, np.random.default_rng(5))
    key = generate_evalkey(ctx, key_id, sec, np.random.default_rng(5), device="cpu")
    assert np.array_equal(key.c0, want_c0) and np.array_equal(key.c1, want_c1)


@pytest.mark.parametrize("threads", ["1", "2", "3"])
def test_keys_do_not_depend_on_threads(monkeypatch, threads):
    ctx = context(N)
    sec = Secrets.generate(N, 3)
    monkeypatch.setenv("CARAMEL_CLIENT_THREADS", "1")
    want = generate_evalkeys(ctx, KEY_IDS, sec, 8)
    monkeypatch.setenv("CARAMEL_CLIENT_THREADS", threads)
    monkeypatch.setattr(devmod, "HOST_CHUNK_RESIDUES", N)  # one row per chunk: many chunks, all threads
    got = generate_evalkeys(ctx, KEY_IDS, sec, 8)
    for k in KEY_IDS:
        assert np.array_equal(got[k].c0, want[k].c0) and np.array_equal(got[k].c1, want[k].c1)


def test_generate_evalkeys_equals_one_by_one():
    ctx = context(N)
    sec = Secrets.generate(N, 4)
    rng = np.random.default_rng(9)
    one = {k: generate_evalkey(ctx, k, sec, rng) for k in KEY_IDS}
    many = generate_evalkeys(ctx, KEY_IDS, sec, np.random.default_rng(9))
    assert all(np.array_equal(one[k].c0, many[k].c0) for k in KEY_IDS)


def test_encrypt_equals_per_limb_and_decrypts(rng):
    ctx = context(N)
    sec = Secrets.generate(N, 2)
    limbs = (0, 1, 2, 5)
    coeffs = rng.integers(-(2**40), 2**40, N)
    ct = encrypt(ctx, sec.s, coeffs, limbs, np.random.default_rng(1))
    r = np.random.default_rng(1)
    qcol = prime_column(ctx, limbs)
    a = uniform_residues(ctx, limbs, r)
    m = to_ntt(coeffs, ctx, limbs).astype(np.uint64)
    e = to_ntt(cbd(N, r), ctx, limbs).astype(np.uint64)
    c0 = ((qcol - mulmod(a, sec.s.ntt_limbs(ctx, limbs), qcol)) + m + e) % qcol
    assert np.array_equal(ct.c0, c0.astype(np.uint32)) and np.array_equal(ct.c1, a)
    got = decrypt(ctx, sec.s, ct)
    assert np.max(np.abs((got - coeffs.astype(object)).astype(np.int64))) <= 21


def test_decrypt_equals_per_limb(rng):
    ctx = context(N)
    sec = Secrets.generate(N, 2)
    limbs = (0, 3, 4)
    ct = encrypt(ctx, sec.s, rng.integers(-1000, 1000, N), limbs, rng)
    qcol = prime_column(ctx, limbs)
    m = (ct.c0.astype(np.uint64) + mulmod(ct.c1, sec.s.ntt_limbs(ctx, limbs), qcol)) % qcol
    want = from_residues(np.asarray(ctx.intt(m.astype(np.uint32), list(limbs))), ctx, limbs)
    assert np.array_equal(decrypt(ctx, sec.s, ct), want)


def test_resolve_and_using():
    assert devmod.resolve(None, "gpu").on_gpu and not devmod.resolve(None, "cpu").on_gpu
    assert not devmod.resolve("cpu", "gpu").on_gpu
    with pytest.raises(caramel.errors.CaramelError):
        devmod.resolve("tpu")
    with devmod.using("cpu"):
        assert devmod.current() is devmod.CPU


def _gpu() -> bool:
    try:
        from caramel.api import gpu_available
    except ImportError:  # pragma: no cover
        return False
    return gpu_available()


@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
def test_gpu_client_equals_cpu_client():
    from pathlib import Path

    program = caramel.load_program(Path(__file__).resolve().parents[2] / "programs" / "Mul_4L_2c")
    ctx = context(1024)
    cpu = generate_keyset(program, ctx, 7, device="cpu")
    gpu = generate_keyset(program, ctx, 7, device="gpu")
    for k, key in cpu.keys.items():
        assert np.array_equal(key.c0, gpu.keys[k].c0) and np.array_equal(key.c1, gpu.keys[k].c1)
    sec = cpu.secrets
    coeffs = np.arange(1024) - 512
    a = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3, device="cpu")
    b = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3, device="gpu")
    assert np.array_equal(a.c0, b.c0) and np.array_equal(a.c1, b.c1)
    assert np.array_equal(decrypt(ctx, sec.s, a, device="cpu"), decrypt(ctx, sec.s, a, device="gpu"))
    c1 = caramel.run_program(program, ctx=ctx, backend="cpu", seed=2, client="cpu")
    c2 = caramel.run_program(program, ctx=ctx, backend="cpu", seed=2, client="gpu")
    assert c1.digest == c2.digest


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
    want = cbd(4096, r1)
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
    from caramel.ckks.sampling import lemire_host
    from caramel.ring import ntt_jit

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
    from caramel.ckks import sampling
    from caramel.ring import ntt_jit

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


def test_object_residues_equal_python_ints():
    """Residues of big (object) integers by words equal Python's % per limb, signs and zero included."""
    from caramel.ckks.rns import to_residues

    ctx = context(64)
    rng = np.random.default_rng(9)
    c = np.array([int(x) * (1 << 70) + int(y) - (1 << 100) for x, y in zip(rng.integers(0, 2**62, 64),
                                                                         rng.integers(0, 2**62, 64))], dtype=object)
    c[:4] = [0, -1, -(1 << 200), ctx.q(3)]
    limbs = [0, 3, 17, 63]
    want = np.stack([[int(v) % ctx.q(l) for v in c] for l in limbs]).astype(np.uint32)
    assert np.array_equal(to_residues(c, ctx, limbs), want)


def test_warm_up_runs_once_in_a_thread_and_never_raises(monkeypatch):
    """Without a GPU the warm-up's failure is only logged; the client waits for the thread once."""
    monkeypatch.setattr(devmod, "_warm_up", None)
    monkeypatch.setenv(devmod.WARM_UP_ENV, "0")
    devmod.warm_up(4096)
    assert devmod._warm_up is None
    monkeypatch.setenv(devmod.WARM_UP_ENV, "1")
    devmod.warm_up(4096)
    first = devmod._warm_up
    assert first is not None
    devmod.warm_up(4096)
    assert devmod._warm_up is first  # started once per process
    devmod.wait_for_warm_up()
    assert not first.is_alive()


@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("n", [4096, 65536])  # caramel's CUDA NTT kernels: one kernel, then two passes
def test_gpu_client_on_cuda_kernels_equals_cpu_client(n):
    """Keys (copied back at once, or in the background), secrets' rows, encryption and decryption."""
    ctx = context(n)
    sec = Secrets.generate(n, 5)
    cpu = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="cpu")
    gpu = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="gpu")
    later = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="gpu", background=True)
    kept = generate_evalkeys(ctx, KEY_IDS, sec, 8, device="gpu", on_device=True)
    for k in KEY_IDS:
        for got in (gpu[k], later[k]):
            assert np.array_equal(cpu[k].c0, got.c0) and np.array_equal(cpu[k].c1, got.c1)
        assert np.array_equal(cpu[k].c0, kept[k].c0.get()) and np.array_equal(cpu[k].c1, kept[k].c1.get())
    coeffs = np.random.default_rng(1).integers(-2**20, 2**20, n)
    limbs = tuple(range(6))
    a = encrypt(ctx, sec.s, coeffs, limbs, 3, device="cpu")
    b = encrypt(ctx, sec.s, coeffs, limbs, 3, device="gpu")
    assert np.array_equal(a.c0, b.c0) and np.array_equal(a.c1, b.c1)
    assert np.array_equal(decrypt(ctx, sec.s, a, device="cpu"), decrypt(ctx, sec.s, a, device="gpu"))
    assert np.array_equal(to_ntt(coeffs, ctx, limbs), devmod.GPU.get(devmod.to_ntt_rows(coeffs, ctx, limbs, devmod.GPU)))


class _Row:
    """Stands for a GPU array: ``__cuda_array_interface__``, ``get()``, no implicit conversion."""

    def __init__(self, a):
        self._a = np.asarray(a)
        self.dtype, self.shape, self.ndim = self._a.dtype, self._a.shape, self._a.ndim
        self.__cuda_array_interface__ = {"shape": self.shape, "typestr": self.dtype.str, "version": 3}

    def get(self):
        return self._a.copy()

    def __array__(self, *args, **kwargs):
        raise TypeError("implicit conversion of a device array")


class _FakeGpu:
    on_gpu = True

    def get(self, a):
        return a.get()


@pytest.fixture
def fake_download(monkeypatch):
    """``transfer.download`` without CuPy: the fake row's ``get()``."""
    from caramel.backends.cuda import transfer

    monkeypatch.setattr(transfer, "download", lambda a: a.get())


def test_keeping_inputs_leaves_the_gpu_client_arrays_there(fake_download):
    """Inside keeping_inputs(True) a GPU array is handed out as it is, else copied to the host;
    the host client always hands out host arrays; host_array copies any of them down."""
    row = _Row(np.arange(6, dtype=np.uint32))
    gpu = _FakeGpu()
    assert isinstance(devmod.client_array(row, gpu), np.ndarray)
    with devmod.keeping_inputs():
        assert devmod.client_array(row, gpu) is row
        host = np.arange(3)
        assert devmod.client_array(host, devmod.CPU) is host
        with devmod.keeping_inputs(False):
            assert isinstance(devmod.client_array(row, gpu), np.ndarray)
        assert devmod.client_array(row, gpu) is row
    assert isinstance(devmod.client_array(row, gpu), np.ndarray)
    assert np.array_equal(devmod.host_array(row), np.arange(6)) and isinstance(devmod.host_array(row), np.ndarray)
    assert devmod.host_array(np.arange(2)).tolist() == [0, 1]


def test_host_client_ignores_keeping_inputs(rng):
    """On the host nothing changes inside keeping_inputs: host arrays, the same bits."""
    ctx = context(N)
    sec = Secrets.generate(N, rng)
    coeffs = np.arange(N) - N // 2
    a = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3, device="cpu")
    with devmod.keeping_inputs():
        b = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3, device="cpu")
        p = devmod.to_ntt(coeffs, ctx, (0, 1), keep=True)
    assert isinstance(b.c0, np.ndarray) and np.array_equal(a.c0, b.c0) and np.array_equal(a.c1, b.c1)
    assert isinstance(p, np.ndarray) and np.array_equal(p, to_ntt(coeffs, ctx, (0, 1)))


def test_load_client_kernels_draws_nothing_of_the_run(rng):
    """The warm-up's throw-away encryption uses its own generator and secret: the client's later
    results are the same with and without it."""
    ctx = context(N)
    sec = Secrets.generate(N, 5)
    before = encrypt(ctx, sec.s, np.arange(N), (0, 1), 3, device="cpu")
    devmod.load_client_kernels(ctx, devmod.CPU)
    after = encrypt(ctx, sec.s, np.arange(N), (0, 1), 3, device="cpu")
    assert np.array_equal(before.c0, after.c0) and np.array_equal(before.c1, after.c1)


@pytest.mark.skipif(not _gpu(), reason="needs CuPy and a CUDA GPU")
def test_inputs_kept_on_the_gpu_equal_the_host_client():
    """keeping_inputs: the GPU client's ciphertexts and plaintexts stay CuPy arrays with the host
    client's bits; run_program on one GPU (inputs kept there) gives the host client's digest and check."""
    from pathlib import Path

    from caramel.ckks.plaintext import plaintext_from_coeffs

    ctx = context(4096)
    sec = Secrets.generate(4096, 5)
    coeffs = np.random.default_rng(1).integers(-2**20, 2**20, 4096)
    a = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3, device="cpu")
    with devmod.using("gpu"), devmod.keeping_inputs():
        b = encrypt(ctx, sec.s, coeffs, (0, 1, 2), 3)
        p = plaintext_from_coeffs(ctx, coeffs, (0, 1))
    assert not isinstance(b.c0, np.ndarray) and not isinstance(p.data, np.ndarray)
    assert np.array_equal(a.c0, b.c0.get()) and np.array_equal(a.c1, b.c1.get())
    assert np.array_equal(to_ntt(coeffs, ctx, (0, 1)), p.data.get())
    program = caramel.load_program(Path(__file__).resolve().parents[2] / "programs" / "Mul_4L_1c")
    host = caramel.run_program(program, n=4096, backend="cpu", seed=2, client="cpu")
    gpu = caramel.run_program(program, n=4096, backend="gpu", seed=2)
    assert gpu.digest == host.digest and gpu.report.summary() == host.report.summary()


def test_gpu_client_without_cupy_is_a_caramel_error(monkeypatch):
    """No CuPy: the GPU client's first use says so (a CaramelError, no traceback in the CLI)."""
    import sys

    from caramel.errors import CaramelError

    monkeypatch.setattr(devmod, "_warm_up", None)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(CaramelError, match="needs CuPy"):
        devmod.ClientDevice(devmod.DeviceKind.GPU).xp


def test_wait_for_warm_up_logs_the_wait_only_when_asked(monkeypatch, caplog):
    """``log=False`` (the key store's c1 thread): the wait ends with the warm-up's thread, no DEBUG line."""
    import logging
    import threading

    for log, lines in ((False, 0), (True, 1)):
        go = threading.Event()
        t = threading.Thread(target=go.wait)
        t.start()
        monkeypatch.setattr(devmod, "_warm_up", t)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger=devmod.logger.name):
            threading.Timer(0.05, go.set).start()
            devmod.wait_for_warm_up(log=log)
        assert not t.is_alive()
        assert len([r for r in caplog.records if "waited" in r.getMessage()]) == lines
