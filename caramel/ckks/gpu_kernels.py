"""Every GPU kernel of the client, compiled before its first use, all at once (:func:`client_jobs`).

The GPU client (:class:`~caramel.ckks.arith.GpuArith`: keys, encoding, encryption, decryption) runs two kinds of
kernels:

* CUDA modules of caramel's own source, compiled through the source-keyed cache
  (:mod:`caramel.backends.cuda.compiler`): the transform and the ring's twiddle kernels (the executor's own, shared
  with it), NumPy's PCG64 words (:mod:`caramel.ckks.pcg`), the Lemire and binomial replays
  (:mod:`caramel.ckks.sampling`), and the plaintexts' encoding (:data:`caramel.ckks.encoding.ENCODE_SRC`,
  :func:`encoding_jobs`);
* the kernels CuPy generates for the array operations of the client's formulas (:mod:`caramel.ckks.arith.base`,
  :func:`~caramel.ckks.rns.mulmod`, :func:`~caramel.ckks.rns.to_residues`): :data:`ARRAY_KERNELS`,
  each the very call a formula makes, in the same form (a ufunc or an operator, the same operand types, a Python
  float where the formula has one), made once on small arrays of the same types and layout
  (:class:`~caramel.backends.cuda.array_kernels.ArrayKernel`).

Compiled one at a time as the client first meets them they took most of a first run's key generation; as jobs of
the compile pool they compile in parallel, at the GPU warm-up (:func:`caramel.ckks.device.warm_up`), while the
program loads. tests/ckks/test_gpu_kernels.py traces the formulas' array calls on the host and checks that
:data:`ARRAY_KERNELS` makes each of them.
"""

from __future__ import annotations

import numpy as np

from caramel.backends.cuda.array_kernels import ROWS, ArrayKernel, index, rows

_U64, _U32, _I64 = np.uint64, np.uint32, np.int64


def column(cp, k: int = ROWS, dtype=np.uint64):
    """A (k, 1) column of primes-like values, as :func:`caramel.ckks.rns.prime_column` makes it."""
    return cp.asarray(np.arange(7, 7 + k, dtype=dtype)[:, None])


def _transform_copy(cp, n: int) -> None:
    arena = cp.empty((2 * ROWS, n), dtype=_U32)
    arena[:ROWS] = rows(cp, n)


def _rlwe_c0_out(cp, n: int) -> None:
    out = cp.empty((ROWS, n), dtype=_U32)
    out[0:ROWS] = rows(cp, n, _U64)


def _in_place(op: str, dtype):
    def launch(cp, n: int) -> None:
        c = rows(cp, n, _U64)
        x = rows(cp, n, dtype)
        if op == "-":
            c -= x
        else:
            c += x
    return launch


def _residue_row(cp, n: int):
    return cp.asarray(np.zeros(n, dtype=_I64), dtype=_I64)[None, :]


