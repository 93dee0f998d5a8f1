"""A K-chip plan on G devices: one merged program per device, and the fabric that connects them.

A device hosts the chips :func:`caramel.execute.collectives.placement` gives it. Its
:class:`DeviceProgram` has one arena: the rows of each hosted chip (its own
:func:`~caramel.plan.assign_rows` map, shifted), then scratch rows for partial sums, one zero
row that is never written, and staging rows. The hosted chips' kernels run merged by plan level; at
each level the communication comes first, as one :class:`~caramel.execute.collectives.CommStep`
(local sums, ONE group of device collectives, ``% q`` and copies; the limbs that one root sends in
the step travel as one call through contiguous staging rows,
:func:`~caramel.execute.collectives.pack`), then the level's kernels, chip by
chip. Each chip keeps its own kernel order, so its row reuse stays valid.

:class:`Fabric` is one device's collective interface: ``group(backend, ops)`` issues the device
collectives of a step as one group on the backend's current stream. :class:`FakeNetwork` gives
each device a CPU fabric with NCCL's semantics (broadcast; uint32 SUM reduce that wraps; the k-th
call on a communicator must be the same collective on every member, else an error), with a
timeout that turns a stall into a :class:`~caramel.errors.DeadlockError` naming the waiting
devices. The NCCL fabric is in :mod:`caramel.execute.multi_gpu`.

:class:`HostRun` (and :func:`run_on_devices`, one run of it) runs a plan on G "devices" of the
NumPy backend, one host thread per device, over a :class:`FakeNetwork`: the CPU twin of the
multi-GPU executor, bit-identical to the reference, that CI runs.
"""

from __future__ import annotations

import abc
import dataclasses
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from caramel.errors import DeadlockError, ExecutionError
from caramel.execute.collectives import (
    ZERO, Collective, CollectiveKind, CommStep, DeviceOp, LocalSum, ModRows, device_comm_step, pack, placement,
    plan_collectives, staging_rows,
)
from caramel.execute.plan_engine import check_plan_memory, lower_kernel
from caramel.execute.reference import RunResult
from caramel.plan.plan import Expr, ExprOp, Kernel, Kind, Plan, ScalarSpec, assign_rows
from caramel.plan.streams import StreamSchedule, Task, assign_streams, check_schedule
from caramel.program import Mem
from caramel.ring import Context, Mode

_I32 = np.int32

#: CUDA streams per GPU of a multi-GPU run by default: the kernels on one, the communication on
#: the other (BootstrapLike_51L on 4 H200s: 19.5 ms with 1 stream, 19.0 with 2, 18.7 with 4; on
#: 2 H200s 24.9, 24.9 and 25.2 ms; inputs then still restored every replay; docs/PERFORMANCE.md).
DEFAULT_STREAMS = 2


@dataclass(frozen=True)
class RowOp:
    """A device collective with arena rows resolved: ``rows`` contiguous rows from ``send`` /
    ``recv`` (-1 where unused); ``sync`` is the first id it carries."""

    sync: int
    kind: CollectiveKind
    group: tuple[int, ...]
    root: int
    send: int
    recv: int
    rows: int = 1


class Fabric(abc.ABC):
    """One device's end of the collective layer (``device`` is its index among G)."""

    device: int

    @abc.abstractmethod
    def group(self, backend, ops: Sequence[RowOp]) -> None:
        """Issue ``ops`` (in order) as one group on the backend's current stream: BROADCAST from
        the root's ``send`` row into the others' ``recv`` rows; REDUCE: uint32 SUM of every
        member's ``send`` row into the root's ``recv`` row."""

    def close(self) -> None:
        """Release communicators."""


@dataclass
class DeviceProgram:
    """What one device runs (see the module docstring)."""

    device: int
    chips: tuple[int, ...]
    rows_of: dict[int, np.ndarray]
    n_rows: int
    scratch_base: int
    zero_row: int
    staging_base: int
    scalars: list[ScalarSpec]
    scalar_base: dict[int, int]
    steps: list[tuple[int, Kernel] | CommStep]  # (chip, kernel) or a communication step
    collectives: int = 0
    comm_bytes: int = 0

    def row(self, ref: tuple[int, int]) -> int:
        """The arena row of a row reference: (chip, buffer), (-1, scratch k) or ZERO."""
        chip, b = ref
        if ref == ZERO:
            return self.zero_row
        if chip < 0:
            return self.scratch_base + b
        return int(self.rows_of[chip][b])


