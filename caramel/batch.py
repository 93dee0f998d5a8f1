"""Program-level parallelism: B independent instances of one program over G devices.

Instance i of a batch with seed S uses ONE set of keys for the whole batch (from the key seed K,
default S, or a :class:`~caramel.ckks.keyset.KeySet` given, e.g. from a key store) and inputs from
seed S + i (or entry i of the user's stacked inputs, :mod:`caramel.userdata`); so its output
digest equals that of ``caramel run --seed S+i --key-seed K`` (:func:`caramel.api.run_program`).

Layout (:func:`batch_layout`): a K-chip program on G >= K devices runs G // K instances at once,
each on K devices of its own (devices jK .. jK+K-1); with G < K one instance at a time on all G
devices (several chips per device); a 1-chip program runs one instance per device. Each *slot*
(a device group) is a host thread that takes the next instance from a shared queue: it encrypts
the instance's inputs, runs it, decrypts and checks it. Without ``gpus`` there is one slot on the
executor's default devices.

What is shared, and what is not:

* the keys are generated (or loaded) once for all instances (on the GPU client for ``gpu``);
* on GPUs a 1-chip program stays resident on each device (:func:`slot_runners`): the device's
  first instance uploads its whole image, evaluation keys included, and captures the graph; every
  later instance on that device rewrites only its own input rows and the scalar table, in place
  (:meth:`caramel.execute.cuda_graph.GpuRun.rebind`), and replays the same graph, so the keys
  are uploaded once per device;
* a K-chip slot stays resident the same way on its devices (:class:`ResidentGpus`: one
  :class:`~caramel.execute.cuda_graph.MultiGpuRun` per slot, its graphs captured on the first
  instance; later instances rewrite the non-key input rows and scalar tables of every device,
  :meth:`~caramel.execute.cuda_graph.MultiGpuRun.rebind`), closed after the batch;
* ``cpu-plan`` slots stay resident on their simulated devices in the same way
  (:class:`ResidentHost`: one set of device runs per slot whose key rows are written once), so
  that CI covers the logic of the GPU slots; ``cpu`` slots share the reference interpreter.

Backends: ``gpu`` (slots on CUDA devices), ``cpu-plan`` (slots on simulated devices: a K-chip
instance runs on K host-thread devices over the fake fabric), ``cpu`` (the reference, slots as
host threads). In process mode (``caramel launch --nproc P -- run ... --batch B``) process r takes
the instances i with i % P == r on its own device (LOCAL_RANK on the GPU, chips merged there),
writes their records (JSON) beside ``CARAMEL_RENDEZVOUS``, and rank 0 gathers and prints them
(:func:`run_batch_distributed`).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from caramel.ckks.bind import requirements
from caramel.errors import CaramelError
from caramel.infiles import npz_arrays, parse_json, read_bounded
from caramel.program import Mem, Program
from caramel.ring import Context, Mode

#: Seconds rank 0 waits for the other ranks' records in process mode.
GATHER_TIMEOUT = 3600.0
#: Largest records file of a rank read (one record of a few hundred bytes per instance).
RECORDS_MAX_BYTES = 64 << 20


class BatchError(CaramelError):
    """A batch that cannot run as asked (sizes, layout, process mode)."""


def batch_layout(chips: int, gpus: int | None) -> list[tuple[int, ...]]:
    """The device groups (slots) of a batch: ``gpus`` None -> one slot on the executor's default
    devices (``()``); K = ``chips`` = 1 -> one slot per device; G >= K -> G // K slots of K
    consecutive devices; G < K -> one slot of all G devices."""
    if gpus is None:
        return [()]
    if gpus < 1 or chips < 1:
        raise BatchError(f"a batch needs at least one device and one chip, got {gpus} and {chips}")
    if gpus < chips:
        return [tuple(range(gpus))]
    return [tuple(range(j * chips, (j + 1) * chips)) for j in range(gpus // chips)]


@dataclass
class Instance:
    """One instance of a batch: its record (:meth:`record`) is what gets printed and gathered."""

    index: int
    seed: int
    digest: str
    report: Any  # CheckReport | None
    devices: tuple[int, ...]
    timings: dict[str, float]
    outputs: dict[str, np.ndarray] | None = None
    rank: int = 0

    @property
    def passed(self) -> bool | None:
        return None if self.report is None else bool(self.report.passed)

    def record(self) -> dict[str, Any]:
        from caramel.results import check_record

        return {"instance": self.index, "seed": self.seed, "rank": self.rank, "devices": list(self.devices),
                "digest": self.digest, "passed": self.passed, "checks": check_record(self.report),
                "timings_s": {k: round(v, 6) for k, v in self.timings.items()}}


@dataclass
class BatchSummary:
    """Instances, wall time (seconds, from the first instance's start to the last one's end,
    keys excluded) and instances per second; ``slots``: instances run at once."""

    instances: int
    wall_s: float
    per_second: float
    slots: int
    devices_per_instance: int
    processes: int = 1
    passed: bool | None = None

    def line(self) -> str:
        verdict = {True: "all checks pass", False: "SOME CHECKS FAIL", None: "not checked"}[self.passed]
        procs = f" in {self.processes} processes" if self.processes > 1 else ""
        return (f"batch: {self.instances} instances in {self.wall_s:.2f} s ({self.per_second:.2f} instances/s), "
                f"{self.slots} at once on {self.devices_per_instance} device(s) each{procs}; {verdict}")


@dataclass
class BatchResult:
    """What :func:`run_batch` returns: per-instance records (sorted by index) and a summary."""

    program: str
    n: int
    mode: str
    backend: str
    seed: int
    key_seed: int | None
    records: list[dict[str, Any]]
    summary: BatchSummary
    timings: dict[str, float] = field(default_factory=dict)  # shared phases: keys, plan
    instances: list[Instance] = field(default_factory=list)  # this process's instances

    @property
    def passed(self) -> bool:
        return self.summary.passed is not False

    def body(self) -> dict[str, Any]:
        """The JSON body (:func:`caramel.results.document` adds the environment)."""
        from dataclasses import asdict

        digests = [r["digest"] for r in self.records]
        return {"program": self.program, "n": self.n, "mode": self.mode, "backend": self.backend,
                "devices": self.summary.slots * self.summary.devices_per_instance * self.summary.processes,
                "seed": self.seed, "key_seed": self.key_seed, "batch": len(self.records),
                "digest": digests[0] if len(digests) == 1 else None, "passed": self.summary.passed,
                "timings_s": {k: round(v, 6) for k, v in self.timings.items()},
                "instances": self.records, "summary": asdict(self.summary)}


def instance_line(record: Mapping[str, Any]) -> str:
    """One printed line per instance: index, seed, verdicts with bits, digest."""
    checks = record.get("checks") or {}
    parts = []
    for name, c in checks.items():
        bits = c["precision_bits"]
        parts.append(f"{c['verdict']} {name} {bits:.1f} bits" if isinstance(bits, float) else f"{c['verdict']} {name} {bits} bits")
    verdicts = "; ".join(parts) if parts else "not checked"
    where = f" devices {','.join(map(str, record['devices']))}" if record.get("devices") else ""
    rank = f" rank {record['rank']}" if record.get("rank") else ""
    return f"instance {record['instance']} (seed {record['seed']}{where}{rank}): {verdicts}; digest {record['digest']}"


def _batch_verdict(verdicts: Sequence[bool | None]) -> bool | None:
    """A batch's verdict from its instances': None when none was checked, else True unless one failed."""
    return None if all(v is None for v in verdicts) else all(v is not False for v in verdicts)


def _slot_context(devices: tuple[int, ...]):
    """``cupy.cuda.Device(d)`` of a 1-device GPU slot (so that everything the call allocates lands
    there); a no-op for a slot of the default device (``()``)."""
    if len(devices) != 1:
        return nullcontext()
    import cupy as cp

    return cp.cuda.Device(devices[0])


def key_mems(program: Program) -> frozenset[Mem]:
    """The limbs of the memory image that hold evaluation keys: the same in every instance of a
    batch (one key set), so that a device keeps them in place from one instance to the next."""
    req = requirements(program)
    return frozenset(Mem(term, l) for term, src in req.terms.items() if src.key is not None
                     for l in req.term_limbs[term])


class ResidentHost:
    """A slot of simulated devices (``cpu-plan``) that stays resident, the CPU twin of
    :class:`ResidentGpus`: the plan's device programs on ``devices`` NumPy devices (host threads,
    a fresh :class:`~caramel.execute.fabric.threads.FakeNetwork` per instance, under the
    watchdog), with the inputs in rows that no kernel overwrites (the GPU's ``keep_inputs``
    placement). The first instance writes its whole image; every later one rewrites only the
    input rows outside ``keep`` and the scalar table (:meth:`DeviceRun.rebind
    <caramel.execute.runner.DeviceRun.rebind>`), so the key rows are written once per device.
    ``streams`` > 1: each run executes a random order that that many streams allow (as
    :class:`~caramel.execute.drive.HostRun`). One instance at a time (one slot thread)."""

    def __init__(self, plan, ctx: Context, mode: Mode, devices: int, keep: frozenset[Mem], *, streams: int = 1,
                 timeout: float = 120.0, seed: int | None = None):
        from caramel.execute.placement import gpu_device_programs

        self.plan, self.ctx, self.mode, self.keep, self.timeout = plan, ctx, Mode(mode), keep, timeout
        # the GPUs' row layout when their memory is short (a row a buffer would take host memory several times over)
        self.progs = gpu_device_programs(plan, max(1, devices), ctx, streams, reuse="fifo" if streams > 1 else None)
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
    (``devices``: the slot's CUDA devices, several chips per GPU when fewer than K; empty: one
    per chip on devices 0, 1, ... up to those present). The first instance uploads its whole
    image (keys included), runs eagerly and captures one graph per GPU; every later instance
    rewrites only the input rows outside ``keep`` and the scalar tables of every GPU
    (:meth:`MultiGpuRun.rebind <caramel.execute.cuda_graph.MultiGpuRun.rebind>`) and replays the
    same graphs. :meth:`close` releases the graphs and communicators (after the batch)."""

    def __init__(self, plan, ctx: Context, mode: Mode, devices: tuple[int, ...], keep: frozenset[Mem],
                 streams: int | None = None):
        self.plan, self.ctx, self.mode, self.keep, self.streams = plan, ctx, Mode(mode), keep, streams
        self.devices = devices
        self.run = None

    def __call__(self, memory: Mapping[Mem, np.ndarray]):
        from caramel.execute.cuda_graph import MultiGpuRun

        if self.run is None:
            devices = self.devices
            if not devices:
                import cupy as cp

                devices = tuple(range(min(len(self.plan.chips), cp.cuda.runtime.getDeviceCount())))
            self.run = MultiGpuRun(self.plan, self.ctx, memory, self.mode, len(devices), device_ids=list(devices),
                                   streams=self.streams)
        else:
            self.run.rebind(memory, self.keep)
        self.run.replay(1)
        return self.run.result()

    def close(self, failed: bool = False) -> None:
        """Drop the graphs and communicators (abort them first after a failed instance)."""
        run, self.run = self.run, None
        if run is not None:
            run.close(failed)


