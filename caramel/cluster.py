"""Instances and partitioned programs on a Dask cluster (``pip install -e '.[cluster]'`` in the clone).

:class:`ClusterExecutor` runs one program on the workers of a Dask cluster (a scheduler address,
a :class:`distributed.Client` or cluster object such as dask-jobqueue's ``SLURMCluster``, or
``"local"``: :func:`local_cluster`, one worker process per GPU or per simulated device), with the
options of every driver (:class:`~caramel.options.RunOptions`):

* **Instances** (:meth:`~ClusterExecutor.submit`, :meth:`~ClusterExecutor.map`,
  :meth:`~ClusterExecutor.run_batch`): instance i (inputs from seed S + i, or entry i of the
  user's inputs; one key set from the key seed, or the keys given) is one Dask task. The job
  (program, options, keys and shared inputs given) goes to every worker once; each worker holds
  one :class:`caramel.Executor` for it (:class:`WorkerJob`), made by its first instance over every
  GPU the worker sees: keys made (or uploaded) once, shared inputs drawn and written once, the
  CUDA graphs captured once, one lane per device slot. Each task submits its instance to that
  executor and waits for it, so a worker runs as many instances at once as it has threads (a
  local GPU cluster gives each worker :func:`caramel.executor.capacity` threads, enough to keep
  its executor's pipeline full). Tasks go to free workers as they finish and the results stream
  back as they complete; a worker lost mid-batch has its instances run again elsewhere (Dask
  reschedules them), and each instance is reported once. Instance i has the digest of instance i
  of :func:`caramel.batch.run_batch` on one machine, i.e. of ``caramel run --seed S+i``.
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
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from caramel import cores
from caramel.errors import CaramelError
from caramel.options import RunOptions, ranks_fuse
from caramel.program import Program

try:  # the plugin's base class; caramel.cluster imports without Dask (ClusterExecutor then says how to install it)
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except ImportError:  # pragma: no cover
    _WorkerPlugin = object

LOG = logging.getLogger("caramel.cluster")
#: The plugin's name on every worker.
PLUGIN = "caramel"
#: Closed jobs a worker remembers, so that a late task of one makes no executor again.
CLOSED_JOBS = 1024
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


def local_cluster(workers: int, backend: str, *, threads: int | None = None,
                  device_ids: Sequence[int] | None = None, options: RunOptions | None = None, quiet: bool = True):
    """A Dask cluster on this machine: ``workers`` worker processes (Dask nannies, restarted when
    one dies) of ``threads`` threads each (default: on the ``gpu`` backend
    :func:`caramel.executor.capacity` of ``options``, the instances one GPU lane works on at once;
    else 1). On the ``gpu`` backend worker i sees only one GPU (``CUDA_VISIBLE_DEVICES``): the i-th
    of ``device_ids`` (CUDA ordinals of this process), else GPU i (of those visible to this
    process). No dashboard, no memory limit."""
    distributed = _distributed()
    if workers < 1:
        raise ClusterError(f"a local cluster needs at least one worker, got {workers}")
    if device_ids is not None and len(device_ids) < workers:
        raise ClusterError(f"{workers} local workers, {len(device_ids)} device_ids given {list(device_ids)}")
    if threads is None:
        from caramel.executor import capacity

        threads = capacity(options or RunOptions()) if backend == "gpu" else 1
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    specs = {}
    for i in range(workers):
        env = {}
        if backend == "gpu":
            d = device_ids[i] if device_ids is not None else i
            env["CUDA_VISIBLE_DEVICES"] = visible[d] if d < len(visible) else str(d)
        specs[f"caramel-{i}"] = {"cls": distributed.Nanny,
                                 "options": {"nthreads": threads, "env": env, "memory_limit": 0, "host": "127.0.0.1",
                                             "dashboard": False, "name": f"caramel-{i}",
                                             # a worker's shutdown can log a heartbeat's traceback at ERROR
                                             # (its scheduler closing first): errors reach the client anyway
                                             "silence_logs": logging.CRITICAL if quiet else logging.WARNING}}
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": None, "host": "127.0.0.1"}}
    # Dask's nannies set MALLOC_TRIM_THRESHOLD_ in their workers, which turns glibc's adaptive mmap threshold
    # off: every array of 128 KiB or more is then a fresh mmap, zeroed page by page, and the client's encoding
    # (many N-sized temporaries an instance) runs far slower than in one process. The workers keep glibc's default.
    import dask

    environ = {k: v for k, v in dask.config.get("distributed.nanny.pre-spawn-environ", {}).items()
               if k != "MALLOC_TRIM_THRESHOLD_"}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": environ}):
        return distributed.SpecCluster(workers=specs, scheduler=scheduler, name="caramel",
                                       silence_logs=logging.ERROR if quiet else logging.WARNING)


# ------------------------------------------------------------------------------------ the job

@dataclass(frozen=True)
class Job:
    """What a worker needs to run instances or ranks of one program; shipped once per worker.
    ``options``: the run's, the backend resolved, ``check`` a CheckSpec or None (read by the
    client: a check file need not exist on the workers), no devices (each worker uses those it
    sees); ``keys``: a KeySet to use instead of generating one, or None; ``shared``: the values
    or objects of shared inputs given (by the caller or the user's inputs); ``data``: the user's
    InputData, or None; ``decrypt``: the instances' outputs kept (the executor's ``decrypt``)."""

    token: str
    program: Program
    options: RunOptions
    keys: Any
    shared: Mapping[str, Any]
    data: Any
    decrypt: bool | str
    fingerprint: str
    timeout: float = 300.0


def _check_here(job: Job, plugin: "CaramelPlugin") -> None:
    """The worker runs the client's caramel (a worker that joined after the check)."""
    mine = plugin.fingerprint
    if mine != job.fingerprint:
        raise ClusterError(f"this worker runs caramel {_version()} with files {mine[:12]}, the client "
                           f"{job.fingerprint[:12]}: install the same caramel on every worker")