def device_programs(plan: Plan, devices: int, primes: Sequence[int], n: int = 0, *,
                    reuse: str = "lifo", keep_inputs: bool = False) -> list[DeviceProgram]:
    """The :class:`DeviceProgram` of each of min(G, K) devices (collectives checked first,
    :func:`~caramel.execute.collectives.plan_collectives`); ``n`` (ring degree) only sizes the
    communicated bytes that are reported; ``reuse``, ``keep_inputs``: each chip's row assignment
    (:func:`~caramel.plan.assign_rows`; ``"fifo"`` for runs on several streams, inputs kept for
    replayed graphs)."""
    cols = plan_collectives(plan, primes)
    where = placement(len(plan.chips), devices)
    by_level: dict[int, list[Collective]] = {}
    for c in cols:
        by_level.setdefault(c.level, []).append(c)
    out = []
    for d in range(max(where) + 1):
        hosted = tuple(c for c, w in enumerate(where) if w == d)
        rows_of, base, scalars, scalar_base = {}, 0, [], {}
        kernels: list[tuple[tuple[int, int, int], Kernel]] = []  # ((level, chip, index), kernel)
        comm_levels: set[int] = set()
        for c in hosted:
            chip = plan.chips[c]
            r, count = assign_rows(chip, reuse=reuse, keep_inputs=keep_inputs)
            rows_of[c] = np.where(r >= 0, r + base, -1)
            base += count
            scalar_base[c] = len(scalars)
            scalars += chip.scalars
            for j, k in enumerate(chip.kernels):
                if k.kind is Kind.COMM:
                    comm_levels.add(k.level)
                else:
                    kernels.append(((k.level, c, j), k))
        # Per level: the communication step first, then the hosted chips' kernels, chip by chip.
        order = sorted([((lv, 0, 0, 0), lv) for lv in comm_levels]
                       + [((key[0], 1) + key[1:], (key[1], k)) for key, k in kernels], key=lambda e: e[0])
        steps, scratch, staging, n_ops = [], 0, 0, 0
        for _, item in order:
            if isinstance(item, int):
                step = device_comm_step(item, by_level[item], d, where)
                scratch = max(scratch, step.scratch)
                staging = max(staging, staging_rows(step.ops))
                n_ops += len(step.ops)
                steps.append(step)
            else:
                steps.append(item)
        sent = sum(1 for s in steps if isinstance(s, CommStep) for o in s.ops
                   if o.kind is CollectiveKind.BROADCAST and o.root == d
                   or o.kind is CollectiveKind.REDUCE and o.root != d)
        out.append(DeviceProgram(d, hosted, rows_of, base + scratch + 1 + staging, base, base + scratch,
                                 base + scratch + 1, scalars, scalar_base, steps, n_ops, sent * 4 * n))
    return out


def device_groups(progs: Sequence[DeviceProgram]) -> list[tuple[int, ...]]:
    """Every device group that a device collective uses, in the fixed order in which every
    device creates its communicators (by size, then devices)."""
    groups = {o.group for p in progs for s in p.steps if isinstance(s, CommStep) for o in s.ops}
    return sorted(groups, key=lambda g: (len(g), g))


def _sum_expr(m: int) -> Expr:
    """v0 + v1 + ... + v(m-1) mod q (m = 1: a copy)."""
    ops = tuple(ExprOp("add", (0 if i == 0 else m + i - 1, i + 1)) for i in range(m - 1))
    return Expr(m, 0, ops, (m + len(ops) - 1,) if ops else (0,))


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
    for m, group in sorted(sums.items()):
        expr = _sum_expr(m)
        ins = np.array([[prog.row(r) for r in a.ins] for a in group], dtype=_I32).reshape(len(group), m)
        outs = np.array([[prog.row(a.out)] for a in group], dtype=_I32)
        primes = np.array([a.prime for a in group], dtype=_I32)
        sca = np.zeros((len(group), 0), dtype=_I32)
        calls.append(lambda b, e=expr, i=ins, o=outs, p=primes, s=sca: b.elementwise(e, i, o, p, s))
    return calls


