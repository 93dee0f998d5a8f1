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
* Each launch makes a fresh run id (``CARAMEL_RUN_ID``) and a fresh private rendezvous folder
  (``caramel-rdv-*`` in the temporary folder, with a ``launcher.json`` naming the launcher's
  process), removed at the end; the ranks meet there through files
  (:mod:`caramel.execute.rendezvous.file`). A launch first removes the folders of launchers of
  this user on this machine that are gone (killed by ``kill -9``): only folders with such a
  marker, and in them only the files caramel writes (:func:`clean_stale_folders`).
* **Heartbeats.** Every rank touches ``heartbeat.<rank>`` in that folder every
  :data:`BEAT_SECONDS` from its start (:func:`start_heartbeat`, a thread). A rank whose heartbeat
  stops for ``heartbeat_timeout`` seconds (stopped by SIGSTOP, frozen), or that shows none within
  :data:`STARTUP_SECONDS`, is treated as failed: the launcher stops every process and names it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from caramel.errors import ExecutionError

#: Seconds between SIGTERM and SIGKILL when the launcher stops its processes.
GRACE_SECONDS = 3.0
#: Seconds between two heartbeats of a rank; a rank silent for HEARTBEAT_SECONDS has stopped making progress.
BEAT_SECONDS = 1.0
HEARTBEAT_SECONDS = 20.0
#: Seconds a rank may take from its start to its first heartbeat.
STARTUP_SECONDS = 120.0
#: The prefix of a launch's private folder in the temporary folder, and its marker file.
FOLDER_PREFIX, MARKER = "caramel-rdv-", "launcher.json"
#: The files a launch and its ranks write in that folder (a rank's file rendezvous, atomic writes' temporary files).
_OWN_FILES = re.compile(r"^\.?(launcher\.json|heartbeat\.\d+|rendezvous\.json(\..*)?)(\.[a-z0-9_]+\.tmp)?$")
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


def start_heartbeat(env: Mapping[str, str] | None = None) -> threading.Thread | None:
    """In a rank started by :func:`launch` (``$CARAMEL_HEARTBEAT`` and ``$RANK`` set): a daemon
    thread touching ``$CARAMEL_HEARTBEAT.<rank>`` every :data:`BEAT_SECONDS`; None elsewhere."""
    env = os.environ if env is None else env
    base, rank = env.get("CARAMEL_HEARTBEAT"), env.get("RANK", "")
    if not base or not rank.isdigit():
        return None
    path = f"{base}.{int(rank)}"
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600))
    except OSError:
        return None

    def beat() -> None:
        while True:
            try:
                os.utime(path, follow_symlinks=False)
            except OSError:
                return  # the launcher removed its folder: the run is over
            time.sleep(BEAT_SECONDS)
    thread = threading.Thread(target=beat, name="caramel-heartbeat", daemon=True)
    thread.start()
    return thread


