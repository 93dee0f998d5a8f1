"""The CUDA modules that a sequence of backend calls needs, found without a GPU.

:class:`KernelSet` is a :class:`~caramel.backends.Backend` whose kernel methods launch nothing: each records the
modules that :class:`~caramel.backends.cuda.backend.CupyBackend` would compile for the same call (through the same
source functions, so the texts are the launch's own). Run a plan's calls on one (the lowered closures of
:mod:`caramel.execute.runner` take any backend) and :attr:`KernelSet.modules` lists every module the run will load;
:meth:`Module.compile` compiles one on the current device, :func:`caramel.backends.cuda.compiler.compile_sources`
many at once.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import NamedTuple

import numpy as np

from caramel.backends import Backend
from caramel.backends.cuda import automorphism, basis, crt, elementwise
from caramel.backends.cuda.compiler import NVRTC_OPTIONS, function
from caramel.backends.cuda.config import KernelConfig
from caramel.backends.cuda.context import COMMON_SRC, TWIDDLE_SRC
from caramel.backends.cuda.ntt.common import ring_lazy
from caramel.backends.cuda.ntt.epilogue import epilogue_weight
from caramel.backends.cuda.ntt.prologue import PROLOGUE_CODES, prologue_kernel
from caramel.backends.cuda.ntt.transform import kernel_names, transform_source
from caramel.backends.cuda.target import CUDA_TARGET
from caramel.backends.cuda.transfer import GATHER_SRC

#: Multiprocessors of the device assumed without one (an H200's): the tensor-core conversion's build depends on it.
MULTIPROCESSORS = 132
#: Relative compile times of the module families (1 for the others; an epilogue's is its own,
#: :func:`~caramel.backends.cuda.ntt.epilogue.epilogue_weight`), the order in which a batch starts them
#: (:func:`caramel.backends.cuda.compiler.schedule`): the transform module is by far the longest to compile, several
#: times any other family's module.
COMPILE_WEIGHTS = MappingProxyType({"ntt": 8.0, "basis": 3.0, "automorphism": 2.0, "crt": 1.5})


class Module(NamedTuple):
    """A module a run loads: ``key`` says what it is (its family first: ``("ntt", N, lazy)``,
    ``("elementwise", expr)``, ...); ``candidates`` are (source, kernel names, options) in the order the launch
    tries them: the first that compiles without local memory is taken (an epilogue's launch bounds), else the last.
    Every other module has one candidate. ``weight``: its relative compile time, the order in which a batch starts it
    (:data:`COMPILE_WEIGHTS`, or an epilogue's own)."""

    key: tuple
    candidates: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]
    weight: float = 1.0

    def compile(self) -> None:
        """Compile and load the module on the current device (the candidates in turn, as the launch takes them)."""
        for code, names, options in self.candidates:
            if not any(function(code, name, options).local_size_bytes for name in names):
                break

    __call__ = compile  # a job of caramel.backends.cuda.compiler.schedule


class KernelSet(Backend):
    """The modules that backend calls at ``ctx`` (N and primes) under ``kernels`` need (:attr:`modules`, in the
    order first asked), on a device of ``multiprocessors`` multiprocessors."""

    target = CUDA_TARGET

    def __init__(self, ctx, kernels: KernelConfig | None = None, multiprocessors: int = MULTIPROCESSORS):
        self.ctx, self.kernels, self.multiprocessors = ctx, kernels or KernelConfig(), multiprocessors
        self.n, self.logn, self.lazy = ctx.n, ctx.n.bit_length() - 1, ring_lazy(ctx)
        self.modules: dict[tuple, Module] = {}
        self._add(("twiddle",), COMMON_SRC + TWIDDLE_SRC, ("twiddle_psi", "twiddle_fill"))  # every ring's tables
        self._add(("gather",), GATHER_SRC, ("gather_rows",), ())  # the upload of rows already on the device

    def _add(self, key: tuple, code: str, names: tuple[str, ...], options: tuple[str, ...] = NVRTC_OPTIONS) -> None:
        module = self.modules.get(key)
        if module is None:
            self.modules[key] = Module(key, ((code, names, options),), COMPILE_WEIGHTS.get(key[0], 1.0))
        elif not set(names) <= set(module.candidates[0][1]):
            code, known, options = module.candidates[0]
            self.modules[key] = module._replace(candidates=((code, tuple(sorted(set(known) | set(names))), options),))

    def _transform(self) -> None:
        self._add(("ntt", self.n, self.lazy), transform_source(self.logn, self.lazy, self.kernels.ntt),
                  kernel_names(self.logn))

    # ------------------------------------------------------------------ the Backend interface

    def write(self, rows, data) -> None:
        pass

    def read(self, rows) -> np.ndarray:
        return np.zeros((len(rows), self.n), dtype=np.uint32)

    def set_scalars(self, values) -> None:
        pass

    def elementwise(self, expr, ins, outs, primes, scalars, galois=None) -> None:
        name = (elementwise.kernel_name(expr),)
        if expr.transformed and self.logn > 12:
            key = ("epilogue", self.n, self.lazy, expr)
            if key not in self.modules:
                config = self.kernels.epilogue
                sources = elementwise.epilogue_sources(expr, self.logn, self.lazy, config)
                weight = epilogue_weight(len(expr.transformed), expr.n_vec, len(expr.outputs), config)
                self.modules[key] = Module(key, tuple((code, name, NVRTC_OPTIONS) for _, code in sources), weight)
            return
        self._add(("elementwise", expr), elementwise.plain_source(expr, self.kernels.elementwise.threads), name)

    def ntt(self, ins, outs, primes, half: bool = False) -> None:
        self._transform()

    def intt(self, ins, outs, primes) -> None:
        self._transform()

    def _prologue(self, kind: str, code: int) -> None:
        source, name = prologue_kernel(self.logn, kind, code, self.lazy)
        self._add(("prologue", self.n, self.lazy, PROLOGUE_CODES[kind], code), source, (name,))

    def ring(self, modes=()) -> "KernelSet":
        """Add the modules known before any plan (returns this set): those every run at this ring loads (the
        twiddle kernels, the row upload, the transform, which the GPU client uses too) and the plan-independent
        families that a program may use: per arithmetic mode of ``modes`` the NTT's three prologues, the ``sud``
        lift's module, the CRT kernels and the automorphism. (A plan's elementwise programs, epilogues and base
        conversions depend on its kernels.)"""
        self._transform()
        for mode in modes:
            for kind in PROLOGUE_CODES:
                self._prologue(kind, basis.mode_code(mode))
        self.sud_lift(None, None, None, None, None)
        self.rsv((0,), None, None, None)
        self.automorphism(None, None, None)
        return self

    def ntt_prologue(self, prologue, ins, outs, primes, args, mode, half: bool = False) -> None:
        self._prologue(prologue.kind.value, basis.mode_code(mode))
        if self.logn > 12 and not half:
            self._transform()  # its row kernel

    def automorphism(self, ins, outs, galois) -> None:
        self._add(("automorphism",), automorphism.source(), ("automorphism",))

    def base_convert(self, in_limbs, out_limbs, ins, outs, mode) -> None:
        tensor = basis.tensor_fits(self.n, len(out_limbs))
        code, name = basis.conversion_kernel(self.n, len(in_limbs), len(ins), basis.mode_code(mode), tensor,
                                             self.multiprocessors)
        self._add(("basis", tensor, code), code, (name,))

    def sud_lift(self, ins, outs, src_primes, dst_primes, mode) -> None:
        self._add(("basis", False, basis.source()), basis.source(), ("sud_lift",))

    def rsv(self, basis_limbs, ins, outs, primes) -> None:
        self._add(("crt",), crt.source(), (f"rsv_{len(basis_limbs)}",))

    def mod(self, ins, outs, primes) -> None:
        self._add(("crt",), crt.source(), (f"mod_{np.asarray(ins).shape[1]}",))


__all__ = ["COMPILE_WEIGHTS", "KernelSet", "Module", "MULTIPROCESSORS"]
