"""Process mode without a GPU: the launcher's environment, the id file rendezvous between
processes, and the gathering of stores at rank 0."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from caramel.errors import ExecutionError
from caramel.execute.distributed import Place, exchange_ids, gather_stores, launch_env
from caramel.program import Mem


def test_launch_env_reads_torchrun_mpirun_and_slurm_variables(tmp_path):
    rdv = str(tmp_path / "ids.json")
    assert launch_env({}) is None
    assert launch_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "CARAMEL_RENDEZVOUS": rdv}) == \
        Place(1, 4, 1, Path(rdv))
    assert launch_env({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                       "CARAMEL_RENDEZVOUS": rdv}).local_rank == 1
    assert launch_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "CARAMEL_RENDEZVOUS": rdv}).local_rank == 2
    with pytest.raises(ExecutionError, match="CARAMEL_RENDEZVOUS"):
        launch_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ExecutionError, match="outside 0..1"):
        launch_env({"RANK": "2", "WORLD_SIZE": "2", "CARAMEL_RENDEZVOUS": rdv})


def test_ids_are_shared_through_the_rendezvous_file(tmp_path):
    groups = [(0, 1), (0, 1, 2)]
    counter = iter(range(100))
    results = {}

    def rank(r):
        place = Place(r, 3, r, tmp_path / "ids.json")
        results[r] = exchange_ids(groups, place, make_id=lambda: (next(counter),) * 4, timeout=10)[1]

    threads = [threading.Thread(target=rank, args=(r,)) for r in (2, 1, 0)]  # rank 0 last
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results[0] == results[1] == results[2]
    assert set(results[0]) == set(groups) and len({v for v in results[0].values()}) == 2


def test_a_missing_rank0_times_out_with_a_clear_error(tmp_path):
    with pytest.raises(ExecutionError, match="did every process start"):
        exchange_ids([(0, 1)], Place(1, 2, 1, tmp_path / "ids.json"), timeout=0.2)


def test_a_stale_id_file_is_refused(tmp_path):
    exchange_ids([(0, 1)], Place(0, 2, 0, tmp_path / "ids.json"), make_id=lambda: (1, 2))
    with pytest.raises(ExecutionError, match="written for 2 processes"):
        exchange_ids([(0, 1, 2)], Place(1, 3, 1, tmp_path / "ids.json"), timeout=1)


def test_stores_are_gathered_at_rank_0(tmp_path):
    rng = np.random.default_rng(0)
    data = {c: {Mem("v1", c): rng.integers(0, 100, 16, dtype=np.uint32), Mem("s_x", 2): np.uint32(c)} for c in range(4)}
    out = {}

    def rank(r, chips):
        place = Place(r, 2, r, tmp_path / "ids.json")
        out[r] = gather_stores([data[c] for c in chips], chips, place, timeout=10)

    threads = [threading.Thread(target=rank, args=(1, [2, 3])), threading.Thread(target=rank, args=(0, [0, 1]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert out[1] is None
    assert len(out[0]) == 4
    for c in range(4):
        assert out[0][c].keys() == data[c].keys()
        assert all(np.array_equal(out[0][c][m], data[c][m]) for m in data[c])


def test_process_mode_end_to_end_on_the_cpu():
    """`caramel launch --nproc 2` runs a 2-chip program in two processes (file fabric, NumPy),
    gathers at rank 0 and gives the reference's digest and a passing check."""
    from tests.conftest import REPO, check_launch

    check_launch(str(REPO / "programs" / "Mul_4L_2c"), 1024, "cpu-plan", env={"CARAMEL_PROGRESS": "0"})


def test_more_processes_than_chips_is_refused(tmp_path):
    from caramel.errors import ExecutionError as Err
    from caramel.execute.distributed import run_distributed
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context
    from tests.conftest import REPO

    plan = build_plan(load_program(REPO / "programs" / "Mul_4L_2c"))
    with pytest.raises(Err, match="3 processes for a 2-chip program"):
        run_distributed(plan, Context(n=1024), {}, "exact", Place(0, 3, 0, tmp_path / "ids.json"), backend="cpu-plan")
