"""The process-mode launcher on the CPU: a dead or stopped rank ends the run promptly and is named,
nothing outlives a killed launcher and the next launch removes the folder it left (and nothing
else), ranks that disagree fail within seconds saying what differs, and what can be checked before
starting processes is (GPU, output paths)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from caramel.errors import ExecutionError
from caramel.launch import MARKER, Ending, clean_stale_folders, launch

from tests.conftest import REPO, caramel_cli

MUL = REPO / "programs" / "Mul_4L_2c"

# A rank that beats, writes its pid to $PIDS/<rank> and sleeps (or exits with $EXIT_<rank>).
SLEEPER = """
import os, sys, time
from caramel.launch import start_heartbeat
start_heartbeat()
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


def _launcher(tmp_path: Path, nproc: int, heartbeat: float = 20.0, env: dict | None = None) -> subprocess.Popen:
    """A launcher of ``nproc`` sleepers writing their pids into ``tmp_path``; its rendezvous folder in a
    temporary folder beside it (a launcher killed by SIGKILL leaves it there, not in /tmp)."""
    tmp = tmp_path.with_name(tmp_path.name + "-tmp")
    tmp.mkdir(exist_ok=True)
    env = {"TMPDIR": str(tmp), **(env or {})}
    script = ("import signal, sys; from caramel.launch import launch; from caramel.errors import CaramelError\n"
              "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a foreground (not inherited ignored)\n"
              f"try:\n    sys.exit(launch({nproc}, [], command=[sys.executable, '-c', {SLEEPER!r}], grace=2, "
              f"heartbeat_timeout={heartbeat}))\n"
              "except CaramelError as e:\n    print('caramel: error:', e, file=sys.stderr); sys.exit(2)\n"
              "except KeyboardInterrupt:\n    sys.exit(130)\n")
    return subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), "PIDS": str(tmp_path), **env})


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


def test_a_stopped_rank_ends_the_run_through_its_heartbeat(tmp_path):
    launcher = _launcher(tmp_path, 2, heartbeat=2.0)
    pids = _pids(tmp_path, 2)
    os.kill(pids[1], signal.SIGSTOP)
    try:
        _, err = launcher.communicate(timeout=60)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert launcher.returncode == 2
    assert re.search(r"rank 1 stopped making progress: no heartbeat for \d+ s \(stopped by a signal such as SIGSTOP\); "
                     r"stopped all 2 processes", err), err
    assert _wait_dead(pids.values())


def _stale_folder(where: Path, name: str, pid: int, host: str | None = None) -> Path:
    import socket

    folder = where / f"caramel-rdv-{name}"
    folder.mkdir(mode=0o700)
    (folder / MARKER).write_text(json.dumps({"pid": pid, "start": None, "host": host or socket.gethostname(),
                                            "uid": os.getuid()}))
    (folder / "rendezvous.json.hello0").write_text("{}")
    (folder / "heartbeat.0").write_text("")
    return folder


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_kill_9_of_the_launcher_leaves_a_folder_that_the_next_launch_removes(tmp_path):
    tmp, where = tmp_path / "tmp", tmp_path / "pids"
    tmp.mkdir()
    where.mkdir()
    launcher = _launcher(where, 2, env={"TMPDIR": str(tmp)})
    pids = _pids(where, 2)
    folders = list(tmp.glob("caramel-rdv-*"))
    launcher.kill()
    launcher.communicate(timeout=30)
    assert _wait_dead(pids.values())
    assert [f for f in folders if f.exists()] == folders and (folders[0] / MARKER).exists()  # left behind
    assert clean_stale_folders(tmp) == folders
    assert list(tmp.iterdir()) == []


def test_the_next_launch_removes_only_stale_folders_it_owns_and_only_its_files(tmp_path, monkeypatch):
    gone = _stale_folder(tmp_path, "gone", _dead_pid())
    live = _stale_folder(tmp_path, "live", os.getpid())  # a launch still running
    elsewhere = _stale_folder(tmp_path, "elsewhere", _dead_pid(), host="another-machine")
    kept = _stale_folder(tmp_path, "kept", _dead_pid())
    (kept / "notes.txt").write_text("mine")  # a file caramel did not write
    unmarked = tmp_path / "caramel-rdv-unmarked"
    unmarked.mkdir()
    (unmarked / "rendezvous.json").write_text("{}")
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "caramel-rdv-link").symlink_to(target)
    assert clean_stale_folders(tmp_path) == [gone]
    assert not gone.exists() and live.exists() and elsewhere.exists() and unmarked.exists() and target.exists()
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]  # caramel's files gone, the user's kept
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    env = {"PIDS": str(tmp_path / "p"), "EXIT_0": "0", "EXIT_1": "0"}
    (tmp_path / "p").mkdir()
    _stale_folder(tmp_path, "gone2", _dead_pid())
    assert launch(2, [], env=env, command=[sys.executable, "-c", SLEEPER]) == 0
    assert not (tmp_path / "caramel-rdv-gone2").exists()  # a launch cleans before it starts


# ----------------------------------------------------------------------------------------------
# The real command: caramel launch / run --distributed on cpu-plan
# ----------------------------------------------------------------------------------------------


def _digest(result) -> str:
    lines = [line for line in result.stdout.splitlines() if line.startswith("output digest")]
    assert lines, result.stderr[-2000:]
    return lines[0]