def slot_runners(program: Program, ctx: Context, mode: Mode, backend: str, layout: Sequence[tuple[int, ...]],
                 streams: int | None = None) -> list[Callable[[Mapping], Any]]:
    """One ``memory -> RunResult`` per slot (see the module docstring for what is shared). On
    GPUs and simulated devices every slot stays resident: the first instance writes its image
    (keys included), the later ones rewrite only their own inputs (a 1-chip program on a GPU:
    :func:`caramel.execute.cuda_graph.resident_executor`; K chips: :class:`ResidentGpus`;
    ``cpu-plan``: :class:`ResidentHost`). Runners with a ``close(failed)`` method are closed by
    :func:`run_batch` after the batch."""
    from caramel.api import executor

    chips = len(program.streams)
    if backend not in ("gpu", "cpu-plan"):  # the reference: one shared function, slots as host threads
        shared = executor(program, ctx, mode, backend, None, streams)
        return [shared for _ in layout]
    from caramel.plan_cache import cached_plan

    plan, keep = cached_plan(program), key_mems(program)  # build_plan(program), or its plan-cache entry
    if backend == "cpu-plan":
        return [ResidentHost(plan, ctx, mode, len(g), keep, streams=streams or 1) for g in layout]
    from caramel.api import gpu_available
    from caramel.execute.cuda_graph import GRAPH_STREAMS, resident_executor

    if not gpu_available():
        raise CaramelError("backend 'gpu' needs CuPy and a CUDA GPU (in the caramel clone: pip install -e "
                           "'.[cuda12]' or '.[cuda13]')")
    if chips > 1 or any(len(g) > 1 for g in layout):
        return [ResidentGpus(plan, ctx, mode, g, keep, streams) for g in layout]

    def resident(devices):
        run = resident_executor(plan, ctx, mode, streams=streams or GRAPH_STREAMS, keep=keep)

        def on_device(memory):
            with _slot_context(devices):
                return run(memory)
        return on_device
    return [resident(g) for g in layout]


