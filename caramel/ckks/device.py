"""Where the client's arithmetic runs: the host (NumPy) or a GPU (CuPy), with bit-identical results.

The client math (key generation, encoding into NTT limbs, encryption, decryption products) is written
once against an array module ``xp``: NumPy on the host, CuPy on the GPU. Random numbers are always
drawn on the host from the same ``numpy.random.Generator`` calls in the same order, then copied to the
device, so both devices give the same secrets, keys and ciphertexts bit for bit (every step after the
draws is exact integer arithmetic modulo primes below 2^30).

A :class:`ClientDevice` is chosen per call (``device=`` of :func:`caramel.ckks.keyset.generate_keyset`)
or for a block of code with :func:`using`; :func:`current` is what the client functions consult.

Batched formulas (rows r of a (k, N) array belong to limbs l_r, q = q_{l_r}, all in NTT form):

    evaluation key:  c1 = a,  c0 = e + [l in D] (P mod q) s_new - a s_old          (mod q)
    encryption:      c1 = a,  c0 = m + e - a s                                     (mod q)
    decryption:      m = INTT(c0 + c1 s)                                           (mod q)

with small integers (e, s) reduced into a limb as e mod q = e + q [e < 0].
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import logging
import os
import threading
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from caramel.ckks.rns import to_ntt as rns_to_ntt, to_residues
from caramel.ckks.sampling import cbd, uniform_residues
from caramel.errors import ArgumentError, CaramelError
from caramel.ring import ntt_jit
from caramel.ring.ntt import map_chunks, ntt

_U64 = np.uint64
logger = logging.getLogger(__name__)


class ClientDeviceError(CaramelError, ValueError):
    """An unknown client device name."""


class DeviceKind(str, enum.Enum):
    """Where client arithmetic runs."""

    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class ClientDevice:
    """A place for client arithmetic: ``kind`` and its array module (NumPy or CuPy)."""

    kind: DeviceKind = DeviceKind.CPU

    @cached_property
    def xp(self):
        if self.kind == DeviceKind.GPU:
            wait_for_warm_up()  # the GPU's first work, when warm_up started it, is done
            try:
                import cupy
            except ImportError:
                raise ClientDeviceError("the GPU client needs CuPy and a CUDA GPU (in the caramel clone: "
                                        "pip install -e '.[cuda12]' or '.[cuda13]')") from None
            return cupy
        return np

    @property
    def on_gpu(self) -> bool:
        return self.kind == DeviceKind.GPU

    def put(self, a, dtype=None):
        """``a`` as an array of this device (a copy to the GPU when needed)."""
        return self.xp.asarray(a, dtype=dtype)

    def get(self, a) -> np.ndarray:
        """``a`` as a host NumPy array (from a GPU through pinned staging buffers)."""
        if hasattr(a, "get") and not isinstance(a, np.ndarray):
            from caramel.backends.cuda.transfer import download

            return download(a)
        return np.asarray(a)

    def rows(self, fn, total: int, chunk_residues: int, n: int) -> None:
        """Call fn(r0, r1) over row slices: on the host in cache-sized chunks on the thread pool,
        on the GPU once for all rows (its kernels are already parallel)."""
        if self.on_gpu:
            fn(0, total)
        else:
            map_chunks(fn, total, max(1, chunk_residues // n))


CPU = ClientDevice(DeviceKind.CPU)
GPU = ClientDevice(DeviceKind.GPU)
#: Host rows are processed in chunks of about this many residues (a core's L2 cache).
HOST_CHUNK_RESIDUES = 1 << 16

_current: contextvars.ContextVar[ClientDevice] = contextvars.ContextVar("caramel_client_device", default=CPU)


def resolve(device: ClientDevice | DeviceKind | str | None, backend: str | None = None) -> ClientDevice:
    """The device of ``device`` ("cpu", "gpu", a ClientDevice) or, when None, of ``backend``:
    the GPU for the ``gpu`` backend, else the host. Raises ClientDeviceError for other names."""
    if isinstance(device, ClientDevice):
        return device
    if device is None or device == "auto":
        return GPU if backend == "gpu" else CPU
    try:
        kind = DeviceKind(device)
    except ValueError:
        raise ClientDeviceError(f"client device must be 'cpu', 'gpu' or 'auto', got {device!r}") from None
    return GPU if kind == DeviceKind.GPU else CPU


#: Environment variable: "0" turns :func:`warm_up` off.
WARM_UP_ENV = "CARAMEL_GPU_WARMUP"
_warm_up: threading.Thread | None = None


def warm_up(n: int) -> None:
    """Start the first GPU work of a run of ring degree ``n`` in a host thread, while the caller
    loads and plans: import CuPy (or wait for ``caramel run``'s early import, :func:`caramel.cli._start_gpu`),
    create the CUDA context and load :mod:`caramel.ckks.pcg`; then load the client's kernels
    (:func:`load_client_kernels`: the CUDA ring's device tables, computed on the GPU, and NTT among
    them) and the CUDA INTT. The GPU client waits for it before its first GPU work (:func:`wait_for_warm_up`); a
    failure here is only logged (the run then meets it itself). Off when ``$CARAMEL_GPU_WARMUP`` is
    "0"; started once per process."""
    global _warm_up
    if _warm_up is not None or os.environ.get(WARM_UP_ENV, "1") == "0":
        return

    def work() -> None:
        stamp = _Stamps()
        try:
            import cupy as cp

            stamp("import cupy")
            cp.empty(1)  # the CUDA context
            stamp("CUDA context")
            from caramel.ckks import pcg

            pcg.device_words(1, 1, 1, cp)
            stamp("pcg")
            from caramel.ring import Context

            ctx = Context(n=n)  # no host NTT table: the CUDA ring builds its twiddles on the GPU
            if ctx.n.bit_length() - 1 in CUDA_NTT_SIZES:
                from caramel.backends.cuda.backend import cuda_ring

                cuda_ring(ctx).twiddles  # noqa: B018 (built now: two kernels, timed apart)
                stamp("ring tables")
            dev = ClientDevice(DeviceKind.GPU)  # a fresh one: the shared GPU's xp must wait for this thread
            load_client_kernels(ctx, dev)  # the CUDA ring's tables and NTT kernels among them
            stamp("client kernels")
            transform_rows(cp.zeros((1, ctx.n), dtype=np.uint32), ctx, [0], dev, inverse=True)  # and its INTT
            cp.cuda.Device().synchronize()
            stamp("INTT")
            logger.debug("GPU warm-up: %s", stamp.line())
        except Exception as exc:  # noqa: BLE001 (the run itself reports what fails)
            logger.debug("GPU warm-up failed: %s: %s", type(exc).__name__, exc)

    _warm_up = threading.Thread(target=work, name="caramel-gpu-warm-up")
    _warm_up.start()


class _Stamps:
    """Wall-clock seconds of named steps since creation (for a DEBUG line)."""

    def __init__(self) -> None:
        self.last = self.start = time.perf_counter()
        self.steps: list[tuple[str, float]] = []

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.steps.append((name, now - self.last))
        self.last = now

    def line(self) -> str:
        parts = ", ".join(f"{name} {s:.3f}" for name, s in self.steps)
        return f"{parts}; {self.last - self.start:.3f} s in all"


def load_client_kernels(ctx, dev: ClientDevice) -> None:
    """Encode and encrypt a zero message once on two limbs of ``ctx`` on ``dev`` (a throw-away secret
    and generator): the array kernels of :func:`to_ntt_rows` and :func:`caramel.ckks.encrypt.encrypt`
    (residues, products, the download) are compiled, or loaded from CuPy's cache, before a run needs
    them. Nothing of the run's draws or keys is touched."""
    rng = np.random.default_rng(0)
    limbs = (0, 1)
    m = to_ntt_rows(np.zeros(ctx.n, dtype=np.int64), ctx, limbs, dev)
    s = SecretRows(rng.integers(-1, 2, ctx.n), ctx, dev).take(limbs)
    dev.get(encrypt_rows(ctx, limbs, m, s, rng, dev)[0])


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


def current() -> ClientDevice:
    """The device that client functions use when none is passed (default: the host)."""
    return _current.get()


@contextlib.contextmanager
def using(device: ClientDevice | str | None):
    """Run the enclosed client code on ``device`` (see :func:`resolve`)."""
    token = _current.set(resolve(device))
    try:
        yield
    finally:
        _current.reset(token)


def prime_column(ctx, limbs, dev: ClientDevice = CPU):
    """The primes of ``limbs`` as a (k, 1) uint64 column on ``dev``."""
    return dev.put(np.array([ctx.q(int(l)) for l in limbs], dtype=_U64)[:, None])


def small_residues(coeffs, qcol, xp=np):
    """[c mod q] for small signed integers c (|c| < q), rows per prime of ``qcol``: c + q [c < 0].

    Computed as x = uint64(c) + q (wrapping), then min(x, x - q) (uint32 result)."""
    x = coeffs.astype(_U64)[None, :] + qcol
    return xp.minimum(x, x - qcol).astype(np.uint32)


def int_residues(coeffs, qcol, xp=np):
    """[c mod q] (non-negative) for int64 coefficients c, rows per prime of ``qcol`` (uint32)."""
    return xp.mod(coeffs.astype(np.int64)[None, :], qcol.astype(np.int64)).astype(np.uint32)


def mulmod(a, b, q, xp=np):
    """(a * b) mod q for residues below 2^32 (uint64 products, q broadcasting); uint64 result."""
    t = xp.multiply(a, b, dtype=_U64)
    return xp.remainder(t, q, out=t)


class SecretRows:
    """A secret's NTT form on every limb of a context, on one device: ``rows[l]`` is NTT_{q_l}(s mod q_l).

    Built with one batched transform for all limbs (cached on the :class:`~caramel.ckks.keys.SecretKey`).
    """

    def __init__(self, coeffs: np.ndarray, ctx, dev: ClientDevice):
        limbs = list(range(len(ctx.primes)))
        qcol = prime_column(ctx, limbs, dev)
        res = small_residues(dev.put(coeffs), qcol, dev.xp)
        self.rows = transform_rows(res, ctx, limbs, dev)
        self.ctx = ctx
        self.dev = dev

    def take(self, limbs):
        """Rows of ``limbs``, (k, N) uint32 on the device."""
        return self.rows[self.dev.put(np.asarray(list(limbs), dtype=np.int64))]


def secret_rows(sk, ctx, dev: ClientDevice) -> SecretRows:
    """The cached :class:`SecretRows` of secret key ``sk`` for ``ctx`` on ``dev``."""
    if ctx.n != sk.n:
        raise ArgumentError(f"secret has N = {sk.n}, context has N = {ctx.n}")
    cache = sk.__dict__.setdefault("_rows", {})
    key = (id(ctx), dev.kind)
    hit = cache.get(key)
    if hit is None or hit.ctx is not ctx:
        hit = cache[key] = SecretRows(sk.coeffs, ctx, dev)
    return hit


def ntt_tables(ctx, limbs):
    return [ctx.ntt_table(int(l)) for l in limbs]


#: Ring degrees for which the GPU client runs caramel's own CUDA NTT kernels
#: (:mod:`caramel.backends.cuda.ntt`); other N use the array NTT of :mod:`caramel.ring.ntt` on CuPy.
CUDA_NTT_SIZES = range(12, 17)


def transform_rows(res, ctx, limbs, dev: ClientDevice, inverse: bool = False):
    """NTT (or, with ``inverse``, INTT) of canonical residues ``res`` (k, N) uint32 on ``dev``, row r
    modulo q_{limbs[r]}: the functions of :func:`caramel.ring.ntt.ntt` / ``intt``, bit for bit.

    On the GPU (N = 2^12 .. 2^16) through caramel's CUDA kernels, the executor's own
    (:func:`caramel.backends.cuda.ntt.ntt`, which compute the reference's transform from the
    context's tables): one launch (the INTT) or two (the NTT) for all rows, the rows copied into the
    first half of a (2k, N) arena and transformed into its second half. Elsewhere :mod:`caramel.ring.ntt`."""
    from caramel.ring.ntt import intt

    limbs = [int(l) for l in limbs]
    if not (dev.on_gpu and ctx.n.bit_length() - 1 in CUDA_NTT_SIZES and len(limbs)):
        return (intt if inverse else ntt)(res, ntt_tables(ctx, limbs))
    from caramel.backends.cuda import ntt as cuda_ntt
    from caramel.backends.cuda.backend import cuda_ring

    cp = dev.xp
    k = len(limbs)
    arena = cp.empty((2 * k, ctx.n), dtype=np.uint32)
    arena[:k] = res
    slots = cp.arange(2 * k, dtype=np.int32)
    primes = cp.asarray(np.asarray(limbs, dtype=np.int32))
    (cuda_ntt.intt if inverse else cuda_ntt.ntt)(cuda_ring(ctx), arena, slots[:k], slots[k:], primes)
    return arena[k:]


def to_ntt_rows(coeffs, ctx, limbs, dev: ClientDevice):
    """NTT-form residues of int64 or Python-int coefficients on ``limbs``, (k, N) uint32 on ``dev``."""
    limbs = [int(l) for l in limbs]
    c = np.asarray(coeffs)
    if c.dtype == object:
        res = dev.put(to_residues(c, ctx, limbs))
    else:
        res = int_residues(dev.put(c), prime_column(ctx, limbs, dev), dev.xp)
    return transform_rows(res, ctx, limbs, dev)


def _host_jit(dev: ClientDevice, e, *rows) -> bool:
    """True when the c0 rows are computed by the compiled host kernel (:func:`caramel.ring.ntt_jit.c0_row`:
    on the host, compiled kernels ready, int64 errors and uint32 rows), else by the array code."""
    return (not dev.on_gpu and e.dtype == np.int64 and ntt_jit.ready(int(e.shape[-1]))
            and all(r.dtype == np.uint32 for r in rows))


def evalkey_c0(ctx, limbs, a, e, s_old, s_new, p_mod, dev: ClientDevice, perm=None):
    """c0 = e + p_mod * s_new - a * s_old (mod q) per row; a, s_old, s_new (k, N), e (N,) int64 on
    ``dev``, p_mod (k, 1) uint64 on the host; ``perm``: s_new stands for s_new[:, perm]. Returns
    (k, N) uint32 on ``dev``."""
    xp = dev.xp
    host_jit = _host_jit(dev, e, a, s_old, s_new)
    if perm is not None and not host_jit:
        s_new = xp.take(s_new, perm, axis=1)
    qcol = prime_column(ctx, limbs, dev)
    tabs = ntt_tables(ctx, limbs) if host_jit else None  # the compiled host kernel's tables
    p_dev = dev.put(p_mod)
    out = xp.empty(a.shape, dtype=np.uint32)
    gather = np.empty(0, dtype=np.int64) if perm is None else np.ascontiguousarray(perm, dtype=np.int64)

    def run(r0: int, r1: int) -> None:
        if host_jit:
            for r in range(r0, r1):
                ntt_jit.c0_row(e, a[r], s_old[r], s_new[r], int(p_mod[r, 0]), tabs[r], out[r], gather)
            return
        q = qcol[r0:r1]
        en = xp.add(transform_rows(small_residues(e, q, xp), ctx, limbs[r0:r1], dev), q, dtype=_U64)  # e + q
        en -= mulmod(a[r0:r1], s_old[r0:r1], q, xp)  # in (0, 2q)
        if p_mod[r0:r1].any():
            en += mulmod(s_new[r0:r1], p_dev[r0:r1], q, xp)
        out[r0:r1] = xp.remainder(en, q, out=en)

    dev.rows(run, len(limbs), HOST_CHUNK_RESIDUES, ctx.n)
    return out


def encrypt_c0(ctx, limbs, a, m, e, s, dev: ClientDevice):
    """c0 = m + e - a * s (mod q) per row; a, m (NTT form), s (k, N) and e (N,) int64 on ``dev``."""
    xp = dev.xp
    qcol = prime_column(ctx, limbs, dev)
    out = xp.empty(a.shape, dtype=np.uint32)
    host_jit = _host_jit(dev, e, a, s, m)
    tabs = ntt_tables(ctx, limbs) if host_jit else None  # the compiled host kernel's tables

    def run(r0: int, r1: int) -> None:
        if host_jit:
            for r in range(r0, r1):
                ntt_jit.c0_row(e, a[r], s[r], m[r], 1, tabs[r], out[r], None)
            return
        q = qcol[r0:r1]
        en = xp.add(transform_rows(small_residues(e, q, xp), ctx, limbs[r0:r1], dev), q, dtype=_U64)  # e + q
        en += m[r0:r1]
        en -= mulmod(a[r0:r1], s[r0:r1], q, xp)  # in (0, 3q)
        out[r0:r1] = xp.remainder(en, q, out=en)

    dev.rows(run, len(limbs), HOST_CHUNK_RESIDUES, ctx.n)
    return out


def encrypt_rows(ctx, limbs, m, s, rng, dev: ClientDevice):
    """(c0, c1 = a) encrypting the NTT-form rows ``m`` under the secret's rows ``s`` (both (k, N) on
    ``dev``): draws ``a`` (uniform on every limb), then ``e``, from ``rng``; c0 by :func:`encrypt_c0`."""
    a = uniform_residues(ctx, limbs, rng, dev.xp)
    e = cbd(ctx.n, rng, xp=dev.xp)
    return encrypt_c0(ctx, limbs, a, m, dev.put(e), s, dev), a


def decrypt_rows(ctx, limbs, c0, c1, s, dev: ClientDevice):
    """Coefficient-form residues INTT(c0 + c1 * s mod q), (k, N) uint32 on ``dev``."""
    xp = dev.xp
    qcol = prime_column(ctx, limbs, dev)
    m = mulmod(c1, s, qcol, xp)
    m += c0
    return transform_rows(xp.remainder(m, qcol, out=m).astype(np.uint32), ctx, limbs, dev, inverse=True)


def to_ntt(coeffs, ctx, limbs, keep: bool = False) -> np.ndarray:
    """NTT-form residues of integer coefficients, shape (len(limbs), N) uint32, computed on the
    current client device (:func:`current`) and returned on the host (with ``keep``, inside
    :func:`keeping_inputs`, left on the GPU); the same bits as :func:`caramel.ckks.rns.to_ntt`."""
    limbs = list(limbs)
    dev = current()
    if dev.on_gpu and np.asarray(coeffs).shape == (ctx.n,):
        rows = to_ntt_rows(coeffs, ctx, limbs, dev)
        return client_array(rows, dev) if keep else dev.get(rows)
    return rns_to_ntt(coeffs, ctx, limbs)


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


def client_array(a, dev: ClientDevice):
    """``a`` (an array of ``dev``) as the client hands it out: left on the GPU inside
    :func:`keeping_inputs`, else a host array."""
    return a if dev.on_gpu and _keep_inputs.get() else dev.get(a)


def host_array(a) -> np.ndarray:
    """``a`` as a host NumPy array (a GPU array, e.g. an input row kept there, is copied down)."""
    return CPU.get(a)
