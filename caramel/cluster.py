"""Instances and partitioned programs on a Dask cluster (``pip install -e '.[cluster]'`` in the clone).

:class:`ClusterExecutor` runs one program on the workers of a Dask cluster (a scheduler address,
a :class:`distributed.Client` or cluster object such as dask-jobqueue's ``SLURMCluster``, or
``"local"``: :func:`local_cluster`, one worker process per GPU or per simulated device):

* **Instances** (:meth:`~ClusterExecutor.submit`, :meth:`~ClusterExecutor.map`,
  :meth:`~ClusterExecutor.run_batch`): instance i (inputs from seed S + i, one key set from the
  key seed) is one Dask task. The job (program, options, keys given) goes to every worker once;
  each worker keeps one *resident runner* per device slot in its :class:`CaramelPlugin` (keys
  made or uploaded once, the CUDA graph captured once, reused by every later instance:
  :func:`make_runner`). Tasks go to free workers as they finish and the results stream back as
  they complete; a worker lost mid-batch has its instances run again elsewhere (Dask reschedules
  them), and each instance is reported once. The digests are those of ``caramel run --seed S+i``.
* **Partitioned programs** (:meth:`~ClusterExecutor.run_partitioned`): a K-chip program as K
  ranks on K workers, one task each, pinned to its worker. They meet and exchange the NCCL ids,
  the CPU backend's limbs and the results worker to worker over Dask's comms
  (:mod:`caramel.execute.rendezvous.dask_comms`); rank 0 checks and returns the digest. When a
  rank fails or its worker is lost, the run fails within seconds naming the rank, and the other
  ranks are aborted (their mailboxes, and on GPUs their NCCL communicators) so that their workers
  are free again.

Before any work, every worker is asked for its caramel version and the digest of its caramel
files (:func:`fingerprint`), and for its GPUs: a worker with another caramel, or without a GPU
for the ``gpu`` backend, is refused with an error naming it (:func:`check_workers`).

The worker side is two functions, :func:`make_runner` ("a resident runner for this job on these
devices") and :meth:`InstanceRunner.run` ("instance i -> its record"), over today's resident
runners (:func:`caramel.batch.slot_runners`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from caramel.errors import CaramelError
from caramel.program import Program

try:  # the plugin's base class; caramel.cluster imports without Dask (ClusterExecutor then says how to install it)
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except ImportError:  # pragma: no cover
    _WorkerPlugin = object

LOG = logging.getLogger("caramel.cluster")
#: The plugin's name on every worker.
PLUGIN = "caramel"
#: Seconds between two looks at a partitioned run's ranks and workers.
WATCH_SECONDS = 0.2
#: Seconds the client waits for the other ranks to stop after one failed.
STOP_SECONDS = 30.0
#: Seconds the client waits, after a rank failed, for the scheduler to tell whether a worker was lost.
LOSS_SECONDS = 2.0
INSTALL = "in the caramel clone: pip install -e '.[cluster]'"


class ClusterError(CaramelError):
    """A cluster that cannot run the work as asked, a refused worker, or a failed rank."""


def _distributed():
    try:
        import distributed
    except ImportError as exc:
        raise ClusterError(f"--cluster needs Dask's distributed scheduler ({INSTALL}): {exc}") from None
    return distributed


# ------------------------------------------------------------------------------------ workers

def fingerprint() -> str:
    """SHA-256 over caramel's own files (sources, grammar, check files): two processes with the same
    fingerprint run the same caramel, bit for bit."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in (".py", ".lark", ".toml") and p.is_file()):
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _version() -> str:
    import caramel.version

    return caramel.version.__version__