def _run_slots(layout, work: Callable[[int, tuple[int, ...]], None], indices: Sequence[int]) -> float:
    """Run ``work(index, devices)`` for every index, one host thread per slot taking the next
    index from a queue; the first error is raised after every thread stopped. Returns the wall
    time in seconds."""
    todo: queue.Queue[int] = queue.Queue()
    for i in indices:
        todo.put(i)
    errors: list[BaseException] = []
    stop = threading.Event()

    def body(devices):
        while not stop.is_set():
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                work(i, devices)
            except BaseException as exc:  # reported by the main thread
                errors.append(exc)
                stop.set()
                return

    start = time.perf_counter()
    if len(layout) == 1:
        body(layout[0])
    else:
        threads = [threading.Thread(target=body, args=(g,), name=f"caramel-slot-{k}", daemon=True)
                   for k, g in enumerate(layout)]
        for t in threads:
            t.start()
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            stop.set()
            raise
    wall = time.perf_counter() - start
    if errors:
        raise errors[0]
    return wall


def _close(runners: Sequence[Any], failed: bool) -> None:
    """Close the resident slots that have a ``close(failed)`` (:class:`ResidentGpus`)."""
    for r in runners:
        close = getattr(r, "close", None)
        if close is not None:
            close(failed)


def run_batch(
    program: Program,
    *,
    n: int = 65536,
    mode: Mode | str = Mode.EXACT,
    backend: str = "auto",
    seed: int = 0,
    key_seed: int | None = None,
    keys=None,
    check: Any = "auto",
    batch: int = 1,
    gpus: int | None = None,
    streams: int | None = None,
    inputs: Any = None,
    ctx: Context | None = None,
    indices: Sequence[int] | None = None,
    outputs: bool = False,
    limbs: bool = False,
    rank: int = 0,
    devices: Sequence[int] | None = None,
    log: Callable[[str], None] | None = None,
    device: str | None = None,
) -> BatchResult:
    """Run ``batch`` instances of ``program`` (module docstring) on ``gpus`` devices of ``backend``
    and check each by decryption. ``indices``: the instances this call runs (default all; process
    mode passes its share); ``devices``: the CUDA devices to use instead of 0 .. G-1 (process mode:
    ``[LOCAL_RANK]``). ``device``: where the client arithmetic runs (as :func:`caramel.api.run_program`;
    default the GPU for the ``gpu`` backend). ``outputs``/``limbs``: keep each instance's decrypted outputs (and raw
    output limbs) in :attr:`Instance.outputs`. Other arguments as :func:`caramel.api.run_program`."""
    from caramel.api import default_spec, key_seed_for, output_digest, prepare_inputs, resolve_backend, run_setup
    from caramel.ckks.check import evaluate_check
    from caramel.ckks.keyset import generate_keyset

    if batch < 1:
        raise BatchError(f"--batch must be at least 1, got {batch}")
    log = log or (lambda s: None)
    mode = Mode(mode)
    ctx, spec, data = run_setup(program, n, ctx, check, inputs, batch)
    from caramel.ckks.device import resolve as client_device, using as using_client

    backend = resolve_backend(backend)
    client = client_device(device, backend)  # by default the arithmetic on the GPU when the backend is the GPU
    indices = list(range(batch)) if indices is None else list(indices)
    shared: dict[str, float] = {}
    t0 = time.perf_counter()
    if keys is None:
        with using_client(client):
            keys = generate_keyset(program, ctx, key_seed_for(seed, key_seed))
    shared["keys"] = time.perf_counter() - t0
    layout = batch_layout(program.chips, gpus)
    if devices is not None:  # renumber the slots' devices onto the given CUDA devices
        devices = list(devices)
        if max((d for g in layout for d in g), default=-1) >= len(devices):
            raise BatchError(f"{gpus} device(s) asked for, {len(devices)} given ({devices})")
        layout = [tuple(devices[d] for d in g) for g in layout]
    t0 = time.perf_counter()
    slots = slot_runners(program, ctx, mode, backend, layout, streams)
    runners = dict(zip(layout, slots))
    shared["plan"] = time.perf_counter() - t0
    log(f"{len(indices)} instance(s) on {len(layout)} slot(s) of {max(1, len(layout[0]))} device(s); keys in "
        f"{shared['keys']:.2f} s")
    done: dict[int, Instance] = {}
    the_spec = spec or default_spec(program)

    def work(i: int, group: tuple[int, ...]) -> None:
        times: dict[str, float] = {}
        t = time.perf_counter()
        supplied = None
        if data is not None:
            from caramel.userdata import instance_values

            supplied = instance_values(data, program, i)
        with using_client(client):
            prepared = prepare_inputs(program, ctx, keys, seed + i, the_spec, supplied)
        times["encrypt"] = time.perf_counter() - t
        t = time.perf_counter()
        result = runners[group](prepared.memory)
        times["run"] = time.perf_counter() - t
        t = time.perf_counter()
        kept = None
        if outputs or limbs:
            from caramel.userdata import decrypted_outputs

            kept = decrypted_outputs(prepared, result.memory, limbs=limbs)
            times["decrypt"] = time.perf_counter() - t
            t = time.perf_counter()
        with using_client(client):
            report = evaluate_check(prepared, result.memory, mode) if spec is not None else None
        digest = output_digest(program, result.memory)
        times["check"] = time.perf_counter() - t
        done[i] = Instance(i, seed + i, digest, report, group, times, kept, rank)
        log(f"instance {i}: {'checked' if report is not None else 'ran'}, digest {digest[:16]}")

    failed = True
    try:
        wall = _run_slots(layout, work, indices)
        failed = False
    finally:
        _close(slots, failed)
    instances = [done[i] for i in sorted(done)]
    passed = _batch_verdict([x.passed for x in instances])
    summary = BatchSummary(len(instances), wall, len(instances) / wall if wall > 0 else 0.0, len(layout),
                           max(1, len(layout[0])), 1, passed)
    return BatchResult(program.name, int(ctx.n), mode.value, backend, seed, key_seed, [x.record() for x in instances],
                       summary, shared, instances)


