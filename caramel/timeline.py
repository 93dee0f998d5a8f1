"""A timeline model of a replay on G devices: what a run would take, from the times of its parts.

Inputs, per device (:class:`DeviceTimeline`): its tasks in the single-stream order
(:mod:`caramel.plan.streams`: a kernel, or a communication step), each on the stream of the run's
:class:`~caramel.plan.streams.StreamSchedule` with its waits, with

* its compute time: a kernel's time, and for a communication step the local work before its collectives
  (sums, copies to staging rows) and after them (copies, ``% q``), from an instrumented run
  (:func:`measured_timeline`) or from kernel cost estimates (:func:`estimated_timeline`; any
  ``kernel -> microseconds`` callable, e.g. :func:`caramel.plan.cost.estimate_us`);
* its collective calls (:class:`Call`: the devices of the call, its payload), priced by a
  :class:`CollectiveModel`: a fixed cost per group call and per collective call, plus bytes over a
  bandwidth, by group size (fitted to measurements, :func:`fit`; :data:`FIRST_FIT` from the figures
  recorded in docs/PERFORMANCE.md and ANCHORS.md).

Simulation (:func:`simulate`), event by event over all devices at once:

* a task starts when the previous task of its stream and every task of its ``waits`` are done
  (streams start together: the fork; a device is done when its last task is: the join);
* compute runs at a device's speed shared by the compute that runs at once: with k kernels running,
  each advances at (1 + overlap (k - 1)) / k of its own speed (``overlap`` 0: they take turns, the
  sum of their times; 1: each as fast as alone). The collectives take no compute (NCCL's few blocks);
* a task's collective calls are issued together (one NCCL group) when its compute before them is done;
  on each device the calls run one after the other in issue order (one communication stream), and a
  call starts when every member has issued it and finished its earlier calls, and no earlier than
  ``group_us`` after each member issued its group (the launch and handshake of a group call); it takes
  ``call_us + bytes / rate`` of its group size, the same on every member;
* the task's compute after its collectives starts when the last of its calls ends.

The replay is the slowest device's end (the devices start together, as :class:`~caramel.execute.
cuda_graph.MultiGpuRun` launches them at a barrier). A device's *compute floor* is the same simulation of
it alone with collectives of zero cost (its program replayed without collectives, as
:func:`caramel.scaling.compute_only_ms` measures it); communication and waiting is the replay minus the
busiest device's floor. A prediction is never a measurement: the model tells what the parts' times
imply, no more; what it leaves out (kernels slowed by the NCCL kernels' blocks, link contention
between concurrent calls of different groups, host launch gaps) is not in it.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from caramel.target import NEUTRAL, Target

#: The default share of a second concurrent kernel's speed that a device keeps (:func:`simulate`).
#: Fitted (:func:`fit_overlap`) so that BootstrapLike_51L_1c's estimated kernels, scaled to its one-stream
#: replay on an H200 (15.3 ms), replay in its measured four-stream time (13.20 ms); docs/MULTI_GPU.md.
OVERLAP = 0.15


# ---------------------------------------------------------------------------------------------- collectives


@dataclass(frozen=True)
class CollectiveCost:
    """The cost of collectives among ``gpus`` devices: ``group_us`` per group call (``ncclGroupStart`` ..
    ``End`` in a graph: launch and handshake), ``call_us`` per collective call in it, and ``us_per_mib``:
    microseconds per MiB of a call's payload (its limbs, 4 N bytes each)."""

    gpus: int
    group_us: float
    call_us: float
    us_per_mib: float

    @property
    def gbps(self) -> float:
        """The payload rate in GB/s."""
        return 2**20 / (self.us_per_mib * 1e3) if self.us_per_mib > 0 else math.inf