def _ranks(rdv: Path, ranks=(0, 1), worlds=(2, 2), seeds=(0, 0), run_ids=(None, None), extra=()):
    """``caramel run MUL --distributed`` as processes with these RANK, WORLD_SIZE, --seed and CARAMEL_RUN_ID
    (file rendezvous at ``rdv``); each one's ((stdout, stderr), exit status)."""
    procs = []
    for r, world, seed, run_id in zip(ranks, worlds, seeds, run_ids):
        env = {**os.environ, "PYTHONPATH": str(REPO), "RANK": str(r), "WORLD_SIZE": str(world),
               "LOCAL_RANK": str(r), "CARAMEL_RENDEZVOUS": str(rdv), "CARAMEL_PROGRESS": "0",
               "CARAMEL_RENDEZVOUS_BACKEND": "file"}
        env.pop("CARAMEL_RUN_ID", None)
        if run_id is not None:
            env["CARAMEL_RUN_ID"] = run_id
        procs.append(subprocess.Popen([sys.executable, "-m", "caramel.cli", "run", str(MUL), "--n", "1024",
                                       "--backend", "cpu-plan", "--seed", str(seed), "-q", "--distributed", *extra],
                                      cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        return [(p.communicate(timeout=120), p.returncode) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_reusing_a_rendezvous_path_with_another_seed_gives_that_seeds_digest(tmp_path):
    rdv = tmp_path / "rdv.json"
    for seed in (0, 1):
        (out0, err0), rc0 = _ranks(rdv, seeds=(seed, seed))[0]
        want = caramel_cli("run", str(MUL), "--n", "1024", "--backend", "cpu", "--seed", str(seed), "-q")
        assert rc0 == 0, err0[-2000:]
        assert _digest(want) in out0
    assert list(tmp_path.iterdir()) == []  # the run's files are removed


@pytest.mark.parametrize("case, ranks, worlds, seeds, run_ids, message", [
    ("seeds", (0, 1), (2, 2), (0, 1), (None, None), r"rank 1 does not match rank 0 \(seed 1 at rank 1, 0 at rank 0\)"),
    ("both rank 0", (0, 0), (2, 2), (0, 0), (None, None), r"two processes are rank 0 of 2: .*pid \d+ on host"),
    ("world sizes", (0, 1), (2, 3), (0, 0), (None, None), r"rank 1 \(pid \d+ .*\) has WORLD_SIZE 3, rank 0 .* has 2"),
    ("run ids", (0, 1), (2, 2), (0, 0), ("a", "b"), r"rank 1 .* is in run 'b', rank 0 .* in run 'a'"),
])
def test_ranks_that_disagree_fail_within_seconds_saying_what(tmp_path, case, ranks, worlds, seeds, run_ids, message):
    """Each of these waited for the 300 s limit with no message before."""
    start = time.monotonic()
    results = _ranks(tmp_path / "rdv.json", ranks, worlds, seeds, run_ids)
    assert time.monotonic() - start < 100  # the processes' own limit is 300 s
    assert [rc for _, rc in results] == [2, 2], results
    errors = "".join(err for (_, err), _ in results)
    assert re.search(message, errors), errors
    assert all("caramel: error:" in err and "Traceback" not in err for (_, err), _ in results)
    assert not any("output digest" in out for (out, _), _ in results)


def test_launch_refuses_other_commands_and_too_many_processes():
    r = caramel_cli("launch", "--nproc", "2", "--", "validate", str(MUL))
    assert r.returncode == 2 and "starts run or profile in process mode, not 'validate'" in r.stderr
    r = caramel_cli("launch", "--nproc", "3", "--", "run", str(MUL), "--n", "1024", "--backend", "cpu-plan")
    assert r.returncode == 2 and "--nproc 3 for Mul_4L_2c, a 2-chip program" in r.stderr
    assert "Traceback" not in r.stderr


def test_launch_refuses_a_command_without_process_mode_before_starting():
    r = caramel_cli("launch", "--nproc", "2", "--", "profile", str(MUL))
    assert r.returncode == 2 and "has no process mode" in r.stderr and "caramel rank" not in r.stderr


@pytest.mark.skipif(__import__("caramel.api", fromlist=["gpu_available"]).gpu_available(), reason="CuPy and a GPU here")
def test_launch_on_the_gpu_without_cupy_is_one_clear_error_before_any_process():
    r = caramel_cli("launch", "--nproc", "2", "--", "run", str(MUL), "--n", "1024", "--backend", "gpu", "-v")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "ModuleNotFoundError" not in r.stderr
    assert "--backend gpu needs CuPy and a CUDA GPU on this machine" in r.stderr
    assert "rank" not in r.stderr  # no process started (each logs its rank)


@pytest.mark.parametrize("outputs, message", [
    (["--json", "{tmp}/missing/r.json"], r"--json {tmp}/missing/r.json: the folder {tmp}/missing does not exist"),
    (["--json", "{tmp}"], r"--json {tmp}: is a folder; caramel writes only regular files"),
    (["--json", "{tmp}/r.npz", "--save-outputs", "{tmp}/r.npz"], r"--save-outputs and --json both write {tmp}/r.npz"),
])
def test_launch_checks_every_output_path_before_starting(tmp_path, outputs, message):
    outputs = [o.format(tmp=tmp_path) for o in outputs]
    r = caramel_cli("launch", "--nproc", "2", "--", "run", str(MUL), "--n", "1024", "--backend", "cpu-plan", "-v",
                    "--batch", "2", *outputs)
    assert r.returncode == 2 and re.search(message.format(tmp=re.escape(str(tmp_path))), r.stderr), r.stderr
    assert "rank" not in r.stderr and list(p.name for p in tmp_path.iterdir() if p.is_file()) == []


def test_launch_refuses_process_mode_options_before_starting(tmp_path):
    r = caramel_cli("launch", "--nproc", "2", "--", "run", str(MUL), "--n", "1024", "--backend", "cpu-plan", "-v",
                    "--json", str(tmp_path / "r.json"))
    assert r.returncode == 2 and "--inputs, --save-outputs and --json go with --batch in process mode" in r.stderr
    assert "rank" not in r.stderr