def _packed(prog: DeviceProgram, ops: Sequence[DeviceOp]):
    """The step's collectives as :class:`RowOp` s, one per bucket of :func:`pack`: a bucket of
    m > 1 limbs goes through m contiguous staging rows (``gather``: (row, staging row) copies
    before, ``scatter``: (staging row, row) copies after, each with its prime); a bucket of one
    uses its rows in place."""
    gather, out, scatter = [], [], []
    at = prog.staging_base
    for bucket in pack(ops):
        o = bucket[0]
        if len(bucket) == 1:
            out.append(RowOp(o.sync, o.kind, o.group, o.root, prog.row(o.send) if o.send is not None else -1,
                             prog.row(o.recv) if o.recv is not None else -1))
            continue
        rows = range(at, at + len(bucket))
        sends = [(prog.row(x.send), r, x.prime) for x, r in zip(bucket, rows) if x.send is not None]
        recvs = [(r, prog.row(x.recv), x.prime) for x, r in zip(bucket, rows) if x.recv is not None]
        gather += sends
        scatter += recvs
        out.append(RowOp(o.sync, o.kind, o.group, o.root, at if sends else -1, at if recvs else -1, len(bucket)))
        at += len(bucket)
    return gather, out, scatter


def _copy_calls(copies: Sequence[tuple[int, int, int]]) -> list[Callable]:
    """One backend call copying arena rows (source, destination, prime) of ``copies``."""
    if not copies:
        return []
    expr = _sum_expr(1)
    ins = np.array([[c[0]] for c in copies], dtype=_I32)
    outs = np.array([[c[1]] for c in copies], dtype=_I32)
    primes = np.array([c[2] for c in copies], dtype=_I32)
    sca = np.zeros((len(copies), 0), dtype=_I32)
    return [lambda b: b.elementwise(expr, ins, outs, primes, sca)]


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
    staging = range(prog.staging_base, prog.staging_base + staging_rows(step.ops))
    return frozenset(reads.union(staging)), frozenset(writes.union(staging))


class DeviceRun:
    """One device's program lowered to backend calls over its arena, with the inputs written.

    ``calls`` is the single-stream sequence (:meth:`run`); ``tasks`` groups it for several
    streams (:meth:`schedule`, :mod:`caramel.plan.streams`): each kernel is a task, and each
    communication step is one task (its local sums, copies, collective group and ``% q``) on
    the communication stream; ``task_calls[t]`` are the calls of task t."""

    def __init__(self, prog: DeviceProgram, plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray],
                 mode: Mode, backend_factory: Callable[[Context, int], object], fabric: Fabric):
        self.prog, self.plan, self.fabric = prog, plan, fabric
        self.backend = backend_factory(ctx, prog.n_rows)
        init_rows, init = [], []
        for c in prog.chips:
            chip = plan.chips[c]
            for m, b in chip.inputs.items():
                init_rows.append(prog.rows_of[c][b])
                init.append(memory[m])
            if chip.zero_buffer >= 0:
                init_rows.append(prog.rows_of[c][chip.zero_buffer])
                init.append(np.zeros(ctx.n, dtype=np.uint32))
        self.init_rows = np.array(init_rows, dtype=np.int64)
        self.init_data = np.stack(init).astype(np.uint32) if init_rows else None
        self.restore()
        self.backend.set_scalars(np.array([s.value(ctx.primes, memory) for s in prog.scalars], dtype=np.uint32))
        self.calls: list[Callable] = []
        self.labels: list[str] = []
        self.groups: set[int] = set()  # indices of the fabric's group calls
        self.tasks: list[Task] = []
        self.task_calls: list[range] = []
        for step in prog.steps:
            first = len(self.calls)
            if isinstance(step, CommStep):
                self.calls += _local_calls(prog, step.before)
                self.labels += ["comm: local sums"] * (len(self.calls) - len(self.labels))
                if step.ops:
                    gather, ops, scatter = _packed(prog, step.ops)
                    self.calls += _copy_calls(gather)
                    self.groups.add(len(self.calls))
                    self.calls.append(lambda b, ops=ops: self.fabric.group(b, ops))
                    self.calls += _copy_calls(scatter)
                    self.labels += ["comm: gather to staging"] * bool(gather) + [
                        f"comm level {step.level}: {len(step.ops)} collective(s) in {len(ops)} call(s), ids "
                        f"{', '.join(str(o.sync) for o in step.ops[:4])}{'...' if len(step.ops) > 4 else ''}"
                    ] + ["comm: scatter from staging"] * bool(scatter)
                self.calls += _local_calls(prog, step.after)
                self.labels += ["comm: % q and copies"] * (len(self.calls) - len(self.labels))
                reads, writes = _comm_rows(prog, step)
                task = Task(reads, writes, cost=len(step.ops) + 1, stream=0, name=f"communication at level {step.level}")
            else:
                c, k = step
                self.calls.append(lower_kernel(k, prog.rows_of[c], ctx, mode, prog.scalar_base[c]))
                self.labels.append(f"chip {c} {k.kind.value} level {k.level}")
                rows = prog.rows_of[c]
                task = Task(frozenset(int(rows[b]) for b in k.reads()), frozenset(int(rows[b]) for b in k.writes()),
                            cost=max(1, k.size), name=f"chip {c} {k.kind.value} level {k.level} (lines {list(k.lines[:3])})")
            self.tasks.append(task)
            self.task_calls.append(range(first, len(self.calls)))
        self.pc = -1

    def schedule(self, streams: int) -> StreamSchedule:
        """The tasks on ``streams`` streams, checked: with more than one, the communication steps
        go on the last stream, in order, and the kernels are spread over the others, so that
        kernels run while collectives wait for their peers."""
        tasks = self.tasks
        if streams > 1:
            tasks = [dataclasses.replace(t, stream=streams - 1) if t.stream is not None else t for t in tasks]
        sch = assign_streams(tasks, streams, reserved=1 if streams > 1 else 0)
        check_schedule(tasks, sch, what=f"stream schedule of device {self.prog.device}")
        return sch

    def run_task(self, t: int, *, collectives: bool = True) -> None:
        """The calls of task ``t``, in order (on the backend's current stream); ``collectives``
        as in :meth:`run`."""
        b = self.backend
        for self.pc in self.task_calls[t]:
            if collectives or self.pc not in self.groups:
                self.calls[self.pc](b)

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