# --------------------------------------------------------------------------------- process mode

def run_batch_distributed(program: Program, place, *, batch: int, backend: str = "auto", outputs: bool = False,
                          limbs: bool = False, timeout: float = GATHER_TIMEOUT, **kwargs) -> BatchResult | None:
    """This process's share of a batch in process mode: instances i with i % world == rank, on
    its own device (``place``: :func:`caramel.execute.distributed.launch_env`; on the GPU the CUDA
    device ``place.local_rank``, a K-chip program with its chips merged there; on the CPU the NumPy
    plan engine). Each rank writes its records (and with ``outputs`` its decrypted outputs, .npz)
    beside the rendezvous file; rank 0 waits for all ranks and returns the whole batch (the other
    ranks return None)."""
    from caramel.api import resolve_backend
    from caramel.execute.distributed import _wait_for
    from caramel.outfiles import write_atomic
    from caramel.results import write_json

    start = time.perf_counter()
    backend = "gpu" if resolve_backend(backend) == "gpu" else "cpu-plan"
    mine = [i for i in range(batch) if i % place.world == place.rank]
    gpu = backend == "gpu"
    result = run_batch(program, batch=batch, backend=backend, indices=mine, gpus=1 if gpu else None,
                       devices=[place.local_rank] if gpu else None, outputs=outputs, limbs=limbs, rank=place.rank,
                       **kwargs)
    if outputs or limbs:  # written before the records, which tell rank 0 that this rank is done
        from caramel.userdata import stack_outputs

        arrays = {"instances": np.asarray([x.index for x in result.instances], dtype=np.int64)}
        if result.instances:
            per = [x.outputs for x in result.instances]
            arrays.update({k: (v[None] if len(per) == 1 and not k.endswith(".limbs") else v)
                           for k, v in stack_outputs(per).items()})
        write_atomic(place.data_path(f"batch{place.rank}.npz"), lambda f: np.savez(f, **arrays))
    write_json(place.data_path(f"batch{place.rank}.json"),
               {"world": place.world, "records": result.records, "timings_s": result.timings})
    if place.rank != 0:
        return None
    records: list[dict] = []
    for r in range(place.world):
        path = place.data_path(f"batch{r}.json")
        _wait_for(path, timeout, f"the records of rank {r}", place)  # stops early when a rank reported a failure
        data = parse_json(read_bounded(path, RECORDS_MAX_BYTES))  # written by a rank of this run; bounded still
        if data.get("world") != place.world:
            raise BatchError(f"{path} was written for {data.get('world')} processes, this run has {place.world}")
        records += data["records"]
    records.sort(key=lambda r: r["instance"])
    if [r["instance"] for r in records] != list(range(batch)):
        raise BatchError(f"the ranks returned instances {[r['instance'] for r in records]}, expected 0..{batch - 1}")
    wall = time.perf_counter() - start
    passed = _batch_verdict([r["passed"] for r in records])
    result.records = records
    result.summary = BatchSummary(batch, wall, batch / wall if wall > 0 else 0.0, place.world, 1, place.world, passed)
    return result