@dataclass(frozen=True)
class CollectiveModel:
    """Fitted :class:`CollectiveCost` s by group size (``costs``, ascending ``gpus``); ``name`` says of what
    (machine, library, where the samples came from). Sizes between two fitted ones are interpolated in
    log2(gpus); sizes outside take the nearest fitted size."""

    name: str
    costs: tuple[CollectiveCost, ...]

    def at(self, gpus: int) -> CollectiveCost:
        """The cost parameters of a group of ``gpus`` devices (class docstring)."""
        sizes = [c.gpus for c in self.costs]
        if gpus in sizes:
            return self.costs[sizes.index(gpus)]
        if gpus <= sizes[0] or gpus >= sizes[-1]:
            return replace(self.costs[0] if gpus <= sizes[0] else self.costs[-1], gpus=gpus)
        i = next(i for i, s in enumerate(sizes) if s > gpus)
        lo, hi = self.costs[i - 1], self.costs[i]
        w = (math.log2(gpus) - math.log2(lo.gpus)) / (math.log2(hi.gpus) - math.log2(lo.gpus))
        mix = lambda a, b: a + w * (b - a)  # noqa: E731
        return CollectiveCost(gpus, mix(lo.group_us, hi.group_us), mix(lo.call_us, hi.call_us),
                              mix(lo.us_per_mib, hi.us_per_mib))

    def call_time_us(self, gpus: int, nbytes: int) -> float:
        """One collective call among ``gpus`` devices moving ``nbytes``: call_us + MiB * us_per_mib."""
        c = self.at(gpus)
        return c.call_us + nbytes / 2**20 * c.us_per_mib


@dataclass(frozen=True)
class CollectiveSample:
    """A measured time: ``us`` microseconds for ``groups`` group calls holding ``calls`` collective calls
    that move ``nbytes`` in all (payloads summed), among ``gpus`` devices; ``source`` says where it was
    measured. A difference of two measurements is a sample too (e.g. full payloads against one word:
    groups = calls = 0)."""

    gpus: int
    groups: float
    calls: float
    nbytes: float
    us: float
    source: str = ""


_TERMS = ("group_us", "us_per_mib", "call_us")  # the columns of fit(), in the order they are kept


def fit(samples: Iterable[CollectiveSample], name: str = "fitted") -> CollectiveModel:
    """A :class:`CollectiveModel` through ``samples``: per group size, the least-squares line
    us = groups * group_us + calls * call_us + MiB * us_per_mib in relative error (each sample weighted by
    1 / us), no term negative (a term that would be is left out and the rest refitted). A term that the
    samples of a size cannot tell apart from the others (a column of zeros, or one proportional to
    another: then the per-call term, the bandwidth kept) is interpolated in log2(gpus) from the sizes
    that determine it, or is 0 when none does. Raises ValueError without samples or without one size
    determining the bandwidth."""
    by: dict[int, list[CollectiveSample]] = {}
    for s in samples:
        if s.gpus < 2 or s.us <= 0:
            raise ValueError(f"a collective sample needs gpus >= 2 and a positive time, got {s}")
        by.setdefault(int(s.gpus), []).append(s)
    if not by:
        raise ValueError("no collective samples to fit")
    known: dict[int, dict[str, float]] = {}
    for g, group in sorted(by.items()):
        a = np.array([[s.groups, s.nbytes / 2**20, s.calls] for s in group], dtype=float)
        y = np.array([s.us for s in group], dtype=float)
        w = 1.0 / y
        cols = [j for j in range(3) if np.any(a[:, j])]
        kept: list[int] = []
        for j in cols:  # drop a column that adds no rank (proportional to the kept ones)
            if np.linalg.matrix_rank(a[:, kept + [j]]) > len(kept):
                kept.append(j)
        while kept:
            coef = np.linalg.lstsq(a[:, kept] * w[:, None], y * w, rcond=None)[0]
            if (coef >= 0).all():
                break
            kept.pop(int(np.argmin(coef)))
        else:
            coef = np.array([])
        known[g] = {_TERMS[j]: float(c) for j, c in zip(kept, coef)}
    if not any("us_per_mib" in k for k in known.values()):
        raise ValueError("no sample determines the bandwidth (every sample moves no bytes, or only in proportion "
                         "to its calls)")

    def term(g: int, t: str) -> float:
        if t in known[g]:
            return known[g][t]
        have = sorted((s, k[t]) for s, k in known.items() if t in k)
        if not have:
            return 0.0
        xs = [math.log2(s) for s, _ in have]
        return float(np.interp(math.log2(g), xs, [v for _, v in have]))

    return CollectiveModel(name, tuple(CollectiveCost(g, **{t: term(g, t) for t in _TERMS}) for g in sorted(known)))