# ---------------------------------------------------------------------------------------------- fake fabric


def collective_result(op: RowOp, sent: Mapping[int, np.ndarray]) -> np.ndarray:
    """What the receivers of ``op`` get from the rows each device sent (``sent[device]``): the
    root's rows (BROADCAST) or their uint32 SUM, wrapping like NCCL's (REDUCE)."""
    if op.kind is CollectiveKind.BROADCAST:
        return sent[op.root]
    return np.sum(np.stack(list(sent.values())), axis=0, dtype=np.uint32)


@dataclass
class _Slot:
    ops: dict[int, RowOp] = field(default_factory=dict)
    data: dict[int, np.ndarray] = field(default_factory=dict)
    result: np.ndarray | None = None


class FakeNetwork:
    """In-process collectives among ``devices`` host threads with NCCL's semantics (see the
    module docstring). ``log[d]`` records, per device, the ops of every group call."""

    def __init__(self, devices: int, timeout: float = 60.0):
        self.devices = devices
        self.timeout = timeout
        self.cond = threading.Condition()
        self.calls: dict[tuple[int, ...], list[int]] = {}  # group -> calls issued per device
        self.slots: dict[tuple[tuple[int, ...], int], _Slot] = {}
        self.log: list[list[list[RowOp]]] = [[] for _ in range(devices)]
        self.waiting: dict[int, str] = {}
        self.failed: BaseException | None = None

    def fabric(self, device: int) -> "FakeFabric":
        return FakeFabric(self, device)

    def abort(self, why: BaseException | None = None) -> None:
        with self.cond:
            self.failed = self.failed or why or ExecutionError("aborted")
            self.cond.notify_all()