def gathered_outputs(place, batch: int) -> dict[str, np.ndarray]:
    """Rank 0, after :func:`run_batch_distributed` with ``outputs``: every rank's outputs merged
    into one array per name, stacked in instance order."""
    parts = []
    for r in range(place.world):
        path = place.data_path(f"batch{r}.npz")  # uncompressed (np.savez): its arrays are no larger than it
        parts.append(npz_arrays(path, max_bytes=os.path.getsize(path)))
    merged: dict[str, np.ndarray] = {}
    order = np.concatenate([p["instances"] for p in parts])
    if sorted(order.tolist()) != list(range(batch)):
        raise BatchError(f"the ranks' outputs hold instances {sorted(order.tolist())}, expected 0..{batch - 1}")
    keys = next((p.keys() for p in parts if len(p["instances"])), {})
    for k in keys:
        if k == "instances":
            continue
        if k.endswith(".limbs"):
            merged[k] = next(p[k] for p in parts if k in p)
            continue
        stacked = np.concatenate([p[k] for p in parts if len(p["instances"])])
        merged[k] = stacked[np.argsort(order, kind="stable")]
    return merged


# --------------------------------------------------------------------------------- throughput

@dataclass
class ThroughputPoint:
    """A 1-chip program on G devices: ``rounds`` instances per device, timed from the first start
    to the last end (encryption and checks excluded: prepared input images, the run only)."""

    program: str
    gpus: int
    instances: int
    wall_s: float
    per_second: float
    speedup: float = 1.0
    efficiency: float = 1.0
    digest: str = ""


