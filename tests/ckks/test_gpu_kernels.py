"""The GPU client's kernels compiled ahead (caramel.ckks.gpu_kernels), checked without a GPU.

CuPy compiles a kernel for each array operation it meets, keyed by the operation and its operands' types and layout.
Here the client runs on a *tracing* array module (NumPy underneath) that records every array call in that shape: the
operation, and per operand its dtype and its layout after CuPy's merging of dimensions (a Python scalar by its type).
caramel's own CUDA kernels (the transform, the row formulas, the encoding, the PCG64 words, the Lemire and binomial
replays) are replaced by host twins, each the kernel's arithmetic in NumPy, so that the traced client's keys,
ciphertexts, decryptions and encodings are checked against the host client's, bit for bit. Key generation of every
key type, encryption, decryption and encoding must then make no array call at all at the sizes of caramel's NTT
(a GPU run compiles no CuPy kernel), while the array formulas of other sizes make many (the tracer sees them).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from caramel.backends.cuda import array_kernels
from caramel.ckks import Secrets, gpu_kernels, pcg, sampling
from caramel.ckks.arith import HOST, GpuArith, small_residues
from caramel.ckks.arith import gpu as gpu_arith
from caramel.ckks.encrypt import decrypt, encrypt
from caramel.ckks.keys import generate_evalkey
from caramel.ckks.rns import mulmod
from caramel.ckks.sampling import PcgState

from ckks_helpers import KEY_IDS, context

N = 4096


# ---------------------------------------------------------------------------------------------- the tracer

_log: list | None = None


@contextlib.contextmanager
def recording():
    """Record the array calls made inside (a set of call signatures)."""
    global _log
    calls: set = set()
    old, _log = _log, calls
    try:
        yield calls
    finally:
        _log = old


def record(*signature) -> None:
    if _log is not None:
        _log.add(signature)


def _strides(a: np.ndarray, shape: tuple) -> tuple:
    """``a``'s element strides broadcast to ``shape`` (0 along a broadcast dimension)."""
    lead = len(shape) - a.ndim
    out = []
    for i, size in enumerate(shape):
        j = i - lead
        if j < 0 or a.shape[j] == 1:
            out.append(0)
        else:
            out.append(a.strides[j] // a.itemsize)
    return tuple(out)


def layout(arrays: list, shape: tuple) -> list:
    """Per array, its layout after CuPy's merging of dimensions (cupy._core._kernel._reduce_dims): dimensions of
    size 1 dropped, neighbours merged where every operand steps through them as one; then (ndim, contiguous)."""
    dims = [i for i, s in enumerate(shape) if s != 1]
    strides = [_strides(a, shape) for a in arrays]
    merged: list[list[int]] = []
    for i in dims:
        if merged:
            j = merged[-1][-1]
            if all(st[j] == st[i] * shape[i] for st in strides):
                merged[-1].append(i)
                continue
        merged.append([i])
    out = []
    for st in strides:
        last = [st[g[-1]] for g in merged]
        sizes = [int(np.prod([shape[i] for i in g])) for g in merged]
        contiguous, step = True, 1
        for s, size in zip(reversed(last), reversed(sizes)):
            contiguous &= s == step
            step *= size
        out.append((len(merged), contiguous))
    return out


def operands(values: list) -> tuple:
    """The signature of the operands of an elementwise call: arrays by dtype and merged layout, scalars by type."""
    arrays = [np.asarray(v) for v in values if isinstance(v, np.ndarray) and not isinstance(v, np.generic)]
    shape = np.broadcast_shapes(*[a.shape for a in arrays]) if arrays else ()
    forms = iter(layout(arrays, shape))
    out = []
    for v in values:
        if isinstance(v, np.ndarray) and not isinstance(v, np.generic):
            out.append(("array", v.dtype.str, *next(forms)))
        elif isinstance(v, np.generic):
            out.append(("numpy scalar", v.dtype.str))
        else:
            out.append(("python scalar", type(v).__name__))
    return tuple(out)


def _plain(x):
    return np.asarray(x) if isinstance(x, Traced) else x


def _advanced(key) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, np.ndarray) and not isinstance(k, np.generic) for k in keys)


def _array(a) -> tuple:
    a = np.asarray(a)
    return a.dtype.str, layout([a], a.shape)[0]


