"""The plan engine: runs a :class:`~caramel.plan.Plan` kernel by kernel on a backend, K chips in
one process.

Per chip: buffers are mapped to arena rows (:func:`caramel.plan.assign_rows`), the input image's
limbs, the zero buffer and the scalar table are written, then the kernels run in plan order.
Communication goes through an in-process transport with the reference's mailbox semantics
(ISA.md section 6): ``dis`` posts a copy under its sync id, ``rcv`` copies it, ``joi`` adds every
contribution modulo q and hands the sum to the destination. A ``COMM`` kernel first does all its
sends, then waits for all its receives; chips run round-robin, each until it blocks, exactly as
the reference scheduler does (the plan's level order guarantees progress,
:mod:`caramel.plan.fusion`). The result is a :class:`~caramel.execute.reference.RunResult`
bit-identical to the reference's.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from caramel.backends import Backend
from caramel.errors import BindingError, DeadlockError, ExecutionError
from caramel.execute.reference import RunResult
from caramel.plan.plan import ChipPlan, Comm, Kernel, Kind, Plan, assign_rows
from caramel.program import Mem, Opcode
from caramel.ring import Context, Mode

_U64 = np.uint64
_I32 = np.int32


def _rows(rows_of: np.ndarray, ids) -> np.ndarray:
    return rows_of[np.asarray(ids, dtype=np.int64)].astype(_I32)


def lower_kernel(kernel: Kernel, rows_of: np.ndarray, ctx: Context, mode: Mode,
                 scalar_base: int = 0) -> Callable[[Backend], None]:
    """The backend call of a non-communication kernel, with its index arrays built once
    (``rows_of``: arena row of every buffer; ``scalar_base``: where the chip's scalar table starts
    in the backend's)."""
    rows = kernel.rows
    primes = np.array([r.prime for r in rows], dtype=_I32)
    kind = kernel.kind
    if kind is Kind.ELEMENTWISE:
        expr = kernel.expr
        ins = _rows(rows_of, [r.ins for r in rows]).reshape(len(rows), expr.n_vec)
        outs = _rows(rows_of, [r.outs for r in rows]).reshape(len(rows), len(expr.outputs))
        sca = np.array([r.scalars for r in rows], dtype=_I32).reshape(len(rows), expr.n_scalar) + scalar_base
        return lambda b: b.elementwise(expr, ins, outs, primes, sca)
    if kind is Kind.BASECONV:
        ins, outs = _rows(rows_of, [r.ins for r in rows]), _rows(rows_of, [r.outs for r in rows])
        return lambda b: b.base_convert(kernel.in_limbs, kernel.out_limbs, ins, outs, mode)
    if kind is Kind.RSV:
        ins, outs = _rows(rows_of, [r.ins for r in rows]), _rows(rows_of, [r.outs for r in rows])
        return lambda b: b.rsv(kernel.in_limbs, ins, outs, primes)
    if kind is Kind.MOD:
        ins, outs = _rows(rows_of, [r.ins for r in rows]), _rows(rows_of, [r.outs[0] for r in rows])
        return lambda b: b.mod(ins, outs, primes)
    ins, outs = _rows(rows_of, [r.ins[0] for r in rows]), _rows(rows_of, [r.outs[0] for r in rows])
    if kind is Kind.NTT:
        return lambda b: b.ntt(ins, outs, primes)
    if kind is Kind.INTT:
        return lambda b: b.intt(ins, outs, primes)
    if kind is Kind.AUTOMORPHISM:
        galois = np.array(kernel.galois(ctx), dtype=_I32)
        return lambda b: b.automorphism(ins, outs, galois)
    if kind is Kind.SUD_LIFT:
        src = np.array([r.arg for r in rows], dtype=_I32)
        return lambda b: b.sud_lift(ins, outs, src, primes, mode)
    raise ExecutionError(f"no backend call for kernel kind {kind.value}")


class Transport:
    """In-process mailboxes keyed by sync id (ISA.md section 6), shared by all chips."""

    def __init__(self, primes):
        self.q = [_U64(q) for q in primes]
        self.mail: dict[int, list] = {}  # sync -> [data, count]
        self.acc: dict[int, list] = {}  # sync -> [total or None, count]

    def send(self, c: Comm, data: np.ndarray | None) -> None:
        if c.op == Opcode.DIS:
            if c.sync in self.mail:
                raise ExecutionError(f"sync id {c.sync} is already in use")
            self.mail[c.sync] = [data, 1]
        else:  # joi contribution, in the reference's arithmetic
            entry = self.acc.setdefault(c.sync, [None, 0])
            if data is not None:
                x = data.astype(_U64)
                entry[0] = x if entry[0] is None else (entry[0] + x) % self.q[c.prime]
            entry[1] += 1

    def ready(self, c: Comm) -> bool:
        if c.op == Opcode.RCV:
            return c.sync in self.mail
        return c.dst < 0 or self.acc.get(c.sync, (None, 0))[1] >= c.size

    def receive(self, c: Comm, n: int) -> np.ndarray:
        if c.op == Opcode.RCV:
            box = self.mail[c.sync]
            box[1] += 1
            if box[1] >= c.size:
                del self.mail[c.sync]
            return box[0]
        total = self.acc.pop(c.sync)[0]
        return np.zeros(n, dtype=np.uint32) if total is None else total.astype(np.uint32)


def check_plan_memory(plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], limit: int = 20) -> None:
    """Raise :class:`BindingError` naming every input limb the plan reads that is missing,
    misshaped (vector limbs (N,), scalars () or (1,)) or out of range (residues below q_limb),
    like the reference's check of the input image."""
    vectors = {m for c in plan.chips for m in c.inputs}
    scalars = {s.mem for c in plan.chips for s in c.scalars if s.mem is not None}
    problems = []
    missing = sorted((vectors | scalars) - memory.keys(), key=str)
    if missing:
        more = f" and {len(missing) - limit} more" if len(missing) > limit else ""
        problems.append(f"{len(missing)} input limb(s) not provided: {', '.join(map(str, missing[:limit]))}{more}")
    for m in sorted((vectors | scalars) & memory.keys(), key=str):
        if len(problems) > limit:
            break
        a = np.asarray(memory[m])
        want = ((), (1,)) if m in scalars else ((ctx.n,),)
        if a.dtype.kind not in "ui" or a.shape not in want:
            problems.append(f"{m}: {a.dtype} array of shape {a.shape}, expected integers of shape {want[0]}")
        elif a.size and (int(a.min()) < 0 or int(a.max()) >= ctx.q(m.limb)):
            problems.append(f"{m}: residues must lie in [0, q_{m.limb} = {ctx.q(m.limb)})")
    if problems:
        raise BindingError("bad input memory image:\n  " + "\n  ".join(problems))


