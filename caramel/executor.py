"""``caramel.Executor``: many instances of one program, in the shape of :mod:`concurrent.futures`.

    >>> import caramel
    >>> program = caramel.load_program("programs/MulRotate_4L_1c")
    >>> with caramel.Executor(program, n=1024, backend="cpu-plan", check="auto") as ex:
    ...     results = list(ex.map([{"x": x, "y": y} for x, y in pairs]))   # doctest: +SKIP
    >>> results[0].outputs["z"]       # the decrypted output slots, at the output's true scale  # doctest: +SKIP

An executor holds a program, its keys (generated from the key seed, or given), the inputs every
instance shares (``shared``: a model's plaintexts and scalars, written once into each device) and
one resident *lane* per device slot (:mod:`caramel.execute.pipeline`: on a GPU the captured graph,
with instances double-buffered). ``submit(inputs)`` returns a :class:`concurrent.futures.Future` of
an :class:`InstanceResult`; ``map`` yields results in submission order; the futures work with
:func:`concurrent.futures.as_completed` and :func:`concurrent.futures.wait`.

Inputs of an instance (``submit``): a mapping from input names to values (a vector of N/2 slots or a
real number, encoded and encrypted at the check's scales), or to ready objects (a
:class:`~caramel.ckks.encrypt.Ciphertext`, :class:`~caramel.ckks.plaintext.Plaintext` or
:class:`~caramel.ckks.plaintext.Scalar`, used as they are: :meth:`Executor.encrypt` makes them); every
input not given and not shared is drawn from the instance's seed (default ``options.seed + i`` for the
i-th submission), exactly as ``caramel run --seed`` draws it (:func:`caramel.instance.draw_inputs`).

Shared inputs are drawn once from the key seed (``options.keys_seed``) in the spec's order, the other
inputs drawing nothing, unless given as values or objects in ``shared=``. So instance i of an executor
with seed S and key seed K has the digest of ``run_program(seed=S + i, key_seed=K, shared=...)``.

Threads: ``workers`` host threads prepare instances (draw, encode, encrypt on the client device; a GPU
client's work on each thread's own CUDA stream; with a lane per GPU, each thread serves one lane and works on
its GPU, which reads the rows in place); they start with the constructor and make their stream and reused rows
while the keys and lanes are made. One driver thread per lane issues the instances, and finisher
threads wait for each, compute its digest (:func:`caramel.instance.output_digest`), check it and
resolve its future. An instance whose inputs are bad (a missing limb, a residue out of range, a value
that does not fit) fails alone; an error of a device stops the executor: the instances not yet run
fail with an :class:`ExecutionError` naming it.

The garbage collector: an open executor's setup (the program, its plan, keys, graphs: hundreds of
thousands of objects that live as long as it) is moved out of the cyclic collector's generations
(:func:`gc.freeze`), so that a full collection in the middle of a batch does not walk them with the
interpreter held; the last executor to shut down puts them back (:func:`gc.unfreeze`), unless the
process had frozen objects of its own before, which are then left as they are.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import queue
import threading
import time
from collections import ChainMap
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np

from caramel import cores
from caramel.ckks.bind import InputKind, requirements
from caramel.ckks.check import CheckError
from caramel.errors import ArgumentError, BindingError, CaramelError, ExecutionError, MissingLimbError
from caramel.instance import (
    InputPlan,
    check_prime_count,
    default_spec,
    draw_inputs,
    input_image,
    input_plan,
    key_image,
    output_digest,
    reserve_rows,
    resolve_check,
)
from caramel import options as run_options
from caramel.options import RunOptions, resolve_backend, shared_names
from caramel.program import Mem, Program
from caramel.ring import Context

logger = logging.getLogger(__name__)

#: Errors that belong to one instance's inputs: the instance fails, the executor goes on.
INPUT_ERRORS = (BindingError, CheckError, ArgumentError, MissingLimbError)


def batch_layout(chips: int, gpus: int | None) -> list[tuple[int, ...]]:
    """The device groups (slots) of an executor: ``gpus`` None -> one slot on the executor's default
    devices (``()``); K = ``chips`` = 1 -> one slot per device; G >= K -> G // K slots of K
    consecutive devices; G < K -> one slot of all G devices."""
    if gpus is None:
        return [()]
    if gpus < 1 or chips < 1:
        raise ArgumentError(f"an executor needs at least one device and one chip, got {gpus} and {chips}")
    if gpus < chips:
        return [tuple(range(gpus))]
    return [tuple(range(j * chips, (j + 1) * chips)) for j in range(gpus // chips)]


def fuses(fusion: str, program: Program, target) -> bool:
    """Whether the plan of ``program`` for ``target`` is fused under ``fusion`` (:data:`caramel.options.FUSIONS`):
    ``on``; ``auto`` when the fused plan is in the plan cache (:func:`caramel.plan_cache.plan_cached`), a sign that
    a fused run or ``caramel compile`` made its kernels; never ``off``."""
    if fusion == "auto":
        from caramel.plan_cache import plan_cached

        return plan_cached(program, target=target)
    return fusion == "on"


def preparers(options: RunOptions) -> int:
    """Host threads of an executor that prepare instances: ``options.workers``, else half the cores, 1 to 4."""
    return options.workers or max(1, min(4, cores.available() // 2))


def capacity(options: RunOptions, lanes: int = 1, depth: int | None = None) -> int:
    """How many instances an executor of ``options`` works on at once (those submitted beyond wait in
    its queue, not yet drawn): on each of ``lanes`` lanes ``depth`` in flight (default
    ``options.depth``, else the GPU lane's default) and one more waiting for it, and one being
    prepared by each of the :func:`preparers`. A front end that feeds an executor from threads that
    each wait for their instance (a Dask worker's) keeps it busy with this many threads."""
    if depth is None:
        from caramel.execute.gpu_pipeline import DEFAULT_DEPTH

        depth = options.depth or DEFAULT_DEPTH
    return lanes * (depth + 1) + preparers(options)


def shared_inputs(program: Program, options: RunOptions, given: Mapping[str, Any]) -> frozenset[str]:
    """The inputs of ``program`` that every instance shares: those ``options.shared`` selects
    (:func:`~caramel.options.shared_names`) and those ``given`` values or objects; a name that is no
    input is an :class:`ArgumentError`."""
    kinds = requirements(program).kinds()
    unknown = sorted(set(given) - set(kinds))
    if unknown:
        raise ArgumentError(f"shared: {', '.join(unknown)} is not an input of {program.name} (its inputs: "
                            f"{', '.join(kinds)})")
    return frozenset(shared_names(options.shared, kinds)) | frozenset(given)


def _is_object(value) -> bool:
    from caramel.ckks.encrypt import Ciphertext
    from caramel.ckks.plaintext import Plaintext, Scalar

    return isinstance(value, (Ciphertext, Plaintext, Scalar))


class _LongLived:
    """Open executors' hold on :func:`gc.freeze` (see the module docstring): ``hold`` freezes every object
    tracked now (an executor's setup among them), ``release`` after the last holder unfreezes them, unless
    objects were frozen before the first hold (the process's own use, which this leaves alone)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.holders = 0
        self._ours = False

    def hold(self) -> None:
        with self._lock:
            if self.holders == 0:
                self._ours = gc.get_freeze_count() == 0
            self.holders += 1
            gc.freeze()

    def release(self) -> None:
        with self._lock:
            self.holders -= 1
            if self.holders == 0 and self._ours:
                gc.unfreeze()


LONG_LIVED = _LongLived()


def _queue_on(device: int | None, schedule: Callable[..., object], *args) -> None:
    """``schedule(*args)`` (a compile-pool queueing) with CUDA device ``device`` current; nothing without a device."""
    if device is None:
        return
    from caramel.backends.cuda.device import on_device

    with on_device(device):
        schedule(*args)


def _queue_lane_kernels(device: int | None) -> None:
    """Queue on the compile pool, for CUDA device ``device``, the modules a GPU lane compiles whatever its plan
    (:func:`caramel.execute.gpu_pipeline.lane_jobs`); nothing without a device."""
    from caramel.backends.cuda.compiler import schedule
    from caramel.execute.gpu_pipeline import lane_jobs

    _queue_on(device, lambda: schedule(lane_jobs()))


class ClientScope:
    """Where the client arithmetic of an executor runs: its :class:`~caramel.ckks.device.ClientDevice`
    and, on the GPU, the CUDA device (one lane's GPU: the inputs it makes are read there in place;
    else device 0). Every thread that encrypts or decrypts for the executor enters it."""

    def __init__(self, device, cuda: int | None):
        self.device, self.cuda = device, cuda

    @contextlib.contextmanager
    def __call__(self, keep: bool = False):
        """The client's device for the enclosed code; ``keep``: its encrypted inputs stay on the GPU."""
        from caramel.ckks.device import keeping_inputs, using

        with using(self.device), keeping_inputs(keep):
            if self.cuda is None:
                yield
                return
            from caramel.backends.cuda.device import on_device

            with on_device(self.cuda):
                yield


class InstanceInputs(dict):
    """Ready inputs of one instance (:meth:`Executor.encrypt`): name -> Ciphertext, Plaintext or Scalar,
    with ``messages`` (the exact messages, for a check) and the ``seed`` they were drawn from."""

    def __init__(self, objects: Mapping[str, Any], messages: Mapping[str, Any], seed: int | None):
        super().__init__(objects)
        self.messages, self.seed = messages, seed


class _ObjectValues(Mapping):
    """The messages of inputs given as objects, decoded when a check first reads them (a ciphertext
    decrypted under the executor's secret, a plaintext decoded, a scalar divided by its scale): once, whichever
    threads read them (the shared inputs' are every instance's)."""

    def __init__(self, objects: Mapping[str, Any], plan: InputPlan, secrets):
        self.objects, self.plan, self.secrets, self._done = objects, plan, secrets, {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str):
        with self._lock:
            if name not in self._done:
                self._done[name] = _decode_object(self.objects[name], self.plan, name, self.secrets)
            return self._done[name]

    def __iter__(self):
        return iter(self.objects)

    def __len__(self) -> int:
        return len(self.objects)


def _decode_object(obj, plan: InputPlan, name: str, secrets):
    from caramel.ckks.encoding import decode
    from caramel.ckks.encrypt import Ciphertext, decrypt_values
    from caramel.ckks.plaintext import Scalar
    from caramel.ckks.rns import from_residues

    scale = obj.scale or plan.scales[name]
    if isinstance(obj, Scalar):
        return obj.value / scale
    if isinstance(obj, Ciphertext):
        return decrypt_values(plan.ctx, secrets.s, obj, scale)
    from caramel.ckks.device import host_array

    data = host_array(obj.data)
    coeffs = np.stack([plan.ctx.intt(np.asarray(data[r], dtype=np.uint32), l) for r, l in enumerate(obj.limbs)])
    return decode(from_residues(coeffs, plan.ctx, obj.limbs), scale, plan.ctx.n)


class _Feed:
    """One instance's inputs as a lane reads them (:class:`caramel.execute.pipeline.Feed`)."""

    def __init__(self, objects: Mapping[str, Any], plan: InputPlan):
        from caramel.ckks.encrypt import Ciphertext
        from caramel.ckks.plaintext import Plaintext

        self.objects, self.plan = objects, plan
        rows: dict = {}
        for name, obj in objects.items():
            if isinstance(obj, Ciphertext):
                rows[(name, "c0")], rows[(name, "c1")] = (obj.c0, obj.limbs), (obj.c1, obj.limbs)
            elif isinstance(obj, Plaintext):
                rows[(name, "p")] = (obj.data, obj.limbs)
            else:
                rows[(name, "s")] = (obj.residues, obj.limbs)
        self.rows = rows

    def image(self) -> dict[Mem, Any]:
        return input_image(self.plan.req, self.objects)


@dataclass
class InstanceResult:
    """One finished instance: ``index`` (submission order), ``seed`` (of its drawn inputs; None when
    every input was given), ``digest`` (SHA-256 of its output limbs), ``memory`` (its output limbs,
    ``Mem -> (N,) uint32``), ``report`` (the check's verdicts, or None), ``timings`` (seconds per phase:
    ``encrypt``, ``upload``, ``replay``, ``download``, ``run`` = the three, ``digest``, ``check``,
    ``decrypt``), ``device_ids`` (the lane's CUDA devices; empty for the default). :attr:`outputs`
    decrypts the outputs."""

    index: int
    seed: int | None
    digest: str
    memory: dict[Mem, np.ndarray]
    report: Any
    timings: dict[str, float]
    device_ids: tuple[int, ...]
    prepared: Any = field(repr=False, default=None)  # PreparedCheck: the spec, scales, secrets, messages
    objects: Mapping[str, Any] = field(repr=False, default_factory=dict)  # its own inputs, with keep_inputs
    client: Any = field(repr=False, default=None)  # ClientScope: where its decryption runs
    _outputs: dict[str, np.ndarray] | None = field(repr=False, default=None)

    @property
    def passed(self) -> bool | None:
        return None if self.report is None else bool(self.report.passed)

    @property
    def outputs(self) -> dict[str, np.ndarray]:
        """Output name -> its N/2 decrypted slots (complex128), decoded at the output's true scale
        (the check file's; without one, 2^28). Decrypted on first use and kept."""
        if self._outputs is None:
            self._outputs = self.decrypt()
        return self._outputs

    def decrypt(self, limbs: bool = False) -> dict[str, np.ndarray]:
        """:attr:`outputs`, and with ``limbs`` the raw output ciphertexts (``<name>.c0``, ``<name>.c1``,
        ``<name>.limbs``) as :func:`caramel.userdata.decrypted_outputs` writes them."""
        from caramel.userdata import decrypted_outputs

        with self.client() if self.client is not None else contextlib.nullcontext():
            return decrypted_outputs(self.prepared, self.memory, limbs=limbs)

    def ciphertexts(self) -> dict:
        """Output name -> its :class:`~caramel.ckks.encrypt.Ciphertext` (scale None), undecrypted."""
        from caramel.ckks.bind import read_outputs

        return read_outputs(self.prepared.manifest, self.memory)


@dataclass(eq=False)
class _Job:
    index: int
    seed: int | None
    inputs: Mapping[str, Any] | None
    future: Future
    start: float = 0.0
    timings: dict = field(default_factory=dict)
    objects: Mapping[str, Any] | None = None
    values: Mapping[str, Any] | None = None
    feed: Any = None
    lane: Any = None
    ticket: Any = None
    scope: Any = None  # ClientScope: where its inputs were made, its check and decryption run


_STOP = object()


class Executor:
    """Runs instances of ``program`` (see the module docstring). ``options`` (a
    :class:`~caramel.options.RunOptions`, or its fields as keywords): ring, mode, backend, seeds, check,
    devices (``gpus``, ``device_ids``), ``streams``, ``client``, ``kernels``, ``shared``, ``depth``,
    ``workers``; ``keys``: a :class:`~caramel.ckks.keyset.KeySet` (default: generated from the key
    seed on the client device); ``shared``: the inputs every instance shares: names (as
    ``options.shared``: names, patterns, kinds) or a mapping input name -> value or object (those
    inputs shared, besides ``options.shared``, with these values); ``ctx``: the ring (default
    ``Context(n)``); ``decrypt``: each result's :attr:`~InstanceResult.outputs` are decrypted by the
    finisher threads (``"limbs"``: with the raw output ciphertexts); ``keep_inputs``: each result keeps its
    instance's input objects (:attr:`InstanceResult.objects`; else empty: on a GPU they are device rows, which
    the results a caller keeps would pin); ``log``: a function of one line,
    told what the setup did; ``progress(phase, done, total)``: called as the keys are made (``"keys"``)
    and as an instance runs on a lane that counts its steps (``"run"``: the reference's instructions, a
    one-device ``cpu-plan`` lane's calls).

    ``timings`` holds the setup's seconds: ``keys``, ``shared`` (drawing the shared inputs) and ``plan``
    (the plan, the resident lanes and their graphs); ``capacity`` the instances it works on at once
    (:func:`capacity`)."""

    def __init__(self, program: Program, options: RunOptions | None = None, *, keys=None,
                 shared: Mapping[str, Any] | str | Iterable[str] | None = None, ctx: Context | None = None,
                 decrypt: bool | str = False, keep_inputs: bool = False, log=None,
                 progress: Callable[[str, int, int], None] | None = None, **fields):
        from caramel.ckks.device import resolve as client_device

        if not isinstance(program, Program):
            raise ArgumentError(f"an Executor needs a Program (from caramel.load_program), got "
                                f"{type(program).__name__}")
        if shared is not None and not isinstance(shared, Mapping):  # names: RunOptions.shared
            fields["shared"], shared = shared, None
        opts = RunOptions.of(options, **fields)
        self.program, self.options = program, opts
        self._report = progress
        self.backend = resolve_backend(opts.backend)
        if self.backend == "gpu" and not run_options.gpu_available():
            raise CaramelError("backend 'gpu' needs CuPy and a CUDA GPU (in the caramel clone: "
                               "pip install -e '.[cuda12]' or '.[cuda13]')")
        self.ctx = ctx or Context(n=opts.n)
        check_prime_count(program, self.ctx)
        self.groups = self._groups()
        lane_gpus = [self._gpu_devices(g) for g in self.groups] if self.backend == "gpu" else []
        #: Whether the lanes run the fused plan (``options.fusion``, :func:`fuses`); None on the reference backend.
        self.fused: bool | None = None
        planning = self._plan_ahead(lane_gpus)  # on a host thread, while the inputs' needs and the keys are made
        self.spec = resolve_check(program, opts.check)
        self.plan_inputs = plan = input_plan(program, self.ctx, self.spec or default_spec(program))
        self.client = client_device(opts.client, self.backend)
        self.decrypt = decrypt
        self.keep_inputs = keep_inputs
        self.timings: dict[str, float] = {}
        log = log or (lambda line: None)
        given = dict(shared or {})
        chosen = shared_inputs(program, opts, given)
        self.shared = tuple(n for n in plan.names if n in chosen)
        self.varying = tuple(n for n in plan.names if n not in self.shared)
        one_gpu = len(lane_gpus) == 1 and len(lane_gpus[0]) == 1
        #: The client on the GPU and every lane on one GPU: an instance is prepared on its lane's GPU, which
        #: reads the inputs in place (with one lane, the keys are made there too).
        self._keep_on_device = self.client.on_gpu and bool(lane_gpus) and all(len(g) == 1 for g in lane_gpus)
        #: Where each lane's instances are prepared; the first is the executor's client (keys, shared inputs,
        #: :meth:`encrypt`): a GPU client works on the first lane's GPU.
        self._scopes = [ClientScope(self.client, g[0] if self.client.on_gpu else None) for g in lane_gpus] or \
            [ClientScope(self.client, 0 if self.client.on_gpu else None)]
        self.client_scope = self._scopes[0]
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self._broken: BaseException | None = None
        self._todo: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        # Instances prepared for a lane: one queue per lane when each lane's instances are prepared on its
        # GPU (preparer k serves lane k % lanes), else one queue that every lane reads. One lane per slot.
        lanes = len(self.groups)
        self._ready = [queue.Queue() for _ in range(lanes)] if self._keep_on_device else [queue.Queue()] * lanes
        workers = max(preparers(opts), lanes if self._keep_on_device else 1)
        self._threads: list[threading.Thread] = []
        self._stages = {"prepare": workers, "drive": lanes, "finish": max(1, min(4, cores.available() // 2))}
        self._left = dict(self._stages)
        # The preparers start now: each makes its stream and reused rows while the keys and the lanes are made
        # (no instance can reach them before this constructor returns).
        for k in range(workers):
            self._spawn(lambda k=k: self._prepare_loop(k % lanes), f"caramel-prepare-{k}")
        self._frozen = False
        try:
            self._setup(keys, given, planning, one_gpu, log)
        except BaseException:
            self._todo.put(_STOP)
            raise
        #: Instances worked on at once (:func:`capacity`); those submitted beyond wait, not yet drawn.
        self.capacity = capacity(opts, len(self.lanes), max(lane.depth for lane in self.lanes))
        self._permits = threading.Semaphore(self.capacity)
        for k, lane in enumerate(self.lanes):
            self._spawn(lambda k=k, lane=lane: self._drive_loop(lane, self._ready[k]), f"caramel-lane-{k}")
        for k in range(self._stages["finish"]):
            self._spawn(self._finish_loop, f"caramel-finish-{k}")
        LONG_LIVED.hold()  # last: a constructor that raises holds nothing
        self._frozen = True

    # ------------------------------------------------------------------ setup

    def _setup(self, keys, given: dict, planning: Future | None, one_gpu: bool, log) -> None:
        """The constructor's work after its threads' state: the keys (``keys``, else generated), the shared inputs
        (``given``: values or objects by name, the others drawn), then the lanes (on the plan of ``planning``)."""
        plan = self.plan_inputs
        t0 = time.perf_counter()
        if keys is None:
            from caramel.ckks.keyset import generate_keyset

            with self.client_scope():
                keys = generate_keyset(self.program, self.ctx, self.options.keys_seed, background=True,
                                       on_device=one_gpu and self.client.on_gpu and bool(plan.req.keys),
                                       progress=self._phase("keys"))
            logger.debug("cold path: keys of %s (%d evaluation keys queued on the %s client) %.2f s", self.program.name,
                         len(keys.keys), "GPU" if self.client.on_gpu else "host", time.perf_counter() - t0)
        self.keys = keys
        self.timings["keys"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        objects = {n: v for n, v in given.items() if _is_object(v)}
        for name, obj in objects.items():
            plan.check_object(name, obj)
        drawn = [n for n in self.shared if n not in objects]
        values: Mapping[str, Any] = {}
        if drawn:
            from caramel.ckks.keyset import input_rng

            with self.client_scope():
                made, values = draw_inputs(plan, keys.secrets, input_rng(self.options.keys_seed), drawn,
                                           {n: v for n, v in given.items() if n not in objects})
            objects.update(made)
        self.shared_objects = objects
        self.shared_values = ChainMap(dict(values), _ObjectValues({n: o for n, o in objects.items() if n not in drawn},
                                                                   plan, keys.secrets))
        fixed = {**key_image(plan.req, keys.keys), **input_image(plan.req, objects)}
        getattr(keys.keys, "wait", lambda: None)()  # keys read in the background: all there, or the error now
        self.timings["shared"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        #: The limbs every instance shares (keys, shared inputs), as the lanes were built from them.
        self.shared_image: Mapping[Mem, Any] = fixed
        self._outputs = self._output_mems()
        self.lanes: list = []
        try:
            self._make_lanes(fixed, planning)
        except BaseException:
            self._close_lanes(failed=True)
            raise
        self.timings["plan"] = time.perf_counter() - t0
        logger.debug("cold path: lanes of %s (with the plan's wait: the precompile's, arenas, uploads, eager run, "
                     "capture) %.2f s", self.program.name, self.timings["plan"])
        log(f"{self.program.name}: {len(self.lanes)} lane(s) ({self.backend}); keys {self.timings['keys']:.2f} s, "
            f"shared inputs ({', '.join(self.shared) or 'none'}) {self.timings['shared']:.2f} s, plan and devices "
            f"{self.timings['plan']:.2f} s")

    def _gpu_devices(self, group: tuple[int, ...]) -> tuple[int, ...]:
        """The CUDA devices of a slot: the group renumbered onto ``device_ids``; the default slot: one
        device (the first of ``device_ids``, else 0) for a 1-chip program, else one per chip up to those
        present."""
        ids = self.options.device_ids
        if group:
            return tuple(ids[d] for d in group) if ids else group
        if self.program.chips == 1:
            return (ids[0] if ids else 0,)
        if ids:
            return tuple(ids[: self.program.chips])
        import cupy as cp

        return tuple(range(min(self.program.chips, cp.cuda.runtime.getDeviceCount())))

    def _groups(self) -> list[tuple[int, ...]]:
        layout = batch_layout(self.program.chips, self.options.gpus)
        ids = self.options.device_ids
        if ids is not None and max((d for g in layout for d in g), default=-1) >= len(ids):
            raise ArgumentError(f"{self.options.gpus} device(s) asked for, {len(ids)} device_ids given {list(ids)}")
        return layout

    def _output_mems(self) -> tuple[Mem, ...]:
        """Every limb a result needs: the manifest's output limbs (in digest order), then the input
        limbs that aliased output parts read (ISA.md 8.6)."""
        req = self.plan_inputs.req
        outs = [Mem(e.term, l) for e in self.program.manifest.outputs for l in e.limbs]
        seen = set(outs)
        for need in req.outputs.values():
            for terms in need.terms.values():
                for t in terms:
                    if t in req.terms:
                        for l in need.limbs:
                            if Mem(t, l) not in seen:
                                seen.add(Mem(t, l))
                                outs.append(Mem(t, l))
        return tuple(outs)

    def _source(self, mem: Mem):
        """The feed key and limb of an input limb that instances bring; None for a key or shared limb."""
        src = self.plan_inputs.req.terms.get(mem.term)
        if src is None or src.key is not None or src.name in self.shared:
            return None
        return (src.name, src.part), mem.limb

    def _phase(self, phase: str) -> Callable[[int, int], None] | None:
        """The ``(done, total)`` callback of ``phase`` for :attr:`progress` (None without one)."""
        report = self._report
        return None if report is None else (lambda done, total: report(phase, done, total))

    def _plan_ahead(self, lane_gpus: list[tuple[int, ...]]) -> Future | None:
        """The future of the lanes' plan (:func:`caramel.plan_cache.cached_plan`, for the CUDA backend's target on a
        GPU), built on a host thread of its own while the caller makes the keys (on the GPU client mostly device
        work and compiles, which leave the host's interpreter free); on a GPU, on the first lane's device, the
        modules of the plan's elementwise programs are queued on the compile pool as soon as fusion has fixed them
        (:func:`caramel.execute.precompile.schedule_programs`) and the rest of its kernels' once it exists
        (:func:`~caramel.execute.precompile.schedule_plan`), before the future resolves; the plan's cache entry and a
        deferred load-cache entry (:func:`caramel.cache.write_deferred`) are written after that, while the kernels
        compile. None for the reference backend (no plan). An error of the plan is the future's."""
        if self.backend == "cpu":
            return None
        from caramel.cache import write_deferred
        from caramel.execute.precompile import schedule_plan, schedule_programs
        from caramel.plan_cache import cached_plan

        if self.backend == "gpu":
            from caramel.backends.cuda.target import CUDA_TARGET as target  # no CuPy: the plan's rows in its order
        else:
            from caramel.target import NEUTRAL as target
        program, ctx, opts = self.program, self.ctx, self.options
        device = lane_gpus[0][0] if lane_gpus and lane_gpus[0] else None
        done: Future = Future()
        fuse = self.fused = fuses(opts.fusion, program, target)
        logger.debug("%s: %s (fusion %s)", program.name, "fused kernels" if fuse else "one kernel per instruction",
                    opts.fusion)

        def queue(plan) -> None:
            logger.debug("cold path: plan of %s (%d kernels) %.2f s", program.name, plan.kernels,
                         time.perf_counter() - t0)
            _queue_on(device, schedule_plan, plan, ctx, [opts.mode], opts.kernels)

        def fused(exprs) -> None:
            _queue_on(device, schedule_programs, exprs, ctx, opts.kernels)

        def build() -> None:
            try:
                _queue_lane_kernels(device)
                # queue runs before the plan's entry is written, fused before the plan exists
                done.set_result(cached_plan(program, target=target, fuse=fuse, built=queue, fused=fused))
            except BaseException as exc:  # noqa: BLE001 (the constructor raises it)
                done.set_exception(exc)
                return
            write_deferred(program)  # a first run's load-cache entry, while the plan's kernels compile

        t0 = time.perf_counter()

        threading.Thread(target=build, name="caramel-plan", daemon=True).start()
        return done

    def _make_lanes(self, fixed: Mapping[Mem, Any], planning: Future | None) -> None:
        """One lane per slot into :attr:`lanes` (see :mod:`caramel.execute.pipeline`), on the plan of ``planning``
        (:meth:`_plan_ahead`)."""
        from caramel.execute.pipeline import HostRowLane, MemoryLane, Template

        req, opts, mode = self.plan_inputs.req, self.options, self.options.mode
        vectors, scalars = set(), set()
        for term, src in req.terms.items():
            if src.key is None and src.name not in self.shared:
                target = scalars if src.kind == InputKind.SCALAR else vectors
                target.update(Mem(term, l) for l in req.term_limbs[term])
        template = Template(fixed, frozenset(vectors), frozenset(scalars), self.ctx.n)
        outs = self._outputs
        if self.backend == "cpu":
            from caramel.execute.reference import run_reference

            for g in self.groups:
                steps = self._phase("run")
                self.lanes.append(MemoryLane(lambda memory: run_reference(self.program, self.ctx, memory, mode,
                                                                          progress=steps), template, outs, g))
            return
        from caramel.execute.pipeline import ResidentGpus, ResidentHost

        t0 = time.perf_counter()
        plan = planning.result()
        logger.debug("cold path: plan of %s awaited %.2f s", self.program.name, time.perf_counter() - t0)
        keep = frozenset(fixed)
        lanes = self.lanes
        for g in self.groups:
            if self.backend == "cpu-plan":
                if len(g) <= 1:
                    lanes.append(HostRowLane(plan, self.ctx, mode, template, self._source, outs,
                                             streams=opts.streams or 1, seed=opts.seed, device_ids=g,
                                             progress=self._phase("run")))
                else:
                    lanes.append(MemoryLane(ResidentHost(plan, self.ctx, mode, len(g), keep, streams=opts.streams or 1,
                                                         seed=opts.seed), template, outs, g))
                continue
            ids = self._gpu_devices(g)
            if len(ids) == 1:
                from caramel.execute.gpu_pipeline import GpuRowLane

                lanes.append(GpuRowLane(plan, self.ctx, mode, template, self._source, outs, device_id=ids[0],
                                        streams=opts.streams, depth=opts.depth, kernels=opts.kernels))
            else:
                lanes.append(MemoryLane(ResidentGpus(plan, self.ctx, mode, ids, keep, opts.streams,
                                                     kernels=opts.kernels), template, outs, ids))

    # ------------------------------------------------------------------ the API

    def submit(self, inputs: Mapping[str, Any] | None = None, *, seed: int | None = None) -> Future:
        """Schedule one instance; returns a :class:`~concurrent.futures.Future` of its
        :class:`InstanceResult`. ``inputs``: name -> value or object (module docstring; the inputs
        not given are drawn from ``seed``, default ``options.seed`` + the submission's index)."""
        if inputs is not None and not isinstance(inputs, Mapping):
            raise ArgumentError(f"an instance's inputs are a mapping of input name to value, not "
                                f"{type(inputs).__name__}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
            raise ArgumentError(f"seed must be an integer >= 0, got {seed!r}")
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to an executor after shutdown")
            index = next(self._counter)
            if seed is None:
                seed = inputs.seed if isinstance(inputs, InstanceInputs) else None
                seed = self.options.seed + index if seed is None else seed
            job = _Job(index, int(seed), inputs, Future())
            if self._broken is not None:
                job.future.set_running_or_notify_cancel()
                job.future.set_exception(self._stopped(self._broken))
                return job.future
            self._todo.put(job)
        return job.future

    def map(self, inputs: Iterable[Mapping[str, Any] | None], *,
            timeout: float | None = None) -> Iterator[InstanceResult]:
        """Submit every element of ``inputs`` (all at once, as :meth:`concurrent.futures.Executor.map`),
        then yield their results in that order as they finish; an instance's error is raised when its
        turn comes. ``timeout``: seconds from this call for all of them (a TimeoutError after)."""
        futures = [self.submit(x) for x in inputs]
        deadline = None if timeout is None else time.monotonic() + timeout

        def results():
            for f in futures:
                yield f.result(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return results()

    def encrypt(self, values: Mapping[str, Any] | None = None, *, seed: int | None = None) -> InstanceInputs:
        """The inputs of one instance made ahead (every input that is not shared): ``values`` (name ->
        slots or number) or drawn from ``seed`` (default ``options.seed``), encoded and encrypted on the
        client device, returned as host arrays: submit them later as they are (serving: the ciphertexts
        ready on the host)."""
        from caramel.ckks.keyset import input_rng

        seed = self.options.seed if seed is None else seed
        values = dict(values or {})
        self._check_names(values)
        with self.client_scope():
            objects, decoded = draw_inputs(self.plan_inputs, self.keys.secrets, input_rng(seed), self.varying, values)
        return InstanceInputs(objects, decoded, seed)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Take no more instances; ``cancel_futures``: cancel those not started; ``wait``: return when
        every started instance has finished and the devices are released (else that happens in the
        background)."""
        with self._lock:
            first = not self._closed
            self._closed = True
        if cancel_futures:
            self._cancel_pending()
        if first:
            self._todo.put(_STOP)
        if wait:
            for t in list(self._threads):
                while t.is_alive():
                    t.join(0.2)
            self._close_lanes()
        elif first:
            threading.Thread(target=self._close_when_done, name="caramel-shutdown", daemon=True).start()

    def __enter__(self) -> "Executor":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """Shut down: after an exception, cancel the instances not started; after one that ends the program
        (Ctrl-C's KeyboardInterrupt, SystemExit: not an ``Exception``) without waiting for those started, whose
        lanes close in the background (a run on the CPU may be seconds from its end: a Ctrl-C stops at once)."""
        failed = exc_type is not None
        self.shutdown(wait=not failed or issubclass(exc_type, Exception), cancel_futures=failed)

    @property
    def device_ids(self) -> list[tuple[int, ...]]:
        """The devices of each lane."""
        return [lane.device_ids for lane in self.lanes]

    # ------------------------------------------------------------------ threads

    def _spawn(self, target, name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _stage_done(self, stage: str, then: list[queue.Queue]) -> None:
        """A thread of ``stage`` stopped: the last one passes the stop on to the next stage's threads (one stop
        each, through the queue each of them reads)."""
        with self._lock:
            self._left[stage] -= 1
            last = self._left[stage] == 0
        if last:
            for q in then:
                q.put(_STOP)

    def _check_names(self, given: Mapping[str, Any]) -> None:
        shared = [n for n in given if n in self.shared]
        if shared:
            raise ArgumentError(f"input(s) {', '.join(shared)} are shared by every instance (given to the executor); "
                                "an instance cannot give them")
        unknown = [n for n in given if n not in self.varying]
        if unknown:
            raise ArgumentError(f"{', '.join(map(str, unknown))} is not an input of {self.program.name} (its inputs: "
                                f"{', '.join(self.plan_inputs.names)})")

    def _client_stream(self, scope: ClientScope):
        """A new CUDA stream on ``scope``'s GPU for one prepare thread (None for a host client): each
        thread queues its instances' client work on its own stream and waits for that alone, never for
        another thread's instance (nor a lane for it)."""
        if not self.client.on_gpu:
            return None
        import cupy as cp

        with scope():
            return cp.cuda.Stream(non_blocking=True)

    def _prepare(self, job: _Job, stream=None) -> None:
        """Draw, encode and encrypt the job's inputs (on its client scope; on the GPU on ``stream``,
        the calling thread's) into its feed."""
        from caramel.ckks.keyset import input_rng

        given = dict(job.inputs or {})
        self._check_names(given)
        objects = {n: v for n, v in given.items() if _is_object(v)}
        for name, obj in objects.items():
            self.plan_inputs.check_object(name, obj)
        supplied = {n: v for n, v in given.items() if n not in objects}
        drawn = [n for n in self.varying if n not in objects]
        values: Mapping[str, Any] = {}
        if drawn:
            on_stream = stream if stream is not None else contextlib.nullcontext()
            with job.scope(self._keep_on_device), on_stream:
                made, values = draw_inputs(self.plan_inputs, self.keys.secrets, input_rng(job.seed), drawn, supplied)
                if stream is not None:  # the rows are complete before a lane's stream reads them
                    stream.synchronize()
            objects.update(made)
        given_values = job.inputs.messages if isinstance(job.inputs, InstanceInputs) else None
        object_values = _ObjectValues({n: o for n, o in objects.items() if n not in drawn}, self.plan_inputs,
                                      self.keys.secrets)
        job.values = ChainMap(values, *([given_values] if given_values is not None else []), object_values,
                              self.shared_values)
        job.objects = objects
        job.feed = _Feed(objects, self.plan_inputs)

    def _prepare_loop(self, lane: int) -> None:
        """Prepare instances for the lanes (for lane ``lane`` alone, on its GPU, when each lane's instances are
        prepared there)."""
        scope = self._scopes[lane] if self._keep_on_device else self.client_scope
        ready = self._ready[lane]
        try:
            stream = self._client_stream(scope)
            with scope(self._keep_on_device):
                reserve_rows(self.plan_inputs, self.varying)
        except BaseException as exc:  # noqa: BLE001 - no stream or rows: the device's error, for every instance
            self._break(exc)
            stream = None
        while True:
            job = self._todo.get()
            if job is _STOP:
                self._todo.put(_STOP)  # for the other preparers
                break
            if not job.future.set_running_or_notify_cancel():
                continue
            self._permits.acquire()
            job.start, job.scope = time.perf_counter(), scope
            try:
                if self._broken is not None:
                    raise self._stopped(self._broken)
                self._prepare(job, stream)
            except BaseException as exc:  # noqa: BLE001 - the instance's error, handed to its future
                self._fail(job, exc)
                continue
            job.timings["encrypt"] = time.perf_counter() - job.start
            ready.put(job)
        self._stage_done("prepare", self._ready)

    def _drive_loop(self, lane, ready: queue.Queue) -> None:
        if lane.device_ids and self.backend == "gpu":
            import cupy as cp

            cp.cuda.runtime.setDevice(lane.device_ids[0])
        while True:
            job = ready.get()
            if job is _STOP:
                break
            try:
                if self._broken is not None:
                    raise self._stopped(self._broken)
                job.lane, job.ticket = lane, lane.start(job.feed)
            except INPUT_ERRORS as exc:
                self._fail(job, exc)
                continue
            except BaseException as exc:  # noqa: BLE001 - a device's error stops the executor
                self._fail(job, exc, fatal=True)
                continue
            self._done.put(job)
        self._stage_done("drive", [self._done] * self._stages["finish"])

    def _finish_loop(self) -> None:
        while True:
            job = self._done.get()
            if job is _STOP:
                break
            try:
                out = job.lane.finish(job.ticket)
            except INPUT_ERRORS as exc:
                self._fail(job, exc)
                continue
            except BaseException as exc:  # noqa: BLE001
                self._fail(job, exc, fatal=True)
                continue
            try:
                result = self._result(job, out)
            except BaseException as exc:  # noqa: BLE001 - a check that cannot run fails its instance
                self._fail(job, exc)
                continue
            job.future.set_result(result)
            self._permits.release()
        self._stage_done("finish", [])

    def _result(self, job: _Job, out) -> InstanceResult:
        t = job.timings
        t.update(out.timings)
        t["run"] = sum(out.timings.get(k, 0.0) for k in ("upload", "replay", "download"))
        memory = dict(out.outputs)
        missing = [m for m in self._outputs if m not in memory]
        if missing:  # outputs that are inputs left unchanged: the instance's, else the shared ones
            from caramel.ckks.device import host_array

            image = ChainMap(job.feed.image(), self.shared_image)
            for m in missing:
                if m in image:
                    memory[m] = np.asarray(host_array(image[m]), dtype=np.uint32)
        t0 = time.perf_counter()
        digest = output_digest(self.program, memory)
        t["digest"] = time.perf_counter() - t0
        # A result holds its input objects only when asked: on a GPU lane they are the instance's rows on the
        # device (every plaintext it draws), which results kept by the caller must not pin.
        objects = job.objects if self.keep_inputs else {}
        prepared = self.plan_inputs.prepared(self.keys.secrets, job.values, objects, {}, self.keys.keys)
        t0 = time.perf_counter()
        report = None
        if self.spec is not None:
            from caramel.ckks.check import evaluate_check

            with job.scope():
                report = evaluate_check(prepared, memory, self.options.mode)
        t["check"] = time.perf_counter() - t0
        result = InstanceResult(job.index, job.seed, digest, memory, report, t, job.lane.device_ids, prepared,
                                objects, job.scope)
        if self.decrypt:
            t0 = time.perf_counter()
            result._outputs = result.decrypt(limbs=self.decrypt == "limbs")
            t["decrypt"] = time.perf_counter() - t0
        return result

    def _fail(self, job: _Job, exc: BaseException, fatal: bool = False) -> None:
        if fatal:
            self._break(exc)
        if not job.future.done():
            job.future.set_exception(exc)
        self._permits.release()

    def _stopped(self, cause: BaseException) -> ExecutionError:
        return ExecutionError(f"not run: the executor stopped after an error ({type(cause).__name__}: {cause})")

    def _break(self, exc: BaseException) -> None:
        """A device failed: no instance runs after this one (those waiting fail as they come)."""
        with self._lock:
            if self._broken is None:
                self._broken = exc

    def _cancel_pending(self) -> None:
        """Cancel every instance not yet taken by a preparer."""
        held = []
        while True:
            try:
                job = self._todo.get_nowait()
            except queue.Empty:
                break
            if job is _STOP:
                held.append(job)
            else:
                job.future.cancel()
        for job in held:
            self._todo.put(job)

    def _close_lanes(self, failed: bool | None = None) -> None:
        lanes, self.lanes = self.lanes, []
        for lane in lanes:
            lane.close(self._broken is not None if failed is None else failed)
        with self._lock:
            frozen, self._frozen = self._frozen, False
        if frozen:
            LONG_LIVED.release()

    def _close_when_done(self) -> None:
        for t in list(self._threads):
            t.join()
        self._close_lanes()


__all__ = ["ClientScope", "Executor", "INPUT_ERRORS", "InstanceInputs", "InstanceResult", "batch_layout", "capacity",
           "preparers", "shared_inputs"]