def open_executor(job: Job):
    """The :class:`caramel.Executor` of ``job`` on this worker: on the ``gpu`` backend over every GPU
    it sees (one lane per slot of :func:`caramel.executor.batch_layout`: a K-chip program on
    fewer GPUs merges its chips), on the CPU backends one lane, as ``run_batch`` without ``gpus``."""
    from caramel.executor import Executor

    gpus = None
    if job.options.backend == "gpu":
        import cupy as cp

        gpus = int(cp.cuda.runtime.getDeviceCount())
    return Executor(job.program, job.options.with_(gpus=gpus), keys=job.keys, shared=dict(job.shared),
                    decrypt=job.decrypt)


class WorkerJob:
    """One job on one worker: its executor (:func:`open_executor`, made by the first instance and
    kept until the client closes the job), fed by every task thread of the worker."""

    def __init__(self, job: Job):
        self.job = job
        self.lock = threading.Lock()
        self.executor = None
        self.error: BaseException | None = None  # the executor could not be made: every instance says why
        self.closed = False

    def open(self):
        with self.lock:
            if self.closed:  # a task that started before the client closed the job: no executor made again
                raise ClusterError(f"job {self.job.token[:12]} was closed")
            if self.error is not None:
                raise self.error
            if self.executor is None:
                try:
                    self.executor = open_executor(self.job)
                except BaseException as exc:
                    self.error = exc
                    raise
            return self.executor

    def run(self, index: int, inputs: Mapping[str, Any] | None = None):
        """Instance ``index`` (inputs: ``inputs``, else entry ``index`` of the user's, the others drawn
        from seed S + index): its :class:`caramel.batch.Instance`; an instance's error is raised."""
        from caramel.batch import Instance, instance_data

        ex = self.open()
        job = self.job
        given = dict(inputs) if inputs is not None else instance_data(job.program, job.data, index, ex.shared)
        result = ex.submit(given, seed=job.options.seed + index).result()
        return Instance.of(index, result, keep=bool(job.decrypt))

    def state(self) -> dict | None:
        """The executor's setup seconds, the devices of its lanes and its shared inputs (None before it is made)."""
        ex = self.executor
        if ex is None:
            return None
        return {"timings": dict(ex.timings), "devices": [tuple(d) for d in ex.device_ids], "shared": tuple(ex.shared)}

    def close(self) -> None:
        with self.lock:
            ex, self.executor, self.closed = self.executor, None, True
        if ex is not None:
            ex.shutdown(wait=True, cancel_futures=True)