def measure_throughput(program: Program, gpus: Sequence[int], *, n: int = 65536, mode: Mode | str = Mode.EXACT,
                       backend: str = "auto", seed: int = 0, rounds: int = 2, streams: int | None = None,
                       log: Callable[[str], None] | None = None) -> list[ThroughputPoint]:
    """Instances per second of ``program`` on each device count of ``gpus`` (one instance per
    device at a time; G input images prepared once from seeds ``seed .. seed+G-1``, each device
    runs its own ``rounds`` times). Speedup = rate(G) / rate(smallest G) * smallest G;
    efficiency = speedup / G. Every run's outputs must have the digest of its image's first run."""
    from caramel.api import default_spec, output_digest, prepare_inputs, resolve_backend
    from caramel.ckks.keyset import generate_keyset

    log = log or (lambda s: None)
    mode = Mode(mode)
    backend = "cpu-plan" if backend == "auto" and resolve_backend("auto") == "cpu" else resolve_backend(backend)
    from caramel.ckks.device import resolve as client_device, using as using_client

    ctx = Context(n=n)
    spec = default_spec(program)
    with using_client(client_device(None, backend)):
        keys = generate_keyset(program, ctx, seed)
        images = [prepare_inputs(program, ctx, keys, seed + d, spec).memory for d in range(max(gpus))]
    points: list[ThroughputPoint] = []
    for g in gpus:
        layout = batch_layout(1, g)
        runners = dict(zip(layout, slot_runners(program, ctx, mode, backend, layout, streams)))
        digests: dict[int, set[str]] = {}
        lock = threading.Lock()

        def work(k: int, group: tuple[int, ...]) -> None:
            d = group[0] if group else 0
            result = runners[group](images[d])
            with lock:
                digests.setdefault(d, set()).add(output_digest(program, result.memory))

        # one warm-up round (compiles kernels per device), then the timed rounds
        try:
            _run_slots(layout, work, list(range(g)))
            digests.clear()
            wall = _run_slots(layout, work, list(range(g * rounds)))
        finally:
            _close(list(runners.values()), False)
        if any(len(s) != 1 for s in digests.values()):
            raise BatchError(f"{program.name} on {g} device(s): repeated runs of one input gave different digests")
        count = g * rounds
        points.append(ThroughputPoint(program.name, g, count, wall, count / wall if wall > 0 else 0.0,
                                      digest=sorted(digests.get(0, {""}))[0]))
        log(f"throughput on {g} device(s): {count} instances in {wall:.2f} s ({count / wall:.2f}/s)")
    base = points[0]
    for p in points:
        p.speedup = p.per_second / base.per_second * base.gpus if base.per_second else 0.0
        p.efficiency = p.speedup / p.gpus
    return points


__all__ = ["BatchError", "BatchResult", "BatchSummary", "Instance", "ResidentGpus", "ResidentHost", "ThroughputPoint",
           "batch_layout",
           "gathered_outputs", "instance_line", "key_mems", "measure_throughput", "run_batch", "run_batch_distributed",
           "slot_runners"]
