"""Program-level parallelism: B independent instances of one program over G devices.

A batch is an :class:`caramel.executor.Executor` fed B instances. Instance i of a batch with seed S
uses ONE set of keys for the whole batch (from the key seed K, default S, or a
:class:`~caramel.ckks.keyset.KeySet` given, e.g. from a key store) and inputs from seed S + i (or
entry i of the user's stacked inputs, :mod:`caramel.userdata`); so its output digest equals that of
``caramel run --seed S+i --key-seed K`` (:func:`caramel.api.run_program`). Inputs named by
``options.shared`` are the same in every instance (drawn once from K, or the user's unstacked
values): written once into each device, and instance i then equals ``caramel run --seed S+i
--key-seed K --shared ...``.

Layout (:func:`caramel.executor.batch_layout`): a K-chip program on G >= K devices runs G // K
instances at once, each on K devices of its own (devices jK .. jK+K-1); with G < K one instance at a
time on all G devices (several chips per device); a 1-chip program runs one instance per device.
Each slot is a resident lane of the executor (:mod:`caramel.execute.pipeline`): the keys and shared
inputs written once, every instance writing only its own rows; on a GPU several instances are in
flight (upload, replay, download overlapped). Without ``gpus`` there is one slot on the executor's
default devices.

A batch reports every instance that finished: one whose inputs are bad fails alone (``failed``),
and an interrupted batch (Ctrl-C) lets the instances already started finish, cancels the others and
returns what finished (``interrupted``), outputs included.

Backends: ``gpu`` (slots on CUDA devices), ``cpu-plan`` (slots on simulated devices: a K-chip
instance runs on K host-thread devices over the fake fabric), ``cpu`` (the reference, slots as
host threads). In process mode (``caramel launch --nproc P -- run ... --batch B``) process r takes
the instances i with i % P == r on its own device (LOCAL_RANK on the GPU, chips merged there) and
sends their records to rank 0 through the run's rendezvous (MPI, a store or a file), which prints
them all (:func:`run_batch_distributed`). On a Dask cluster, :mod:`caramel.cluster`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from caramel.ckks.bind import InputKind, requirements
from caramel.errors import CaramelError
from caramel.execute.pipeline import ResidentGpus, ResidentHost  # noqa: F401 (the slots of a K-chip instance)
from caramel.executor import batch_layout  # noqa: F401
from caramel.program import Mem, Program
from caramel.ring import Context

logger = logging.getLogger(__name__)

#: Seconds rank 0 waits for the other ranks' records in process mode.
GATHER_TIMEOUT = 3600.0


class BatchError(CaramelError):
    """A batch that cannot run as asked (sizes, layout, process mode)."""


@dataclass
class Instance:
    """One instance of a batch: its record (:meth:`record`) is what gets printed and gathered."""

    index: int
    seed: int
    digest: str
    report: Any  # CheckReport | None
    device_ids: tuple[int, ...]
    timings: dict[str, float]
    outputs: dict[str, np.ndarray] | None = None
    rank: int = 0

    @classmethod
    def of(cls, index: int, result, *, keep: bool = False, rank: int = 0) -> "Instance":
        """Instance ``index`` of a batch from its :class:`~caramel.executor.InstanceResult`; ``keep``:
        with the outputs that the executor decrypted (``decrypt=True`` or ``"limbs"``)."""
        return cls(index, result.seed, result.digest, result.report, result.device_ids, result.timings,
                   result.outputs if keep else None, rank)

    @property
    def passed(self) -> bool | None:
        return None if self.report is None else bool(self.report.passed)

    def record(self) -> dict[str, Any]:
        from caramel.results import check_record

        return {"instance": self.index, "seed": self.seed, "rank": self.rank, "devices": list(self.device_ids),
                "digest": self.digest, "passed": self.passed, "checks": check_record(self.report),
                "timings_s": {k: round(v, 6) for k, v in self.timings.items()}}


@dataclass
class BatchSummary:
    """Instances, wall time (seconds, from the first instance's start to the last one's end,
    keys excluded) and instances per second; ``slots``: instances run at once, in all ``processes``
    together."""

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
    """What :func:`run_batch` returns: per-instance records of the instances that finished (sorted
    by index), a summary, the instances that failed (index -> error) and whether the batch was
    interrupted (the instances not started then are neither finished nor failed)."""

    program: str
    n: int
    mode: str
    backend: str
    seed: int
    key_seed: int | None
    records: list[dict[str, Any]]
    summary: BatchSummary
    timings: dict[str, float] = field(default_factory=dict)  # shared phases: keys, shared, plan
    instances: list[Instance] = field(default_factory=list)  # this process's instances
    failed: dict[int, str] = field(default_factory=dict)
    interrupted: bool = False
    shared: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.summary.passed is not False and not self.failed and not self.interrupted

    def body(self) -> dict[str, Any]:
        """The JSON body (:func:`caramel.results.document` adds the environment)."""
        from dataclasses import asdict

        digests = [r["digest"] for r in self.records]
        return {"program": self.program, "n": self.n, "mode": self.mode, "backend": self.backend,
                "devices": self.summary.slots * self.summary.devices_per_instance,
                "seed": self.seed, "key_seed": self.key_seed, "batch": len(self.records) + len(self.failed),
                "shared": list(self.shared),
                "digest": digests[0] if len(digests) == 1 and not self.failed else None, "passed": self.summary.passed,
                "timings_s": {k: round(v, 6) for k, v in self.timings.items()},
                "instances": self.records,
                "failed": [{"instance": i, "error": e} for i, e in sorted(self.failed.items())],
                "interrupted": self.interrupted, "summary": asdict(self.summary)}


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


def key_mems(program: Program) -> frozenset[Mem]:
    """The limbs of the memory image that hold evaluation keys: the same in every instance of a
    batch (one key set), so that a device keeps them in place from one instance to the next."""
    req = requirements(program)
    return frozenset(Mem(term, l) for term, src in req.terms.items() if src.key is not None
                     for l in req.term_limbs[term])


def run_batch(program: Program, options=None, *, batch: int = 1, keys=None, inputs: Any = None,
              ctx: Context | None = None, indices: Sequence[int] | None = None, outputs: bool = False,
              limbs: bool = False, rank: int = 0, log: Callable[[str], None] | None = None,
              started: Callable[[], None] | None = None, **fields) -> BatchResult:
    """Run ``batch`` instances of ``program`` (module docstring) as ``options`` says
    (:class:`~caramel.options.RunOptions`, or its fields as keywords: ``gpus`` devices of
    ``backend``, ``device_ids`` instead of 0 .. G-1, ``shared`` inputs, ...) and check each by
    decryption. ``keys``: the key set (default: generated from the key seed); ``inputs``: the user's
    values (a file or a mapping, :mod:`caramel.userdata`; stacked values feed one instance each, and
    a shared input's value must be unstacked); ``indices``: the instances this call runs (default all;
    process mode passes its share); ``outputs``/``limbs``: keep each instance's decrypted outputs (and
    raw output limbs) in :attr:`Instance.outputs`; ``log``: a function of one line per event; ``started``:
    called once the executor is set up, before the first instance is submitted (process mode's ranks meet there).

    Never raises for one instance: a failed instance is in ``failed``, a Ctrl-C (KeyboardInterrupt)
    ends the batch with the instances that finished (``interrupted``); the setup's errors (keys,
    plan, devices) are raised."""
    from concurrent.futures import FIRST_COMPLETED, wait

    from caramel.executor import Executor
    from caramel.instance import run_setup
    from caramel.options import RunOptions

    opts = RunOptions.of(options, **fields)
    if batch < 1:
        raise BatchError(f"--batch must be at least 1, got {batch}")
    log = log or (lambda s: None)
    ctx, _, data = run_setup(program, opts.n, ctx, opts.check, inputs, batch)
    indices = list(range(batch)) if indices is None else list(indices)
    executor = Executor(program, opts, keys=keys, ctx=ctx, shared=shared_data(program, opts.shared, data),
                        decrypt="limbs" if limbs else outputs, log=log)
    slots, per_slot, shared = len(executor.lanes), max(1, len(executor.groups[0])), executor.shared
    log(f"{len(indices)} instance(s) on {slots} slot(s) of {per_slot} device(s); keys in "
        f"{executor.timings['keys']:.2f} s")
    futures: dict[int, Any] = {}
    interrupted = False
    start = time.perf_counter()
    try:
        if started is not None:
            started()
            start = time.perf_counter()
        for i in indices:
            futures[i] = executor.submit(instance_data(program, data, i, shared), seed=opts.seed + i)
        index_of = {f: i for i, f in futures.items()}
        pending = set(futures.values())
        while pending:
            done, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=index_of.get):
                i, exc = index_of[f], f.exception()
                log(f"instance {i}: failed: {exc}" if exc is not None else
                    f"instance {i}: {'checked' if f.result().report is not None else 'ran'}, digest "
                    f"{f.result().digest[:16]}")
    except KeyboardInterrupt:
        interrupted = True
        log("interrupted: the instances started finish, the others are cancelled")
        executor.shutdown(wait=True, cancel_futures=True)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    wall = time.perf_counter() - start
    done_instances, failed = [], {}
    for i in sorted(futures):
        f = futures[i]
        if f.cancelled() or not f.done():
            continue
        exc = f.exception()
        if exc is not None:
            failed[i] = f"{type(exc).__name__}: {exc}"
            continue
        done_instances.append(Instance.of(i, f.result(), keep=outputs or limbs, rank=rank))
    passed = _batch_verdict([x.passed for x in done_instances])
    count = len(done_instances)
    summary = BatchSummary(count, wall, count / wall if wall > 0 else 0.0, slots, per_slot, 1, passed)
    return BatchResult(program.name, int(ctx.n), opts.mode.value, executor.backend, opts.seed, opts.key_seed,
                       [x.record() for x in done_instances], summary, dict(executor.timings), done_instances, failed,
                       interrupted, shared)


def shared_data(program: Program, shared, data) -> dict[str, Any]:
    """The values that the user's ``data`` (:class:`caramel.userdata.InputData`, or None) gives to the
    inputs that ``shared`` (:attr:`RunOptions.shared <caramel.options.RunOptions.shared>`) names: one
    value each, for every instance; a shared input with one value per instance is a :class:`BatchError`."""
    if data is None:
        return {}
    from caramel.options import shared_names
    from caramel.userdata import instance_values

    kinds = requirements(program).kinds()
    values: dict[str, Any] = {}
    for name in shared_names(shared, kinds):
        if name in data.arrays:
            if data.arrays[name].ndim == (1 if kinds[name] is InputKind.SCALAR else 2):  # one value per instance
                raise BatchError(f"input {name} is shared by every instance, but {data.source} gives one value per "
                                 "instance")
            values[name] = instance_values(data, program, 0)[name]
    return values


def instance_data(program: Program, data, index: int, shared: Sequence[str]) -> dict[str, Any] | None:
    """The values that the user's ``data`` (or None) gives to instance ``index``, but for the ``shared`` inputs."""
    if data is None:
        return None
    from caramel.userdata import instance_values

    return {k: v for k, v in instance_values(data, program, index).items() if k not in shared}