def worker_info() -> dict:
    """What a worker says of itself (run there by :meth:`ClusterExecutor.workers`): caramel's
    version and :func:`fingerprint`, its host and its usable GPUs (0 without CuPy or a GPU)."""
    import socket

    gpus = 0
    try:
        from caramel.api import gpu_available

        if gpu_available():
            import cupy as cp

            gpus = int(cp.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 (a broken CUDA install is "no GPU" here; the error names the worker)
        gpus = 0
    return {"version": _version(), "fingerprint": fingerprint(), "host": socket.gethostname(), "gpus": gpus,
            "pid": os.getpid()}


@dataclass(frozen=True)
class WorkerInfo:
    """One worker of the cluster (:func:`worker_info`)."""

    address: str
    host: str
    version: str
    fingerprint: str
    gpus: int


def check_workers(workers: Sequence[WorkerInfo], backend: str, version: str, digest: str) -> None:
    """Refuse the cluster when a worker runs another caramel (``version``, files ``digest``) or,
    for the ``gpu`` backend, has no GPU; the error names every such worker."""
    if not workers:
        raise ClusterError("the cluster has no workers")
    other = [w for w in workers if (w.version, w.fingerprint) != (version, digest)]
    if other:
        named = ", ".join(f"{w.address} (caramel {w.version}, files {w.fingerprint[:12]})" for w in other[:8])
        raise ClusterError(f"{len(other)} worker(s) run another caramel than this client (caramel {version}, files "
                           f"{digest[:12]}): {named}; install the same caramel on every worker")
    if backend == "gpu":
        bare = [w for w in workers if w.gpus < 1]
        if bare:
            named = ", ".join(f"{w.address} on {w.host}" for w in bare[:8])
            raise ClusterError(f"backend 'gpu' needs a GPU on every worker; {len(bare)} have none (no CuPy or no CUDA "
                               f"device): {named}")


def local_cluster(workers: int, backend: str, *, threads: int = 1, quiet: bool = True):
    """A Dask cluster on this machine: ``workers`` worker processes (Dask nannies, restarted when
    one dies) of ``threads`` threads; on the ``gpu`` backend worker i sees only GPU i
    (``CUDA_VISIBLE_DEVICES``, of those visible to this process). No dashboard, no memory limit."""
    distributed = _distributed()
    if workers < 1:
        raise ClusterError(f"a local cluster needs at least one worker, got {workers}")
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    specs = {}
    for i in range(workers):
        env = {}
        if backend == "gpu":
            env["CUDA_VISIBLE_DEVICES"] = visible[i] if i < len(visible) else str(i)
        specs[f"caramel-{i}"] = {"cls": distributed.Nanny,
                                 "options": {"nthreads": threads, "env": env, "memory_limit": 0, "host": "127.0.0.1",
                                             "dashboard": False, "name": f"caramel-{i}",
                                             "silence_logs": logging.ERROR if quiet else logging.WARNING}}
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": None, "host": "127.0.0.1"}}
    return distributed.SpecCluster(workers=specs, scheduler=scheduler, name="caramel",
                                   silence_logs=logging.ERROR if quiet else logging.WARNING)


# ------------------------------------------------------------------------------------ the job

@dataclass(frozen=True)
class Job:
    """What a worker needs to run instances or ranks of one program; shipped once per worker."""

    token: str
    program: Program
    n: int
    mode: str
    backend: str  # resolved: gpu, cpu-plan or cpu
    seed: int
    key_seed: int | None
    keys: Any  # a KeySet to use instead of generating one (from a key store), or None
    spec: Any  # the CheckSpec (None: random inputs, not judged)
    data: Any  # the user's InputData, or None
    streams: int | None
    outputs: bool
    limbs: bool
    fingerprint: str
    timeout: float = 300.0


def _check_here(job: Job, plugin: "CaramelPlugin") -> None:
    """The worker runs the client's caramel (a worker that joined after the check)."""
    mine = plugin.fingerprint
    if mine != job.fingerprint:
        raise ClusterError(f"this worker runs caramel {_version()} with files {mine[:12]}, the client "
                           f"{job.fingerprint[:12]}: install the same caramel on every worker")


class InstanceRunner:
    """Instances of one job on one device slot of a worker, resident (:func:`make_runner`): the
    keys are made (or taken from the job) once, the slot's runner is made once
    (:func:`caramel.batch.slot_runners`), and :meth:`run` encrypts, runs, checks instance i."""

    def __init__(self, job: Job, devices: tuple[int, ...]):
        from caramel.api import key_seed_for
        from caramel.batch import slot_runners
        from caramel.ckks.device import resolve as client_device, using as using_client
        from caramel.ckks.keyset import generate_keyset
        from caramel.ring import Context, Mode

        self.job, self.devices = job, devices
        self.ctx = Context(n=job.n)
        self.mode = Mode(job.mode)
        self.client = client_device(None, job.backend)
        t0 = time.perf_counter()
        keys = job.keys
        if keys is None:
            with using_client(self.client):
                keys = generate_keyset(job.program, self.ctx, key_seed_for(job.seed, job.key_seed))
        self.keys = keys
        self.setup = {"keys": time.perf_counter() - t0}
        t0 = time.perf_counter()
        self.slot = slot_runners(job.program, self.ctx, self.mode, job.backend, [devices], job.streams)[0]
        self.setup["plan"] = time.perf_counter() - t0

    def run(self, index: int):
        """Instance ``index``: its :class:`caramel.batch.Instance` (record, report, outputs)."""
        from caramel.api import default_spec, output_digest, prepare_inputs
        from caramel.batch import Instance
        from caramel.ckks.check import evaluate_check
        from caramel.ckks.device import using as using_client

        job = self.job
        times: dict[str, float] = {}
        t = time.perf_counter()
        supplied = None
        if job.data is not None:
            from caramel.userdata import instance_values

            supplied = instance_values(job.data, job.program, index)
        with using_client(self.client):
            prepared = prepare_inputs(job.program, self.ctx, self.keys, job.seed + index,
                                      job.spec or default_spec(job.program), supplied)
        times["encrypt"] = time.perf_counter() - t
        t = time.perf_counter()
        result = self.slot(prepared.memory)
        times["run"] = time.perf_counter() - t
        t = time.perf_counter()
        kept = None
        if job.outputs or job.limbs:
            from caramel.userdata import decrypted_outputs

            kept = decrypted_outputs(prepared, result.memory, limbs=job.limbs)
            times["decrypt"] = time.perf_counter() - t
            t = time.perf_counter()
        with using_client(self.client):
            report = evaluate_check(prepared, result.memory, self.mode) if job.spec is not None else None
        digest = output_digest(job.program, result.memory)
        times["check"] = time.perf_counter() - t
        return Instance(index, job.seed + index, digest, report, self.devices, times, kept)

    def close(self, failed: bool = False) -> None:
        close = getattr(self.slot, "close", None)
        if close is not None:
            close(failed)


def make_runner(job: Job, devices: tuple[int, ...]) -> InstanceRunner:
    """A resident runner of ``job`` on this worker's ``devices`` (the CUDA devices of one slot; empty
    on the CPU backends)."""
    return InstanceRunner(job, devices)


def _slots(job: Job) -> list[tuple[int, ...]]:
    """This worker's device slots for ``job``: on the GPU :func:`caramel.batch.batch_layout` over
    its visible GPUs (a K-chip program on fewer GPUs merges its chips); one slot on the CPU."""
    if job.backend != "gpu":
        return [()]
    import cupy as cp

    from caramel.batch import batch_layout

    return batch_layout(job.program.chips, int(cp.cuda.runtime.getDeviceCount()))


class _Pool:
    """The resident runners of one job on one worker: one per slot, made on first use, lent to one
    task at a time."""

    def __init__(self, job: Job):
        self.job = job
        self.free: queue.Queue = queue.Queue()
        for slot in _slots(job):
            self.free.put(slot)
        self.runners: dict[tuple[int, ...], InstanceRunner] = {}
        self.lock = threading.Lock()

    def run(self, index: int):
        slot = self.free.get()
        try:
            runner = self.runners.get(slot)
            made = runner is None
            if made:
                runner = self.runners[slot] = make_runner(self.job, slot)
            instance = runner.run(index)
            if made:  # the slot's keys and plan, counted once, with its first instance
                instance.timings = {**runner.setup, **instance.timings}
            return instance
        finally:
            self.free.put(slot)

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()
        self.runners.clear()


class CaramelPlugin(_WorkerPlugin):
    """caramel's state on a Dask worker (a worker plugin, registered as :data:`PLUGIN`): the
    resident runners of each job, by its token, until the client closes the job; and the
    mailboxes of the ranks of partitioned runs (:class:`~caramel.execute.rendezvous.dask_comms.PostOffice`)."""

    name = PLUGIN

    def setup(self, worker) -> None:
        from caramel.execute.rendezvous.dask_comms import PostOffice

        self.worker = worker
        self.fingerprint = fingerprint()  # this worker's caramel, compared with each job's
        self.pools: dict[str, _Pool] = {}
        self.lock = threading.Lock()
        self.office = PostOffice()
        self.office.install(worker)

    def pool(self, job: Job) -> _Pool:
        with self.lock:
            if job.token not in self.pools:
                self.pools[job.token] = _Pool(job)
            return self.pools[job.token]

    def close_job(self, token: str) -> bool:
        with self.lock:
            pool = self.pools.pop(token, None)
        if pool is not None:
            pool.close()
        return pool is not None

    def teardown(self, worker) -> None:
        for token in list(getattr(self, "pools", {})):
            self.close_job(token)


def _plugin(worker) -> CaramelPlugin:
    plugin = worker.plugins.get(PLUGIN)
    if plugin is None:
        raise ClusterError(f"worker {worker.address} has no caramel plugin (registered by ClusterExecutor)")
    return plugin


def run_instance(job: Job, index: int):
    """The task of instance ``index`` (on a worker): (the worker's address, its Instance)."""
    from distributed import get_worker

    worker = get_worker()
    plugin = _plugin(worker)
    _check_here(job, plugin)
    return worker.address, plugin.pool(job).run(index)


def _abort_rank(token: str, rank: int, origin: int | None, reason: str, dask_worker=None) -> None:
    """Abort rank ``rank`` of run ``token`` on this worker (the client stops a run; :func:`run_rank`)."""
    plugin = dask_worker.plugins.get(PLUGIN) if dask_worker is not None else None
    box = plugin.office.box(token, rank) if plugin is not None else None
    if box is not None:
        box.abort(origin, reason)


def _has_plugin(dask_worker=None) -> bool:
    return dask_worker is not None and PLUGIN in dask_worker.plugins


def _close_job(token: str, dask_worker=None) -> bool:
    plugin = dask_worker.plugins.get(PLUGIN) if dask_worker is not None else None
    return plugin.close_job(token) if plugin is not None else False


# ------------------------------------------------------------------------------------ partitioned

@dataclass
class PartitionedRun:
    """One run of a partitioned program on a cluster: its digest and check (rank 0's), per rank
    its worker, and the seconds of the whole run (meeting, keys, run, gathering) as the client saw it."""

    program: str
    backend: str
    ranks: int
    digest: str
    report: Any
    workers: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)


