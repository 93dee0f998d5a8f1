"""caramel.backends: the kernel interface that every execution backend implements.

A backend owns an *arena*: S rows of N uint32 residues (one limb per row). Every kernel takes
int32 NumPy arrays of row indices and per-row prime indices (indices into the context's prime
list) and runs all rows as one launch; rows of one call are independent, and an output row
never equals an input row of another row of the same call. Inputs must be written before they
are read; results are canonical residues. The same calls, with the same arrays, drive the NumPy
reference backend (:mod:`caramel.backends.numpy_backend`) and a device backend (the CUDA kernels
of :mod:`caramel.backends.cuda` take exactly these arrays). This package does not import CuPy.

Expressions (``elementwise``) are :class:`caramel.expr.Expr` values. Each backend publishes a
:class:`caramel.target.Target` (:attr:`Backend.target`): what the planner may know of its device.

On CUDA each method is one call of :mod:`caramel.backends.cuda` with the same arrays uploaded
as int32: ``ntt_prologue`` -> ``ntt.ntt_prologue``, ``elementwise`` -> ``elementwise.fused``,
``ntt``/``intt`` -> ``ntt.ntt``/``ntt.intt``, ``automorphism`` ->
``automorphism.automorphism``, ``base_convert`` -> ``BaseConversion(in, out).convert``,
``sud_lift`` -> ``basis.sud_lift``, ``rsv`` -> a copy of the words then ``CrtBasis.rsv`` (which
accumulates in place), ``mod`` -> ``crt.mod``. ``tests/plan/test_cuda_plan.py`` holds such an
adapter and checks plans on it against the reference.
"""

from __future__ import annotations

import abc

import numpy as np

from caramel.target import NEUTRAL, Target


class Backend(abc.ABC):
    """One device's arena and kernels. Index arguments are int32 arrays: ``ins``/``outs`` hold
    arena rows, ``primes`` prime indices; shapes are given per method (R = number of rows)."""

    #: The context (ring degree N and primes) the backend computes in.
    ctx: object
    #: What the planner may know of the device (:mod:`caramel.target`).
    target: Target = NEUTRAL

    @abc.abstractmethod
    def write(self, rows: np.ndarray, data: np.ndarray) -> None:
        """arena[rows[r]] = data[r] for host data of shape (R, N), or a list of R rows of N (integer
        residues below their prime, converted to the arena type)."""

    @abc.abstractmethod
    def read(self, rows: np.ndarray) -> np.ndarray:
        """Host copy of arena[rows], shape (R, N), uint32."""

    @abc.abstractmethod
    def set_scalars(self, values: np.ndarray) -> None:
        """The scalar table read by ``elementwise`` (uint32, each canonical for the primes of
        the rows that use it)."""

    @abc.abstractmethod
    def elementwise(self, expr, ins: np.ndarray, outs: np.ndarray, primes: np.ndarray, scalars: np.ndarray,
                    galois: np.ndarray | None = None) -> None:
        """Evaluate ``expr`` per residue: ins (R, n_vec) rows, scalars (R, n_scalar) indices into
        the scalar table, outs (R, len(outputs)) rows, primes (R,). When ``expr.gathered`` is not
        empty (an automorphism in the load), galois (R, len(gathered)) holds Galois elements and
        operand gathered[m] of row r is arena[ins[r, k]] under X -> X^galois[r, m] (as
        :meth:`automorphism` would write it); such an input row is never an output row of the call.
        A transformed operand (``expr.transformed``) was written by a half NTT (:meth:`ntt`): its value is
        that NTT's output, however the backend split the transform."""

    @abc.abstractmethod
    def ntt(self, ins: np.ndarray, outs: np.ndarray, primes: np.ndarray, half: bool = False) -> None:
        """arena[outs[r]] = NTT_{q_primes[r]}(arena[ins[r]]); ins, outs, primes (R,). ``half``: only
        transformed operands of :meth:`elementwise` read the outputs (``Kernel.half``), so a backend may
        leave there what the rest of the transform, run in their loads, needs."""

    @abc.abstractmethod
    def ntt_prologue(self, prologue, ins: np.ndarray, outs: np.ndarray, primes: np.ndarray, args: np.ndarray,
                     mode, half: bool = False) -> None:
        """Forward NTT whose load computes its input (fusion across NTT boundaries, a
        :class:`caramel.plan.kernel.Prologue`): arena[outs[r]] = NTT_{q_primes[r]}(y_r), y_r being
        ``prologue.kind``'s result from rows ins (R, prologue.width): SUD_LIFT the lift of ins[r, 0]
        from prime args[r] to primes[r] in ``mode`` (:meth:`sud_lift`); MOD the words ins[r] mod
        q_primes[r] (:meth:`mod`); BASECONV the conversion of ins[r] (limbs ``prologue.in_limbs``)
        to limb primes[r] in ``mode`` (:meth:`base_convert`). args is zero for MOD and BASECONV. ``half``
        as for :meth:`ntt`."""

    @abc.abstractmethod
    def intt(self, ins: np.ndarray, outs: np.ndarray, primes: np.ndarray) -> None:
        """arena[outs[r]] = INTT_{q_primes[r]}(arena[ins[r]]); ins, outs, primes (R,)."""

    @abc.abstractmethod
    def automorphism(self, ins: np.ndarray, outs: np.ndarray, galois: np.ndarray) -> None:
        """arena[outs[r]] = arena[ins[r]] under X -> X^galois[r], in NTT form; (R,) each."""

    @abc.abstractmethod
    def base_convert(self, in_limbs, out_limbs, ins: np.ndarray, outs: np.ndarray, mode) -> None:
        """B conversions from limbs ``in_limbs`` to ``out_limbs`` (tuples of limb indices) in
        arithmetic ``mode``: ins (B, len(in_limbs)) rows in in_limbs order, outs (B, len(out_limbs))."""

    @abc.abstractmethod
    def sud_lift(self, ins: np.ndarray, outs: np.ndarray, src_primes: np.ndarray, dst_primes: np.ndarray, mode) -> None:
        """Register-form ``sud`` lift of arena[ins[r]] from q_src to q_dst (coefficient form)."""

    @abc.abstractmethod
    def rsv(self, basis, ins: np.ndarray, outs: np.ndarray, primes: np.ndarray) -> None:
        """``rsv`` on G accumulators of m = len(basis) words: ins (G, m + 1) rows (the words, then
        rs), outs (G, m) rows of the new words, primes (G,) the limb of each rs."""

    @abc.abstractmethod
    def mod(self, ins: np.ndarray, outs: np.ndarray, primes: np.ndarray) -> None:
        """``mod``: arena[outs[r]] = X_r mod q_primes[r]; ins (R, m) words, outs (R,)."""


__all__ = ["Backend"]
