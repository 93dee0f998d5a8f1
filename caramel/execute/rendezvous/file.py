"""The rendezvous through files beside ``CARAMEL_RENDEZVOUS`` (a path every process can read: a
private folder under ``caramel launch``, a shared file system across machines). The fallback of
:mod:`caramel.execute.rendezvous` when neither MPI nor torch's store is there.

* **Hellos that beat.** Rank r keeps ``<path>.hello<r>`` (JSON: :func:`~caramel.execute.rendezvous.hello`
  and a beat counter) rewritten every :data:`BEAT` seconds by a thread. A hello counts as live once
  it changed while watched; one that stays the same for :data:`STALE` seconds is an earlier run's
  leftover (before the meeting) or a rank that died or was stopped (after it).
* **Disagreements within seconds.** :meth:`FileRendezvous.meet` compares every live hello with this
  rank's as soon as it sees it: another WORLD_SIZE, another run id, another program or options, a
  live hello at a rank beyond the world, or a second process writing this rank's hello (two
  processes with the same RANK: each sees the other's hello replace its own) fail at once, naming
  the ranks and their processes. The meeting ends when every rank's hello is live, in the meeting,
  and agrees, after :data:`SETTLE` more beats in which no duplicate showed (the time the others also
  take to see this rank). The ranks of one ``caramel launch`` (one process per rank: a process whose
  parent is the launcher that ``CARAMEL_LAUNCHER`` names) skip those beats: each says in its hello that
  it has seen every other (``met``), and leaves once every other has said so or ended after it was seen.
* **Messages.** A value for rank d under tag t is ``<path>.<run>.m<src>-<d>.<t>`` (written
  atomically, in :func:`~caramel.execute.rendezvous.encode`'s format, never pickle; the receiver
  reads it, bounded by :data:`MESSAGE_LIMIT`, and removes it). Files of another run id are never read.
* **Failures.** A failing rank writes its reason into its hello (``failed``); a rank waiting on it
  stops at once with that reason, and on a silent one after :data:`STALE` seconds.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from caramel.errors import ExecutionError
from caramel.execute.rendezvous.base import (Disagreement, PeerFailed, Rendezvous, RunIdentity, compare, decode,
                                             disagreements, encode, hello, who)
from caramel.infiles import NotRegularFile, open_regular
from caramel.outfiles import replace_atomically

#: Seconds between two rewrites of a rank's hello.
BEAT = 0.5
#: Seconds after which a hello that has not changed is stale (its process gone, stopped or of an earlier run).
STALE = 20.0
#: Beats a meeting waits after every rank agreed, so that a second process of one rank shows.
SETTLE = 2
#: A hello written less than this many beats ago (by its clock) is live at first sight.
FRESH = 4
#: Seconds of clock difference allowed between machines when a failure's time is compared with a rank's start.
SKEW = 5.0
#: Bytes of a hello and of one message file read at most.
HELLO_LIMIT = 1 << 16
MESSAGE_LIMIT = 1 << 40
#: Seconds between two looks at the peers' hellos while meeting.
_MEET_POLL = 0.02
#: Seconds between two looks for a message: ``_POLLS`` first, then every ``_POLL``. A message is seen within a few
#: milliseconds of its writing (the ranks start a batch together within them; a collective of the CPU fabric waits no
#: longer); a rank that waits long looks 200 times a second, a file's open that finds nothing.
_POLLS = (0.001, 0.002, 0.004)
_POLL = 0.005
_TAG = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


def _read(path: Path, limit: int) -> bytes | None:
    """The bytes of the regular file ``path`` (not through a symbolic link), None when absent or
    unreadable; an error when it holds more than ``limit`` bytes."""
    try:
        with open_regular(path, follow=False) as (f, st):
            if st.st_size > limit:
                raise ExecutionError(f"{path}: {st.st_size} bytes, more than a rendezvous file holds ({limit})")
            data = f.read(st.st_size + 1)
    except (OSError, NotRegularFile):
        return None
    if len(data) > st.st_size:
        return None  # still growing (never so for the atomic writes of a rank): read it again
    return data


class _Watch:
    """What this rank saw of one peer's hello: its bytes, when they last changed, whether it is live
    (``moved``: it changed while watched, ``changed_here``, or was fresh at first sight), and the
    tokens of the live processes seen writing it."""

    def __init__(self) -> None:
        self.data: bytes | None = None
        self.changed = time.monotonic()
        self.moved = False
        self.changed_here = False
        self.hello: dict | None = None
        self.tokens: dict[str, dict] = {}


class FileRendezvous(Rendezvous):
    """The file way (module docstring) for ``place`` (rank, world, run id, path)."""

    def __init__(self, place, *, beat: float = BEAT, stale: float = STALE):
        self.rank, self.world, self.run_id = place.rank, place.world, place.run_id
        self.base = Path(place.rendezvous)
        self.beat, self.stale = beat, stale
        #: Whether no second process of a rank can come (the module docstring): the ranks of one ``caramel launch``.
        self.launched = getattr(place, "launcher", None) == os.getppid()
        self.base.parent.mkdir(parents=True, exist_ok=True)
        self._hello = {**hello(self.rank, self.world, self.run_id, None), "phase": "start", "beat": 0}
        self._written: bytes | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._duplicate: dict | None = None
        self._watch: dict[int, _Watch] = {}
        self._failed = False
        self._born = time.time()
        self._write_hello()
        self._thread = threading.Thread(target=self._beat, name=f"caramel-rendezvous-{self.rank}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- hellos

    def _hello_path(self, rank: int) -> Path:
        return self.base.with_name(f"{self.base.name}.hello{rank}")

    def _write_hello(self) -> None:
        with self._lock:
            self._hello["beat"] += 1
            self._hello["time"] = time.time()
            data = json.dumps(self._hello).encode()
            replace_atomically(self._hello_path(self.rank), data)
            self._written = data

    def _beat(self) -> None:
        while not self._stop.wait(self.beat):
            seen = _read(self._hello_path(self.rank), HELLO_LIMIT)
            if seen is not None and seen != self._written and self._duplicate is None:
                other = _parse(seen)
                if other is not None and other.get("token") != self._hello["token"]:
                    self._duplicate = other  # another live process writes this rank's hello
            try:
                self._write_hello()
            except OSError:
                pass

    def _observe(self, rank: int) -> _Watch:
        """Read rank's hello. It is live when it changed while watched, or at first sight when it
        was written in the last :data:`FRESH` beats (by its clock)."""
        data = _read(self._hello_path(rank), HELLO_LIMIT)
        w = self._watch.get(rank)
        if w is None:
            w = self._watch[rank] = _Watch()
            w.data, w.hello = data, _parse(data)
            w.moved = w.hello is not None and _age(w.hello) < FRESH * self.beat
        elif data != w.data:
            w.moved = w.changed_here = True
            w.data, w.changed, w.hello = data, time.monotonic(), _parse(data)
        if w.moved and w.hello is not None and not w.hello.get("failed"):  # (a failed one no longer writes)
            w.tokens[str(w.hello.get("token"))] = w.hello
        return w

    def _live(self, w: _Watch) -> bool:
        return w.moved and w.hello is not None and time.monotonic() - w.changed < self.stale

    def _failure(self, r: int, w: _Watch) -> None:
        """Stop when rank r's hello says it failed in this run: written while this rank watched, or
        naming this rank's process among those it saw (one found failed may be an earlier run's)."""
        h = w.hello
        if h is None or not h.get("failed") or not (w.changed_here or self._hello["token"] in (h.get("seen") or ())):
            return
        origin = h.get("failed_rank", r)
        if h.get("run_id") != self._hello["run_id"] or h.get("world") != self.world:
            problem = compare({**self._hello, "identity": None}, {**h, "identity": None})
            raise Disagreement(f"the ranks disagree: {problem}")
        raise PeerFailed(origin if isinstance(origin, int) else r, str(h["failed"]))

    def _check_duplicate(self) -> None:
        if self._duplicate is not None:
            raise Disagreement(f"two processes are rank {self.rank} of {self.world}: this one ({who(self._hello)}) and "
                               f"{who(self._duplicate)}: every process needs its own RANK")

    def meet(self, identity: RunIdentity | None, timeout: float) -> None:
        with self._lock:
            self._hello.update(identity=None if identity is None else identity.to_json(), phase="meet")
        self._write_hello()
        deadline = time.monotonic() + timeout
        settled = None
        confirmed: dict[int, dict] = {}  # peers seen live, meeting and agreeing (one that then ends stays counted)
        while True:
            self._check_duplicate()
            waiting = []
            for r in range(self.world):
                if r == self.rank:
                    continue
                w = self._observe(r)
                self._failure(r, w)
                if self._live(w):
                    self._compare(r, w)
                    if w.hello.get("phase") in ("meet", "met"):
                        confirmed[r] = w.hello
                if r not in confirmed:
                    waiting.append(r)
            self._beyond_world()
            if not waiting:
                hellos = [self._hello if r == self.rank else confirmed[r] for r in range(self.world)]
                problem = disagreements(hellos)
                if problem is not None:
                    raise Disagreement(f"the ranks disagree: {problem}")
                if self.launched:
                    if self._hello["phase"] != "met":
                        with self._lock:
                            self._hello["phase"] = "met"
                        self._write_hello()
                    if all(self._watch[r].hello is None or self._watch[r].hello.get("phase") == "met"
                           for r in confirmed):  # each has seen this rank (or ended after it was seen)
                        break
                else:
                    settled = settled or time.monotonic()
                    if time.monotonic() - settled >= SETTLE * self.beat:
                        break
            if time.monotonic() > deadline:
                stale = [r for r in waiting if self._watch[r].data is not None and not self._live(self._watch[r])]
                more = f" (the hello of rank(s) {stale} is stale: of an earlier run?)" if stale else ""
                raise ExecutionError(f"waited {timeout:g} s at {self.base} for rank(s) {waiting} of {self.world}"
                                     f"{more}; did every process start, with the same CARAMEL_RENDEZVOUS?")
            time.sleep(_MEET_POLL)
        with self._lock:
            self._hello["phase"] = "met"
        zero = hellos[0]
        self.run_id = zero.get("run_id") or zero.get("token")

    def _compare(self, r: int, w: _Watch) -> None:
        """Refuse a live peer hello that disagrees with this rank's, or a second process at its rank."""
        h = w.hello
        if len(w.tokens) > 1:
            a, b = list(w.tokens.values())[-2:]
            raise Disagreement(f"two processes are rank {r} of {self.world}: {who(a)} and {who(b)}: every process "
                               "needs its own RANK")
        mine = self._hello
        if h.get("phase") not in ("meet", "met"):  # its identity comes when it meets
            mine, h = {**mine, "identity": None}, {**h, "identity": None}
        problem = compare(mine, h)
        if problem is not None:
            raise Disagreement(f"the ranks disagree: {problem}")

    def _beyond_world(self) -> None:
        """A live hello at a rank >= this world: a process that has a larger WORLD_SIZE."""
        for path in self.base.parent.glob(f"{self.base.name}.hello*"):
            tail = path.name[len(self.base.name) + len(".hello"):]
            if not tail.isdigit() or int(tail) < self.world or int(tail) > 1 << 20:
                continue
            w = self._observe(int(tail))
            if self._live(w):
                raise Disagreement(f"the ranks disagree: a process at rank {tail} ({who(w.hello)}) has WORLD_SIZE "
                                   f"{w.hello.get('world')}, rank {self.rank} has {self.world}")

    # ---------------------------------------------------------------- messages

    def _message(self, source: int, dest: int, tag: str) -> Path:
        if not _TAG.match(tag):
            raise ValueError(f"bad tag {tag!r}")
        return self.base.with_name(f"{self.base.name}.{self.run_id or 'run'}.m{source}-{dest}.{tag}")

    def send(self, dest: int, tag: str, value: Any) -> None:
        self._check_duplicate()
        data = encode(value)
        replace_atomically(self._message(self.rank, dest, tag), data)

    def receive(self, source: int, tag: str, timeout: float) -> Any:
        path = self._message(source, self.rank, tag)
        deadline = time.monotonic() + timeout
        checked = 0.0
        waits = itertools.chain(_POLLS, itertools.repeat(_POLL))
        while True:
            data = _read(path, MESSAGE_LIMIT)
            if data is not None:
                try:
                    path.unlink()
                except OSError:
                    pass
                return decode(data, str(path))
            now = time.monotonic()
            if now - checked > self.beat / 2:
                checked = now
                self._check_duplicate()
                self._check_peer(source, tag)
            if now > deadline:
                raise ExecutionError(f"waited {timeout:g} s for {tag} from rank {source} at {path}")
            time.sleep(next(waits))

    def _check_peer(self, source: int, tag: str) -> None:
        w = self._observe(source)
        if w.hello is None:
            if _read(self._message(source, self.rank, tag), MESSAGE_LIMIT) is None:
                raise ExecutionError(f"rank {source} ended without sending {tag} (its hello {self._hello_path(source)} "
                                     "is gone)")
            return
        self._failure(source, w)
        if time.monotonic() - w.changed > self.stale:
            raise ExecutionError(f"rank {source} ({who(w.hello)}) stopped: its heartbeat "
                                 f"{self._hello_path(source)} has not changed for {self.stale:g} s (killed, stopped, "
                                 "or its machine is down)")

    # ---------------------------------------------------------------- end

    def fail(self, reason: str, origin: int | None = None) -> None:
        self._failed = True
        self._stop.set()
        with self._lock:
            self._hello.update(failed=reason[:2000], failed_rank=self.rank if origin is None else origin,
                               seen=sorted({t for w in self._watch.values() for t in w.tokens}))
        try:
            self._write_hello()
        except OSError:
            pass

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self._failed:
            return  # the hello says why, for ranks still waiting
        path = self._hello_path(self.rank)
        mine = _read(path, HELLO_LIMIT)
        if mine is not None and mine == self._written:
            try:
                path.unlink()
            except OSError:
                pass


def _age(h: dict) -> float:
    """Seconds since a hello was written, by the writer's clock (infinite when it says no time)."""
    t = h.get("time")
    return abs(time.time() - t) if isinstance(t, (int, float)) else float("inf")


def _parse(data: bytes | None) -> dict | None:
    try:
        value = json.loads(data) if data else None
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


__all__ = ["BEAT", "FileRendezvous", "STALE"]
