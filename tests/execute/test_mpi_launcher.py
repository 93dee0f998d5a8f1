"""Process mode under a real launcher: MPICH's ``mpiexec`` (Hydra; the ``mpich`` wheel of the test
extra) starts 2 processes of a 2-chip program on ``--backend cpu-plan``; rank 0 must print the
reference's output digest and a passing check. Skips when no ``mpiexec`` is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

from caramel.execute.distributed import launch_env

from tests.conftest import REPO, caramel_cli


def _mpiexec() -> str | None:
    here = os.pathsep.join([sysconfig.get_path("scripts"), os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    return shutil.which("mpiexec", path=here)


def test_hydra_variables_give_the_place():
    place = launch_env({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "CARAMEL_RENDEZVOUS": "/tmp/r"})
    assert (place.rank, place.world, place.local_rank) == (1, 2, 1)


@pytest.mark.skipif(_mpiexec() is None, reason="mpiexec not installed (pip install mpich)")
def test_two_processes_under_mpiexec_match_the_reference(tmp_path):
    program = str(REPO / "programs" / "Mul_4L_2c")
    want = caramel_cli("run", program, "--n", "1024", "--backend", "cpu", "-q")
    assert want.returncode == 0, want.stderr[-2000:]
    digest = next(line for line in want.stdout.splitlines() if line.startswith("output digest"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO), CARAMEL_RENDEZVOUS=str(tmp_path / "rendezvous.json"))
    have = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "caramel", "run", program, "--n", "1024",
                           "--backend", "cpu-plan", "--distributed", "-q"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert have.returncode == 0, (have.stdout + have.stderr)[-3000:]
    assert digest in have.stdout and "2 processes" in have.stdout and "PASS" in have.stdout