def run_rank(job: Job, rank: int, addresses: Sequence[str], device: int = 0) -> PartitionedRun | None:
    """The task of rank ``rank`` of a partitioned run (on its worker, on its CUDA ``device``): meet
    the others, make the keys and inputs of ``caramel run --seed S``, run this rank's chips
    (:func:`caramel.execute.distributed.run_distributed`); rank 0 returns the checked result."""
    from caramel.api import key_seed_for, output_digest, prepare_inputs
    from caramel.ckks.check import evaluate_check
    from caramel.ckks.device import resolve as client_device, using as using_client
    from caramel.ckks.keyset import generate_keyset
    from caramel.execute.distributed import Place, run_distributed
    from caramel.execute.rendezvous import RunIdentity
    from caramel.execute.rendezvous.dask_comms import DaskRendezvous
    from distributed import get_worker
    from caramel.plan_cache import cached_plan
    from caramel.ring import Context, Mode

    worker = get_worker()
    plugin = _plugin(worker)
    _check_here(job, plugin)
    world = len(addresses)
    place = Place(rank, world, device, None, job.token)
    backend = "gpu" if job.backend == "gpu" else "cpu-plan"
    identity = RunIdentity(job.fingerprint, job.n, job.mode, job.seed, world, backend, None, job.key_seed)
    timings: dict[str, float] = {}
    with DaskRendezvous(rank, addresses, job.token, worker, plugin.office, job.timeout) as rdv:
        # (a failure in this block aborts the other ranks)
        t = time.perf_counter()
        rdv.meet(identity, job.timeout)
        timings["meet"] = time.perf_counter() - t
        t = time.perf_counter()
        ctx = Context(n=job.n)
        client = client_device(None, backend)
        supplied = None
        if job.data is not None:
            from caramel.userdata import instance_values

            supplied = instance_values(job.data, job.program, 0)
        with using_client(client):
            keys = job.keys or generate_keyset(job.program, ctx, key_seed_for(job.seed, job.key_seed))
            prepared = prepare_inputs(job.program, ctx, keys, job.seed, job.spec, supplied)
        timings["keys"] = time.perf_counter() - t
        t = time.perf_counter()
        result = run_distributed(cached_plan(job.program), ctx, prepared.memory, Mode(job.mode), place, rdv,
                                 backend=backend, streams=job.streams, timeout=job.timeout)
        timings["run"] = time.perf_counter() - t
    if result is None:
        return None
    with using_client(client):
        report = evaluate_check(prepared, result.memory, Mode(job.mode)) if job.spec is not None else None
    return PartitionedRun(job.program.name, backend, world, output_digest(job.program, result.memory), report,
                          timings=timings)