def _state(pid: int) -> str:
    """The process's state in words (Linux ``/proc``), or '' when unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            code = f.read(4096).rsplit(b")", 1)[-1].split()[0].decode()
    except (OSError, IndexError):
        return ""
    return {"T": "stopped by a signal such as SIGSTOP", "t": "stopped by a debugger", "D": "in an uninterruptible wait",
            "Z": "a zombie"}.get(code, f"state {code}")


def silent_rank(procs: Sequence[subprocess.Popen], heartbeat: str, started: float, timeout: float,
                startup: float = STARTUP_SECONDS) -> str | None:
    """The first running rank whose heartbeat file ``<heartbeat>.<rank>`` is older than ``timeout``
    seconds (or absent ``startup`` seconds after ``started``, a :func:`time.time`), in words; None."""
    now = time.time()
    for rank, p in enumerate(procs):
        if p.poll() is not None:
            continue
        try:
            age = now - os.stat(f"{heartbeat}.{rank}", follow_symlinks=False).st_mtime
        except OSError:
            if now - started > startup:
                state = _state(p.pid) or "running"
                return f"rank {rank} showed no heartbeat in {startup:g} s after its start ({state})"
            continue
        if age > timeout:
            state = _state(p.pid)
            more = f" ({state})" if state else ""
            return f"rank {rank} stopped making progress: no heartbeat for {age:.0f} s{more}"
    return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), which tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read(4096).rsplit(b")", 1)[-1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _marker() -> dict:
    return {"pid": os.getpid(), "start": _start_time(os.getpid()), "host": socket.gethostname(), "uid": os.getuid()}


def _launcher_gone(marker: Mapping) -> bool:
    """Whether the launcher a marker names is gone (same host only; a live pid with another start
    time is a reused pid)."""
    if marker.get("host") != socket.gethostname() or not isinstance(marker.get("pid"), int):
        return False
    pid = marker["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return marker.get("start") is not None and _start_time(pid) != marker.get("start")


def clean_stale_folders(where: str | os.PathLike | None = None) -> list[Path]:
    """Remove the rendezvous folders in ``where`` (default the temporary folder) that a launcher of
    this user on this machine left when it died without cleaning up: a real folder (not a link)
    owned by this user, holding a marker whose launcher is gone. Only the files caramel writes
    there are removed, then the folder if it is empty. Returns the folders removed."""
    from caramel.infiles import NotRegularFile, open_regular

    base = Path(where or tempfile.gettempdir())
    removed = []
    try:
        entries = list(base.glob(f"{FOLDER_PREFIX}*"))
    except OSError:
        return removed
    for folder in entries[:10000]:
        try:
            st = folder.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
                continue
            with open_regular(folder / MARKER, follow=False) as (f, _):
                marker = json.loads(f.read(4096))
        except (OSError, ValueError, NotRegularFile):
            continue
        if not isinstance(marker, dict) or marker.get("uid") != os.getuid() or not _launcher_gone(marker):
            continue
        for entry in os.scandir(folder):
            if _OWN_FILES.match(entry.name) and entry.is_file(follow_symlinks=False):
                try:
                    os.unlink(entry.path)
                except OSError:
                    pass
        try:
            folder.rmdir()
            removed.append(folder)
        except OSError:
            pass
    return removed


def first_failure(procs: Sequence[subprocess.Popen]) -> Ending | None:
    """The first rank (lowest) that has ended badly, or None."""
    for rank, p in enumerate(procs):
        code = p.poll()
        if code is not None and code != 0:
            return Ending(rank, code)
    return None


def launch(nproc: int, args: Sequence[str], timeout: float | None = None, grace: float = GRACE_SECONDS,
           env: dict | None = None, command: Sequence[str] | None = None,
           heartbeat_timeout: float | None = HEARTBEAT_SECONDS, startup: float = STARTUP_SECONDS) -> int:
    """Run ``nproc`` processes of ``python -m caramel.cli ARGS --distributed`` (RANK, WORLD_SIZE,
    LOCAL_RANK, CARAMEL_RENDEZVOUS in a fresh private folder with CARAMEL_RENDEZVOUS_BACKEND=file,
    CARAMEL_HEARTBEAT there, CARAMEL_RUN_ID a fresh uuid, CARAMEL_LAUNCHER this process's pid;
    NCCL_NVLS_ENABLE=0 unless set) and wait
    for all (see the module docstring). Returns 0 when all succeed, 1 when a rank's check failed;
    raises :class:`ExecutionError` for any other ending, naming the rank, when a rank's heartbeat
    stops for ``heartbeat_timeout`` seconds (None: not watched) and when ``timeout`` seconds pass.
    ``command`` replaces ``python -m caramel.cli ARGS --distributed`` (tests)."""
    clean_stale_folders()
    run_id = uuid.uuid4().hex
    prctl = _prctl()
    with tempfile.TemporaryDirectory(prefix=FOLDER_PREFIX) as tmp:
        from caramel.outfiles import replace_atomically

        replace_atomically(Path(tmp) / MARKER, json.dumps(_marker()), mode=0o600)
        heartbeat = str(Path(tmp) / "heartbeat")
        base = {**os.environ, **(env or {}), "WORLD_SIZE": str(nproc),
                "CARAMEL_RENDEZVOUS": str(Path(tmp) / "rendezvous.json"), "CARAMEL_RENDEZVOUS_BACKEND": "file",
                "CARAMEL_RUN_ID": run_id, "CARAMEL_HEARTBEAT": heartbeat, "CARAMEL_LAUNCHER": str(os.getpid())}
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
            started = time.time()
            for r in range(nproc):
                procs.append(subprocess.Popen(
                    list(command) if command is not None else
                    [sys.executable, "-m", "caramel.cli", *args, "--distributed"],
                    env={**base, "RANK": str(r), "LOCAL_RANK": str(r)},
                    preexec_fn=_child_setup(os.getpid(), prctl)))
            deadline = None if timeout is None else time.monotonic() + timeout
            checked = 0.0
            while any(p.poll() is None for p in procs):
                bad = first_failure(procs)
                if bad is not None:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    stop_all(procs, grace=grace)
                    raise ExecutionError(f"the {nproc} processes did not finish in {timeout:g} s; stopped them")
                if heartbeat_timeout is not None and time.monotonic() - checked > 0.25:
                    checked = time.monotonic()
                    silent = silent_rank(procs, heartbeat, started, heartbeat_timeout, startup)
                    if silent is not None:
                        stop_all(procs, grace=grace)
                        stopped.append(1)
                        raise ExecutionError(f"{silent}; stopped all {nproc} processes")
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


__all__ = ["BEAT_SECONDS", "Ending", "GRACE_SECONDS", "HEARTBEAT_SECONDS", "STARTUP_SECONDS", "clean_stale_folders",
           "first_failure", "launch", "silent_rank", "start_heartbeat", "stop_all"]