class FakeFabric(Fabric):
    def __init__(self, net: FakeNetwork, device: int):
        self.net, self.device = net, device

    def group(self, backend, ops: Sequence[RowOp]) -> None:
        net, d = self.net, self.device
        net.log[d].append(list(ops))
        posted = []
        with net.cond:
            for op in ops:  # post every contribution first (a group does not block in between)
                counts = net.calls.setdefault(op.group, [0] * net.devices)
                key = (op.group, counts[d])
                counts[d] += 1
                slot = net.slots.setdefault(key, _Slot())
                other = next(iter(slot.ops.values()), None)
                if other is not None and (other.kind, other.root, other.sync, other.rows) != (
                        op.kind, op.root, op.sync, op.rows):
                    err = ExecutionError(
                        f"collective order mismatch on devices {op.group} at call {key[1]}: device {d} "
                        f"issued {op.kind.value} of id {op.sync} (root {op.root}, {op.rows} limbs), another "
                        f"issued {other.kind.value} of id {other.sync} (root {other.root}, {other.rows} limbs)")
                    net.failed = net.failed or err
                    net.cond.notify_all()
                    raise err
                slot.ops[d] = op
                if op.send >= 0:
                    slot.data[d] = backend.read(np.arange(op.send, op.send + op.rows))
                if len(slot.ops) == len(op.group):
                    slot.result = collective_result(op, slot.data)
                    net.cond.notify_all()
                posted.append((key, op))
            for key, op in posted:
                if op.recv < 0:
                    continue
                slot = net.slots[key]
                net.waiting[d] = f"{op.kind.value} of id {op.sync} among devices {op.group}"
                ok = net.cond.wait_for(lambda: slot.result is not None or net.failed is not None, net.timeout)
                net.waiting.pop(d, None)
                if net.failed is not None:
                    raise ExecutionError(f"device {d}: stopped, another device failed") from net.failed
                if not ok:
                    missing = sorted(set(op.group) - set(slot.ops))
                    err = DeadlockError(
                        f"device {d} waited {net.timeout:g} s for {op.kind.value} of id {op.sync} among "
                        f"devices {op.group}; device(s) {missing} never issued it")
                    net.failed = err
                    net.cond.notify_all()
                    raise err
                backend.write(np.arange(op.recv, op.recv + op.rows), slot.result)



# ---------------------------------------------------------------------------------------------- driver


def run_threads(workers: Sequence[Callable[[], object]], timeout: float, abort: Callable[[BaseException], None],
                describe: Callable[[int], str]) -> list[object]:
    """Run one host thread per device and wait for all: the watchdog. A worker that raises, or
    a run still unfinished after ``timeout`` seconds, aborts the fabric (so that every blocked
    device returns) and raises: a :class:`DeadlockError` naming the unfinished devices and where
    they wait (``describe(d)``), or the first worker's error. Threads are daemons: an
    interpreter exit never waits for a stuck device."""
    results: list[object] = [None] * len(workers)
    errors: list[BaseException | None] = [None] * len(workers)
    done = threading.Semaphore(0)

    def body(i: int) -> None:
        try:
            results[i] = workers[i]()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors[i] = e
            abort(e)
        finally:
            done.release()

    threads = [threading.Thread(target=body, args=(i,), daemon=True, name=f"caramel-device-{i}")
               for i in range(len(workers))]
    for t in threads:
        t.start()
    finished = 0
    deadline = time.monotonic() + timeout
    while finished < len(workers):
        try:
            got = done.acquire(timeout=max(0.0, deadline - time.monotonic()))
        except KeyboardInterrupt:  # Ctrl-C: unblock every device, then let the interrupt through
            abort(ExecutionError("interrupted"))
            raise
        if not got:
            stuck = [i for i, t in enumerate(threads) if t.is_alive()]
            err = DeadlockError(f"watchdog: no progress after {timeout:g} s; unfinished device(s):\n  "
                                + "\n  ".join(f"device {i}: {describe(i)}" for i in stuck))
            abort(err)
            for t in threads:
                t.join(5.0)
            raise err
        finished += 1
    first = next((e for e in errors if e is not None and not _is_secondary(e)), None)
    first = first or next((e for e in errors if e is not None), None)
    if first is not None:
        raise first
    return results


def _is_secondary(e: BaseException) -> bool:
    return isinstance(e, ExecutionError) and "another device failed" in str(e)


def merge_results(plan: Plan, memory: Mapping[Mem, np.ndarray], runs_stores: Sequence[tuple[tuple[int, ...], list]]) -> RunResult:
    """A :class:`RunResult` from every device's (hosted chips, stores)."""
    stores: list[dict] = [{} for _ in plan.chips]
    for chips, per_chip in runs_stores:
        for c, s in zip(chips, per_chip):
            stores[c] = s
    return RunResult.from_stores(stores, memory, plan.instructions)


