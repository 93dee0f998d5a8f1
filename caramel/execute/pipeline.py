"""Instances through a resident device: the rows an instance writes, and the lanes that run them.

A *lane* is one device (or device group) holding a program resident: its plan, its arena with the
inputs every instance shares (evaluation keys, a model's plaintexts and scalars) written once, and
on the GPU its captured graph. An instance brings only its own inputs, as a *feed*: per input part
``(name, part)`` an array and the limbs of its rows (a ciphertext's ``c0``/``c1``, a plaintext's rows,
a scalar's residues), and the lane writes those rows and scalars in place, runs, and reads back the
output limbs. Every lane has the interface of :class:`Lane`: ``start(feed)`` issues an instance (it
blocks while every slot of the lane is busy) and returns a ticket, ``finish(ticket)`` waits for it
and returns its outputs and per-phase seconds.

* :class:`RowLayout`: which arena rows (and scalar table entries) an instance writes, which rows
  hold its outputs, computed once from the device program;
* :class:`HostRowLane`: the plan on one NumPy device (``cpu-plan``), synchronous: the CPU twin of
  the GPU lane that CI runs;
* :class:`MemoryLane`: any ``memory -> RunResult`` runner (the reference interpreter, a K-chip slot
  of simulated devices, :class:`ResidentHost`, or of GPUs, :class:`ResidentGpus`), given the
  instance's whole image: the shared limbs and its own;
* :class:`GpuRowLane` (:mod:`caramel.execute.gpu_pipeline`): one CUDA device with the instance
  rows double-buffered, so that uploads, the replay and downloads of consecutive instances overlap.

A feed's rows are checked where they are written: every limb present (here), residues below their
prime (the host lanes scan the staged rows; the GPU lane reduces them on the device while copying).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol, Sequence

import numpy as np

from caramel.errors import BindingError
from caramel.program import Mem
from caramel.ring import Context, Mode

#: A feed's key: (input name, part) with part ``c0``, ``c1`` (ciphertext), ``p`` (plaintext), ``s`` (scalar).
Key = tuple[str, str]


class Feed(Protocol):
    """What one instance brings: ``rows[key] = (array, limbs)`` (``array[r]`` is limb ``limbs[r]``:
    (k, N) for vectors, (k,) residues for scalars; NumPy or CuPy) and ``image()``, its inputs as
    memory image limbs (``Mem -> array``) for the lanes that take a whole image."""

    rows: Mapping[Key, tuple[object, tuple[int, ...]]]

    def image(self) -> Mapping[Mem, object]: ...


@dataclass(frozen=True)
class Group:
    """The rows of one feed key: positions ``start:stop`` of the instance rows, reading limbs ``limbs``."""

    limbs: tuple[int, ...]
    start: int
    stop: int


@dataclass(frozen=True)
class ScalarGroup:
    """The scalar table entries of one scalar input: entry ``positions[j]`` = residue on limb
    ``limbs[j]`` mod ``primes[j]`` (the table's prime), the residue being below ``moduli[j]``."""

    limbs: tuple[int, ...]
    positions: np.ndarray
    primes: np.ndarray
    moduli: np.ndarray


@dataclass
class LaneOutput:
    """A finished instance on a lane: its output limbs (``Mem -> (N,) uint32``, host arrays it owns)
    and the seconds of its phases on the lane (``upload``, ``replay``, ``download``)."""

    outputs: dict[Mem, np.ndarray]
    timings: dict[str, float] = field(default_factory=dict)


class Lane(Protocol):
    """A resident device (see the module docstring)."""

    device_ids: tuple[int, ...]
    depth: int

    def start(self, feed: Feed) -> object: ...

    def finish(self, ticket: object) -> LaneOutput: ...

    def close(self, failed: bool = False) -> None: ...


class RowLayout:
    """The instance rows of one device program ``prog`` of ``plan`` (all chips on one device):
    ``source(mem)`` names the feed key and limb of an input limb that instances bring, None for the
    limbs written once (keys, shared inputs). ``rows``: the arena rows an instance writes, grouped by
    key (``groups``), ``mems`` the limb each holds and ``moduli`` its prime; ``scalars``: the scalar
    table entries it writes (``scalar_groups``); ``out_mems``/``out_rows``: the ``outputs`` that the
    device stores and the rows holding them after a run (a limb stored by several chips: the last)."""

    def __init__(self, prog, plan, ctx: Context, source: Callable[[Mem], tuple[Key, int] | None],
                 outputs: Sequence[Mem]):
        by_key: dict[Key, list[tuple[int, int, Mem]]] = {}
        for c in prog.chips:
            for m, b in plan.chips[c].inputs.items():
                got = source(m)
                if got is not None:
                    by_key.setdefault(got[0], []).append((int(prog.rows_of[c][b]), got[1], m))
        rows, mems, groups = [], [], {}
        for key, entries in by_key.items():
            groups[key] = Group(tuple(l for _, l, _ in entries), len(rows), len(rows) + len(entries))
            rows += [r for r, _, _ in entries]
            mems += [m for _, _, m in entries]
        self.rows = np.array(rows, dtype=np.int64)
        self.mems: tuple[Mem, ...] = tuple(mems)
        self.groups: dict[Key, Group] = groups
        self.moduli = np.array([ctx.q(m.limb) for m in mems], dtype=np.uint64)
        sca: dict[Key, list[tuple[int, int, int, int]]] = {}
        for j, s in enumerate(prog.scalars):
            got = source(s.mem) if s.mem is not None else None
            if got is not None:
                sca.setdefault(got[0], []).append((j, got[1], ctx.q(s.prime), ctx.q(s.mem.limb)))
        self.scalar_groups: dict[Key, ScalarGroup] = {
            key: ScalarGroup(tuple(e[1] for e in es), np.array([e[0] for e in es], dtype=np.int64),
                             np.array([e[2] for e in es], dtype=np.uint64),
                             np.array([e[3] for e in es], dtype=np.uint64))
            for key, es in sca.items()}
        wanted = set(outputs)
        where: dict[Mem, int] = {}
        for c in prog.chips:
            for m, b in plan.chips[c].stores.items():
                if m in wanted:
                    where[m] = int(prog.rows_of[c][b])
        self.out_mems: tuple[Mem, ...] = tuple(m for m in outputs if m in where)
        self.out_rows = np.array([where[m] for m in self.out_mems], dtype=np.int64)
        self._index: dict[tuple[Key, tuple[int, ...]], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.rows)

    def source_rows(self, key: Key, limbs: Sequence[int], want: tuple[int, ...]) -> np.ndarray:
        """The rows of an array holding ``limbs`` that give the limbs ``want`` (cached per limb list);
        a limb it lacks is a :class:`BindingError` naming the input."""
        cache_key = (key, tuple(limbs), want)
        got = self._index.get(cache_key)
        if got is None:
            at = {int(l): r for r, l in enumerate(limbs)}
            lacking = sorted({l for l in want if l not in at})
            if lacking:
                raise BindingError(f"input {key[0]} ({key[1]}) lacks limbs {lacking} (has {list(limbs)})")
            got = self._index[cache_key] = np.array([at[l] for l in want], dtype=np.int64)
        return got

    def check_feed(self, feed: Feed) -> None:
        """Every key the layout reads is in ``feed`` (a :class:`BindingError` names those missing)."""
        missing = sorted({k for k in (*self.groups, *self.scalar_groups) if k not in feed.rows})
        if missing:
            raise BindingError("the instance lacks input(s) " + ", ".join(f"{n}:{p}" for n, p in missing))

    def scalar_table(self, base: np.ndarray, feed: Feed) -> np.ndarray:
        """The scalar table of an instance: ``base`` (the shared entries) with the instance's scalar
        entries written (uint32); a residue at or above its limb's prime is a :class:`BindingError`."""
        table = np.array(base, dtype=np.uint64)
        for key, g in self.scalar_groups.items():
            values, limbs = feed.rows[key]
            values = np.asarray(values)
            if values.ndim != 1 or values.dtype.kind not in "ui":
                raise BindingError(f"scalar input {key[0]}: residues of shape {values.shape} and dtype {values.dtype}; "
                                   "expected one integer per limb")
            picked = values[self.source_rows(key, limbs, g.limbs)].astype(np.int64)
            bad = np.flatnonzero((picked < 0) | (picked.astype(np.uint64) >= g.moduli))
            if bad.size:
                l = g.limbs[int(bad[0])]
                raise BindingError(f"scalar input {key[0]}: residue {int(picked[bad[0]])} on limb {l} is not below "
                                   f"q_{l} = {int(g.moduli[bad[0]])}")
            table[g.positions] = picked.astype(np.uint64) % g.primes
        return table.astype(np.uint32)

    def range_problems(self, maxima: np.ndarray) -> list[str]:
        """The instance rows whose largest residue (``maxima``, one per row) is not below its prime."""
        bad = np.flatnonzero(np.asarray(maxima, dtype=np.uint64) >= self.moduli)
        return [f"{self.mems[i]}: residues must lie in [0, q_{self.mems[i].limb} = {int(self.moduli[i])}), "
                f"found up to {int(maxima[i])}" for i in bad[:20]]


def check_host_rows(name: str, a: np.ndarray, n: int) -> np.ndarray:
    """``a`` as a (k, N) integer host array that converts to uint32 without wrapping (a
    :class:`BindingError` otherwise); the range below the primes is checked where the rows land."""
    a = np.asarray(a)
    if a.ndim != 2 or a.shape[1] != n:
        raise BindingError(f"input {name}: rows of shape {a.shape}, expected (k, {n})")
    if a.dtype.kind not in "ui":
        raise BindingError(f"input {name}: dtype {a.dtype} is not an integer type")
    if a.dtype.itemsize > 4 or a.dtype.kind == "i":
        if a.size and (int(a.min()) < 0 or int(a.max()) >= 2**32):
            raise BindingError(f"input {name}: residues outside [0, 2^32)")
    return a


def stage_rows(layout: RowLayout, feed: Feed, out: np.ndarray) -> None:
    """Write the instance rows of ``feed`` into ``out`` ((len(layout), N) uint32, host), group by group."""
    for key, g in layout.groups.items():
        a, limbs = feed.rows[key]
        a = check_host_rows(f"{key[0]} ({key[1]})", a, out.shape[1])
        src = layout.source_rows(key, limbs, g.limbs)
        if a.dtype == out.dtype:
            np.take(a, src, axis=0, out=out[g.start:g.stop])
        else:
            np.copyto(out[g.start:g.stop], a[src], casting="unsafe")


class HostRowLane:
    """The plan on ONE NumPy device hosting every chip (``cpu-plan``), resident: the template image
    (keys, shared inputs, zeros for the instance rows) is written once; each instance writes its rows
    and scalar entries, runs (``streams`` > 1: a random order that many streams allow, as the GPU's
    streams could run it) and reads its output rows. Synchronous: ``start`` runs the instance."""

    depth = 1

    def __init__(self, plan, ctx: Context, mode: Mode, template: Mapping[Mem, object],
                 source: Callable[[Mem], tuple[Key, int] | None], outputs: Sequence[Mem], *, streams: int = 1,
                 seed: int | None = None, device_ids: tuple[int, ...] = (),
                 progress: Callable[[int, int], None] | None = None):
        from caramel.backends.numpy_backend import NumpyBackend
        from caramel.execute.memory import check_plan_memory
        from caramel.execute.placement import gpu_device_programs
        from caramel.execute.runner import DeviceRun

        check_plan_memory(plan, ctx, template)  # once: the instance rows are checked as they are staged
        self.prog = gpu_device_programs(plan, 1, ctx, streams, reuse="fifo" if streams > 1 else None)[0]
        self.run = DeviceRun(self.prog, plan, ctx, template, Mode(mode), NumpyBackend)
        self.run.init_data = None  # the inputs stay in their rows: no host copy to restore from
        self.layout = RowLayout(self.prog, plan, ctx, source, outputs)
        self.base_scalars = self.run._scalar_values(template)
        self.schedule = self.run.schedule(streams) if streams > 1 else None
        self.seed = np.random.SeedSequence(seed).entropy
        self.device_ids = tuple(device_ids)  # the simulated device of the slot, for the records
        self.count = 0
        self.progress = progress  # (calls done, calls) as an instance runs
        self._stage = np.empty((len(self.layout), ctx.n), dtype=np.uint32)

    def start(self, feed: Feed) -> LaneOutput:
        import time

        layout, run = self.layout, self.run
        t0 = time.perf_counter()
        layout.check_feed(feed)
        stage_rows(layout, feed, self._stage)
        problems = layout.range_problems(self._stage.max(axis=1) if len(layout) else np.zeros(0))
        if problems:
            raise BindingError("bad input rows:\n  " + "\n  ".join(problems))
        table = layout.scalar_table(self.base_scalars, feed) if layout.scalar_groups else None
        if len(layout):
            run.backend.write(layout.rows, self._stage)
        if table is not None:
            run.backend.set_scalars(table)
        t1 = time.perf_counter()
        total, report = len(run.calls), self.progress
        if self.schedule is None:
            run.run(None if report is None else lambda i: report(i + 1, total))
        else:
            from caramel.plan.streams import happens_before_order

            rng = np.random.default_rng((self.seed, self.count))
            done = 0
            for t in happens_before_order(self.schedule, rng):
                run.run_task(t)
                if report is not None:
                    done += len(run.task_calls[t])
                    report(done, total)
            run.pc = len(run.calls)
        self.count += 1
        t2 = time.perf_counter()
        out = run.backend.read(layout.out_rows) if len(layout.out_rows) else np.zeros((0, run.backend.ctx.n), np.uint32)
        t3 = time.perf_counter()
        return LaneOutput(dict(zip(layout.out_mems, out)), {"upload": t1 - t0, "replay": t2 - t1, "download": t3 - t2})

    def finish(self, ticket: LaneOutput) -> LaneOutput:
        return ticket

    def close(self, failed: bool = False) -> None:
        """Nothing to release."""


class MemoryLane:
    """A runner ``memory -> RunResult`` that takes whole images (the reference interpreter, a K-chip
    slot resident on simulated devices or GPUs: :class:`ResidentHost`, :class:`ResidentGpus`): each
    instance's image is the template's limbs (keys and
    shared inputs, kept in place by resident runners) under its own. Synchronous."""

    depth = 1

    def __init__(self, runner: Callable[[Mapping[Mem, object]], object], template: Mapping[Mem, object],
                 outputs: Sequence[Mem], device_ids: tuple[int, ...] = (), context=None):
        self.runner, self.template, self.outputs = runner, template, tuple(outputs)
        self.device_ids = device_ids
        self.context = context  # entered around every run (a CUDA device of a 1-device slot), or None

    def start(self, feed: Feed) -> LaneOutput:
        import time
        from collections import ChainMap
        from contextlib import nullcontext

        from caramel.arrays import to_host

        t0 = time.perf_counter()
        memory = ChainMap(dict(feed.image()), self.template)
        with self.context() if self.context is not None else nullcontext():
            result = self.runner(memory)
        t1 = time.perf_counter()
        wanted, outputs = set(self.outputs), {}
        for store in result.stores:  # in chip order: a limb stored by several chips is the last one's (merge order)
            for m, a in store.items():
                if m in wanted:
                    outputs[m] = np.asarray(to_host(a), dtype=np.uint32)
        return LaneOutput(outputs, {"replay": t1 - t0})

    def finish(self, ticket: LaneOutput) -> LaneOutput:
        return ticket

    def close(self, failed: bool = False) -> None:
        close = getattr(self.runner, "close", None)
        if close is not None:
            close(failed)


class ResidentHost:
    """A slot of simulated devices (``cpu-plan``) that stays resident, the CPU twin of
    :class:`ResidentGpus`: the plan's device programs on ``gpus`` NumPy devices (host threads,
    a fresh :class:`~caramel.execute.fabric.threads.FakeNetwork` per instance, under the
    watchdog), with the inputs in rows that no kernel overwrites (the GPU's ``keep_inputs``
    placement). The first instance writes its whole image; every later one rewrites only the
    input rows outside ``keep`` and the scalar table (:meth:`DeviceRun.rebind
    <caramel.execute.runner.DeviceRun.rebind>`), so the key rows are written once per device.
    ``streams`` > 1: each run executes a random order that that many streams allow (as
    :class:`~caramel.execute.drive.HostRun`). One instance at a time (one slot thread)."""

    def __init__(self, plan, ctx: Context, mode: Mode, gpus: int, keep: frozenset[Mem], *, streams: int = 1,
                 timeout: float = 120.0, seed: int | None = None):
        from caramel.execute.placement import gpu_device_programs

        self.plan, self.ctx, self.mode, self.keep, self.timeout = plan, ctx, Mode(mode), keep, timeout
        # the GPUs' row layout when their memory is short (a row a buffer would take host memory several times over)
        self.progs = gpu_device_programs(plan, max(1, gpus), ctx, streams, reuse="fifo" if streams > 1 else None)
        self.streams = streams
        self.seed = np.random.SeedSequence(seed).entropy
        self.runs: list = []
        self.schedules: list | None = None
        self.instances = 0  # instances run so far

    def __call__(self, memory: Mapping[Mem, np.ndarray]):
        from caramel.backends.numpy_backend import NumpyBackend
        from caramel.execute.drive import run_threads
        from caramel.execute.fabric.threads import FakeNetwork
        from caramel.execute.memory import check_plan_memory
        from caramel.execute.result import merge_results
        from caramel.execute.runner import DeviceRun

        if self.runs:
            check_plan_memory(self.plan, self.ctx, memory, kept=self.keep)
            for r in self.runs:
                r.rebind(memory, self.keep)
        else:
            check_plan_memory(self.plan, self.ctx, memory)
            self.runs = [DeviceRun(p, self.plan, self.ctx, memory, self.mode, NumpyBackend) for p in self.progs]
            for r in self.runs:
                r.init_data = None  # the inputs stay in their rows: no host copy to restore from
            if self.streams > 1:
                self.schedules = [r.schedule(self.streams) for r in self.runs]
        net = FakeNetwork(len(self.runs), self.timeout)
        count, self.instances = self.instances, self.instances + 1

        def body(r):
            r.fabric = net.fabric(r.prog.device)
            if self.schedules is None:
                r.run()
            else:
                from caramel.plan.streams import happens_before_order

                rng = np.random.default_rng((self.seed, count, r.prog.device))
                for t in happens_before_order(self.schedules[r.prog.device], rng):
                    r.run_task(t)
                r.pc = len(r.calls)
            return r.prog.chips, r.stores()
        if len(self.runs) == 1:  # one device hosting every chip: no collectives, no watchdog
            out = [body(self.runs[0])]
        else:
            out = run_threads([lambda r=r: body(r) for r in self.runs], self.timeout, net.abort,
                              lambda d: self.runs[d].position)
        return merge_results(self.plan, memory, out)

    def close(self, failed: bool = False) -> None:
        """Nothing to release (the interface of :class:`ResidentGpus`)."""


class ResidentGpus:
    """A K-chip slot resident on its CUDA devices: ONE :class:`~caramel.execute.cuda_graph.MultiGpuRun`
    (``device_ids``: the slot's CUDA devices, several chips per GPU when fewer than K; empty: one
    per chip on devices 0, 1, ... up to those present). The first instance uploads its whole
    image (keys included), runs eagerly and captures one graph per GPU; every later instance
    rewrites only the input rows outside ``keep`` and the scalar tables of every GPU
    (:meth:`MultiGpuRun.rebind <caramel.execute.cuda_graph.MultiGpuRun.rebind>`) and replays the
    same graphs. :meth:`close` releases the graphs and communicators (after the batch)."""

    def __init__(self, plan, ctx: Context, mode: Mode, device_ids: tuple[int, ...], keep: frozenset[Mem],
                 streams: int | None = None, *, kernels=None):
        self.plan, self.ctx, self.mode, self.keep, self.streams = plan, ctx, Mode(mode), keep, streams
        self.device_ids = device_ids
        self.extra = {} if kernels is None else {"kernels": kernels}  # the CUDA kernels' configuration
        self.run = None

    def __call__(self, memory: Mapping[Mem, np.ndarray]):
        from caramel.execute.cuda_graph import MultiGpuRun

        if self.run is None:
            devices = self.device_ids
            if not devices:
                import cupy as cp

                devices = tuple(range(min(len(self.plan.chips), cp.cuda.runtime.getDeviceCount())))
            self.run = MultiGpuRun(self.plan, self.ctx, memory, self.mode, len(devices), device_ids=list(devices),
                                   streams=self.streams, **self.extra)
        else:
            self.run.rebind(memory, self.keep)
        self.run.replay(1)
        return self.run.result()

    def close(self, failed: bool = False) -> None:
        """Drop the graphs and communicators (abort them first after a failed instance)."""
        run, self.run = self.run, None
        if run is not None:
            run.close(failed)


class Template(Mapping):
    """The image a lane is built from: ``fixed`` limbs (keys, shared inputs) and, for the limbs that
    instances bring, zeros (``vectors``: rows of N, ``scalars``: one residue), overwritten per instance."""

    def __init__(self, fixed: Mapping[Mem, object], vectors: frozenset[Mem], scalars: frozenset[Mem], n: int):
        self.fixed, self.vectors, self.scalars = fixed, vectors, scalars
        self._zero_row = np.zeros(n, dtype=np.uint32)
        self._zero_row.setflags(write=False)
        self._zero = np.zeros((), dtype=np.uint32)
        self._zero.setflags(write=False)

    def __getitem__(self, m: Mem):
        if m in self.fixed:
            return self.fixed[m]
        if m in self.vectors:
            return self._zero_row
        if m in self.scalars:
            return self._zero
        raise KeyError(m)

    def __contains__(self, m) -> bool:
        return m in self.fixed or m in self.vectors or m in self.scalars

    def __iter__(self):
        yield from self.fixed
        yield from (m for m in self.vectors if m not in self.fixed)
        yield from (m for m in self.scalars if m not in self.fixed)

    def __len__(self) -> int:
        return len(self.fixed) + len(self.vectors - set(self.fixed)) + len(self.scalars - set(self.fixed))


__all__ = ["Feed", "Group", "HostRowLane", "Key", "Lane", "LaneOutput", "MemoryLane", "ResidentGpus", "ResidentHost",
           "RowLayout", "ScalarGroup", "Template", "check_host_rows", "stage_rows"]