_LIMB = 4 * 65536  # bytes of one limb at N = 65536

#: The samples of :data:`FIRST_FIT`: H200s, NVLink NV18, NCCL 2.28.9, NVLS off, collectives in CUDA graphs.
FIRST_SAMPLES = (
    # ANCHORS.md: 51 broadcasts of one 256 KiB limb, roots rotating, in a graph: one call each (a kernel
    # between: a group of one) 9.7 us per broadcast on 2 GPUs, 14-15 us on 8; all in one group 1.3-1.8 us
    # per broadcast on 2, 3.5-4.9 on 8 (the ~230 us of some ranks, unexplained there, left out).
    CollectiveSample(2, 1, 1, _LIMB, 9.7, "ANCHORS.md: graph, one call each, 2 GPUs"),
    CollectiveSample(2, 1, 51, 51 * _LIMB, 51 * 1.55, "ANCHORS.md: graph, one group of 51, 2 GPUs"),
    CollectiveSample(8, 1, 1, _LIMB, 14.5, "ANCHORS.md: graph, one call each, 8 GPUs"),
    CollectiveSample(8, 1, 51, 51 * _LIMB, 51 * 4.2, "ANCHORS.md: graph, one group of 51, 8 GPUs"),
    # The performance log at 9d91a43 (git show 9d91a43:docs/PERFORMANCE.md), "Synchronisation against
    # bandwidth": BootstrapLike_51L_2c / _4c, one
    # stream a GPU, every collective cut to one uint32 against the full payload: 24.94 - 22.66 ms on 2 GPUs,
    # 19.48 - 16.16 ms on 4; each device takes part in all 2439 one-limb collectives.
    CollectiveSample(2, 0, 0, 2439 * _LIMB, 2280.0, "log at 9d91a43: payload vs one word, 2 GPUs"),
    CollectiveSample(4, 0, 0, 2439 * _LIMB, 3320.0, "log at 9d91a43: payload vs one word, 4 GPUs"),
)

#: The collective costs fitted to :data:`FIRST_SAMPLES` (re-fit on every machine of several GPUs:
#: ``bench/timeline.py``).
FIRST_FIT = fit(FIRST_SAMPLES, "H200 NV18, NCCL 2.28 in CUDA graphs (ANCHORS.md, the performance log at 9d91a43)")


# ---------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Call:
    """One collective call as the model sees it: ``key`` names it alike on every member (its first
    communication id, kind and root), ``group`` its devices, ``nbytes`` its payload."""

    key: tuple
    group: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class ModelTask:
    """One task of a device: its ``stream`` and ``waits`` (the schedule's), compute ``before_us`` its
    collective ``calls`` (a kernel: its whole time, no calls) and ``after_us``; ``comm`` marks a
    communication step."""

    stream: int
    waits: tuple[int, ...]
    before_us: float
    calls: tuple[Call, ...] = ()
    after_us: float = 0.0
    comm: bool = False


@dataclass(frozen=True)
class DeviceTimeline:
    """A device's tasks for :func:`simulate` (module docstring)."""

    device: int
    tasks: tuple[ModelTask, ...]

    def compute_us(self) -> float:
        """The sum of its compute times (its one-stream floor)."""
        return sum(t.before_us + t.after_us for t in self.tasks)

    def scaled(self, factor: float) -> "DeviceTimeline":
        """The same with every compute time multiplied by ``factor`` (calibration to a measured floor)."""
        return replace(self, tasks=tuple(replace(t, before_us=t.before_us * factor, after_us=t.after_us * factor)
                                         for t in self.tasks))