# --------------------------------------------------------------------------------- process mode

@dataclass
class GatheredBatch:
    """What rank 0 of a process-mode batch holds at the end: the whole batch, and with ``outputs``
    every instance's decrypted outputs stacked in instance order (:func:`gathered_outputs`)."""

    result: BatchResult
    outputs: dict[str, np.ndarray] | None = None


def run_batch_distributed(program: Program, place, rdv, options=None, *, batch: int, outputs: bool = False,
                          limbs: bool = False, timeout: float = GATHER_TIMEOUT, inputs: Any = None, keys=None,
                          **fields) -> GatheredBatch | None:
    """This process's share of a batch in process mode: instances i with i % world == rank, on
    its own device (``place``: :func:`caramel.execute.distributed.launch_env`; on the GPU the CUDA
    device ``place.local_rank``, a K-chip program with its chips merged there; on the CPU the NumPy
    plan engine). ``rdv``: the run's :class:`~caramel.execute.rendezvous.Rendezvous`, met already
    (:meth:`~caramel.execute.rendezvous.Rendezvous.meet`); each rank sends its records (and with
    ``outputs`` its decrypted outputs) through it to rank 0, which returns the whole batch (the
    other ranks return None). ``keys``: this rank's key set (e.g. the key store's, read by each rank), else
    generated from the key seed. A rank with a failed instance raises :class:`BatchError` naming it."""
    from caramel.options import RunOptions, resolve_backend

    opts = RunOptions.of(options, **fields)
    backend = "gpu" if resolve_backend(opts.backend) == "gpu" else "cpu-plan"
    mine = [i for i in range(batch) if i % place.world == place.rank]
    gpu = backend == "gpu"
    opts = opts.with_(backend=backend, gpus=1 if gpu else None, device_ids=(place.local_rank,) if gpu else None)
    # The ranks start their instances together, their setups done (keys, plans, graphs), as one process's do.
    result = run_batch(program, opts, batch=batch, indices=mine, outputs=outputs, limbs=limbs, rank=place.rank,
                       inputs=inputs, keys=keys, started=lambda: rdv.allgather("batch-start", place.rank, timeout))
    ended = time.time()  # the epoch clock: ranks on several hosts compare their windows
    if result.failed or result.interrupted:
        what = "; ".join(f"instance {i}: {e}" for i, e in sorted(result.failed.items())) or "interrupted"
        raise BatchError(f"rank {place.rank}: {what}")
    part: dict[str, Any] = {"world": place.world, "records": result.records,
                            "window": (ended - result.summary.wall_s, ended)}
    if outputs or limbs:
        from caramel.userdata import stack_outputs

        arrays = {"instances": np.asarray([x.index for x in result.instances], dtype=np.int64)}
        if result.instances:
            per = [x.outputs for x in result.instances]
            arrays.update({k: (v[None] if len(per) == 1 and not k.endswith(".limbs") else v)
                           for k, v in stack_outputs(per).items()})
        part["outputs"] = arrays
    parts = rdv.gather("batch", part, timeout)
    if parts is None:
        return None
    records: list[dict] = []
    for r, p in enumerate(parts):
        if p.get("world") != place.world:
            raise BatchError(f"rank {r} ran a batch of {p.get('world')} processes, this run has {place.world}")
        records += p["records"]
    records.sort(key=lambda r: r["instance"])
    if [r["instance"] for r in records] != list(range(batch)):
        raise BatchError(f"the ranks returned instances {[r['instance'] for r in records]}, expected 0..{batch - 1}")
    # As in one process, the batch's wall runs from the first instance's start to the last one's end (setup
    # excluded): the union of the ranks' windows.
    start = min(p["window"][0] for p in parts)
    wall = max(p["window"][1] for p in parts) - start
    windows = (f"rank {r} {p['window'][0] - start:.3f}..{p['window'][1] - start:.3f} s" for r, p in enumerate(parts))
    logger.debug("the ranks' windows: %s", ", ".join(windows))
    passed = _batch_verdict([r["passed"] for r in records])
    result.records = records
    result.summary = BatchSummary(batch, wall, batch / wall if wall > 0 else 0.0, place.world, 1, place.world, passed)
    merged = gathered_outputs([p["outputs"] for p in parts], batch) if outputs or limbs else None
    return GatheredBatch(result, merged)