class Traced(np.ndarray):
    """A NumPy array standing for a CuPy array: its array calls are recorded."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = kwargs.get("out")
        outs = tuple(out) if out is not None else ()
        dtype = kwargs.get("dtype")
        values = list(inputs) + list(outs)
        forms = operands(values) if method == "__call__" else tuple(  # a reduction: no broadcasting
            _array(v) if isinstance(v, np.ndarray) else type(v).__name__ for v in values)
        record(ufunc.__name__, method, forms, len(outs), None if dtype is None else np.dtype(dtype).str,
               tuple(sorted((k, str(v)) for k, v in kwargs.items() if k not in ("out", "dtype"))))
        args = [_plain(x) for x in inputs]
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in outs)
        result = getattr(ufunc, method)(*args, **kwargs)
        if out is not None:
            return out[0] if len(outs) == 1 else out
        return result.view(Traced) if isinstance(result, np.ndarray) else result

    def astype(self, dtype, *args, **kwargs):
        record("astype", _array(self), np.dtype(dtype).str)
        return np.asarray(self).astype(dtype, *args, **kwargs).view(Traced)

    def __getitem__(self, key):
        if _advanced(key):
            keys = key if isinstance(key, tuple) else (key,)
            record("getitem", _array(self), tuple(_array(k) if isinstance(k, np.ndarray) else type(k).__name__
                                                  for k in keys))
            key = tuple(_plain(k) for k in keys) if isinstance(key, tuple) else _plain(key)
        got = np.asarray(self)[key]
        return got.view(Traced) if isinstance(got, np.ndarray) else got

    def __setitem__(self, key, value):
        target = np.asarray(self)[_plain(key) if not isinstance(key, tuple) else tuple(_plain(k) for k in key)]
        record("setitem", _advanced(key), _array(target) if isinstance(target, np.ndarray) else "scalar",
               _array(value) if isinstance(value, np.ndarray) else type(value).__name__)
        np.asarray(self)[_plain(key) if not isinstance(key, tuple) else tuple(_plain(k) for k in key)] = _plain(value)

    def any(self, *args, **kwargs):
        record("any", _array(self), args, tuple(sorted(kwargs)))
        return np.asarray(self).any(*args, **kwargs)

    def get(self):
        return np.array(self)


def _traced(a):
    return np.asarray(a).view(Traced)


class TracingXP:
    """NumPy as the array module of a client, its results :class:`Traced` (the calls that launch no kernel, such as
    ``empty``, ``zeros`` and ``asarray`` of host data, are not recorded)."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def asarray(a, dtype=None):
        if isinstance(a, Traced):
            if dtype is not None and np.dtype(dtype) != a.dtype:
                return a.astype(dtype)
            return a
        return _traced(np.array(a, dtype=dtype))

    @staticmethod
    def empty(shape, dtype=float):
        return _traced(np.zeros(shape, dtype=dtype))

    zeros = empty

    @staticmethod
    def ones(shape, dtype=float):
        record("ones", np.dtype(dtype).str)
        return _traced(np.ones(shape, dtype=dtype))

    @staticmethod
    def arange(*args, dtype=None):
        record("arange", None if dtype is None else np.dtype(dtype).str)
        return _traced(np.arange(*args, dtype=dtype))

    @staticmethod
    def take(a, indices, axis=None):
        record("take", _array(a), _array(indices), axis)
        return _traced(np.take(np.asarray(a), np.asarray(indices), axis=axis))

    @staticmethod
    def where(cond, x, y):
        record("where", operands([cond, x, y]))
        return _traced(np.where(_plain(cond), _plain(x), _plain(y)))

    @staticmethod
    def concatenate(arrays, axis=0):
        record("concatenate", tuple(_array(a) for a in arrays), axis)
        return _traced(np.concatenate([np.asarray(a) for a in arrays], axis=axis))

    @staticmethod
    def cumsum(a, axis=None, dtype=None):
        record("cumsum", _array(a), axis, None if dtype is None else np.dtype(dtype).str)
        return _traced(np.cumsum(np.asarray(a), axis=axis, dtype=dtype))


# ---------------------------------------------------------------------------------------------- the CUDA kernels' twins