def _calls(ops, n: int) -> tuple[Call, ...]:
    return tuple(Call((o.sync, o.kind.value, o.root), o.group, o.rows * 4 * n) for o in ops)


def local_us(limbs: int, n: int, target: Target = NEUTRAL) -> float:
    """The estimated time of a local copy or sum kernel reading and writing ``limbs`` limbs at ring dimension
    ``n`` (the elementwise line of ``target``'s costs); 0 for none."""
    c = target.cost("elementwise")
    return c.base_us + c.per_limb_us * limbs * n / 65536 if limbs else 0.0


def estimated_timeline(prog, tasks, schedule, n: int, kernel_us: Callable | None = None,
                       copy_us: Callable[[int, int], float] | None = None,
                       target: Target = NEUTRAL) -> DeviceTimeline:
    """The :class:`DeviceTimeline` of a device program (:class:`~caramel.execute.placement.DeviceProgram`) with
    its ``tasks`` and ``schedule`` (:meth:`~caramel.execute.runner.DeviceRun.schedule`, or the same built from
    :func:`~caramel.execute.runner.step_task`), compute times estimated: ``kernel_us(kernel)`` (default
    :func:`caramel.plan.cost.estimate_us` at ``n`` on ``target``) and ``copy_us(limbs, n)`` for the local work of a
    communication step."""
    from caramel.execute.placement import CommStep
    from caramel.execute.runner import comm_work
    from caramel.plan.cost import estimate_us

    kernel_us = kernel_us or (lambda k: estimate_us(k, n, target))
    copy_us = copy_us or (lambda limbs, n: local_us(limbs, n, target))
    out = []
    for k, step in enumerate(prog.steps):
        stream, waits = schedule.stream[k], schedule.waits[k]
        if isinstance(step, CommStep):
            w = comm_work(prog, step)
            out.append(ModelTask(stream, waits, copy_us(w.before_limbs, n), _calls(w.ops, n),
                                 copy_us(w.after_limbs, n), comm=True))
        else:
            out.append(ModelTask(stream, waits, float(kernel_us(step[2]))))
    return DeviceTimeline(prog.device, tuple(out))


def device_timelines(progs, n: int, streams: int, *, comm_stream: bool = True,
                     kernel_us: Callable | None = None, target: Target = NEUTRAL) -> list[DeviceTimeline]:
    """The estimated :class:`DeviceTimeline` of each device program (:func:`estimated_timeline`), on the stream
    schedule that a run with ``streams`` streams a device uses (:func:`~caramel.execute.runner.schedule_tasks`:
    ``comm_stream`` as :class:`~caramel.execute.cuda_graph.MultiGpuRun` and :class:`~caramel.execute.drive.HostRun`
    keep one), with ``target``'s kernel costs (a backend's :class:`~caramel.target.Target`, e.g. the CUDA
    backend's for an H200); no backend, no arena: any ring dimension ``n`` on any machine."""
    from caramel.execute.runner import schedule_tasks, step_task

    out = []
    for p in progs:
        tasks = [step_task(p, s, n, target) for s in p.steps]
        out.append(estimated_timeline(p, tasks, schedule_tasks(tasks, streams, comm_stream=comm_stream,
                                                               device=p.device), n, kernel_us, target=target))
    return out


