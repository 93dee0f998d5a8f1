"""Kernel launches with programmatic dependent launch (caramel.backends.cuda.launch), on the CPU: the
entry statement in every kernel of every plan module, the kernel arguments' C values, and a plain
launch when PDL is off. (The GPU test modules run every kernel through the PDL launch.)"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from caramel.backends.cuda import automorphism, basis, crt, elementwise, launch, ntt


def _plan_sources() -> list[str]:
    return ([ntt._source(16), ntt._source(12), automorphism._source(), basis._source(), basis._tc_source(2, 1, 4),
             crt._source(), elementwise.ADD.source(), elementwise.MUL_SCALAR.source()]
            + [ntt._prologue_source(16, pk, pm, True) for pk in (0, 1, 2) for pm in (0, 1, 2)])


@pytest.mark.parametrize("source", _plan_sources(), ids=lambda s: s.split("(")[0][-24:])
def test_every_kernel_starts_with_the_entry(source):
    out = launch.with_entry(source)
    kernels = source.count('extern "C" __global__')
    assert kernels and out.count("CARAMEL_KERNEL_ENTRY();") == kernels
    for head in out.split('extern "C" __global__')[1:]:  # the first statement after the brace
        assert head.split("{", 1)[1].lstrip().startswith("CARAMEL_KERNEL_ENTRY();")
    assert launch.with_entry("__device__ int f() { return 1; }") == "__device__ int f() { return 1; }"


def test_a_kernel_without_its_brace_is_refused():
    with pytest.raises(ValueError):
        launch.with_entry('extern "C" __global__ void k(int a);')


def test_arguments_are_pointers_and_c_scalars():
    class Device:  # what a CuPy array offers: .data.ptr
        class data:
            ptr = 0x7F0000001000

    assert launch.argument(Device()).value == 0x7F0000001000
    for value, ctype in ((np.int32(-3), ctypes.c_int32), (np.uint32(2**32 - 1), ctypes.c_uint32),
                         (np.int64(-2**40), ctypes.c_int64), (np.float64(0.25), ctypes.c_double)):
        c = launch.argument(value)
        assert type(c) is ctype and c.value == value.item()
    for bad in (3, 0.5, np.int8(1), "x"):
        with pytest.raises(TypeError):
            launch.argument(bad)


def test_plain_launch_when_pdl_is_off(monkeypatch):
    calls = []

    class Fn:
        max_dynamic_shared_size_bytes = 0

        def __call__(self, grid, block, args, shared_mem=0):
            calls.append((grid, block, args, shared_mem))

    monkeypatch.setattr(launch, "ENABLED", False)
    k = launch.Kernel(Fn())
    k.max_dynamic_shared_size_bytes = 4096  # attributes are the function's
    assert k.fn.max_dynamic_shared_size_bytes == 4096 == k.max_dynamic_shared_size_bytes
    k((2,), (32,), (np.int32(1),), shared_mem=128)
    assert calls == [((2,), (32,), (np.int32(1),), 128)]


def test_dependent_kernels_in_a_graph_on_the_gpu():
    """On a GPU: a chain in which each kernel reads what the one before wrote (NTT, INTT in place,
    elementwise products, 24 launches), captured into one CUDA graph and replayed, equals the
    reference; with PDL each launch may start while the one before drains, so a missing wait would
    show here."""
    cp = pytest.importorskip("cupy")
    from caramel.backends.cuda import CudaRing, available

    if not available():
        pytest.skip("no CUDA device")
    from caramel.ring import Context

    ctx = Context(n=65536)
    ring = CudaRing(ctx)
    rng = np.random.default_rng(11)
    limbs = [0, 17, 40, 63]
    x = np.stack([rng.integers(0, ctx.q(l), ctx.n, dtype=np.uint64) for l in limbs]).astype(np.uint32)
    arena = cp.asarray(np.concatenate([x, x]))
    rows, primes = cp.arange(4, dtype=cp.int32), cp.asarray(np.array(limbs, dtype=np.int32))
    prod_ins = cp.asarray(np.stack([np.arange(4), np.arange(4, 8)], axis=1).astype(np.int32))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(8):  # x <- intt(ntt(x) * y) with y = x's first value, in place
            ntt.ntt(ring, arena, rows, rows, primes)
            elementwise.fused(ring, elementwise.MUL, arena, rows[:, None].copy(), prod_ins, primes)
            ntt.intt(ring, arena, rows, rows, primes)
        graph = stream.end_capture()
    graph.launch(stream)
    stream.synchronize()
    want, y = x.copy(), x.copy()
    for _ in range(8):
        f = ctx.ntt(want, limbs).astype(np.uint64) * y.astype(np.uint64)
        want = ctx.intt((f % np.array([ctx.q(l) for l in limbs], dtype=np.uint64)[:, None]).astype(np.uint32), limbs)
    assert np.array_equal(cp.asnumpy(arena[:4]), want)