class CaramelPlugin(_WorkerPlugin):
    """caramel's state on a Dask worker (a worker plugin, registered as :data:`PLUGIN`): the
    :class:`WorkerJob` of each job, by its token, until the client closes the job; and the
    mailboxes of the ranks of partitioned runs (:class:`~caramel.execute.rendezvous.dask_comms.PostOffice`)."""

    name = PLUGIN

    def setup(self, worker) -> None:
        from caramel.execute.rendezvous.dask_comms import PostOffice

        self.worker = worker
        self.fingerprint = fingerprint()  # this worker's caramel, compared with each job's
        self.jobs: dict[str, WorkerJob] = {}
        self.closed: OrderedDict[str, None] = OrderedDict()  # tokens of closed jobs, the latest CLOSED_JOBS
        self.lock = threading.Lock()
        self.office = PostOffice()
        self.office.install(worker)

    def job(self, job: Job) -> WorkerJob:
        with self.lock:
            if job.token in self.closed:
                raise ClusterError(f"job {job.token[:12]} was closed")
            if job.token not in self.jobs:
                self.jobs[job.token] = WorkerJob(job)
            return self.jobs[job.token]

    def close_job(self, token: str) -> bool:
        with self.lock:
            held = self.jobs.pop(token, None)
            self.closed[token] = None
            while len(self.closed) > CLOSED_JOBS:
                self.closed.popitem(last=False)
        if held is not None:
            held.close()
        return held is not None

    def teardown(self, worker) -> None:
        for token in list(getattr(self, "jobs", {})):
            self.close_job(token)


def _plugin(worker) -> CaramelPlugin:
    plugin = worker.plugins.get(PLUGIN)
    if plugin is None:
        raise ClusterError(f"worker {worker.address} has no caramel plugin (registered by ClusterExecutor)")
    return plugin


def run_instance(job: Job, index: int, inputs: Mapping[str, Any] | None = None):
    """The task of instance ``index`` (on a worker): (the worker's address, its Instance)."""
    from distributed import get_worker

    worker = get_worker()
    plugin = _plugin(worker)
    _check_here(job, plugin)
    return worker.address, plugin.job(job).run(index, inputs)


def open_job(job: Job) -> dict | None:
    """The task that makes the executor of ``job`` on its worker now (:meth:`ClusterExecutor.warm_up`):
    its :meth:`WorkerJob.state`."""
    from distributed import get_worker

    plugin = _plugin(get_worker())
    _check_here(job, plugin)
    held = plugin.job(job)
    held.open()
    return held.state()


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