def measured_timeline(run, schedule, call_us: Sequence[float], n: int) -> DeviceTimeline:
    """The :class:`DeviceTimeline` of a :class:`~caramel.execute.runner.DeviceRun` with per-call times
    ``call_us`` (microseconds, e.g. an instrumented run's durations), on ``schedule``: a task's calls before its
    group call are its compute before the collectives, those after it its compute after; the group call's
    own time is not used (the collectives are the model's); ``n`` the ring dimension."""
    from caramel.execute.runner import comm_work

    comm_steps = iter([s for s in run.prog.steps if not isinstance(s, tuple)])
    out = []
    for k, calls in enumerate(run.task_calls):
        stream, waits = schedule.stream[k], schedule.waits[k]
        group = [i for i in calls if i in run.groups]
        if not isinstance(run.prog.steps[k], tuple):
            step = next(comm_steps)
            cut = group[0] if group else calls.stop
            before = sum(call_us[i] for i in calls if i < cut)
            after = sum(call_us[i] for i in calls if i > cut)
            out.append(ModelTask(stream, waits, before, _calls(comm_work(run.prog, step).ops, n)
                                 if group else (), after, comm=True))
        else:
            out.append(ModelTask(stream, waits, sum(call_us[i] for i in calls)))
    return DeviceTimeline(run.prog.device, tuple(out))


def timeline_json(tl: DeviceTimeline) -> dict:
    """``tl`` as JSON data (:func:`timeline_from_json` reads it back)."""
    return {"device": tl.device, "tasks": [
        {"stream": t.stream, "waits": list(t.waits), "before_us": t.before_us, "after_us": t.after_us, "comm": t.comm,
         "calls": [{"key": list(c.key), "group": list(c.group), "bytes": c.nbytes} for c in t.calls]}
        for t in tl.tasks]}


def timeline_from_json(data: Mapping) -> DeviceTimeline:
    """The :class:`DeviceTimeline` of :func:`timeline_json`'s data."""
    return DeviceTimeline(int(data["device"]), tuple(
        ModelTask(int(t["stream"]), tuple(int(j) for j in t["waits"]), float(t["before_us"]),
                  tuple(Call(tuple(c["key"]), tuple(int(d) for d in c["group"]), int(c["bytes"])) for c in t["calls"]),
                  float(t["after_us"]), bool(t["comm"]))
        for t in data["tasks"]))


def model_json(model: CollectiveModel) -> dict:
    """``model`` as JSON data (:func:`model_from_json` reads it back)."""
    return {"name": model.name, "costs": [{"gpus": c.gpus, "group_us": c.group_us, "call_us": c.call_us,
                                           "us_per_mib": c.us_per_mib, "gbps": c.gbps} for c in model.costs]}


def model_from_json(data: Mapping) -> CollectiveModel:
    """The :class:`CollectiveModel` of :func:`model_json`'s data."""
    return CollectiveModel(str(data["name"]), tuple(
        CollectiveCost(int(c["gpus"]), float(c["group_us"]), float(c["call_us"]), float(c["us_per_mib"]))
        for c in data["costs"]))


# ---------------------------------------------------------------------------------------------- simulation


@dataclass(frozen=True)
class DeviceReplay:
    """One device in a simulated replay: ``end_us`` (its last task), ``floor_us`` (alone, collectives
    free), ``calls`` (collective calls issued), ``groups`` (group calls), ``nbytes`` (their payload)."""

    device: int
    end_us: float
    floor_us: float
    calls: int
    groups: int
    nbytes: int


@dataclass(frozen=True)
class Replay:
    """A simulated replay (:func:`simulate`): per device, and the figures of the whole; ``model`` names the
    collective model, ``overlap`` the compute sharing used."""

    devices: tuple[DeviceReplay, ...]
    model: str
    overlap: float

    @property
    def predicted_ms(self) -> float:
        return max(d.end_us for d in self.devices) / 1e3

    @property
    def compute_floor_ms(self) -> float:
        """The busiest device's floor."""
        return max(d.floor_us for d in self.devices) / 1e3

    @property
    def comm_wait_ms(self) -> float:
        """The replay minus the busiest device's floor: communication and waiting."""
        return max(0.0, self.predicted_ms - self.compute_floor_ms)

    @property
    def collectives(self) -> int:
        """The most collective calls that one device issues."""
        return max((d.calls for d in self.devices), default=0)


