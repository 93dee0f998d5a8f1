"""Streams: tasks spread over several in-order queues (CUDA streams).

A *task* (:class:`Task`) is one unit of a single-stream run: on a device, a kernel or one
communication step (:mod:`caramel.execute.runner`); it declares the arena rows it reads and
writes. A :class:`StreamSchedule` puts every task on one of ``n_streams`` streams. Tasks of one
stream run in task order; a task also waits for the earlier tasks of other streams listed in
``waits`` (an event recorded after each of them). Before the first task every stream
is ordered after the arena's initial writes (the *fork*), and before the stores are read stream
0 waits for the last task of every other stream (the *join*, ``joins``; explicit for every
stream, as CUDA graph capture wants), so that everything happens before the end. Together they
form the happens-before relation of a run.

Rule: a schedule is correct when every pair of accesses to one arena row that the single-stream
run (task order) makes, with at least one write, is ordered the same way by happens-before:

* read-after-write: a task reading a row follows the last earlier task that wrote it (this
  covers the plan's data dependencies ``chip.deps``, which are also honoured as ``Task.deps``);
* write-after-read and write-after-write: a task writing a row follows the last earlier writer
  and every task that read the row since. These come from row reuse (:func:`assign_rows` gives
  a freed row to a later buffer), not from the data flow. With last-in first-out reuse (the
  default) a freed row goes straight to the next writer, which chains most kernels one after
  the other; first-in first-out reuse (``assign_rows(chip, reuse="fifo")``, the same row count)
  reuses the row freed longest ago and leaves nearly only the data dependencies.

Then any execution consistent with happens-before computes exactly the single-stream result.
:func:`hazards` lists these orderings, :func:`assign_streams` builds a schedule that honours them
with few waits, :func:`check_schedule` verifies a schedule against them by vector clocks.

Stream choice (:func:`assign_streams`) is list scheduling on an estimated cost (a kernel's
estimated GPU time, :mod:`caramel.plan.cost`): in task order, each task goes on the stream where
it could start earliest, preferring the stream whose last task it must follow (a chain continues
without a wait), then the lowest index; so independent branches spread over idle streams. A task
with a fixed ``stream`` goes there (a device's communication steps on a stream of their own,
``reserved`` for them, so that kernels overlap the collectives). Redundant waits
are dropped with a vector clock per task: ``clock[s]`` is the latest task of stream s already
ordered before it; a needed task j that the clock covers (``clock[stream[j]] >= j``) needs no
wait of its own (needed tasks are taken latest first, so most earlier ones are already covered;
the result is small, not guaranteed minimal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from caramel.errors import ExecutionError


@dataclass(frozen=True)
class Task:
    """One unit of work to schedule: the arena ``reads`` and ``writes`` it makes, ``deps`` (earlier
    tasks it must follow besides its row hazards), an estimated ``cost`` (nanoseconds,
    :mod:`caramel.plan.cost`), ``stream``: the stream it must go on (None: any free stream), and a
    ``name`` for messages."""

    reads: frozenset[int]
    writes: frozenset[int]
    deps: tuple[int, ...] = ()
    cost: int = 1
    stream: int | None = None
    name: str = ""


@dataclass(frozen=True)
class StreamSchedule:
    """Per task k: ``stream[k]`` (0..n_streams-1), ``waits[k]`` the earlier tasks of other
    streams it waits for, ``event[k]`` the index of the event recorded after it (-1: nobody
    waits for it); ``joins`` the last task of every other stream used, which stream 0 waits
    for at the end; ``n_events`` events in all."""

    n_streams: int
    stream: tuple[int, ...]
    waits: tuple[tuple[int, ...], ...]
    joins: tuple[int, ...]
    event: tuple[int, ...]
    n_events: int


DEP, RAW, WAW, WAR = "data dependency", "read-after-write", "write-after-write", "write-after-read"


def orderings(accesses: Iterable[tuple[Iterable, Iterable, Iterable[int]]]):
    """Every ordering that the module rule asks of a sequence of accesses ((reads, writes, deps):
    the resources read and written, and earlier accesses to follow anyway), in program order:
    (earlier index j, index k, kind, resource) for each of ``deps`` (resource None), then each
    read-after-write and write-after-write on the resource's last writer and each write-after-read
    on the readers since that write. Linear: one last writer and one list of readers since that
    write per resource, never a scan of earlier accesses."""
    writer: dict = {}  # resource -> last access that wrote it
    readers: dict = {}  # resource -> accesses that read it since
    for k, (reads, writes, deps) in enumerate(accesses):
        for j in deps:
            yield j, k, DEP, None
        for r in reads:
            if r in writer:
                yield writer[r], k, RAW, r
        for r in writes:
            if r in writer:
                yield writer[r], k, WAW, r
            for j in readers.get(r, ()):
                yield j, k, WAR, r
        for r in reads:
            readers.setdefault(r, []).append(k)
        for r in writes:
            writer[r] = k
            readers[r] = []


def hazards(tasks: Sequence[Task]) -> tuple[tuple[int, ...], ...]:
    """Per task, the earlier tasks it must follow (module rule: :func:`orderings` on arena rows,
    plus ``deps``), sorted."""
    need: list[set[int]] = [set() for _ in tasks]
    for j, k, _, _ in orderings((t.reads, t.writes, t.deps) for t in tasks):
        need[k].add(j)
    return tuple(tuple(sorted(n - {k})) for k, n in enumerate(need))


def assign_streams(tasks: Sequence[Task], n_streams: int, reserved: int = 0) -> StreamSchedule:
    """A schedule of ``tasks`` on ``n_streams`` streams honouring :func:`hazards` (module
    docstring: the rule, the stream choice and the removal of redundant waits). Tasks with a
    ``stream`` go there; the others go on streams 0..n_streams-reserved-1 (the last ``reserved``
    streams are kept for pinned tasks, e.g. communication). One stream gives no waits at all."""
    if n_streams < 1 or not 0 <= reserved < n_streams:
        raise ValueError(f"need n_streams >= 1 and 0 <= reserved < n_streams, got {n_streams} and {reserved}")
    need = hazards(tasks)
    n = len(tasks)
    free_streams = range(n_streams - reserved)
    stream = [0] * n
    clock: list[list[int]] = [[]] * n
    finish = [0.0] * n  # estimated
    free = [0.0] * n_streams  # estimated time each stream becomes idle
    tail = [-1] * n_streams  # last task of each stream
    waits: list[tuple[int, ...]] = []
    for k, task in enumerate(tasks):
        ready = max((finish[j] for j in need[k]), default=0.0)
        if task.stream is not None:
            if not 0 <= task.stream < n_streams:
                raise ValueError(f"{task.name or f'task {k}'} is pinned to stream {task.stream} of {n_streams}")
            s = task.stream
        else:
            s = min(free_streams, key=lambda t: (max(free[t], ready), tail[t] not in need[k], t))
        c = list(clock[tail[s]]) if tail[s] >= 0 else [-1] * n_streams
        mine = []
        for j in reversed(need[k]):  # latest first: its clock often covers the earlier ones
            if c[stream[j]] < j:
                mine.append(j)
                c = [max(a, b) for a, b in zip(c, clock[j])]
        c[s] = k
        stream[k], clock[k], tail[s] = s, c, k
        finish[k] = free[s] = max(free[s], ready) + task.cost
        waits.append(tuple(sorted(mine)))
    joins = [t for t in tail[1:] if t >= 0]  # every one, even if already ordered: CUDA wants each joined
    event = [-1] * n
    n_events = 0
    for j in sorted({j for w in waits for j in w} | set(joins)):
        event[j], n_events = n_events, n_events + 1
    return StreamSchedule(n_streams, tuple(stream), tuple(waits), tuple(sorted(joins)), tuple(event), n_events)


def _describe(tasks: Sequence[Task], k: int, schedule: StreamSchedule) -> str:
    return f"{tasks[k].name or f'task {k}'} on stream {schedule.stream[k]}"


def check_schedule(tasks: Sequence[Task], schedule: StreamSchedule, limit: int = 10, what: str = "stream schedule") -> None:
    """Verify ``schedule`` for ``tasks``: its shape (streams in range, waits on earlier tasks of
    other streams, an event for every task waited for), then, by vector clocks over
    happens-before (stream order, waits, fork, join), that every read-after-write,
    write-after-read and write-after-write on an arena row and every ``deps`` edge is ordered as
    in task order, and that stream 0 waits for the last task of every other stream (CUDA graph
    capture wants every forked stream joined back explicitly, even when the order is already
    implied). Raises :class:`ExecutionError` (``what`` names the schedule) listing the first
    ``limit`` violations."""
    n, m = len(tasks), schedule.n_streams
    s_of = schedule.stream
    if len(s_of) != n or len(schedule.waits) != n or len(schedule.event) != n:
        raise ExecutionError(f"the {what} covers {len(s_of)} tasks, there are {n}")
    problems: list[str] = []
    events = [e for e in schedule.event if e >= 0]
    if sorted(events) != list(range(schedule.n_events)):
        problems.append(f"events are not numbered 0..{schedule.n_events - 1} once each")
    for k in range(n):
        if not 0 <= s_of[k] < m:
            raise ExecutionError(f"{tasks[k].name or f'task {k}'} is on stream {s_of[k]}, outside 0..{m - 1}")
        if tasks[k].stream is not None and s_of[k] != tasks[k].stream:
            problems.append(f"{_describe(tasks, k, schedule)}: it must go on stream {tasks[k].stream}")
        for j in schedule.waits[k]:
            if not 0 <= j < k or s_of[j] == s_of[k]:
                problems.append(f"{_describe(tasks, k, schedule)} waits for task {j}: "
                                "not an earlier task of another stream")
            elif schedule.event[j] < 0:
                problems.append(f"task {j} is waited for but records no event")
    for j in schedule.joins:
        if not 0 <= j < n or schedule.event[j] < 0:
            problems.append(f"join on task {j}, which does not exist or records no event")
    if problems:
        raise ExecutionError(f"bad {what}:\n  " + "\n  ".join(problems[:limit]))

    clock: list[list[int]] = []
    last = [-1] * m
    for k in range(n):
        s = s_of[k]
        c = list(clock[last[s]]) if last[s] >= 0 else [-1] * m
        for j in schedule.waits[k]:
            c = [max(a, b) for a, b in zip(c, clock[j])]
        c[s] = k
        clock.append(c)
        last[s] = k

    def need(j: int, k: int, why: str) -> None:
        if j != k and clock[k][s_of[j]] < j:
            problems.append(f"{_describe(tasks, k, schedule)} is not ordered after "
                            f"{_describe(tasks, j, schedule)}: {why}")

    for j, k, kind, r in orderings((t.reads, t.writes, t.deps) for t in tasks):
        need(j, k, kind if r is None else f"{kind} on row {r}")
    joins = set(schedule.joins)
    for s in range(1, m):
        if last[s] >= 0 and last[s] not in joins:
            problems.append(f"stream {s} is not joined: stream 0 does not wait for its last "
                            f"{_describe(tasks, last[s], schedule)}")
    if problems:
        more = f"\n  ... and {len(problems) - limit} more" if len(problems) > limit else ""
        raise ExecutionError(f"{what} misses {len(problems)} ordering(s):\n  "
                             + "\n  ".join(problems[:limit]) + more)


def happens_before_order(schedule: StreamSchedule, rng) -> list[int]:
    """A random order of all kernels consistent with the schedule's happens-before (stream
    order and waits): at each step one of the kernels whose predecessors have all run, chosen by
    ``rng`` (a :class:`numpy.random.Generator`). For tests: executing kernels in any such order
    must reproduce the single-stream result."""
    n, m = len(schedule.stream), schedule.n_streams
    queues = [[k for k, t in enumerate(schedule.stream) if t == s] for s in range(m)]
    pos = [0] * m
    done = [False] * n
    order: list[int] = []
    while len(order) < n:
        ready = [s for s in range(m)
                 if pos[s] < len(queues[s]) and all(done[j] for j in schedule.waits[queues[s][pos[s]]])]
        if not ready:
            raise ExecutionError("the schedule deadlocks: every stream waits for a kernel that cannot run")
        s = ready[int(rng.integers(len(ready)))]
        k = queues[s][pos[s]]
        pos[s] += 1
        done[k] = True
        order.append(k)
    return order


__all__ = ["StreamSchedule", "Task", "assign_streams", "check_schedule", "happens_before_order", "hazards", "orderings"]