def _job_state(token: str, dask_worker=None) -> dict | None:
    plugin = dask_worker.plugins.get(PLUGIN) if dask_worker is not None else None
    held = plugin.jobs.get(token) if plugin is not None else None
    return held.state() if held is not None else None


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
    from caramel.api import output_digest, prepare_inputs
    from caramel.ckks.check import evaluate_check
    from caramel.ckks.device import resolve as client_device, using as using_client
    from caramel.ckks.keyset import generate_keyset
    from caramel.execute.distributed import Place, run_distributed
    from caramel.execute.rendezvous import RunIdentity
    from caramel.execute.rendezvous.dask_comms import DaskRendezvous
    from distributed import get_worker
    from caramel.plan_cache import cached_plan
    from caramel.ring import Context

    worker = get_worker()
    plugin = _plugin(worker)
    _check_here(job, plugin)
    opts = job.options
    world = len(addresses)
    place = Place(rank, world, device, None, job.token)
    backend = "gpu" if opts.backend == "gpu" else "cpu-plan"
    fused = ranks_fuse(opts.fusion)
    identity = RunIdentity(job.fingerprint, opts.n, opts.mode.value, opts.seed, world, backend, None, opts.key_seed,
                           fused=fused)
    timings: dict[str, float] = {}
    with DaskRendezvous(rank, addresses, job.token, worker, plugin.office, job.timeout) as rdv:
        # (a failure in this block aborts the other ranks)
        t = time.perf_counter()
        rdv.meet(identity, job.timeout)
        timings["meet"] = time.perf_counter() - t
        t = time.perf_counter()
        ctx = Context(n=opts.n)
        client = client_device(opts.client, backend)
        supplied = None
        if job.data is not None:
            from caramel.userdata import instance_values

            supplied = instance_values(job.data, job.program, 0)
        with using_client(client):
            keys = job.keys or generate_keyset(job.program, ctx, opts.keys_seed)
            prepared = prepare_inputs(job.program, ctx, keys, opts.seed, opts.check, supplied)
        timings["keys"] = time.perf_counter() - t
        t = time.perf_counter()
        result = run_distributed(cached_plan(job.program, fuse=fused), ctx, prepared.memory, opts.mode, place, rdv,
                                 backend=backend, streams=opts.streams, timeout=job.timeout)
        timings["run"] = time.perf_counter() - t
    if result is None:
        return None
    with using_client(client):
        report = evaluate_check(prepared, result.memory, opts.mode) if opts.check is not None else None
    return PartitionedRun(job.program.name, backend, world, output_digest(job.program, result.memory), report,
                          timings=timings)


# ------------------------------------------------------------------------------------ the executor

