"""``caramel launch``: start G local processes of one caramel command in process mode, and make
sure that they end together.

* Every process is started in a process group of its own (a Ctrl-C on the terminal reaches the
  launcher only) and, on Linux, with ``PR_SET_PDEATHSIG = SIGKILL``: a launcher that dies, even by
  ``kill -9``, takes its processes with it.
* The launcher waits on every process. When one exits with a non-zero status or dies by a signal,
  it stops the others (SIGTERM to their process groups, SIGKILL after :data:`GRACE_SECONDS`) and
  ends naming the rank and how it ended: status 1 (a failed check) is passed on, anything else is an
  :class:`~caramel.errors.ExecutionError` (exit status 2).
* SIGINT and SIGTERM sent to the launcher are passed to every process (then SIGKILL after the grace
  period); a second Ctrl-C while it waits goes straight to SIGKILL.
* Each launch makes a fresh run id (``CARAMEL_RUN_ID``) and a fresh rendezvous folder, removed at the
  end; :mod:`caramel.execute.distributed` writes the run id into the rendezvous data and every rank
  refuses data of another run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from caramel.errors import ExecutionError

#: Seconds between SIGTERM and SIGKILL when the launcher stops its processes.
GRACE_SECONDS = 3.0
_POLL = 0.05
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Ending:
    """How one rank's process ended: ``status`` >= 0 an exit status, < 0 the signal that killed it."""

    rank: int
    status: int

    def __str__(self) -> str:
        if self.status < 0:
            try:
                name = signal.Signals(-self.status).name
            except ValueError:
                name = f"signal {-self.status}"
            return f"rank {self.rank} was killed by {name}"
        return f"rank {self.rank} exited with status {self.status}"


def _prctl():
    """libc's ``prctl`` (Linux), resolved before any fork; None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _child_setup(parent: int, prctl):
    """Runs in each child between fork and exec: own process group, die with the launcher."""

    def setup() -> None:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return setup


def _signal_all(procs: Sequence[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                try:
                    p.send_signal(sig)
                except ProcessLookupError:
                    pass


class _Stop(Exception):
    """SIGTERM reached the launcher."""


def stop_all(procs: Sequence[subprocess.Popen], sig: int = signal.SIGTERM, grace: float = GRACE_SECONDS) -> None:
    """Send ``sig`` to every live process (its process group), SIGKILL after ``grace`` seconds
    (at once on a further Ctrl-C), and reap them all."""
    hurry = []
    previous = None
    try:
        previous = signal.signal(signal.SIGINT, lambda *_: hurry.append(1))
    except ValueError:  # not the main thread
        pass
    try:
        _signal_all(procs, sig)
        deadline = time.monotonic() + grace
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline and not hurry:
            time.sleep(_POLL)
        _signal_all(procs, signal.SIGKILL)
        for p in procs:
            p.wait()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def first_failure(procs: Sequence[subprocess.Popen]) -> Ending | None:
    """The first rank (lowest) that has ended badly, or None."""
    for rank, p in enumerate(procs):
        code = p.poll()
        if code is not None and code != 0:
            return Ending(rank, code)
    return None


def launch(nproc: int, args: Sequence[str], timeout: float | None = None, grace: float = GRACE_SECONDS,
           env: dict | None = None, command: Sequence[str] | None = None) -> int:
    """Run ``nproc`` processes of ``python -m caramel.cli ARGS --distributed`` (RANK, WORLD_SIZE,
    LOCAL_RANK, CARAMEL_RENDEZVOUS in a fresh private folder, CARAMEL_RUN_ID a fresh uuid;
    NCCL_NVLS_ENABLE=0 unless set) and wait for all (see the module docstring). Returns 0 when all
    succeed, 1 when a rank's check failed; raises :class:`ExecutionError` for any other ending,
    naming the rank, and when ``timeout`` seconds pass. ``command`` replaces
    ``python -m caramel.cli ARGS --distributed`` (tests)."""
    run_id = uuid.uuid4().hex
    prctl = _prctl()
    with tempfile.TemporaryDirectory(prefix="caramel-rdv-") as tmp:
        base = {**os.environ, **(env or {}), "WORLD_SIZE": str(nproc),
                "CARAMEL_RENDEZVOUS": str(Path(tmp) / "rendezvous.json"), "CARAMEL_RUN_ID": run_id}
        base.setdefault("NCCL_NVLS_ENABLE", "0")
        procs: list[subprocess.Popen] = []
        stopped = []

        def on_term(signum, frame):
            raise _Stop()

        previous = None
        try:
            previous = signal.signal(signal.SIGTERM, on_term)
        except ValueError:
            pass
        try:
            for r in range(nproc):
                procs.append(subprocess.Popen(
                    list(command) if command is not None else
                    [sys.executable, "-m", "caramel.cli", *args, "--distributed"],
                    env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                    preexec_fn=_child_setup(os.getpid(), prctl)))
            deadline = None if timeout is None else time.monotonic() + timeout
            while any(p.poll() is None for p in procs):
                bad = first_failure(procs)
                if bad is not None:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    stop_all(procs, grace=grace)
                    raise ExecutionError(f"the {nproc} processes did not finish in {timeout:g} s; stopped them")
                time.sleep(_POLL)
            bad = first_failure(procs)
            if bad is None:
                return 0
            stop_all(procs, grace=grace)
            stopped.append(1)
            others = sum(1 for p in procs if p.returncode is not None) - 1
            if bad.status == 1:
                print(f"caramel launch: {bad}", file=sys.stderr, flush=True)
                return 1
            raise ExecutionError(f"{bad}; stopped the other {others} process(es)")
        except KeyboardInterrupt:
            stop_all(procs, signal.SIGINT, grace)
            raise
        except _Stop:
            stop_all(procs, signal.SIGTERM, grace)
            raise KeyboardInterrupt from None
        finally:
            if not stopped:
                stop_all(procs, grace=grace)
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)


__all__ = ["Ending", "GRACE_SECONDS", "first_failure", "launch", "stop_all"]
