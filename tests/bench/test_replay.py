"""bench/replay.py's arithmetic of where a replay waits, without a GPU: task spans from their ends and the schedule,
how long a replay runs n tasks at once, and how long a ready task waited meanwhile."""

from __future__ import annotations

from bench.replay import concurrency, spans


def test_a_task_starts_after_its_stream_and_its_waits():
    # streams 0 and 1; task 2 (stream 0) waits for task 1 (stream 1), task 3 (stream 1) for task 0
    span = spans([2.0, 3.0, 5.0, 4.0], [0, 1, 0, 1], [(), (), (1,), (0,)])
    assert span == [(0.0, 2.0), (0.0, 3.0), (3.0, 5.0), (3.0, 4.0)]
    # an end before the start (a stamp of a task that had nothing to do) gives an empty span, not a negative one
    assert spans([1.0, 0.5], [0, 0], [(), ()]) == [(0.0, 1.0), (1.0, 1.0)]


def test_tasks_at_once_and_waiting():
    span = [(0.0, 2.0), (0.0, 3.0), (3.0, 5.0), (3.0, 4.0)]
    # task 3's data was ready at 2.0, but it started at 3.0: it waited while task 1 ran alone (2.0 .. 3.0)
    by_count, alone = concurrency(span, [0.0, 0.0, 3.0, 2.0])
    assert by_count == {2: [3.0, 0.0], 1: [2.0, 1.0]}
    assert alone == [0.0, 1.0, 1.0, 0.0]
    by_count, _ = concurrency(span, [0.0, 0.0, 3.0, 3.0])
    assert by_count[1] == [2.0, 0.0]
