"""Process mode under a real launcher: MPICH's ``mpiexec`` (Hydra; the ``mpich`` wheel of the test
extra) starts 2 processes on ``--backend cpu-plan``. With mpi4py (the test extra) the ranks meet
and exchange limbs and results through MPI, with no shared file; without it, or when asked, through
the file ``CARAMEL_RENDEZVOUS``. Rank 0 must print the reference's output digest and a passing
check; ranks that disagree end the job at once, saying what differs. Skips without ``mpiexec``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from caramel.execute.distributed import launch_env
from caramel.execute.rendezvous import importable

from tests.conftest import REPO, caramel_cli

PROGRAM = str(REPO / "programs" / "Mul_4L_2c")


def _mpiexec() -> str | None:
    here = os.pathsep.join([sysconfig.get_path("scripts"), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return shutil.which("mpiexec", path=here)


needs_mpiexec = pytest.mark.skipif(_mpiexec() is None, reason="mpiexec not installed (pip install mpich)")
needs_mpi4py = pytest.mark.skipif(_mpiexec() is None or not importable("mpi4py"),
                                  reason="mpiexec or mpi4py not installed (pip install mpich mpi4py)")


def test_hydra_variables_give_the_place():
    place = launch_env({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "CARAMEL_RENDEZVOUS": "/tmp/r"})
    assert (place.rank, place.world, place.local_rank) == (1, 2, 1)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "CARAMEL_RENDEZVOUS", "CARAMEL_RENDEZVOUS_BACKEND")}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def _run(args, env, cwd, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([_mpiexec(), *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


def _reference(*extra) -> str:
    want = caramel_cli("run", PROGRAM, "--n", "1024", "--backend", "cpu", "-q", *extra)
    assert want.returncode == 0, want.stderr[-2000:]
    return want.stdout


def _command(*extra):
    return [sys.executable, "-m", "caramel", "run", PROGRAM, "--n", "1024", "--backend", "cpu-plan", "--distributed",
            "-v", *extra]


@needs_mpi4py
def test_two_processes_under_mpiexec_meet_through_mpi_without_a_shared_file(tmp_path):
    digest = next(line for line in _reference().splitlines() if line.startswith("output digest"))
    have = _run(["-n", "2", *_command()], _env(), tmp_path)
    assert have.returncode == 0, (have.stdout + have.stderr)[-3000:]
    assert digest in have.stdout and "2 processes" in have.stdout and "PASS" in have.stdout
    assert "rendezvous through MPI" in have.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written beside the processes


@needs_mpi4py
def test_a_batch_under_mpiexec_gathers_every_instance_through_mpi(tmp_path):
    want = caramel_cli("run", str(REPO / "programs" / "Mul_4L_1c"), "--n", "1024", "--backend", "cpu-plan", "-q",
                       "--batch", "3")
    digests = [line.rsplit(" ", 1)[1] for line in want.stdout.splitlines() if line.startswith("instance")]
    have = _run(["-n", "2", sys.executable, "-m", "caramel", "run", str(REPO / "programs" / "Mul_4L_1c"), "--n",
                 "1024", "--backend", "cpu-plan", "--distributed", "-q", "--batch", "3"], _env(), tmp_path)
    assert have.returncode == 0, (have.stdout + have.stderr)[-3000:]
    assert len(digests) == 3 and all(d in have.stdout for d in digests) and "in 2 processes" in have.stdout


@needs_mpi4py
def test_ranks_that_disagree_under_mpiexec_end_the_job_saying_what(tmp_path):
    have = _run(["-n", "1", *_command("--seed", "0"), ":", "-n", "1", *_command("--seed", "1")], _env(), tmp_path,
                timeout=120)
    assert have.returncode != 0
    assert "rank 1 does not match rank 0 (seed 1 at rank 1, 0 at rank 0)" in have.stderr, have.stderr[-3000:]
    assert "output digest" not in have.stdout


@needs_mpiexec
def test_the_shared_file_stays_the_fallback_under_mpiexec(tmp_path):
    digest = next(line for line in _reference().splitlines() if line.startswith("output digest"))
    env = _env(CARAMEL_RENDEZVOUS=str(tmp_path / "rendezvous.json"), CARAMEL_RENDEZVOUS_BACKEND="file")
    have = _run(["-n", "2", *_command()], env, tmp_path)
    assert have.returncode == 0, (have.stdout + have.stderr)[-3000:]
    assert digest in have.stdout and "2 processes" in have.stdout and "PASS" in have.stdout
    assert "rendezvous through files beside" in have.stderr