class _Device:
    """Simulation state of one device (see :func:`_run`)."""

    def __init__(self, tl: DeviceTimeline):
        self.tl = tl
        self.queues: dict[int, list[int]] = {}
        for k, t in enumerate(tl.tasks):
            self.queues.setdefault(t.stream, []).append(k)
        self.pos = {s: 0 for s in self.queues}
        n = len(tl.tasks)
        self.done = [False] * n
        self.started = [False] * n
        self.finish = [0.0] * n
        self.begin = [0.0] * n
        self.outstanding = [0] * n
        self.jobs: dict[int, float] = {}  # task -> remaining compute (us at full speed)
        self.phase: dict[int, str] = {}
        self.issued: deque = deque()  # calls issued, in order: (key, task, issue time, first of its group)
        self.link_free = 0.0
        self.end = 0.0

    def rate(self, overlap: float) -> float:
        k = len(self.jobs)
        return (1.0 + overlap * (k - 1)) / k if k else 0.0


def _run(timelines: Sequence[DeviceTimeline], model: CollectiveModel | None, overlap: float,
         spans: list | None = None) -> list[float]:
    """The simulation of :func:`simulate`; ``model`` None: collectives cost nothing and nobody waits for
    another device (each device's floor). Returns each device's end in microseconds; with ``spans`` (a list)
    appends (device, task, start, end) of every task and (device, -1 - task, start, end) of every call."""
    devs = [_Device(tl) for tl in timelines]
    index = {tl.device: i for i, tl in enumerate(timelines)}
    members: dict[tuple, dict[int, float]] = {}  # call key -> device -> issue time (+ group latency)
    heap: list = []  # (time, seq, device index, task) ends of calls
    seq = 0
    now = 0.0

    def start_phase(d: int, k: int, phase: str) -> None:
        dev, t = devs[d], devs[d].tl.tasks[k]
        if phase == "before" and t.before_us > 0:
            dev.jobs[k], dev.phase[k] = t.before_us, "before"
            return
        if phase in ("before", "calls") and t.calls and model is not None:
            dev.phase[k] = "calls"
            dev.outstanding[k] = len(t.calls)
            for i, c in enumerate(t.calls):
                dev.issued.append((c, k))
                members.setdefault(c.key, {})[d] = now + (model.at(len(c.group)).group_us if i == 0 else 0.0)
            return
        if phase != "end" and t.after_us > 0:
            dev.jobs[k], dev.phase[k] = t.after_us, "after"
            return
        dev.done[k], dev.finish[k] = True, now
        dev.end = max(dev.end, now)
        dev.phase.pop(k, None)

    def next_phase(d: int, k: int) -> None:
        start_phase(d, k, {"before": "calls", "calls": "after", "after": "end"}[devs[d].phase[k]])

    def advance_tasks() -> bool:
        moved = False
        for d, dev in enumerate(devs):
            again = True
            while again:
                again = False
                for s, q in dev.queues.items():
                    p = dev.pos[s]
                    if p >= len(q):
                        continue
                    k = q[p]
                    if dev.started[k]:
                        if dev.done[k]:
                            dev.pos[s] += 1
                            again = True
                        continue
                    if p > 0 and not dev.done[q[p - 1]]:
                        continue
                    if all(dev.done[j] for j in dev.tl.tasks[k].waits):
                        dev.started[k] = True
                        dev.begin[k] = now
                        start_phase(d, k, "before")
                        moved = again = True
        return moved

    def start_calls() -> bool:
        nonlocal seq
        moved = False
        again = True
        while again:
            again = False
            for d, dev in enumerate(devs):
                if not dev.issued:
                    continue
                call, _ = dev.issued[0]
                who = [index[m] for m in call.group]
                issued = members.get(call.key, {})
                if any(m not in issued or not devs[m].issued or devs[m].issued[0][0].key != call.key for m in who):
                    continue
                start = max(max(issued[m], devs[m].link_free) for m in who)
                end = start + model.call_time_us(len(call.group), call.nbytes)
                for m in who:
                    _, task = devs[m].issued.popleft()
                    if spans is not None:
                        spans.append((devs[m].tl.device, -1 - task, start, end))
                    devs[m].link_free = end
                    heapq.heappush(heap, (end, seq, m, task))
                    seq += 1
                del members[call.key]
                moved = again = True
        return moved

    advance_tasks()
    while True:
        while advance_tasks() | (model is not None and start_calls()):
            pass
        t_next = math.inf
        for dev in devs:
            if dev.jobs:
                t_next = min(t_next, now + min(dev.jobs.values()) / dev.rate(overlap))
        if heap:
            t_next = min(t_next, heap[0][0])
        if t_next == math.inf:
            break
        for dev in devs:
            if dev.jobs:
                step = (t_next - now) * dev.rate(overlap)
                for k in dev.jobs:
                    dev.jobs[k] -= step
        now = t_next
        for d, dev in enumerate(devs):
            for k in [k for k, rem in dev.jobs.items() if rem <= 1e-9 * max(1.0, now)]:
                del dev.jobs[k]
                next_phase(d, k)
        while heap and heap[0][0] <= now:
            _, _, d, k = heapq.heappop(heap)
            devs[d].outstanding[k] -= 1
            if devs[d].outstanding[k] == 0:
                next_phase(d, k)
    stuck = [(tl.device, dev.done.count(False)) for tl, dev in zip(timelines, devs) if not all(dev.done)]
    if stuck:
        raise ValueError("the simulated replay deadlocks: tasks never done on device(s) "
                         + ", ".join(f"{d} ({n} tasks)" for d, n in stuck))
    if spans is not None:
        spans += [(tl.device, k, dev.begin[k], dev.finish[k]) for tl, dev in zip(timelines, devs)
                  for k in range(len(dev.done))]
    return [dev.end for dev in devs]


