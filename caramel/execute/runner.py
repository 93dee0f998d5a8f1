"""The chip runner: a device's program lowered to backend calls, for every backend and driver.

:class:`DeviceRun` takes one device's :class:`~caramel.execute.placement.DeviceProgram` (the chips
it hosts, merged by level, with their communication steps), writes the inputs, zero rows and
scalar table into the backend's arena and lowers every kernel to one backend call
(:func:`lower_kernel`) and every communication step to local sums, copies through staging rows
(only for calls whose rows are not laid out contiguously), ONE fabric group call and ``% q``. The same
object runs in order on one stream (:meth:`run`), task by task for several streams (:meth:`schedule`,
:meth:`run_task`, :mod:`caramel.plan.streams`) or captured into a CUDA graph; the drivers (``drive``,
``cuda_graph``, ``distributed``) decide how many devices and which fabric. :func:`step_task`,
:func:`schedule_tasks` and :func:`comm_work` give the same tasks, schedule and communication without a
backend (:mod:`caramel.timeline`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from caramel.backends import Backend
from caramel.errors import ExecutionError
from caramel.execute.fabric import Fabric, RowOp
from caramel.execute.placement import (
    CommStep, DeviceOp, DeviceProgram, LocalSum, ModRows, bucket_sides, in_place, pack,
)
from caramel.plan.cost import comm_cost, task_cost
from caramel.plan.kernel import Expr, ExprOp, Kernel, Kind, Plan
from caramel.plan.streams import StreamSchedule, Task, assign_streams, check_schedule
from caramel.program import Mem
from caramel.ring import Context, Mode
from caramel.target import NEUTRAL, Target

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
        if expr.gathered:  # operands read through an automorphism: their Galois elements (R, gathered)
            galois = np.array(kernel.gather_galois(ctx), dtype=_I32).reshape(len(rows), len(expr.gathered))
            return lambda b: b.elementwise(expr, ins, outs, primes, sca, galois)
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
    if kernel.prologue is not None:  # an NTT computing its input in its load
        pro = kernel.prologue
        ins = _rows(rows_of, [r.ins for r in rows]).reshape(len(rows), pro.width)
        outs = _rows(rows_of, [r.outs[0] for r in rows])
        args = np.array([r.arg or 0 for r in rows], dtype=_I32)
        return lambda b: b.ntt_prologue(pro, ins, outs, primes, args, mode, kernel.half)
    ins, outs = _rows(rows_of, [r.ins[0] for r in rows]), _rows(rows_of, [r.outs[0] for r in rows])
    if kind is Kind.NTT:
        return lambda b: b.ntt(ins, outs, primes, kernel.half)
    if kind is Kind.INTT:
        return lambda b: b.intt(ins, outs, primes)
    if kind is Kind.AUTOMORPHISM:
        galois = np.array(kernel.galois(ctx), dtype=_I32)
        return lambda b: b.automorphism(ins, outs, galois)
    if kind is Kind.SUD_LIFT:
        src = np.array([r.arg for r in rows], dtype=_I32)
        return lambda b: b.sud_lift(ins, outs, src, primes, mode)
    raise ExecutionError(f"no backend call for kernel kind {kind.value}")


def _sum_call(ins, outs, primes) -> Callable[[Backend], None]:
    """One elementwise call: row ``outs[i]`` = (sum of rows ``ins[i]``) mod q_primes[i] (one input: a copy)."""
    ins = np.array(ins, dtype=_I32)
    m = ins.shape[1]
    ops = tuple(ExprOp("add", (0 if i == 0 else m + i - 1, i + 1)) for i in range(m - 1))
    expr = Expr(m, 0, ops, (m + len(ops) - 1,) if ops else (0,))
    outs, primes = np.array(outs, dtype=_I32).reshape(-1, 1), np.array(primes, dtype=_I32)
    sca = np.zeros((len(ins), 0), dtype=_I32)
    return lambda b: b.elementwise(expr, ins, outs, primes, sca)


def local_work_calls(chips: int) -> list[Callable[[Backend], None]]:
    """Every backend call that the communication steps of a plan of ``chips`` chips may make besides the collectives,
    on any placement (:func:`_local_calls`, :func:`_copy_calls`): a sum of 1 .. ``chips`` rows (local sums of the
    chips on one device; one row: a staging copy) and the ``% q`` of reduce results. A module depends on neither
    the rows nor the primes, so one call of each finds them all."""
    row = np.zeros(1, dtype=_I32)
    calls = [_sum_call([[0] * m], [0], [0]) for m in range(1, chips + 1)]
    calls.append(lambda b: b.mod(row[:, None].copy(), row, row))
    return calls


def _local_calls(prog: DeviceProgram, actions: Sequence[LocalSum | ModRows]) -> list[Callable]:
    """Backend calls for local sums (batched by input count) and ``% q`` of reduce results."""
    calls: list[Callable] = []
    sums: dict[int, list[LocalSum]] = {}
    mods: list[ModRows] = []
    for a in actions:
        if isinstance(a, LocalSum):
            sums.setdefault(len(a.ins), []).append(a)
        else:
            mods.append(a)
    if mods:
        rows = np.array([prog.row(r) for m in mods for r in m.rows], dtype=_I32)
        primes = np.array([m.prime for m in mods for _ in m.rows], dtype=_I32)
        words = rows[:, None].copy()
        calls.append(lambda b: b.mod(words, rows, primes))
    for _, group in sorted(sums.items()):
        calls.append(_sum_call([[prog.row(r) for r in a.ins] for a in group], [prog.row(a.out) for a in group],
                               [a.prime for a in group]))
    return calls


def _packed(prog: DeviceProgram, ops: Sequence[DeviceOp]):
    """The step's collectives as :class:`RowOp` s, one per call of :func:`pack`, and the staging rows they use: a
    call uses its sent and received rows in place where they are contiguous in its order (a call of one limb
    always); a side that is not goes through m contiguous staging rows (``gather``: (row, staging row) copies
    before, ``scatter``: (staging row, row) copies after, each with its prime)."""
    gather, out, scatter, staged = [], [], [], []
    at = prog.staging_base
    for bucket in pack(ops):
        o, m = bucket[0], len(bucket)
        sends, recvs = bucket_sides(bucket, prog.row)
        if m == 1 or (in_place(sends) and in_place(recvs)):
            out.append(RowOp(o.sync, o.kind, o.group, o.root, sends[0] if sends else -1, recvs[0] if recvs else -1, m))
            continue
        rows = range(at, at + m)
        send, recv = (sends[0] if sends else -1), (recvs[0] if recvs else -1)
        if not in_place(sends):
            gather += [(r, s, x.prime) for x, r, s in zip(bucket, sends, rows)]
            send = at
        if not in_place(recvs):
            scatter += [(s, r, x.prime) for x, r, s in zip(bucket, recvs, rows)]
            recv = at
        out.append(RowOp(o.sync, o.kind, o.group, o.root, send, recv, m))
        staged += rows
        at += m
    return gather, out, scatter, staged


def _copy_calls(copies: Sequence[tuple[int, int, int]]) -> list[Callable]:
    """One backend call copying arena rows (source, destination, prime) of ``copies``."""
    return [_sum_call([[c[0]] for c in copies], [c[1] for c in copies], [c[2] for c in copies])] if copies else []


def _comm_rows(prog: DeviceProgram, step: CommStep) -> tuple[frozenset[int], frozenset[int]]:
    """The arena rows (reads, writes) of a communication step, staging and scratch rows included."""
    reads: set[int] = set()
    writes: set[int] = set()
    for a in step.before + step.after:
        if isinstance(a, LocalSum):
            reads.update(prog.row(r) for r in a.ins)
            writes.add(prog.row(a.out))
        else:
            rows = {prog.row(r) for r in a.rows}
            reads |= rows
            writes |= rows
    for o in step.ops:
        if o.send is not None:
            reads.add(prog.row(o.send))
        if o.recv is not None:
            writes.add(prog.row(o.recv))
    staging = _packed(prog, step.ops)[3] if step.ops else []
    return frozenset(reads.union(staging)), frozenset(writes.union(staging))


def _local_limbs(actions: Sequence[LocalSum | ModRows]) -> int:
    """Limbs that local sums, copies and ``% q`` read and write (the traffic the timeline model prices)."""
    return sum(len(a.ins) + 1 if isinstance(a, LocalSum) else 2 * len(a.rows) for a in actions)


@dataclasses.dataclass(frozen=True)
class CommWork:
    """What one communication step does, as :mod:`caramel.timeline` prices it: the limbs that its local work reads
    and writes before the collectives (local sums, copies to staging rows) and after them (copies from staging
    rows, ``% q``, copies to the device's other receivers), and the collectives as the fabric gets them."""

    before_limbs: int
    ops: tuple[RowOp, ...]
    after_limbs: int


def comm_work(prog: DeviceProgram, step: CommStep) -> CommWork:
    """The :class:`CommWork` of ``step`` on ``prog``'s device (the calls :class:`DeviceRun` makes of it)."""
    gather, ops, scatter, _ = _packed(prog, step.ops) if step.ops else ([], [], [], [])
    return CommWork(_local_limbs(step.before) + 2 * len(gather), tuple(ops),
                    2 * len(scatter) + _local_limbs(step.after))


def step_task(prog: DeviceProgram, step: tuple[int, int, Kernel] | CommStep, n: int,
              target: Target = NEUTRAL) -> Task:
    """The :class:`~caramel.plan.streams.Task` of one step of ``prog`` at ring dimension ``n``: a kernel with its
    arena rows and cost estimated on ``target`` (the backend's), or a communication step (its rows, staging and
    scratch rows included) pinned to stream 0 (a driver with a communication stream moves it there)."""
    if isinstance(step, CommStep):
        reads, writes = _comm_rows(prog, step)
        return Task(reads, writes, cost=comm_cost(len(step.ops)), stream=0, name=f"communication at level {step.level}")
    c, _, k = step
    rows = prog.rows_of[c]
    return Task(frozenset(int(rows[b]) for b in k.reads()), frozenset(int(rows[b]) for b in k.writes()),
                cost=task_cost(k, n, target), name=f"chip {c} {k.kind.value} level {k.level} (lines {list(k.lines[:3])})")


def schedule_tasks(tasks: Sequence[Task], streams: int, *, comm_stream: bool = True, device: int = 0) -> StreamSchedule:
    """A device's ``tasks`` (:func:`step_task`) on ``streams`` streams, checked: with more than one (and
    ``comm_stream``), the communication steps go on the last stream, in order, and the kernels are spread over the
    others, so that kernels run while collectives wait for their peers; without ``comm_stream`` (a device without
    communication) the kernels use every stream. Read from the plan cache folder when built before."""
    reserved = 1 if streams > 1 and comm_stream else 0
    if reserved:
        tasks = [dataclasses.replace(t, stream=streams - 1) if t.stream is not None else t for t in tasks]
    from caramel.plan_cache import cached_schedule  # checked once, then read from the plan cache folder

    def build():
        sch = assign_streams(tasks, streams, reserved=reserved)
        check_schedule(tasks, sch, what=f"stream schedule of device {device}")
        return sch

    return cached_schedule(tasks, streams, reserved, build)


class DeviceRun:
    """One device's program lowered to backend calls over its arena, with the inputs written.

    ``calls`` is the single-stream sequence (:meth:`run`); ``tasks`` groups it for several
    streams (:meth:`schedule`, :mod:`caramel.plan.streams`): each kernel is a task, and each
    communication step is one task (its local sums, copies, collective group and ``% q``) on
    the communication stream; ``task_calls[t]`` are the calls of task t."""

    def __init__(self, prog: DeviceProgram, plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray],
                 mode: Mode, backend_factory: Callable[[Context, int], object], fabric: Fabric | None = None,
                 *, per_row: bool = False):
        """``fabric``: the device's collectives (None: a device hosting every chip needs none);
        ``per_row``: every kernel row is its own call (with an unfused plan, one call per
        limb-level instruction: the eager baseline)."""
        self.prog, self.plan, self.fabric = prog, plan, fabric
        self.backend = backend_factory(ctx, prog.n_rows)
        target = getattr(self.backend, "target", NEUTRAL)  # its kernel costs (Backend.target)
        init_rows, init, self.input_mems = [], [], []
        for c in prog.chips:
            chip = plan.chips[c]
            for m, b in chip.inputs.items():
                init_rows.append(prog.rows_of[c][b])
                init.append(memory[m])
                self.input_mems.append(m)
            if chip.zero_buffer >= 0:
                init_rows.append(prog.rows_of[c][chip.zero_buffer])
                init.append(np.zeros(ctx.n, dtype=np.uint32))
                self.input_mems.append(None)
        self.init_rows = np.array(init_rows, dtype=np.int64)
        self.init_data = init if init_rows else None  # rows as given: backend.write copies them (no host image)
        self.restore()
        self._primes = ctx.primes
        self.backend.set_scalars(self._scalar_values(memory))
        self.calls: list[Callable] = []
        self.labels: list[str] = []
        self.kernel_of: list[tuple[int, int, Kernel] | None] = []  # per call: (chip, index, kernel) or None
        self.groups: set[int] = set()  # indices of the fabric's group calls
        self.tasks: list[Task] = []
        self.task_calls: list[range] = []

        def add(calls: list[Callable], label: str, kernel: tuple[int, int, Kernel] | None = None) -> None:
            self.calls += calls
            self.labels += [label] * len(calls)
            self.kernel_of += [kernel] * len(calls)

        for step in prog.steps:
            first = len(self.calls)
            if isinstance(step, CommStep):
                add(_local_calls(prog, step.before), "comm: local sums")
                if step.ops:
                    gather, ops, scatter, _ = _packed(prog, step.ops)
                    add(_copy_calls(gather), "comm: gather to staging")
                    self.groups.add(len(self.calls))
                    add([lambda b, ops=ops: self.fabric.group(b, ops)],
                        f"comm level {step.level}: {len(step.ops)} collective(s) in {len(ops)} call(s), ids "
                        f"{', '.join(str(o.sync) for o in step.ops[:4])}{'...' if len(step.ops) > 4 else ''}")
                    add(_copy_calls(scatter), "comm: scatter from staging")
                add(_local_calls(prog, step.after), "comm: % q and copies")
            else:
                c, j, k = step
                parts = [dataclasses.replace(k, rows=(r,)) for r in k.rows] if per_row else [k]
                add([lower_kernel(p, prog.rows_of[c], ctx, mode, prog.scalar_base[c]) for p in parts],
                    f"chip {c} {k.kind.value} level {k.level}", step)
            self.tasks.append(step_task(prog, step, ctx.n, target))
            self.task_calls.append(range(first, len(self.calls)))
        self.pc = -1

    def schedule(self, streams: int, *, comm_stream: bool = True) -> StreamSchedule:
        """:func:`schedule_tasks` of this device's tasks."""
        return schedule_tasks(self.tasks, streams, comm_stream=comm_stream, device=self.prog.device)

    def run_task(self, t: int, *, collectives: bool = True) -> None:
        """The calls of task ``t``, in order (on the backend's current stream); ``collectives``
        as in :meth:`run`."""
        b = self.backend
        for self.pc in self.task_calls[t]:
            if collectives or self.pc not in self.groups:
                self.calls[self.pc](b)

    def _scalar_values(self, memory: Mapping[Mem, np.ndarray]) -> np.ndarray:
        return np.array([s.value(self._primes, memory) for s in self.prog.scalars], dtype=np.uint32)

    def rebind(self, memory: Mapping[Mem, np.ndarray], keep: frozenset[Mem] = frozenset()) -> None:
        """Take the inputs of another instance of the same program: write every input row except
        those of ``keep`` (limbs whose values are those already written, such as the evaluation
        keys that the instances of a batch share) and the scalar table, both in place, so that the
        same calls (or a graph captured from them) run on the new inputs. Needs input rows that
        no call overwrites (``keep_inputs`` placement, as on the GPU) or a :meth:`restore` copy."""
        idx = [i for i, m in enumerate(self.input_mems) if m is not None and m not in keep]
        if idx:
            rows = [memory[self.input_mems[i]] for i in idx]  # as given: backend.write copies them (no host image)
            self.backend.write(self.init_rows[idx], rows)
            if self.init_data is not None:
                for j, i in enumerate(idx):
                    self.init_data[i] = rows[j]
        self.backend.set_scalars(self._scalar_values(memory))

    def restore(self) -> None:
        """Write the inputs (and zero buffers) again: a run may reuse their rows."""
        if self.init_data is not None:
            self.backend.write(self.init_rows, self.init_data)

    def run(self, mark: Callable[[int], None] | None = None, *, collectives: bool = True) -> None:
        """Every call in order (``pc`` tells where a stalled run waits); ``mark(i)``, if given,
        is called after call i (an instrumented run records a clock or an event there).
        ``collectives=False`` skips the fabric's group calls: a dry run that only compiles and
        loads every kernel and uploads its index arrays (results are meaningless)."""
        b = self.backend
        for self.pc, call in enumerate(self.calls):
            if collectives or self.pc not in self.groups:
                call(b)
            if mark is not None:
                mark(self.pc)
        self.pc = len(self.calls)

    def is_comm(self, i: int) -> bool:
        """Whether call i is communication (a collective group, a local sum or ``% q``)."""
        return self.labels[i].startswith("comm")

    @property
    def position(self) -> str:
        if 0 <= self.pc < len(self.calls):
            return f"step {self.pc} of {len(self.calls)} ({self.labels[self.pc]})"
        return "finished" if self.pc >= len(self.calls) else "not started"

    def stores(self) -> list[dict[Mem, np.ndarray]]:
        """The private store of each hosted chip."""
        out = []
        for c in self.prog.chips:
            names = list(self.plan.chips[c].stores)
            rows = np.array([self.prog.rows_of[c][self.plan.chips[c].stores[m]] for m in names], dtype=np.int64)
            data = self.backend.read(rows) if names else []
            out.append(dict(zip(names, data)))
        return out


__all__ = ["CommWork", "DeviceRun", "comm_work", "lower_kernel", "schedule_tasks", "step_task"]
