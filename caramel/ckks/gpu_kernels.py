"""Every GPU kernel of the client, compiled before its first use, all at once (:func:`client_jobs`).

The GPU client (:class:`~caramel.ckks.arith.GpuArith`: keys, encoding, encryption, decryption) runs CUDA modules of
caramel's own source only, compiled through the source-keyed cache (:mod:`caramel.backends.cuda.compiler`): the
transform and the ring's twiddle kernels (the executor's own, shared with it), the client's row formulas
(:data:`caramel.ckks.arith.gpu.CLIENT_ROWS_SRC`), NumPy's PCG64 words (:mod:`caramel.ckks.pcg`), the Lemire and
binomial replays (:mod:`caramel.ckks.sampling`), and the plaintexts' encoding (:data:`caramel.ckks.encoding.ENCODE_SRC`,
:func:`encoding_jobs`). At N = 2^12 .. 2^16 it makes no array operation that CuPy would compile a kernel for (each
would be one more NVRTC compile of CuPy's headers in a first run: tests/ckks/test_gpu_kernels.py traces the client's
array calls on the host and finds none); other N run the formulas' array operations, compiled by CuPy on first use.

As jobs of the compile pool the modules compile in parallel, at the GPU warm-up (:func:`caramel.ckks.device.warm_up`),
while the program loads.
"""

from __future__ import annotations


def client_modules(ctx) -> list:
    """The CUDA modules of the client at ring ``ctx`` (:class:`~caramel.backends.cuda.kernel_set.Module`): the
    transform, the twiddle kernels and the row formulas (for N = 2^12 .. 2^16, where the client transforms on
    caramel's kernels), the PCG64 words, the Lemire replay and the binomial replay (:data:`sampling.BINOMIAL_SOURCE`)."""
    from caramel.backends.cuda.compiler import NVRTC_OPTIONS
    from caramel.backends.cuda.kernel_set import KernelSet, Module
    from caramel.ckks import pcg, sampling
    from caramel.ckks.arith import CUDA_NTT_SIZES
    from caramel.ckks.arith.gpu import CLIENT_ROWS_KERNELS, CLIENT_ROWS_SRC

    found = []
    if ctx.n.bit_length() - 1 in CUDA_NTT_SIZES:
        ring = KernelSet(ctx).ring().modules
        found += [m for key, m in ring.items() if key[0] in ("ntt", "twiddle")]
        found.append(Module(("client_rows",), ((CLIENT_ROWS_SRC, CLIENT_ROWS_KERNELS, NVRTC_OPTIONS),)))
    found.append(Module(("pcg",), ((pcg.SOURCE, (pcg.KERNEL,), pcg.OPTIONS),)))
    found.append(Module(("lemire",), ((sampling.LEMIRE_SOURCE, sampling.LEMIRE_KERNELS, sampling.LEMIRE_OPTIONS),)))
    found.append(Module(("binomial",), ((sampling.BINOMIAL_SOURCE, (sampling.BINOMIAL_KERNEL,), NVRTC_OPTIONS),)))
    return found


def client_jobs(ctx) -> list:
    """Every kernel of the GPU client at ring ``ctx`` as jobs of the compile pool
    (:func:`caramel.backends.cuda.compiler.schedule`): :func:`client_modules`."""
    return client_modules(ctx)


def encoding_jobs() -> list:
    """The module of the plaintexts' encoding (:data:`caramel.ckks.encoding.ENCODE_SRC`), first needed once inputs
    are drawn, after the keys: the warm-up queues it behind the client's kernels and waits for it nowhere."""
    from caramel.backends.cuda.compiler import NVRTC_OPTIONS
    from caramel.backends.cuda.kernel_set import Module
    from caramel.ckks.encoding import ENCODE_KERNELS, ENCODE_SRC

    return [Module(("encode",), ((ENCODE_SRC, ENCODE_KERNELS, NVRTC_OPTIONS),))]


__all__ = ["client_jobs", "client_modules", "encoding_jobs"]