class ClusterExecutor:
    """``program`` on a Dask cluster (module docstring), in the shape of
    :class:`concurrent.futures.Executor`: :meth:`submit` (instance i -> a future),
    :meth:`map` (instances -> their results as they complete, or in order), plus
    :meth:`run_batch` and :meth:`run_partitioned`; a context manager (:meth:`close`).

    ``options``: a :class:`~caramel.options.RunOptions`, or its fields as keywords (``n``,
    ``mode``, ``backend``, ``seed``, ``key_seed``, ``check``, ``streams``, ``client``, ``kernels``,
    ``shared``, ``depth``, ``workers``: the workers' executors take them as they are). On a cluster
    ``gpus`` counts workers: the workers of ``"local"``, the ranks of a partitioned run (default
    one per chip, at most one per worker); ``device_ids``: the GPUs of this machine that a local
    cluster's workers take, one each. ``backend="auto"`` is the workers' choice: the GPU when every
    worker has one.

    ``cluster``: ``"local"`` (:func:`local_cluster` of ``gpus`` workers: default, for a ``batch``,
    one per GPU on the ``gpu`` backend, else one per CPU core, at most ``batch``; without a batch
    one per chip, at most one per GPU), a scheduler address, a ``distributed.Client`` or a Dask
    cluster object (dask-jobqueue's ``SLURMCluster``, say). ``keys``: a KeySet shipped to every
    worker instead of one generated there from the key seed; ``shared``: the inputs every instance
    shares, as the :class:`caramel.Executor` takes them (names, or a mapping name -> values or
    object, shipped); ``inputs``: the user's values (:mod:`caramel.userdata`: stacked values feed
    one instance each, a shared input's value is unstacked); ``outputs``/``limbs``: keep each
    instance's decrypted outputs (and raw output limbs); ``batch``: the instances to come (the
    size of a local cluster, the stacked inputs checked); ``timeout``: seconds a rank waits for
    another."""

    def __init__(self, program: Program, options: RunOptions | None = None, *, cluster: Any = "local", keys=None,
                 shared: Mapping[str, Any] | str | Iterable[str] | None = None, inputs: Any = None,
                 outputs: bool = False, limbs: bool = False, timeout: float = 300.0, batch: int | None = None,
                 **fields):
        from caramel.batch import shared_data
        from caramel.executor import shared_inputs
        from caramel.instance import run_setup
        from caramel.options import resolve_backend

        distributed = _distributed()
        if not isinstance(program, Program):
            raise ClusterError(f"ClusterExecutor needs a Program (caramel.load_program), got {type(program).__name__}")
        if shared is not None and not isinstance(shared, Mapping):  # names: RunOptions.shared
            fields["shared"], shared = shared, None
        opts = RunOptions.of(options, **fields)
        self.program, self.options, self.gpus = program, opts, opts.gpus
        # "auto" on a local cluster is this machine's choice; on another cluster its workers' (below)
        local = isinstance(cluster, str) and cluster == "local"
        if opts.device_ids is not None and not local:
            raise ClusterError("device_ids name GPUs of this machine, for a local cluster; the workers of another "
                               "cluster use the GPUs they see (CUDA_VISIBLE_DEVICES)")
        self.backend = resolve_backend(opts.backend) if opts.backend != "auto" or local else "auto"
        ctx, spec, data = run_setup(program, opts.n, None, opts.check, inputs, batch)
        given = dict(shared or {})
        shared_inputs(program, opts, given)  # names that are no input: refused here, not on every worker
        given.update(shared_data(program, opts.shared, data))
        if keys is not None:
            from caramel.ckks.keyset import KeySet

            keys = KeySet(keys.secrets, dict(keys.keys))  # every key read now: the whole set is shipped
        self._fingerprint = fingerprint()
        self._cluster = None
        self._own_client = True
        if local:
            self._cluster = local_cluster(self._local_workers(batch), self.backend, device_ids=opts.device_ids,
                                          options=opts)
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
        self._numbers: dict[str, int] = {}  # worker address -> its number in the records (``rank``)
        self._tasks = itertools.count()
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # worker address -> instances submitted there, not yet done
        try:
            self.infos = self.workers()
            if self.backend == "auto":  # the GPU when every worker has one, as `caramel run` on one machine
                self.backend = "gpu" if self.infos and all(w.gpus > 0 for w in self.infos) else "cpu"
            check_workers(self.infos, self.backend, _version(), self._fingerprint)
        except BaseException:
            self.close()
            raise
        self._numbers.update({w.address: k for k, w in enumerate(self.infos)})
        job_options = opts.with_(n=int(ctx.n), backend=self.backend, check=spec, gpus=None, device_ids=None)
        self.job = Job(uuid.uuid4().hex, program, job_options, keys, given, data,
                       "limbs" if limbs else bool(outputs), self._fingerprint, timeout)

    def _local_workers(self, batch: int | None) -> int:
        if self.gpus is not None:
            return self.gpus
        ids = self.options.device_ids
        if batch is None:  # a partitioned run: one worker per chip, at most one per GPU
            if self.backend != "gpu":
                return self.program.chips
            return max(1, min(self.program.chips, len(ids) if ids else _gpu_count()))
        if self.backend == "gpu":
            return len(ids) if ids else _gpu_count()
        return max(1, min(cores.available(), batch))

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
        """The job on every worker (once), and the plugin that keeps its executors."""
        if self._job is None:
            self._plugin()
            self._job = self.client.scatter(self.job, broadcast=True, hash=False)
        return self._job

    def submit(self, index: int, inputs: Mapping[str, Any] | None = None):
        """Instance ``index`` as a Dask future of (worker address, :class:`caramel.batch.Instance`):
        its inputs ``inputs`` (name -> values or objects, as :meth:`caramel.Executor.submit` takes
        them, shipped with the task) or entry ``index`` of the user's inputs, the others drawn from
        seed S + ``index``."""
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise ClusterError(f"an instance index is an integer >= 0, got {index!r}")
        if inputs is not None and not isinstance(inputs, Mapping):
            raise ClusterError(f"an instance's inputs are a mapping of input name to value, not "
                               f"{type(inputs).__name__}")
        # A key of its own (Dask would answer a key it holds with its first result, whatever the inputs). Placed on
        # the worker with the fewest of this executor's instances pending (Dask alone may put a burst of short
        # tasks on one worker); a preference only: Dask still moves it to another worker when that one dies or
        # lags (work stealing).
        shipped, worker = self._shipped(), self._least_loaded()
        future = self.client.submit(run_instance, shipped, index, None if inputs is None else dict(inputs),
                                    key=f"caramel-{self.job.token}-{next(self._tasks)}-instance-{index}",
                                    workers=None if worker is None else [worker], allow_other_workers=True)
        if worker is not None:
            future.add_done_callback(lambda _, w=worker: self._settled(w))
        return future

    def _least_loaded(self) -> str | None:
        """The worker (of those the executor started with) with the fewest pending instances; None without one."""
        with self._lock:
            if not self.infos:
                return None
            worker = min((w.address for w in self.infos), key=lambda a: self._pending.get(a, 0))
            self._pending[worker] = self._pending.get(worker, 0) + 1
            return worker

    def _settled(self, worker: str) -> None:
        with self._lock:
            self._pending[worker] -= 1

    def warm_up(self, *, timeout: float | None = None) -> dict[str, dict[str, float]]:
        """Make the job's executor on every worker now (keys, shared inputs, plan and graphs: what the
        first instance on a worker would otherwise wait for), one task pinned to each worker; returns
        each worker's setup seconds by its address. ``timeout``: seconds for them all."""
        distributed = _distributed()
        shipped = self._shipped()
        futures = {self.client.submit(open_job, shipped, workers=[w.address], allow_other_workers=False,
                                      key=f"caramel-{self.job.token}-{next(self._tasks)}-open"): w.address
                   for w in self.infos}
        try:
            return {futures[f]: f.result()["timings"] for f in _completed(distributed, list(futures), timeout)}
        finally:
            for f in futures:
                f.cancel()

    def _received(self, index: int, future):
        """The Instance of a finished future (its error raised), numbered by its worker."""
        address, instance = future.result()
        future.release()
        instance.rank = self._numbers.setdefault(address, len(self._numbers))  # a restarted worker: a new number
        self.where[index] = address
        return instance

    def _submitted(self, indices: Iterable[int]) -> dict:
        indices = list(indices)
        if len(set(indices)) != len(indices):
            raise ClusterError("an instance index appears twice")
        return {self.submit(i): i for i in indices}

    def map(self, indices: Iterable[int], *, ordered: bool = True, timeout: float | None = None) -> Iterator:
        """The :class:`caramel.batch.Instance` of every index, each once: in index order
        (``ordered``; an instance's error is raised when its turn comes) or as they complete. The
        instances run as workers free up. ``timeout``: seconds for them all (None: no limit)."""
        distributed = _distributed()
        futures = self._submitted(indices)
        order = list(futures.values())
        done: dict[int, Any] = {}
        next_index = 0
        try:
            for future in _completed(distributed, list(futures), timeout):  # each future once, as it completes
                i = futures.pop(future)
                if not ordered:
                    yield self._received(i, future)
                    continue
                done[i] = future
                while next_index < len(order) and order[next_index] in done:
                    yield self._received(order[next_index], done.pop(order[next_index]))
                    next_index += 1
        finally:
            for future in [*futures, *done.values()]:
                future.cancel()

    def run_batch(self, batch: int, *, log=None, timeout: float | None = None):
        """``batch`` instances (seeds S .. S+batch-1) on the cluster: a :class:`caramel.batch.BatchResult`
        as :func:`caramel.batch.run_batch` returns it (records sorted by index, each with the worker
        that ran it; ``timings``: the workers' setups, summed; ``processes``: the workers). An
        instance that fails is in ``failed``; a Ctrl-C ends the batch with the instances that
        finished (``interrupted``; the others are cancelled). ``timeout`` as :meth:`map`."""
        from caramel.batch import BatchError, BatchResult, BatchSummary, _batch_verdict

        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise BatchError(f"--batch must be at least 1, got {batch}")
        if self.job.data is not None:
            from caramel.userdata import check_inputs

            check_inputs(self.job.data, self.program, self.job.options.n // 2, batch=batch)
        log = log or (lambda s: None)
        distributed = _distributed()
        start = time.perf_counter()
        futures = self._submitted(range(batch))
        instances, failed, interrupted = [], {}, False
        try:
            for future in _completed(distributed, list(futures), timeout):
                i = futures.pop(future)
                try:
                    instance = self._received(i, future)
                except Exception as exc:  # noqa: BLE001 - this instance's error (or its task's)
                    failed[i] = f"{type(exc).__name__}: {exc}"
                    log(f"instance {i}: failed: {exc}")
                    continue
                instances.append(instance)
                log(f"instance {i}: digest {instance.digest[:16]} (worker {instance.rank})")
        except KeyboardInterrupt:
            interrupted = True
            log("interrupted: the instances not finished are cancelled")
        finally:
            for future in futures:
                future.cancel()
        wall = time.perf_counter() - start
        instances.sort(key=lambda x: x.index)
        states = self._states()
        lanes = [d for s in states for d in s["devices"]]
        timings: dict[str, float] = {}
        for s in states:
            for k, v in s["timings"].items():
                timings[k] = timings.get(k, 0.0) + v
        count = len(instances)
        summary = BatchSummary(count, wall, count / wall if wall > 0 else 0.0, max(1, len(lanes)),
                               max([1, *map(len, lanes)]), len(self.infos),
                               _batch_verdict([x.passed for x in instances]))
        records = [{**x.record(), "worker": self.where.get(x.index)} for x in instances]
        opts = self.job.options
        return BatchResult(self.program.name, opts.n, opts.mode.value, self.backend, opts.seed, opts.key_seed, records,
                           summary, timings, instances, failed, interrupted, states[0]["shared"] if states else ())

    def _states(self) -> list[dict]:
        """What each worker's executor of the job says of itself (:meth:`WorkerJob.state`), from the
        workers that hold one."""
        try:
            found = self.client.run(_job_state, self.job.token, on_error="return")
        except Exception:  # noqa: BLE001 (a worker going away says nothing)
            return []
        return [s for _, s in sorted(found.items()) if isinstance(s, dict)]

    # ---------------------------------------------------------------- partitioned

    def run_partitioned(self, *, timeout: float | None = None) -> PartitionedRun:
        """One run of the program as ranks on distinct workers (module docstring): ``gpus`` ranks
        (default one per chip, at most one per worker), rank r on the r-th worker. Fails within
        seconds, naming the rank, when a rank fails or its worker is lost, after aborting the other ranks; ``timeout``:
        seconds for the whole run (None: no limit beyond each rank's waits)."""
        if self.options.shared or self.job.shared:
            raise ClusterError("shared inputs go with a batch of instances; a partitioned run draws every input from "
                               "its seed, as `caramel run --seed S`")
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


def _gpu_count() -> int:
    import cupy as cp

    return int(cp.cuda.runtime.getDeviceCount())


__all__ = ["CaramelPlugin", "ClusterError", "ClusterExecutor", "Job", "PartitionedRun", "WorkerInfo", "WorkerJob",
           "check_workers", "fingerprint", "local_cluster", "open_executor", "open_job", "rank_devices", "run_instance",
           "run_rank", "worker_info"]
