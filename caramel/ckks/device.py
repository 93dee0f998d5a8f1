"""Where the client's arithmetic runs: the host or a GPU (:mod:`caramel.ckks.arith`), bit-identical.

An implementation (a :class:`~caramel.ckks.arith.ClientArith`: :data:`CPU` the host, :data:`GPU`
the GPU) is chosen per call (``device=`` of :func:`caramel.ckks.keyset.generate_keyset`,
:func:`caramel.ckks.encrypt.encrypt`, ...) or for a block of code with :func:`using`;
:func:`chosen` is what the client functions consult. This module also hands the client's arrays
out (:func:`client_array`, :func:`keeping_inputs`, :func:`host_array`) and starts the GPU's first
work early (:func:`warm_up`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
import time

import numpy as np

from caramel.ckks.arith import (
    CUDA_NTT_SIZES,
    GPU,
    HOST,
    ClientArith,
    ClientDeviceError,
    DeviceKind,
    GpuArith,
    SecretRows,
)

logger = logging.getLogger(__name__)

#: The former name of the interface (an implementation is where the client computes).
ClientDevice = ClientArith
#: The host client (:data:`caramel.ckks.arith.HOST`).
CPU = HOST

_current: contextvars.ContextVar[ClientArith] = contextvars.ContextVar("caramel_client_device", default=CPU)


def resolve(device: ClientArith | DeviceKind | str | None, backend: str | None = None) -> ClientArith:
    """The implementation of ``device`` ("cpu", "gpu", a ClientArith) or, when None, of ``backend``:
    the GPU for the ``gpu`` backend, else the host. Raises ClientDeviceError for other names."""
    if isinstance(device, ClientArith):
        return device
    if device is None or device == "auto":
        return GPU if backend == "gpu" else CPU
    try:
        kind = DeviceKind(device)
    except ValueError:
        raise ClientDeviceError(f"client device must be 'cpu', 'gpu' or 'auto', got {device!r}") from None
    return GPU if kind == DeviceKind.GPU else CPU


def current() -> ClientArith:
    """The implementation that client functions use when none is passed (default: the host)."""
    return _current.get()


def chosen(device: ClientArith | DeviceKind | str | None = None) -> ClientArith:
    """The implementation of ``device`` (:func:`resolve`) or, when None, :func:`current`; a GPU one
    once the warm-up's thread (:func:`warm_up`, if started) has finished."""
    dev = resolve(device) if device is not None else current()
    if dev.on_gpu:
        wait_for_warm_up()
    return dev


@contextlib.contextmanager
def using(device: ClientArith | str | None):
    """Run the enclosed client code on ``device`` (see :func:`resolve`)."""
    token = _current.set(resolve(device))
    try:
        yield
    finally:
        _current.reset(token)


#: Environment variable: "0" turns :func:`warm_up` off.
WARM_UP_ENV = "CARAMEL_GPU_WARMUP"
_warm_up: threading.Thread | None = None


def warm_up(n: int, mode=None, *, always: bool = False) -> None:
    """Start the first GPU work of a run of ring degree ``n`` in a host thread, while the caller loads and
    plans: import CuPy (or wait for ``caramel run``'s early import, :func:`caramel.cli._start_gpu`); queue on
    the compile pool (:func:`caramel.backends.cuda.compiler.schedule`, every core) every kernel of the GPU client
    (:func:`caramel.ckks.gpu_kernels.client_jobs`) and, behind them, the executor's modules known before any
    plan (:meth:`~caramel.backends.cuda.kernel_set.KernelSet.ring`, for arithmetic mode ``mode``: None, exact),
    its helpers' array kernels and the encoding's module (:func:`~caramel.ckks.gpu_kernels.encoding_jobs`, first
    needed after the keys); make the CUDA context meanwhile (NVRTC needs none); wait for the client's
    kernels only (the executor's go on compiling while the program loads and plans, and its precompile finds
    them done); build the ring's twiddle tables; last, encrypt a zero message once
    (:func:`load_client_kernels`: anything the tables missed compiles here). The GPU client waits for it before
    its first GPU work (:func:`chosen`, :func:`wait_for_warm_up`); a failure here is only logged (the run then
    meets it itself). Each step is logged with its wall time at DEBUG ("cold path: ..."). Off when
    ``$CARAMEL_GPU_WARMUP`` is "0", unless ``always`` (``caramel compile``, whose purpose it is); started once
    per process."""
    global _warm_up
    if _warm_up is not None or (os.environ.get(WARM_UP_ENV, "1") == "0" and not always):
        return

    def work() -> None:
        stamp = _Stamps()
        try:
            import cupy as cp

            stamp("CuPy import (or the wait for the early one)")
            from caramel.backends.cuda import compiler
            from caramel.backends.cuda.array_kernels import backend_jobs
            from caramel.backends.cuda.kernel_set import KernelSet
            from caramel.ckks.gpu_kernels import client_jobs, encoding_jobs
            from caramel.ring import Context, Mode

            ctx = Context(n=n)  # no host NTT table: the CUDA ring builds its twiddles on the GPU
            client = client_jobs(ctx)
            mine = {m.key for m in client if hasattr(m, "key")}
            executor = [m for key, m in KernelSet(ctx).ring([Mode(mode or Mode.EXACT)]).modules.items()
                        if key not in mine] + backend_jobs(n) + encoding_jobs()
            # Queued before the context exists: NVRTC needs none (a module's load waits for it).
            batch = compiler.schedule(client)
            compiler.schedule(executor)  # behind the client's: compiled while the program loads and plans
            stamp("kernels queued")
            cp.empty(1)  # the CUDA context (or the wait for the early one, caramel.cli._start_gpu)
            stamp("CUDA context")
            try:
                batch.wait(progress=False)
            except Exception as exc:  # noqa: BLE001 (what did not compile ahead compiles at its first use)
                logger.debug("a kernel of the GPU client did not compile ahead: %s: %s", type(exc).__name__, exc)
            stamp(f"client kernels compiled ({len(client)}; {len(executor)} of the executor's queued behind)")
            if ctx.n.bit_length() - 1 in CUDA_NTT_SIZES:
                from caramel.backends.cuda.backend import cuda_ring

                cuda_ring(ctx).twiddles  # noqa: B018 (built now, on the GPU)
                stamp("ring tables")
            dev = GpuArith()  # the GPU, used directly: chosen() waits for this thread
            load_client_kernels(ctx, dev)
            dev.transform(cp.zeros((1, ctx.n), dtype=np.uint32), ctx, [0], inverse=True)  # and its INTT
            cp.cuda.Device().synchronize()
            stamp("client check (a zero encrypted)")
        except Exception as exc:  # noqa: BLE001 (the run itself reports what fails)
            logger.debug("GPU warm-up failed: %s: %s", type(exc).__name__, exc)

    _warm_up = threading.Thread(target=work, name="caramel-gpu-warm-up")
    _warm_up.start()