# ------------------------------------------------------------------------------------ the executor

class ClusterExecutor:
    """``program`` on a Dask cluster (module docstring), in the shape of
    :class:`concurrent.futures.Executor`: :meth:`submit` (instance i -> a future),
    :meth:`map` (instances -> their results as they complete, or in order), plus
    :meth:`run_batch` and :meth:`run_partitioned`; a context manager (:meth:`close`).

    ``cluster``: ``"local"`` (:func:`local_cluster` of ``gpus`` workers: default, for a ``batch``, one
    per GPU on the ``gpu`` backend, else one per CPU core, at most ``batch``; without a batch one per
    chip, at most one per GPU), a scheduler address, a
    ``distributed.Client`` or a Dask cluster object (dask-jobqueue's ``SLURMCluster``, say); with an
    address or a cluster, ``gpus`` uses the first ``gpus`` workers (by address) of a partitioned
    run. The other options are :func:`caramel.batch.run_batch`'s; ``keys``: a KeySet shipped to
    every worker instead of one generated there from the key seed. ``timeout``: seconds a rank
    waits for another."""

    def __init__(self, program: Program, *, cluster: Any = "local", gpus: int | None = None, n: int = 65536,
                 mode: str = "exact", backend: str = "auto", seed: int = 0, key_seed: int | None = None, keys=None,
                 check: Any = "auto", streams: int | None = None, inputs: Any = None, outputs: bool = False,
                 limbs: bool = False, timeout: float = 300.0, batch: int | None = None):
        from caramel.api import resolve_backend, run_setup
        from caramel.ring import Mode

        distributed = _distributed()
        if not isinstance(program, Program):
            raise ClusterError(f"ClusterExecutor needs a Program (caramel.load_program), got {type(program).__name__}")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
            raise ClusterError(f"gpus must be a positive integer, got {gpus!r}")
        self.program, self.gpus = program, gpus
        # "auto" on a local cluster is this machine's choice; on another cluster its workers' (below)
        local = isinstance(cluster, str) and cluster == "local"
        self.backend = resolve_backend(backend) if backend != "auto" or local else "auto"
        ctx, spec, data = run_setup(program, n, None, check, inputs, batch)
        if keys is not None:
            from caramel.ckks.keyset import KeySet

            keys = KeySet(keys.secrets, dict(keys.keys))  # every key read now: the whole set is shipped
        self._fingerprint = fingerprint()
        self._cluster = None
        self._own_client = True
        if local:
            self._cluster = local_cluster(self._local_workers(batch), self.backend)
            self.client = distributed.Client(self._cluster)
        elif isinstance(cluster, distributed.Client):
            self.client, self._own_client = cluster, False
        elif isinstance(cluster, str):
            try:
                self.client = distributed.Client(cluster, timeout=30)
            except (OSError, TimeoutError) as exc:
                raise ClusterError(f"cannot reach the Dask scheduler at {cluster}: {exc}") from None
        else:
            self.client = distributed.Client(cluster)
        self._job = None
        self.job = None
        self._closed = False
        self.where: dict[int, str] = {}  # instance index -> the address of the worker that ran it
        try:
            self.infos = self.workers()
            if self.backend == "auto":  # the GPU when every worker has one, as `caramel run` on one machine
                self.backend = "gpu" if self.infos and all(w.gpus > 0 for w in self.infos) else "cpu"
            check_workers(self.infos, self.backend, _version(), self._fingerprint)
        except BaseException:
            self.close()
            raise
        self.job = Job(uuid.uuid4().hex, program, int(ctx.n), Mode(mode).value, self.backend, seed, key_seed, keys,
                       spec, data, streams, outputs, limbs, self._fingerprint, timeout)

    def _local_workers(self, batch: int | None) -> int:
        if self.gpus is not None:
            return self.gpus
        if batch is None:  # a partitioned run: one worker per chip, at most one per GPU
            if self.backend != "gpu":
                return self.program.chips
            import cupy as cp

            return max(1, min(self.program.chips, int(cp.cuda.runtime.getDeviceCount())))
        if self.backend == "gpu":
            import cupy as cp

            return int(cp.cuda.runtime.getDeviceCount())
        return max(1, min(os.cpu_count() or 1, batch))

    def workers(self) -> list[WorkerInfo]:
        """Every worker of the cluster now (sorted by address), as it describes itself."""
        found = self.client.run(worker_info)
        return [WorkerInfo(a, i["host"], i["version"], i["fingerprint"], int(i["gpus"]))
                for a, i in sorted(found.items())]

    # ---------------------------------------------------------------- instances

    def _plugin(self) -> None:
        """caramel's plugin on every worker (registered once per cluster; new workers get it too)."""
        has = self.client.run(_has_plugin)
        if not all(has.values()):
            self.client.register_plugin(CaramelPlugin(), name=PLUGIN)

    def _shipped(self):
        """The job on every worker (once), and the plugin that keeps its runners."""
        if self._job is None:
            self._plugin()
            self._job = self.client.scatter(self.job, broadcast=True, hash=False)
        return self._job

    def submit(self, index: int):
        """Instance ``index`` as a Dask future of (worker address, :class:`caramel.batch.Instance`)."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ClusterError(f"an instance index is an integer >= 0, got {index!r}")
        return self.client.submit(run_instance, self._shipped(), index,
                                  key=f"caramel-{self.job.token}-instance-{index}")

    def map(self, indices: Iterable[int], *, ordered: bool = True, timeout: float | None = None) -> Iterator:
        """The :class:`caramel.batch.Instance` of every index, each once: in index order
        (``ordered``) or as they complete. The instances run as workers free up. ``timeout``:
        seconds for them all (None: no limit)."""
        distributed = _distributed()
        indices = list(indices)
        if len(set(indices)) != len(indices):
            raise ClusterError("an instance index appears twice")
        futures = {self.submit(i): i for i in indices}
        ranks = {w.address: k for k, w in enumerate(self.infos)}
        done: dict[int, Any] = {}
        next_index = 0
        try:
            for future in _completed(distributed, list(futures), timeout):  # each future once, as it completes
                i = futures.pop(future)
                address, instance = future.result()
                future.release()
                instance.rank = ranks.setdefault(address, len(ranks))  # a restarted worker: a new number
                self.where[i] = address
                done[i] = instance
                if not ordered:
                    yield instance
                    continue
                while next_index < len(indices) and indices[next_index] in done:
                    yield done.pop(indices[next_index])
                    next_index += 1
        finally:
            for future in futures:
                future.cancel()

    def run_batch(self, batch: int, *, log=None, timeout: float | None = None):
        """``batch`` instances (seeds S .. S+batch-1) on the cluster: a :class:`caramel.batch.BatchResult`
        (records sorted by index, one per instance, each from the worker that ran it); ``timeout``
        as :meth:`map`."""
        from caramel.batch import BatchError, BatchResult, BatchSummary, _batch_verdict

        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise BatchError(f"--batch must be at least 1, got {batch}")
        if self.job.data is not None:
            from caramel.userdata import check_inputs

            check_inputs(self.job.data, self.program, self.job.n // 2, batch=batch)
        log = log or (lambda s: None)
        start = time.perf_counter()
        instances = []
        for instance in self.map(range(batch), ordered=False, timeout=timeout):
            instances.append(instance)
            log(f"instance {instance.index}: digest {instance.digest[:16]} (worker {instance.rank})")
        wall = time.perf_counter() - start
        instances.sort(key=lambda x: x.index)
        if [x.index for x in instances] != list(range(batch)):
            raise ClusterError(f"the cluster returned instances {[x.index for x in instances]}, "
                               f"expected 0..{batch - 1}")
        layouts = [_slots_of(w, self.job) for w in self.infos]
        summary = BatchSummary(batch, wall, batch / wall if wall > 0 else 0.0, sum(len(l) for l in layouts),
                               max(1, max(len(l[0]) for l in layouts)), len(self.infos),
                               _batch_verdict([x.passed for x in instances]))
        records = [{**x.record(), "worker": self.where.get(x.index)} for x in instances]
        return BatchResult(self.program.name, self.job.n, self.job.mode, self.backend, self.job.seed, self.job.key_seed,
                           records, summary, {}, instances)

    # ---------------------------------------------------------------- partitioned

    def run_partitioned(self, *, timeout: float | None = None) -> PartitionedRun:
        """One run of the program as ranks on distinct workers (module docstring): ``gpus`` ranks
        (default one per chip, at most one per worker), rank r on the r-th worker. Fails within
        seconds, naming the rank, when a rank fails or its worker is lost, after aborting the other ranks; ``timeout``:
        seconds for the whole run (None: no limit beyond each rank's waits)."""
        chips = self.program.chips
        ranks = self.gpus or min(chips, len(self.infos))  # fewer workers than chips: several chips per rank
        if ranks > chips:
            raise ClusterError(f"{ranks} ranks for {self.program.name}, a {chips}-chip program: use at most {chips}")
        if ranks > len(self.infos):
            raise ClusterError(f"{self.program.name} as {ranks} ranks needs {ranks} workers; the cluster has "
                               f"{len(self.infos)}")
        self._plugin()
        job = replace(self.job, token=uuid.uuid4().hex)
        workers = [w.address for w in self.infos[:ranks]]
        devices = rank_devices(self.infos[:ranks])
        start = time.perf_counter()
        shipped = self.client.scatter(job, workers=workers, broadcast=True, hash=False)
        futures = [self.client.submit(run_rank, shipped, r, workers, devices[r], workers=[w], allow_other_workers=False,
                                      key=f"caramel-{job.token}-rank-{r}") for r, w in enumerate(workers)]
        try:
            self._watch(job.token, futures, workers, None if timeout is None else time.monotonic() + timeout)
            out = futures[0].result()
        finally:
            for f in futures:
                f.cancel()
            del shipped
        out.workers, out.seconds = workers, time.perf_counter() - start
        return out

    def _watch(self, token: str, futures, workers: Sequence[str], deadline: float | None) -> None:
        """Wait for every rank; on the first that fails or whose worker leaves, abort the others
        (their mailboxes), wait for them to stop, and raise naming it: a rank whose worker was lost
        first, else one that failed of itself (not because another did)."""
        from caramel.execute.rendezvous import PeerFailed

        troubled = None
        while True:
            present = set(self.client.scheduler_info().get("workers", {}))
            lost = [r for r, (f, w) in enumerate(zip(futures, workers)) if w not in present or f.status == "lost"]
            failed = [r for r, f in enumerate(futures) if f.status == "error"]
            if lost or failed:
                troubled = troubled or time.monotonic()
                # a rank fails at once when it cannot reach a lost one: give the scheduler a moment to see the loss
                if lost or time.monotonic() - troubled > LOSS_SECONDS:
                    break
            elif all(f.done() for f in futures):
                return
            if deadline is not None and time.monotonic() > deadline:
                self._stop_ranks(token, futures, workers, set(), None, "the run did not finish in time")
                raise ClusterError(f"the run did not finish in time; stopped its {len(futures)} rank(s)")
            time.sleep(WATCH_SECONDS)
        if lost:
            r = lost[0]
            reason = f"rank {r} was lost with its worker {workers[r]} (the worker died or left the cluster)"
        else:
            errors = {r: futures[r].exception() for r in failed}
            r = next((r for r in failed if not isinstance(errors[r], PeerFailed)), failed[0])
            reason = f"rank {r} failed on worker {workers[r]}: {errors[r]}"
        self._stop_ranks(token, futures, workers, set(lost), r, reason)
        raise ClusterError(f"{reason}; stopped the other {len(futures) - 1} rank(s)")

    def _stop_ranks(self, token: str, futures, workers: Sequence[str], lost: set, failed: int | None,
                    reason: str) -> None:
        """Abort the ranks still running (not ``lost``) on their workers, and wait for them to end."""
        running = [r for r, f in enumerate(futures) if r not in lost and r != failed and not f.done()]
        for r in running:
            try:
                self.client.run(_abort_rank, token, r, failed, reason, workers=[workers[r]], on_error="return")
            except Exception:  # noqa: BLE001 (that worker may be going too)
                pass
        deadline = time.monotonic() + STOP_SECONDS
        while time.monotonic() < deadline and not all(futures[r].done() for r in running):
            time.sleep(WATCH_SECONDS)

    # ---------------------------------------------------------------- end

    def close(self) -> None:
        """Release the job's runners on every worker, then the client and the local cluster (if made here)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._job is not None and self.job is not None:
                try:
                    self.client.run(_close_job, self.job.token)
                except Exception:  # noqa: BLE001 (a worker going away has nothing left to close)
                    pass
                self._job = None
        finally:
            if self._own_client:
                self.client.close()
            if self._cluster is not None:
                self._cluster.close()

    def __enter__(self) -> "ClusterExecutor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def rank_devices(workers: Sequence[WorkerInfo]) -> list[int]:
    """The CUDA device of each rank (rank r on ``workers[r]``): 0 on a worker that sees one GPU (one
    worker per GPU, the layout to use); on workers that see several, the ranks on one host take
    their devices in turn (0, 1, ...), so that two workers of one host never share a GPU."""
    seen: dict[str, int] = {}
    out = []
    for w in workers:
        k = seen.get(w.host, 0)
        seen[w.host] = k + 1
        out.append(k % w.gpus if w.gpus > 1 else 0)
    return out


def _completed(distributed, futures, timeout: float | None):
    """``distributed.as_completed`` with a clear error when ``timeout`` seconds pass."""
    try:
        yield from distributed.as_completed(futures, timeout=timeout)
    except distributed.TimeoutError:
        raise ClusterError(f"the instances did not finish in {timeout:g} s") from None


def _slots_of(info: WorkerInfo, job: Job) -> list[tuple[int, ...]]:
    if job.backend != "gpu":
        return [()]
    from caramel.batch import batch_layout

    return batch_layout(job.program.chips, max(1, info.gpus))


__all__ = ["CaramelPlugin", "ClusterError", "ClusterExecutor", "InstanceRunner", "Job", "PartitionedRun", "WorkerInfo",
           "check_workers", "fingerprint", "local_cluster", "make_runner", "rank_devices", "run_instance", "run_rank",
           "worker_info"]