#: The array kernels of the client's formulas (module docstring), each named by the call it makes.
ARRAY_KERNELS = (
    # small_residues (secret rows, the error of an RLWE sample): x = uint64(c) + q, then min(x, x - q) as uint32
    ArrayKernel("small_residues: c.astype(uint64)", lambda cp, n: cp.zeros(n, dtype=_I64).astype(_U64)),
    ArrayKernel("small_residues: c[None, :] + q", lambda cp, n: cp.zeros(n, dtype=_U64)[None, :] + column(cp)),
    ArrayKernel("small_residues: c[None, :] + q (one limb)",
                lambda cp, n: cp.zeros(n, dtype=_U64)[None, :] + column(cp, 1)),
    ArrayKernel("small_residues: x - q", lambda cp, n: rows(cp, n, _U64) - column(cp)),
    ArrayKernel("small_residues: x - q (one limb)", lambda cp, n: rows(cp, n, _U64, 1) - column(cp, 1)),
    ArrayKernel("small_residues: minimum(x, x - q)", lambda cp, n: cp.minimum(rows(cp, n, _U64), rows(cp, n, _U64))),
    ArrayKernel("astype(uint32) of uint64 rows", lambda cp, n: rows(cp, n, _U64).astype(_U32)),
    # GpuArith.transform: the rows copied into the transform's arena; its slots
    ArrayKernel("GpuArith.transform: arena[:k] = res", _transform_copy),
    ArrayKernel("GpuArith.transform: arange(int32)", lambda cp, n: cp.arange(2 * ROWS, dtype=np.int32)),
    # SecretRows.take
    ArrayKernel("SecretRows.take: rows[int64 limbs]", lambda cp, n: rows(cp, n, _U32, 3)[index(cp, [0, 2])]),
    ArrayKernel("SecretRows.take: rows[int64 limbs] (one limb)", lambda cp, n: rows(cp, n, _U32, 3)[index(cp, [2])]),
    # mulmod: multiply(a, b, dtype=uint64), then remainder(t, q, out=t)
    ArrayKernel("mulmod: multiply(uint32, uint32, dtype=uint64)",
                lambda cp, n: cp.multiply(rows(cp, n), rows(cp, n), dtype=_U64)),
    ArrayKernel("mulmod: multiply(uint32, uint64 column, dtype=uint64)",
                lambda cp, n: cp.multiply(rows(cp, n), column(cp), dtype=_U64)),
    ArrayKernel("mulmod: remainder(t, q, out=t)",
                lambda cp, n: (lambda t: cp.remainder(t, column(cp), out=t))(rows(cp, n, _U64))),
    ArrayKernel("mulmod: remainder(t, q, out=t) (one limb)",
                lambda cp, n: (lambda t: cp.remainder(t, column(cp, 1), out=t))(rows(cp, n, _U64, 1))),
    # rlwe_c0: c = NTT(e) + q - a s (+ f m) mod q, into uint32 rows
    ArrayKernel("rlwe_c0: take(m, perm, axis=1)",
                lambda cp, n: cp.take(rows(cp, n), index(cp, np.arange(n)), axis=1)),
    ArrayKernel("rlwe_c0: add(NTT(e), q, dtype=uint64)",
                lambda cp, n: cp.add(cp.empty((2 * ROWS, n), dtype=_U32)[ROWS:], column(cp), dtype=_U64)),
    ArrayKernel("rlwe_c0: add(NTT(e), q, dtype=uint64) (one limb)",
                lambda cp, n: cp.add(cp.empty((2, n), dtype=_U32)[1:], column(cp, 1), dtype=_U64)),
    ArrayKernel("rlwe_c0: c -= a s", _in_place("-", _U64)),
    ArrayKernel("rlwe_c0, decrypt_rows: c += m (uint32)", _in_place("+", _U32)),
    ArrayKernel("rlwe_c0: c += f m", _in_place("+", _U64)),
    ArrayKernel("rlwe_c0: out[r0:r1] = c (uint64 into uint32)", _rlwe_c0_out),
    # to_residues (encoding): mod(c, q) of int64 coefficients, as uint32
    ArrayKernel("to_residues: q.astype(int64)", lambda cp, n: column(cp).astype(_I64)),
    ArrayKernel("to_residues: mod(c[None, :], q)",
                lambda cp, n: cp.mod(_residue_row(cp, n), column(cp).astype(_I64))),
    ArrayKernel("to_residues: mod(c[None, :], q) (one limb)",
                lambda cp, n: cp.mod(_residue_row(cp, n), column(cp, 1).astype(_I64))),
    ArrayKernel("to_residues: astype(uint32) of int64 rows", lambda cp, n: rows(cp, n, _I64).astype(_U32)),
    # the uniform draw (lemire_state_rows): its status
    ArrayKernel("lemire_state_rows: ones(int64)", lambda cp, n: cp.ones(2, dtype=_I64)),
)


def client_modules(ctx) -> list:
    """The CUDA modules of the client at ring ``ctx`` (:class:`~caramel.backends.cuda.kernel_set.Module`): the
    transform, the twiddle kernels and the plaintexts' residues (for N = 2^12 .. 2^16, where the client transforms on
    caramel's kernels), the PCG64 words, the Lemire replay and the binomial replay (:data:`sampling.BINOMIAL_SOURCE`)."""
    from caramel.backends.cuda.compiler import NVRTC_OPTIONS
    from caramel.backends.cuda.kernel_set import KernelSet, Module
    from caramel.ckks import pcg, sampling
    from caramel.ckks.arith import CUDA_NTT_SIZES
    from caramel.ckks.arith.gpu import RESIDUE_ROWS_SRC

    found = []
    if ctx.n.bit_length() - 1 in CUDA_NTT_SIZES:
        ring = KernelSet(ctx).ring().modules
        found += [m for key, m in ring.items() if key[0] in ("ntt", "twiddle")]
        found.append(Module(("residue_rows",), ((RESIDUE_ROWS_SRC, ("residue_rows",), NVRTC_OPTIONS),)))
    found.append(Module(("pcg",), ((pcg.SOURCE, (pcg.KERNEL,), pcg.OPTIONS),)))
    found.append(Module(("lemire",), ((sampling.LEMIRE_SOURCE, sampling.LEMIRE_KERNELS, sampling.LEMIRE_OPTIONS),)))
    found.append(Module(("binomial",), ((sampling.BINOMIAL_SOURCE, (sampling.BINOMIAL_KERNEL,), NVRTC_OPTIONS),)))
    return found


def client_jobs(ctx) -> list:
    """Every kernel of the GPU client at ring ``ctx`` as jobs of the compile pool
    (:func:`caramel.backends.cuda.compiler.schedule`): :func:`client_modules` and :data:`ARRAY_KERNELS` at N."""
    return client_modules(ctx) + [k.at(ctx.n) for k in ARRAY_KERNELS]


def encoding_jobs() -> list:
    """The module of the plaintexts' encoding (:data:`caramel.ckks.encoding.ENCODE_SRC`), first needed once inputs
    are drawn, after the keys: the warm-up queues it behind the client's kernels and waits for it nowhere."""
    from caramel.backends.cuda.compiler import NVRTC_OPTIONS
    from caramel.backends.cuda.kernel_set import Module
    from caramel.ckks.encoding import ENCODE_KERNELS, ENCODE_SRC

    return [Module(("encode",), ((ENCODE_SRC, ENCODE_KERNELS, NVRTC_OPTIONS),))]


__all__ = ["ARRAY_KERNELS", "client_jobs", "client_modules", "column", "encoding_jobs"]