class HostRun:
    """The CPU twin of :class:`~caramel.execute.multi_gpu.MultiGpuRun`: a plan's device programs
    on NumPy (or ``backend``) devices, one host thread each, over a :class:`FakeNetwork` (a fresh
    one per run unless given), under the watchdog (``timeout``); timed with the wall clock.

    ``streams`` > 1 stands in for the GPU's concurrent streams: each device's tasks are scheduled
    as on the GPU (:meth:`DeviceRun.schedule`, rows reused first-in first-out) and a run executes
    them in a random order that the schedule's happens-before allows (one new order per run,
    from ``seed``); any such order must give the single-stream result."""

    def __init__(self, plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                 devices: int | None = None, *, backend=None, timeout: float = 120.0, streams: int = 1,
                 seed: int | None = None):
        if backend is None:
            from caramel.backends.numpy_backend import NumpyBackend as backend
        check_plan_memory(plan, ctx, memory)
        self.plan, self.memory, self.timeout = plan, memory, timeout
        self.progs = device_programs(plan, devices or len(plan.chips), ctx.primes, ctx.n,
                                     reuse="fifo" if streams > 1 else "lifo")
        self.runs = [DeviceRun(p, plan, ctx, memory, Mode(mode), backend, None) for p in self.progs]
        self.schedules = [r.schedule(streams) for r in self.runs] if streams > 1 else None
        self.seed = np.random.SeedSequence(seed).entropy
        self.count = 0  # runs so far: each run draws new orders

    def _run(self, r: DeviceRun) -> None:
        """One run of device ``r``: in order, or in a random happens-before order of its schedule."""
        if self.schedules is None:
            r.run()
            return
        from caramel.plan.streams import happens_before_order

        rng = np.random.default_rng((self.seed, self.count, r.prog.device))
        for t in happens_before_order(self.schedules[r.prog.device], rng):
            r.run_task(t)
        r.pc = len(r.calls)

    def _all(self, body: Callable[[DeviceRun], object], network: FakeNetwork | None = None) -> list:
        """``body(run)`` on every device (inputs restored first), in host threads."""
        net = network or FakeNetwork(len(self.runs), self.timeout)
        self.count += 1
        for r in self.runs:
            r.fabric = net.fabric(r.prog.device)
            r.restore()
        return run_threads([lambda r=r: body(r) for r in self.runs], self.timeout, net.abort,
                           lambda d: self.runs[d].position)

    def time(self, repeats: int = 10, warmup: int = 1):
        """Wall-clock milliseconds per whole run (all devices)."""
        from caramel.execute.gpu import Timing

        for _ in range(warmup):
            self._all(self._run)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            self._all(self._run)
            times.append((time.perf_counter() - t0) * 1e3)
        return Timing(float(np.median(times)), min(times), max(times), len(times))

    def instrument(self) -> list[list[tuple[int, float, float]]]:
        """One run with the wall clock read after every call: per device, (call index, start ms,
        duration ms), like :meth:`MultiGpuRun.instrument`."""
        def body(r: DeviceRun):
            marks: list[float] = []
            t0 = time.perf_counter()
            r.run(lambda i: marks.append((time.perf_counter() - t0) * 1e3))
            starts = [0.0] + marks[:-1]
            return [(i, a, b - a) for i, (a, b) in enumerate(zip(starts, marks))]
        return self._all(body)

    def result(self, network: FakeNetwork | None = None) -> RunResult:
        """Run once and return every chip's outputs."""
        def body(r: DeviceRun):
            self._run(r)
            return r.prog.chips, r.stores()
        return merge_results(self.plan, self.memory, self._all(body, network))

    def close(self) -> None:
        """Nothing to release (the interface of MultiGpuRun)."""


def run_on_devices(plan: Plan, ctx: Context, memory: Mapping[Mem, np.ndarray], mode: Mode | str = Mode.EXACT,
                   devices: int | None = None, *, backend=None, timeout: float = 120.0,
                   network: FakeNetwork | None = None, streams: int = 1, seed: int | None = None) -> RunResult:
    """Run ``plan`` once on ``devices`` (default: one per chip) host-thread devices
    (:class:`HostRun`, ``streams`` and ``seed`` as there); bit-identical to the reference."""
    return HostRun(plan, ctx, memory, mode, devices, backend=backend, timeout=timeout, streams=streams,
                   seed=seed).result(network)


__all__ = ["DEFAULT_STREAMS", "DeviceProgram", "DeviceRun", "Fabric", "FakeNetwork", "HostRun", "RowOp", "collective_result", "device_groups", "device_programs",
           "merge_results", "run_on_devices", "run_threads"]
