"""The NumPy backend: the kernels of :class:`caramel.backends.Backend` on a host arena.

All arithmetic is the reference interpreter's (same :mod:`caramel.ring` functions, same 64-bit
formulas), so a plan run here is bit-identical to :func:`caramel.execute.reference.run_reference`.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from caramel.backends import Backend
from caramel.ring import Context, Mode
from caramel.ring.modular import ELEMENTWISE

_U64 = np.uint64


class NumpyBackend(Backend):
    """A (rows, N) uint32 arena and the kernels over it."""

    def __init__(self, ctx: Context, rows: int):
        self.ctx = ctx
        self.arena = np.zeros((max(rows, 1), ctx.n), dtype=np.uint32)
        self._q = np.array(ctx.primes, dtype=_U64)
        self._scalars = np.zeros(0, dtype=_U64)

    def write(self, rows, data) -> None:
        self.arena[rows] = data

    def read(self, rows) -> np.ndarray:
        return self.arena[rows].copy()

    def set_scalars(self, values) -> None:
        """The scalar table; rewritten in place when its size is unchanged (as the CUDA backend's)."""
        values = np.asarray(values, dtype=_U64)
        if getattr(self, "_scalars", None) is not None and self._scalars.shape == values.shape:
            self._scalars[...] = values
        else:
            self._scalars = values

    def elementwise(self, expr, ins, outs, primes, scalars, galois=None) -> None:
        q = self._q[primes][:, None]
        vals = [self.arena[ins[:, k]].astype(_U64) for k in range(expr.n_vec)]
        for m, k in enumerate(getattr(expr, "gathered", ())):  # read through the automorphism (the reference's)
            for g in np.unique(galois[:, m]):
                sel = galois[:, m] == g
                vals[k][sel] = self.ctx.automorphism(self.arena[ins[sel, k]], int(g))
        vals += [self._scalars[scalars[:, k]][:, None] for k in range(expr.n_scalar)]
        for o in expr.ops:
            f = ELEMENTWISE.get(o.op)
            if f is None:
                raise ValueError(f"unknown elementwise operation {o.op!r}")
            vals.append(f(q, *(vals[i] for i in o.args)))
        for k, v in enumerate(expr.outputs):
            self.arena[outs[:, k]] = vals[v]

    def ntt(self, ins, outs, primes, half: bool = False) -> None:
        """The whole transform, ``half`` or not (a transformed operand then reads the NTT's output as is)."""
        self.arena[outs] = self.ctx.ntt(self.arena[ins], [int(p) for p in primes])

    def ntt_prologue(self, prologue, ins, outs, primes, args, mode, half: bool = False) -> None:
        """The prologue's limbs computed by the kernels below (same functions, same bits), then
        :meth:`ntt`: no arena row holds them."""
        self.arena[outs] = self.ctx.ntt(prologue_limbs(self.ctx, self.arena, prologue, ins, primes, args, mode),
                                        [int(p) for p in primes])

    def intt(self, ins, outs, primes) -> None:
        self.arena[outs] = self.ctx.intt(self.arena[ins], [int(p) for p in primes])

    def automorphism(self, ins, outs, galois) -> None:
        for g in np.unique(galois):
            sel = galois == g
            self.arena[outs[sel]] = self.ctx.automorphism(self.arena[ins[sel]], int(g))

    def base_convert(self, in_limbs, out_limbs, ins, outs, mode) -> None:
        # Every conversion is per coefficient: B inputs side by side are one input of B*N columns.
        b, n = ins.shape[0], self.ctx.n
        x = self.arena[ins.T].reshape(len(in_limbs), b * n)
        y = self.ctx.base_converter(in_limbs, out_limbs).convert(x, Mode(mode))
        self.arena[outs.T] = y.reshape(len(out_limbs), b, n)

    def sud_lift(self, ins, outs, src_primes, dst_primes, mode) -> None:
        pairs = np.stack([src_primes, dst_primes], axis=1)
        for t, l in np.unique(pairs, axis=0):
            sel = (src_primes == t) & (dst_primes == l)
            self.arena[outs[sel]] = self.ctx.sud_lift(self.arena[ins[sel]], int(t), int(l), mode)

    def rsv(self, basis, ins, outs, primes) -> None:
        for r in range(ins.shape[0]):
            words = self.arena[ins[r, :-1]]
            self.arena[outs[r]] = self.ctx.rsv_accumulate(words, self.arena[ins[r, -1]], basis, int(primes[r]))

    def mod(self, ins, outs, primes) -> None:
        for r in range(ins.shape[0]):
            self.arena[outs[r]] = self.ctx.mod_reduce(self.arena[ins[r]], int(primes[r]))


def _lift_rows(ctx: Context, arena, prologue, ins, primes, args, mode) -> np.ndarray:
    y = np.empty((len(primes), ctx.n), dtype=np.uint32)
    for r in range(len(primes)):
        y[r] = ctx.sud_lift(arena[ins[r, 0]], int(args[r]), int(primes[r]), mode)
    return y


def _mod_rows(ctx: Context, arena, prologue, ins, primes, args, mode) -> np.ndarray:
    return np.stack([ctx.mod_reduce(arena[ins[r]], int(primes[r])) for r in range(len(primes))])


def _conv_rows(ctx: Context, arena, prologue, ins, primes, args, mode) -> np.ndarray:
    # Rows with the same inputs are outputs of one conversion: convert once to all their primes.
    y = np.empty((len(primes), ctx.n), dtype=np.uint32)
    groups: dict[tuple, list[int]] = {}
    for r in range(len(primes)):
        groups.setdefault(tuple(int(b) for b in ins[r]), []).append(r)
    for rows_in, members in groups.items():
        out = [int(primes[r]) for r in members]
        conv = ctx.base_converter(prologue.in_limbs, out)
        y[members] = conv.convert(arena[list(rows_in)], Mode(mode))
    return y


#: The prologue of a fused NTT by producer kind (its value, ``Kind.value``): (ctx, arena,
#: prologue, ins, primes, args, mode) -> the (R, N) limbs the NTT transforms.
PROLOGUES = MappingProxyType({"sud_lift": _lift_rows, "mod": _mod_rows, "baseconv": _conv_rows})


def prologue_limbs(ctx: Context, arena, prologue, ins, primes, args, mode) -> np.ndarray:
    """The limbs an NTT's prologue computes (see :meth:`Backend.ntt_prologue`), uint32 (R, N)."""
    f = PROLOGUES.get(prologue.kind.value)
    if f is None:
        raise ValueError(f"no NTT prologue for kind {prologue.kind.value!r}")
    return f(ctx, arena, prologue, np.asarray(ins).reshape(len(primes), prologue.width), primes, args, mode)