def alone_us(timeline: DeviceTimeline, overlap: float = OVERLAP) -> float:
    """The replay of ``timeline``'s device alone, collectives free: its compute floor in microseconds."""
    return _run([timeline], None, overlap)[0]


def simulate(timelines: Sequence[DeviceTimeline], model: CollectiveModel = FIRST_FIT, *,
             overlap: float = OVERLAP) -> Replay:
    """The replay of ``timelines`` (one per device) under ``model`` (module docstring), with every device's
    floor (simulated alone, collectives free)."""
    ends = _run(timelines, model, overlap)
    out = []
    for tl, end in zip(timelines, ends):
        floor = alone_us(tl, overlap)
        calls = [c for t in tl.tasks for c in t.calls]
        out.append(DeviceReplay(tl.device, end, floor, len(calls), sum(1 for t in tl.tasks if t.calls),
                                sum(c.nbytes for c in calls)))
    return Replay(tuple(out), model.name, overlap)


def fit_overlap(timeline: DeviceTimeline, measured_us: float, lo: float = 0.0, hi: float = 1.0) -> float | None:
    """The ``overlap`` (:func:`simulate`) in [lo, hi] with which ``timeline`` alone replays in ``measured_us``
    (bisection: the simulated time does not grow with overlap); ``lo`` or ``hi`` when out of reach; None when the
    overlap makes no difference (one stream of kernels)."""
    f = lambda o: alone_us(timeline, o)  # noqa: E731
    if f(lo) - f(hi) <= 1e-3 * f(lo):
        return None
    if f(lo) <= measured_us:
        return lo
    if f(hi) >= measured_us:
        return hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) > measured_us else (lo, mid)
    return (lo + hi) / 2


__all__ = [
    "Call", "CollectiveCost", "CollectiveModel", "CollectiveSample", "DeviceReplay", "DeviceTimeline", "FIRST_FIT",
    "FIRST_SAMPLES", "ModelTask", "OVERLAP", "Replay", "device_timelines", "estimated_timeline", "fit", "fit_overlap",
    "local_us", "measured_timeline", "model_from_json", "model_json", "simulate", "timeline_from_json",
    "timeline_json",
]
