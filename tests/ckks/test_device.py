"""Choosing where the client computes (caramel.ckks.device), handing its arrays out, the GPU warm-up."""

from __future__ import annotations

import numpy as np
import pytest

import caramel
from caramel.ckks import Secrets
from caramel.ckks import device as devmod
from caramel.ckks.arith import GpuArith, HostArith
from caramel.ckks.encrypt import encrypt
from caramel.ckks.rns import to_ntt

from ckks_helpers import context, gpu

N = 256


def test_resolve_and_using():
    assert devmod.resolve(None, "gpu").on_gpu and not devmod.resolve(None, "cpu").on_gpu
    assert not devmod.resolve("cpu", "gpu").on_gpu
    with pytest.raises(caramel.errors.CaramelError):
        devmod.resolve("tpu")
    with devmod.using("cpu"):
        assert devmod.current() is devmod.CPU
    posed = GpuArith(array_module=np, cuda_ntt=False)
    assert devmod.resolve(posed, "cpu") is posed and devmod.resolve("cpu") is devmod.CPU
    assert devmod.resolve("gpu") is devmod.GPU and isinstance(devmod.CPU, HostArith)


def test_chosen_waits_for_the_warm_up_before_gpu_work_only(monkeypatch):
    """The GPU client's first work waits for the warm-up's thread (its CuPy import, CUDA context and
    kernels); the host client never does."""
    import threading

    go = threading.Event()
    t = threading.Thread(target=go.wait)
    t.start()
    monkeypatch.setattr(devmod, "_warm_up", t)
    assert devmod.chosen() is devmod.CPU and devmod.chosen("cpu") is devmod.CPU and t.is_alive()
    posed = GpuArith(array_module=np, cuda_ntt=False)
    threading.Timer(0.05, go.set).start()
    with devmod.using(posed):
        assert devmod.chosen() is posed
    assert not t.is_alive()


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
    fake = _FakeGpu()
    assert isinstance(devmod.client_array(row, fake), np.ndarray)
    with devmod.keeping_inputs():
        assert devmod.client_array(row, fake) is row
        host = np.arange(3)
        assert devmod.client_array(host, devmod.CPU) is host
        with devmod.keeping_inputs(False):
            assert isinstance(devmod.client_array(row, fake), np.ndarray)
        assert devmod.client_array(row, fake) is row
    assert isinstance(devmod.client_array(row, fake), np.ndarray)
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


@pytest.mark.skipif(not gpu(), reason="needs CuPy and a CUDA GPU")
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
    on_gpu = caramel.run_program(program, n=4096, backend="gpu", seed=2)
    assert on_gpu.digest == host.digest and on_gpu.report.summary() == host.report.summary()


@pytest.mark.skipif(not gpu(), reason="needs CuPy and a CUDA GPU")
def test_secret_rows_are_made_on_each_gpu_that_encrypts():
    """The GPU client's cached secret rows belong to the device current when they are asked for: an encryption on
    GPU 1 after one on GPU 0 reads rows on GPU 1 (not GPU 0's through peer access), with the same bits."""
    import cupy as cp

    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("2 GPUs needed")
    ctx = context(4096)
    sec = Secrets.generate(4096, 5)
    rows = {}
    for d in (0, 1):
        with cp.cuda.Device(d):
            rows[d] = devmod.GPU.secret_rows(sec.s, ctx).take([0, 1])
            assert rows[d].device.id == d
            assert devmod.GPU.secret_rows(sec.s, ctx).take([0, 1]).device.id == d  # cached per device
    assert np.array_equal(rows[0].get(), rows[1].get())


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