@pytest.fixture
def host_kernels(monkeypatch):
    """The client's CUDA kernels replaced by their host twins: the transform (the context's NTT, rows of the arena
    by slots), the PCG64 words (NumPy's own), the Lemire replay (its host reference) and the binomial replay (one
    value at a time)."""
    from caramel.backends.cuda import backend
    from caramel.backends.cuda import ntt as cuda_ntt

    def transform(inverse):
        def run(ctx, arena, ins, outs, primes):
            a = np.asarray(arena)
            for i, o, p in zip(np.asarray(ins), np.asarray(outs), np.asarray(primes)):
                a[o] = (ctx.intt if inverse else ctx.ntt)(a[i].copy(), int(p))
        return run

    monkeypatch.setattr(backend, "cuda_ring", lambda ctx: ctx)
    monkeypatch.setattr(cuda_ntt, "ntt", transform(False))
    monkeypatch.setattr(cuda_ntt, "intt", transform(True))
    drawn = {}

    def device_words(state, inc, count, cp=None, dtype=np.uint64):
        drawn["state"] = (state, inc)
        bg = np.random.PCG64()
        bg.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}
        return _traced(bg.random_raw(count).view(dtype))

    def lemire_kernel(name):
        def launch(grid, block, args):
            if name != "lemire_scatter":
                return
            raw, first, hf, p, k, width, n, counts, starts, limits, status, out = args
            k, n = int(k), int(n)
            st = PcgState(*drawn["state"], int(hf), int(first))
            qs = [int(q) for q in np.asarray(p)[k:2 * k]]
            got, flag = sampling.lemire_state_rows(qs, n, st, np)
            np.asarray(out)[...] = got
            np.asarray(status)[...] = flag
        return launch

    def rows_kernel(name):  # CLIENT_ROWS_SRC, each kernel as the host formula it replaces
        def plain(x):  # np.uint64(0) is a null pointer; other scalars are values
            return None if isinstance(x, np.uint64) else np.asarray(x) if isinstance(x, np.ndarray) else x

        def residue_rows(c, meta, plaintexts, n, out):  # row r of plaintext p = its coefficients mod q_r
            c = c.reshape(int(plaintexts), int(n))
            qs = meta[int(plaintexts) + 1:]
            for p in range(int(plaintexts)):
                for r in range(int(meta[p]), int(meta[p + 1])):
                    out.reshape(-1, int(n))[r] = np.mod(c[p], qs[r])

        def small_rows(c, q, n, out):
            out[...] = small_residues(c, q.reshape(-1, 1))

        def rlwe_c0_rows(ne, a, s, m, perm, f, q, n, out):
            q = q.reshape(-1, 1)
            m = m if perm is None else np.take(m, perm, axis=1)
            c = ne.astype(np.uint64) + q - mulmod(a, s, q)
            c += m if f is None else mulmod(m, f.reshape(-1, 1), q)
            out[...] = c % q

        def decrypt_rows(c0, c1, s, q, n, out):
            q = q.reshape(-1, 1)
            out[...] = (mulmod(c1, s, q) + c0) % q

        def mulmod_rows(a, b, bcol, q, n, out):
            out[...] = mulmod(a, b if bcol is None else bcol.reshape(-1, 1), q.reshape(-1, 1))

        def take_rows(src, idx, n, out):
            out[...] = src if idx is None else src[idx]

        twin = locals()[name]

        def launch(grid, block, args):
            twin(*(plain(a) for a in args))
        return launch

    def encode_kernels():  # ENCODE_SRC: the same IEEE operations, each rounded, on whole rows
        def gather(grid, block, args):
            parts, g, yr, yi, m = (np.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
            m = int(m)
            yr[...], yi[...] = parts[:, g[:m]], parts[:, g[m:]]

        def stage(grid, block, args):
            xr, xi, yr, yi, wr, wi, m, ns = (np.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
            m, ns = int(m), int(ns)
            j = np.arange(m // 2)
            k, o = j & (ns - 1), 2 * (j - (j & (ns - 1))) + (j & (ns - 1))
            ar, ai, br, bi = xr[:, j], xi[:, j], xr[:, j + m // 2], xi[:, j + m // 2]
            if ns > 1:
                c, d = wr[k], wi[k]
                br, bi = br * c - bi * d, br * d + bi * c
            yr[:, o], yi[:, o], yr[:, o + ns], yi[:, o + ns] = ar + br, ai + bi, ar - br, ai - bi

        def finish(grid, block, args):
            xr, xi, zr, zi, scales, x, out, over, m = (np.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
            m = int(m)
            u, v = np.rint((xr * zr - xi * zi) * scales), np.rint((xr * zi + xi * zr) * scales)
            x[:, :m], x[:, m:] = u, v
            fits = (np.abs(x) < 2.0**62).all(axis=1)
            out[fits] = x[fits]
            over[...] = ~fits
        return gather, stage, finish

    monkeypatch.setattr(pcg, "device_words", device_words)
    monkeypatch.setattr(sampling, "_lemire_kernel", lemire_kernel)
    monkeypatch.setattr(gpu_arith, "_rows_kernel", rows_kernel)
    monkeypatch.setattr(gpu_arith, "_encode_kernels", encode_kernels)

    def binomial_kernel():
        def launch(grid, block, args):  # BINOMIAL_SOURCE, one value at a time
            words, px, bound, m, out, flag = args
            words, px, bound, m = np.asarray(words), [float(v) for v in np.asarray(px)], int(bound), int(m)

            def inverse(word) -> int:
                u, x = float(int(word) >> 11) * (1.0 / 9007199254740992.0), 0
                for s in range(bound):
                    if not u > px[s]:
                        return x
                    x, u = x + 1, u - px[s]
                if u > px[bound]:
                    np.asarray(flag)[0] = 1
                return x
            np.asarray(out)[:] = [inverse(words[i]) - inverse(words[m + i]) for i in range(m)]
        return launch

    monkeypatch.setattr(sampling, "_binomial_kernel", binomial_kernel)


def client_calls(cuda_ntt: bool = True) -> set:
    """The array calls of the GPU client (on the tracing module; ``cuda_ntt``: on caramel's kernels, else on the
    array formulas): keys of every type, encryption and decryption of a ciphertext of one limb and of several, the
    secret's rows, the encoding of plaintexts (a row of Python ints among them). Checks every result against the
    host client's."""
    xp = TracingXP()
    dev = GpuArith(array_module=xp, cuda_ntt=cuda_ntt)
    ctx = context(N)
    secrets = Secrets.generate(N, 3)
    with recording() as calls:
        for kid in KEY_IDS:
            got = generate_evalkey(ctx, kid, secrets, 7, device=dev)
            want = generate_evalkey(ctx, kid, secrets, 7, device=HOST)
            assert np.array_equal(got.c0, want.c0) and np.array_equal(got.c1, want.c1), kid
        coeffs = np.random.default_rng(1).integers(-2**20, 2**20, N)
        for limbs in ((0,), (0, 1, 2)):
            ct = encrypt(ctx, secrets.s, coeffs, limbs, 5, device=dev)
            host = encrypt(ctx, secrets.s, coeffs, limbs, 5, device=HOST)
            assert np.array_equal(np.asarray(ct.c0), host.c0) and np.array_equal(np.asarray(ct.c1), host.c1)
            back = decrypt(ctx, secrets.s, ct, device=dev)
            assert np.array_equal(np.asarray(back), decrypt(ctx, secrets.s, host, device=HOST))
        dev.to_ntt_rows(coeffs, ctx, [2])
        parts = np.random.default_rng(2).uniform(-1, 1, (3, N))
        for scales in ([2.0**40, 2.0**30, 1.0], [2.0**40, 2.0**80, 1.0]):  # a row of Python ints in the second
            got = dev.encode_rows(parts, scales, N, xp.empty((3, N), dtype=np.int64))
            want = HOST.encode_rows(parts, scales, N, np.empty((3, N), dtype=np.int64))
            assert all(np.array_equal(np.asarray(g), w) and g.dtype == w.dtype for g, w in zip(got, want))
    return calls


def table_calls(kernels) -> set:
    xp = TracingXP()
    with recording() as calls:
        for k in kernels:
            k.launch(xp, N)
    return calls


def test_the_gpu_client_makes_no_array_call_at_the_ntt_sizes(host_kernels):
    """Keys, encryption, decryption and encoding on caramel's kernels: no kernel for CuPy to compile."""
    made = client_calls()
    assert not made, f"array calls of the GPU client: {sorted(map(str, made))}"


def test_the_tracer_sees_the_array_formulas(host_kernels):
    """The same steps on the array formulas make the calls that the tracer records (so an empty record above is the
    client's, not the tracer's)."""
    assert len(client_calls(cuda_ntt=False)) > 20


def test_rows_the_kernels_cannot_take_run_the_formulas(host_kernels):
    """Rows that are not C-contiguous (here column-major) take the array formulas, which the tracer sees; both
    ways give the host client's bits."""
    xp, ctx, limbs = TracingXP(), context(N), [0, 1, 2]
    dev, rng = GpuArith(array_module=xp), np.random.default_rng(3)
    q = np.array([ctx.q(l) for l in limbs], dtype=np.uint64)[:, None]
    a, s, m = (rng.integers(0, q, (len(limbs), N)).astype(np.uint32) for _ in range(3))
    e = rng.integers(-20, 21, N)
    want = HOST.rlwe_c0(ctx, limbs, a, s, e, m)
    for a_dev, kernels in ((_traced(a), True), (_traced(np.asfortranarray(a)), False)):
        with recording() as calls:
            got = dev.rlwe_c0(ctx, limbs, a_dev, _traced(s), _traced(e), _traced(m))
        assert np.array_equal(np.asarray(got), want) and (not calls) == kernels


def test_each_entry_makes_a_call():
    """No dead entry: every array kernel of the executor's helpers launches something."""
    for k in array_kernels.BACKEND_KERNELS:
        assert table_calls([k]), k.site


def test_the_tracer_tells_layouts_apart():
    """A column added to rows (two dimensions) is another kernel than rows added to rows (one, merged), than one row
    and a one-limb column (one dimension, the column broadcast), than a Python scalar's."""
    xp = TracingXP()
    rows, col = xp.asarray(np.zeros((2, 8), np.uint64)), xp.asarray(np.zeros((2, 1), np.uint64))
    one, col1 = xp.asarray(np.zeros((1, 8), np.uint64)), xp.asarray(np.zeros((1, 1), np.uint64))
    forms = []
    for a, b in ((rows, col), (rows, rows), (one, col1), (one, one), (rows, 3)):
        with recording() as calls:
            np.add(a, b)
        forms.append(calls)
    assert forms[1] == forms[3]  # contiguous rows merge into one dimension, however many
    assert len({frozenset(c) for c in forms}) == 4
    with recording() as calls:
        x = xp.asarray(np.zeros((2, 8), np.uint64))
        x += rows
    assert {c[0] for c in calls} == {"add"} and all(c[3] == 1 for c in calls)  # in place: out= given


def test_client_jobs_name_every_kernel_without_a_gpu():
    """The client's jobs at N = 2^16: the transform and twiddle modules (the executor's sources), the PCG64 and Lemire
    modules (the sources the client launches), the client's row formulas; nothing else."""
    from caramel.backends.cuda.config import KernelConfig
    from caramel.backends.cuda.ntt.transform import transform_source

    jobs = gpu_kernels.client_jobs(context(65536))
    modules = {j.key[0]: j for j in jobs if hasattr(j, "key")}
    assert len(modules) == len(jobs) and set(modules) == {"ntt", "twiddle", "pcg", "lemire", "client_rows", "binomial"}
    assert modules["client_rows"].candidates[0][:2] == (gpu_arith.CLIENT_ROWS_SRC, gpu_arith.CLIENT_ROWS_KERNELS)
    assert modules["ntt"].candidates[0][0] == transform_source(16, True, KernelConfig().ntt)
    assert modules["pcg"].candidates == ((pcg.SOURCE, ("pcg64_words",), pcg.OPTIONS),)
    assert modules["lemire"].candidates[0][1] == ("lemire_counts", "lemire_chain", "lemire_scatter")
    assert max(jobs, key=lambda j: j.weight) is modules["ntt"]  # started first
    assert {j.key[0] for j in gpu_kernels.client_jobs(context(1 << 11)) if hasattr(j, "key")} == {"pcg", "lemire", "binomial"}
    from caramel.ckks.encoding import ENCODE_KERNELS, ENCODE_SRC

    (encode,) = gpu_kernels.encoding_jobs()
    assert encode.candidates[0][:2] == (ENCODE_SRC, ENCODE_KERNELS)