class _Stamps:
    """Logs each named step with its wall-clock seconds since the one before (DEBUG, "cold path: ...")."""

    def __init__(self) -> None:
        self.last = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        logger.debug("cold path: %s %.2f s", name, now - self.last)
        self.last = now


def load_client_kernels(ctx, dev: ClientArith) -> None:
    """Encode and encrypt a zero message once on two limbs of ``ctx`` on ``dev`` (a throw-away secret
    and generator): every kernel of :meth:`~caramel.ckks.arith.ClientArith.to_ntt_rows` and
    :func:`caramel.ckks.encrypt.encrypt` (residues, products, the download) is loaded before a run needs it
    (on the GPU the warm-up has compiled them all at once; any it missed compiles here, one at a time).
    Nothing of the run's draws or keys is touched."""
    rng = np.random.default_rng(0)
    limbs = (0, 1)
    m = dev.to_ntt_rows(np.zeros(ctx.n, dtype=np.int64), ctx, limbs)
    s = SecretRows(rng.integers(-1, 2, ctx.n), ctx, dev).take(limbs)
    dev.get(dev.encrypt_rows(ctx, limbs, m, s, rng)[0])


def wait_for_warm_up(log: bool = True) -> None:
    """Return when the thread of :func:`warm_up` (if one was started) has finished (``log``: a DEBUG
    line with the seconds waited)."""
    t = _warm_up
    if t is not None and t is not threading.current_thread():
        if t.is_alive():
            start = time.perf_counter()
            t.join()
            if log:
                logger.debug("waited %.3f s for the GPU warm-up", time.perf_counter() - start)
        t.join()


def to_ntt(coeffs, ctx, limbs, keep: bool = False) -> np.ndarray:
    """NTT-form residues of integer coefficients, shape (len(limbs), N) uint32, computed on the
    current client device (:func:`chosen`) and returned on the host (with ``keep``, inside
    :func:`keeping_inputs`, left on the GPU); the same bits as :func:`caramel.ckks.rns.to_ntt`."""
    dev = chosen()
    rows = dev.to_ntt_rows(coeffs, ctx, limbs)
    return client_array(rows, dev) if keep else dev.get(rows)


_keep_inputs: contextvars.ContextVar[bool] = contextvars.ContextVar("caramel_keep_inputs", default=False)


@contextlib.contextmanager
def keeping_inputs(keep: bool = True):
    """Inside (with ``keep``), the GPU client's encrypted inputs (plaintexts, ciphertexts) stay on the
    GPU as CuPy arrays instead of being copied to the host: for a 1-GPU executor, which copies device
    rows into its arena there (:func:`caramel.backends.cuda.transfer.upload_rows`)."""
    token = _keep_inputs.set(bool(keep))
    try:
        yield
    finally:
        _keep_inputs.reset(token)


def client_array(a, dev: ClientArith):
    """``a`` (an array of ``dev``) as the client hands it out: left on the GPU inside
    :func:`keeping_inputs`, else a host array."""
    return a if dev.on_gpu and _keep_inputs.get() else dev.get(a)


def host_array(a) -> np.ndarray:
    """``a`` as a host NumPy array (a GPU array, e.g. an input row kept there, is copied down)."""
    return CPU.get(a)