class ChipRun:
    """One chip's execution state: its backend, row map, lowered kernels and program counter."""

    def __init__(self, plan: ChipPlan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode, backend,
                 reuse: str = "lifo", keep_inputs: bool = False):
        """``reuse``, ``keep_inputs``: the row assignment of :func:`~caramel.plan.assign_rows`."""
        self.plan = plan
        self.rows_of, n_rows = assign_rows(plan, reuse=reuse, keep_inputs=keep_inputs)
        self.backend: Backend = backend(ctx, n_rows)
        if plan.inputs:
            data = np.stack([memory[m] for m in plan.inputs])
            self.backend.write(_rows(self.rows_of, list(plan.inputs.values())), data)
        if plan.zero_buffer >= 0:
            self.backend.write(_rows(self.rows_of, [plan.zero_buffer]), np.zeros((1, ctx.n), dtype=np.uint32))
        self.backend.set_scalars(np.array([s.value(ctx.primes, memory) for s in plan.scalars], dtype=np.uint32))
        self.calls = [None if k.kind is Kind.COMM else lower_kernel(k, self.rows_of, ctx, mode) for k in plan.kernels]
        self.n = ctx.n
        self.pc = 0
        self.sent = False

    @property
    def done(self) -> bool:
        return self.pc >= len(self.calls)

    def run(self, transport: Transport) -> bool:
        """Run until done or blocked on a receive; True if any kernel completed."""
        progressed = False
        kernels, calls, b = self.plan.kernels, self.calls, self.backend
        while self.pc < len(calls):
            call = calls[self.pc]
            if call is not None:
                call(b)
            else:
                comms = kernels[self.pc].comms
                if not self.sent:
                    for c in comms:
                        if c.op != Opcode.RCV:
                            transport.send(c, b.read(_rows(self.rows_of, [c.src]))[0] if c.src >= 0 else None)
                    self.sent = True
                if not all(transport.ready(c) for c in comms if c.dst >= 0):
                    return progressed
                for c in comms:
                    if c.dst >= 0:
                        b.write(_rows(self.rows_of, [c.dst]), transport.receive(c, self.n)[None])
                self.sent = False
            self.pc += 1
            progressed = True
        return progressed

    def stores(self) -> dict[Mem, np.ndarray]:
        """The chip's private store at the end: every stored or spilled memory name."""
        names = list(self.plan.stores)
        data = self.backend.read(_rows(self.rows_of, [self.plan.stores[m] for m in names])) if names else []
        return dict(zip(names, data))


def run_plan(
    plan: Plan,
    ctx: Context,
    memory: Mapping[Mem, np.ndarray],
    mode: Mode | str = Mode.EXACT,
    *,
    backend: Callable[[Context, int], Backend] | None = None,
) -> RunResult:
    """Run ``plan`` over the read-only input image ``memory`` (checked first,
    :func:`check_plan_memory`) in arithmetic ``mode``; ``backend`` builds one chip's backend from
    (ctx, arena rows) (default: the NumPy backend)."""
    if backend is None:
        from caramel.backends.numpy_backend import NumpyBackend as backend
    mode = Mode(mode)
    check_plan_memory(plan, ctx, memory)
    chips = [ChipRun(cp, ctx, memory, mode, backend) for cp in plan.chips]
    transport = Transport(ctx.primes)
    while not all(ch.done for ch in chips):
        progressed = False
        for ch in chips:
            progressed |= ch.run(transport)
        if not progressed:
            waits = [f"chip {ch.plan.chip} waits at kernel {ch.pc} (lines {ch.plan.kernels[ch.pc].lines[:4]})"
                     for ch in chips if not ch.done]
            raise DeadlockError("deadlock: every unfinished chip is blocked:\n  " + "\n  ".join(waits))
    if transport.mail:
        ids = ", ".join(str(i) for i in sorted(transport.mail)[:8])
        raise ExecutionError(f"run finished with undelivered dis messages (sync ids {ids})")
    return RunResult.from_stores([ch.stores() for ch in chips], memory, plan.instructions)
