"""The process-mode launcher and rendezvous on the CPU: a dead rank ends the run promptly and is named,
nothing outlives a killed launcher, stale or foreign rendezvous data is never used as this run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from caramel.errors import ExecutionError
from caramel.execute.distributed import Place, RunIdentity, clean_up, rendezvous
from caramel.launch import Ending, launch

from tests.conftest import REPO, SHARED_PROGRAMS, caramel_cli

MUL = SHARED_PROGRAMS / "Mul_4L_2c"
needs_corpus = pytest.mark.skipif(not MUL.is_dir(), reason="shared corpus not found")

# A rank that writes its pid to $PIDS/<rank> and sleeps (or exits with $EXIT_<rank>).
SLEEPER = """
import os, sys, time
rank = os.environ["RANK"]
open(os.path.join(os.environ["PIDS"], rank), "w").write(str(os.getpid()))
code = os.environ.get("EXIT_" + rank)
if code is not None:
    time.sleep(0.3)
    sys.exit(int(code))
time.sleep(600)
"""


def _pids(folder: Path, n: int, timeout: float = 30) -> dict[int, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {int(p.name): int(p.read_text() or 0) for p in folder.iterdir() if p.read_text()}
        if len(found) == n and all(found.values()):
            return found
        time.sleep(0.05)
    raise AssertionError(f"ranks did not start: {list(folder.iterdir())}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pids, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_ending_names_the_rank_and_how():
    assert str(Ending(1, -9)) == "rank 1 was killed by SIGKILL"
    assert str(Ending(0, 3)) == "rank 0 exited with status 3"


def test_a_failing_rank_stops_the_others_and_is_named(tmp_path):
    env = {"PIDS": str(tmp_path), "EXIT_1": "3"}
    start = time.monotonic()
    with pytest.raises(ExecutionError, match="rank 1 exited with status 3; stopped the other 2"):
        launch(3, [], env=env, command=[sys.executable, "-c", SLEEPER], grace=2)
    assert time.monotonic() - start < 60
    assert _wait_dead(_pids(tmp_path, 3).values())


def test_a_failed_check_passes_status_1(tmp_path):
    env = {"PIDS": str(tmp_path), "EXIT_0": "1", "EXIT_1": "0"}
    assert launch(2, [], env=env, command=[sys.executable, "-c", SLEEPER]) == 1


def _launcher(tmp_path: Path, nproc: int) -> subprocess.Popen:
    script = ("import sys; from caramel.launch import launch; from caramel.errors import CaramelError\n"
              f"try:\n    sys.exit(launch({nproc}, [], command=[sys.executable, '-c', {SLEEPER!r}], grace=2))\n"
              "except CaramelError as e:\n    print('caramel: error:', e, file=sys.stderr); sys.exit(2)\n"
              "except KeyboardInterrupt:\n    sys.exit(130)\n")
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "PIDS": str(tmp_path)})


def test_kill_9_of_a_rank_ends_the_launcher_promptly(tmp_path):
    launcher = _launcher(tmp_path, 3)
    pids = _pids(tmp_path, 3)
    os.kill(pids[1], signal.SIGKILL)
    _, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 2
    assert "rank 1 was killed by SIGKILL" in err
    assert _wait_dead(pids.values())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_nothing_outlives_the_launcher(tmp_path, sig):
    launcher = _launcher(tmp_path, 2)
    pids = _pids(tmp_path, 2)
    launcher.send_signal(sig)
    launcher.communicate(timeout=30)
    assert launcher.returncode != 0
    assert _wait_dead(pids.values())


# ----------------------------------------------------------------------------------------------
# Rendezvous data
# ----------------------------------------------------------------------------------------------

IDENT = RunIdentity("digest", 1024, "exact", 0, 2, "cpu-plan")


def test_a_stale_rendezvous_file_of_another_run_is_never_read(tmp_path):
    rdv = tmp_path / "rdv.json"
    rdv.write_text(json.dumps({"run_id": "old", "world": 2, "identity": IDENT.to_json()}))
    got = {}

    def rank1():
        got["place"], got["data"] = rendezvous(Place(1, 2, 1, rdv, "new"), IDENT, timeout=20)

    t = threading.Thread(target=rank1)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()  # still waiting: the file is of another run
    rendezvous(Place(0, 2, 0, rdv, "new"), IDENT, {"x": 1})
    t.join(20)
    assert got["place"].run_id == "new" and got["data"]["x"] == 1


def test_a_stale_file_times_out_with_a_clear_error(tmp_path):
    rdv = tmp_path / "rdv.json"
    rdv.write_text(json.dumps({"run_id": "old", "world": 2, "identity": IDENT.to_json()}))
    with pytest.raises(ExecutionError, match="holds run old, not this run new"):
        rendezvous(Place(1, 2, 1, rdv, "new"), IDENT, timeout=0.3)


def test_a_mismatching_rank_is_refused(tmp_path):
    rdv = tmp_path / "rdv.json"
    rendezvous(Place(0, 2, 0, rdv), IDENT)
    other = RunIdentity("digest", 1024, "exact", 5, 2, "cpu-plan")
    with pytest.raises(ExecutionError, match="seed 5 here, 0 at rank 0"):
        rendezvous(Place(1, 2, 1, rdv), other, timeout=5)


def test_clean_up_removes_the_run_files_only(tmp_path):
    rdv = tmp_path / "rdv.json"
    place, _ = rendezvous(Place(0, 2, 0, rdv, "abc"), IDENT)
    mine = place.data_path("stores1.npz")
    mine.write_bytes(b"x")
    other = tmp_path / "rdv.json.zzz.stores1.npz"
    other.write_bytes(b"x")
    assert set(clean_up(place)) == {rdv, mine}
    assert other.exists()


# ----------------------------------------------------------------------------------------------
# The real command: caramel launch / run --distributed on cpu-plan
# ----------------------------------------------------------------------------------------------


def _digest(result) -> str:
    lines = [line for line in result.stdout.splitlines() if line.startswith("output digest")]
    assert lines, result.stderr[-2000:]
    return lines[0]


def _ranks(rdv: Path, seeds, world: int = 2, extra=()):
    procs = []
    for r, seed in enumerate(seeds):
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(r), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(r), "CARAMEL_RENDEZVOUS": str(rdv), "CARAMEL_PROGRESS": "0"}
        env.pop("CARAMEL_RUN_ID", None)
        procs.append(subprocess.Popen([sys.executable, "-m", "caramel.cli", "run", str(MUL), "--n", "1024",
                                       "--backend", "cpu-plan", "--seed", str(seed), "-q", "--distributed", *extra],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return [(p.communicate(timeout=300), p.returncode) for p in procs]


@needs_corpus
def test_reusing_a_rendezvous_path_with_another_seed_gives_that_seeds_digest(tmp_path):
    rdv = tmp_path / "rdv.json"
    for seed in (0, 1):
        (out0, err0), rc0 = _ranks(rdv, [seed, seed])[0]
        want = caramel_cli("run", str(MUL), "--n", "1024", "--backend", "cpu", "--seed", str(seed), "-q")
        assert rc0 == 0, err0[-2000:]
        assert _digest(want) in out0
    assert list(tmp_path.iterdir()) == []  # the run's files are removed


@needs_corpus
def test_ranks_with_different_seeds_are_refused(tmp_path):
    ((out0, err0), rc0), ((out1, err1), rc1) = _ranks(tmp_path / "rdv.json", [0, 1])
    assert rc1 == 2 and "seed 1 here, 0 at rank 0" in err1
    assert rc0 == 2 and "rank 1 failed" in err0
    assert "output digest" not in out0


@needs_corpus
def test_launch_refuses_other_commands_and_too_many_processes():
    r = caramel_cli("launch", "--nproc", "2", "--", "validate", str(MUL))
    assert r.returncode == 2 and "starts run or profile in process mode, not 'validate'" in r.stderr
    r = caramel_cli("launch", "--nproc", "3", "--", "run", str(MUL), "--n", "1024", "--backend", "cpu-plan")
    assert r.returncode == 2 and "--nproc 3 for Mul_4L_2c, a 2-chip program" in r.stderr
    assert "Traceback" not in r.stderr


@needs_corpus
def test_launch_refuses_a_command_without_process_mode_before_starting():
    r = caramel_cli("launch", "--nproc", "2", "--", "profile", str(MUL))
    assert r.returncode == 2 and "has no process mode" in r.stderr and "caramel rank" not in r.stderr