def gathered_outputs(parts: Sequence[Mapping[str, np.ndarray]], batch: int) -> dict[str, np.ndarray]:
    """Every rank's outputs (``parts[r]``: rank r's arrays, with ``instances``, the indices of its
    instances) merged into one array per name, stacked in instance order."""
    merged: dict[str, np.ndarray] = {}
    order = np.concatenate([np.asarray(p["instances"], dtype=np.int64) for p in parts])
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
    speedup: float | None = None  # rate(G) / rate(1); None without a one-device point
    efficiency: float | None = None  # speedup / G
    digest: str = ""


def measure_throughput(program: Program, gpus: Sequence[int], options=None, *, rounds: int = 2,
                       log: Callable[[str], None] | None = None, **fields) -> list[ThroughputPoint]:
    """Instances per second of ``program`` on each device count of ``gpus`` (an
    :class:`~caramel.executor.Executor` on G devices; G instances' inputs encrypted before timing, from
    seeds ``seed .. seed+G-1``, each submitted ``rounds`` times after one untimed round; inputs named by
    ``options.shared`` resident). ``options``: :class:`~caramel.options.RunOptions` or its fields (the
    check is off). Speedup = rate(G) / rate(1), efficiency = speedup / G, both None when ``gpus`` has no 1. Every
    run of one input must have the digest of its first run."""
    from caramel.ckks.device import resolve as client_device, using as using_client
    from caramel.ckks.keyset import generate_keyset
    from caramel.executor import Executor
    from caramel.options import RunOptions, resolve_backend

    log = log or (lambda s: None)
    opts = RunOptions.of(options, **fields)
    backend = resolve_backend(opts.backend)
    backend = "cpu-plan" if opts.backend == "auto" and backend == "cpu" else backend
    opts = opts.with_(backend=backend, check=None)
    ctx = Context(n=opts.n)
    with using_client(client_device(opts.client, backend)):
        keys = generate_keyset(program, ctx, opts.keys_seed)
    points: list[ThroughputPoint] = []
    for g in gpus:
        with Executor(program, opts.with_(gpus=g), keys=keys, ctx=ctx) as ex:
            images = [ex.encrypt(seed=opts.seed + d) for d in range(g)]
            first = [r.digest for r in ex.map(images)]  # untimed: every lane's first instance
            start = time.perf_counter()
            digests = [r.digest for r in ex.map([images[k % g] for k in range(g * rounds)])]
            wall = time.perf_counter() - start
        if any(d != first[k % g] for k, d in enumerate(digests)):
            raise BatchError(f"{program.name} on {g} device(s): repeated runs of one input gave different digests")
        count = g * rounds
        points.append(ThroughputPoint(program.name, g, count, wall, count / wall if wall > 0 else 0.0, digest=first[0]))
        log(f"throughput on {g} device(s): {count} instances in {wall:.2f} s ({count / wall:.2f}/s)")
    base = next((p for p in points if p.gpus == 1 and p.per_second), None)
    if base is not None:
        for p in points:
            p.speedup = p.per_second / base.per_second
            p.efficiency = p.speedup / p.gpus
    return points


__all__ = ["BatchError", "BatchResult", "BatchSummary", "GatheredBatch", "Instance", "ResidentGpus", "ResidentHost",
           "ThroughputPoint", "batch_layout", "gathered_outputs", "instance_data", "instance_line", "key_mems",
           "measure_throughput", "run_batch", "run_batch_distributed", "shared_data"]
