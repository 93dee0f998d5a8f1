"""Process mode without a GPU: the launcher's environment, the choice of rendezvous, the message
format, the file and store rendezvous between threads (meeting, ids, gathering, failures), and
the CPU fabric over messages."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from caramel.errors import ExecutionError
from caramel.execute.distributed import Place, launch_env, run_distributed
from caramel.execute.rendezvous import (Disagreement, PeerFailed, RunIdentity, compare, decode, disagreements, encode,
                                        hello, select)
from caramel.execute.rendezvous.file import FileRendezvous
from caramel.execute.rendezvous.store import StoreRendezvous

from tests.conftest import REPO

IDENT = RunIdentity("digest", 1024, "exact", 0, 2, "cpu-plan")


def test_launch_env_reads_torchrun_mpirun_and_slurm_variables(tmp_path):
    rdv = str(tmp_path / "ids.json")
    assert launch_env({}) is None
    assert launch_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "CARAMEL_RENDEZVOUS": rdv}) == \
        Place(1, 4, 1, Path(rdv))
    assert launch_env({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                       "CARAMEL_RENDEZVOUS": rdv}).local_rank == 1
    assert launch_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "CARAMEL_RENDEZVOUS": rdv}).local_rank == 2
    assert launch_env({"RANK": "0", "WORLD_SIZE": "2"}).rendezvous is None  # MPI or a store may not need the file
    assert launch_env({"RANK": "0", "WORLD_SIZE": "2", "CARAMEL_LAUNCHER": "4321"}).launcher == 4321
    assert launch_env({"RANK": "0", "WORLD_SIZE": "2", "CARAMEL_LAUNCHER": "x"}).launcher is None
    with pytest.raises(ExecutionError, match="outside 0..1"):
        launch_env({"RANK": "2", "WORLD_SIZE": "2", "CARAMEL_RENDEZVOUS": rdv})


def test_the_rendezvous_follows_the_launcher(monkeypatch):
    import caramel.execute.rendezvous as rv

    monkeypatch.setattr(rv, "importable", lambda name: name in ("mpi4py", "torch"))
    assert select({"PMI_SIZE": "2", "CARAMEL_RENDEZVOUS": "/x"}) == "mpi"
    assert select({"SLURM_PROCID": "0"}) == "mpi"
    assert select({"TORCHELASTIC_RUN_ID": "r", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == "store"
    assert select({"PMI_SIZE": "2", "CARAMEL_RENDEZVOUS_BACKEND": "file"}) == "file"
    monkeypatch.setattr(rv, "importable", lambda name: False)
    assert select({"PMI_SIZE": "2", "CARAMEL_RENDEZVOUS": "/x"}) == "file"  # without mpi4py: the shared file
    with pytest.raises(ExecutionError, match="mpi4py under mpirun/srun .*torch under torchrun.*CARAMEL_RENDEZVOUS"):
        select({"PMI_SIZE": "2"})
    with pytest.raises(ExecutionError, match="choose one of file, mpi, store"):
        select({"CARAMEL_RENDEZVOUS_BACKEND": "carrier-pigeon"})


def test_messages_round_trip_and_refuse_what_is_not_one():
    value = {"ids": [[[0, 1], [1, -2, 3]]], "rows": np.arange(12, dtype=np.uint32).reshape(3, 4), "x": 1.5,
             "none": None, "scalar": np.uint32(7), "flag": True, "name": "r\u00e9"}
    back = decode(encode(value))
    assert back.keys() == value.keys() and back["ids"] == value["ids"] and back["x"] == 1.5 and back["none"] is None
    assert back["rows"].dtype == np.uint32 and np.array_equal(back["rows"], value["rows"])
    assert back["scalar"] == 7 and back["flag"] is True and back["name"] == value["name"]
    data = encode({"a": np.zeros(1000, dtype=np.uint64)})
    with pytest.raises(ExecutionError, match="array longer than the file"):
        decode(data[:-8])
    with pytest.raises(ExecutionError, match="trailing bytes"):
        decode(data + b"x")
    with pytest.raises(ExecutionError, match="no header"):
        decode(b"\x80\x04pickle")
    with pytest.raises(TypeError, match="cannot send a object"):
        encode(object())


def test_hellos_are_compared_naming_the_ranks_and_fields():
    a = hello(0, 2, "run", IDENT, token="a")
    assert compare(a, hello(1, 2, "run", IDENT, token="b")) is None
    wider = compare(a, hello(1, 3, "run", IDENT))
    assert "rank 1 (pid" in wider and "WORLD_SIZE 3" in wider
    assert "in run 'other'" in compare(a, hello(1, 2, "other", IDENT))
    assert "two processes are rank 0" in compare(a, hello(0, 2, "run", IDENT))
    other = RunIdentity("digest", 1024, "exact", 5, 2, "cpu-plan")
    assert "seed 5 at rank 1, 0 at rank 0" in compare(hello(1, 2, "run", other), a)
    assert disagreements([a, hello(1, 2, "run", IDENT)]) is None
    assert "says it is rank 0" in disagreements([a, hello(0, 2, "run", IDENT)])


def _ranks(fn, world: int, timeout: float = 30):
    """Run ``fn(rank)`` for every rank in threads; (results, errors) by rank."""
    out, errors = {}, {}

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as exc:  # noqa: BLE001 (reported to the test)
            errors[r] = exc
    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    return out, errors


def _file(tmp_path, r, world=2, run_id="run1", **kw):
    return FileRendezvous(Place(r, world, r, tmp_path / "rdv.json", run_id), beat=0.05, **kw)


def test_the_file_rendezvous_meets_broadcasts_and_gathers(tmp_path):
    def rank(r):
        with _file(tmp_path, r, 3) as rdv:
            rdv.meet(RunIdentity("d", 1024, "exact", 0, 3, "cpu-plan"), 20)
            ids = rdv.broadcast("ids", {"g": [1, 2, 3]} if r == 0 else None, 20)
            got = rdv.gather("stores", {"rank": r, "rows": np.full(4, r, dtype=np.uint32)}, 20)
            return rdv.run_id, ids, got
    out, errors = _ranks(rank, 3)
    assert not errors
    assert {o[0] for o in out.values()} == {"run1"} and all(o[1] == {"g": [1, 2, 3]} for o in out.values())
    assert [g["rank"] for g in out[0][2]] == [0, 1, 2] and out[1][2] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # every hello and message removed


def test_a_receive_looks_soon_then_at_its_pace(tmp_path, monkeypatch):
    """A receive looks for its message after 1, 2 and 4 ms, then every 5 ms: a message written soon after the
    receiver began to wait (the ranks' start of a batch) is seen within milliseconds, not a fixed poll's 20."""
    from caramel.execute.rendezvous import file as file_rdv

    with _file(tmp_path, 0) as receiver, _file(tmp_path, 1) as sender:
        slept = []

        def sleep(seconds):
            slept.append(seconds)
            if len(slept) == 6:
                sender.send(0, "late", {"after": len(slept)})

        monkeypatch.setattr(file_rdv.time, "sleep", sleep)
        got = receiver.receive(1, "late", 20)
    assert got == {"after": 6}
    assert slept == [0.001, 0.002, 0.004, 0.005, 0.005, 0.005]


@pytest.mark.parametrize("launcher", ["parent", "self", None])
@pytest.mark.parametrize("world", [2, 3])
def test_ranks_that_close_right_after_meeting_leave_none_waiting(tmp_path, launcher, world):
    """Only the ranks of one caramel launch (their parent the launcher their place names) skip the settling beats;
    they leave the meeting once every other rank has said it saw them, so that a rank that meets and closes at once
    (its hello gone) never leaves another waiting for it."""
    import os

    pid = {"parent": os.getppid(), "self": os.getpid(), None: None}[launcher]

    def rank(r):
        with FileRendezvous(Place(r, world, r, tmp_path / "rdv.json", "run1", pid), beat=0.05) as rdv:
            rdv.meet(IDENT if world == 2 else RunIdentity("digest", 1024, "exact", 0, 3, "cpu-plan"), 20)
            return rdv.launched
    out, errors = _ranks(rank, world, timeout=30)
    assert not errors and out == {r: launcher == "parent" for r in range(world)}
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_stale_hello_of_an_earlier_run_is_not_a_rank(tmp_path):
    import json

    stale = {**hello(1, 3, "old", None), "phase": "meet", "beat": 9, "time": time.time() - 3600}
    (tmp_path / "rdv.json.hello1").write_text(json.dumps(stale))  # world 3, another run, not beating

    def rank(r):
        with _file(tmp_path, r) as rdv:
            rdv.meet(IDENT, 20)
            return rdv.run_id
    out, errors = _ranks(rank, 2)
    assert not errors and out == {0: "run1", 1: "run1"}


@pytest.mark.parametrize("case, message", [
    ("world", r"rank 1 \(pid \d+ on host .*\) has WORLD_SIZE 3, rank 0 .* has 2"),
    ("run", r"rank 1 .* is in run 'b', rank 0 .* in run 'a'"),
    ("seed", r"rank 1 does not match rank 0 \(seed 1 at rank 1, 0 at rank 0\)"),
    ("fused", r"rank 1 does not match rank 0 \(fused False at rank 1, True at rank 0\)"),
])
def test_ranks_that_disagree_fail_within_seconds_saying_what_differs(tmp_path, case, message):
    def rank(r):
        world = 3 if case == "world" and r == 1 else 2
        run_id = ("a", "b")[r] if case == "run" else "a"
        ident = RunIdentity("digest", 1024, "exact", r if case == "seed" else 0, 2, "cpu-plan",
                            fused=not (case == "fused" and r == 1))
        with FileRendezvous(Place(r, world, r, tmp_path / "rdv.json", run_id), beat=0.05) as rdv:
            rdv.meet(ident, 60)
    start = time.monotonic()
    _, errors = _ranks(rank, 2, timeout=60)
    assert set(errors) == {0, 1}  # both stop, neither waits for the 60 s limit
    assert time.monotonic() - start < 30
    assert any(isinstance(e, Disagreement) and re.search(message, str(e)) for e in errors.values()), errors


def test_two_processes_with_one_rank_are_refused(tmp_path):
    def rank(k):
        r = (0, 0, 1)[k]
        with FileRendezvous(Place(r, 2, r, tmp_path / "rdv.json", "a"), beat=0.05) as rdv:
            rdv.meet(IDENT, 60)
            rdv.gather("x", r, 60)
    _, errors = _ranks(rank, 3, timeout=60)
    assert set(errors) == {0, 1, 2}
    assert any("two processes are rank 0" in str(e) for e in errors.values())


def test_a_rank_that_goes_silent_is_named(tmp_path):
    def rank(r):
        rdv = _file(tmp_path, r, stale=1.0)
        rdv.meet(IDENT, 20)
        if r == 1:
            rdv._stop.set()  # as a stopped process: no more heartbeats, nothing sent
            time.sleep(3)
            return None
        with pytest.raises(ExecutionError, match=r"rank 1 \(pid .*\) stopped: its heartbeat .* not changed for 1 s"):
            rdv.receive(1, "never", 30)
        rdv.close()
    _, errors = _ranks(rank, 2)
    assert not errors


@pytest.mark.parametrize("run_id", ["run1", None])  # None: no launcher's run id (rank 0's token names the run)
def test_a_failed_rank_stops_the_one_waiting_for_it(tmp_path, run_id):
    def rank(r):
        with _file(tmp_path, r, run_id=run_id) as rdv:
            rdv.meet(IDENT, 20)
            if r == 1:
                time.sleep(0.5)  # rank 0 waits in receive by now
                raise ExecutionError("out of disk")
            rdv.receive(1, "stores", 30)
    _, errors = _ranks(rank, 2)
    assert isinstance(errors[0], PeerFailed) and str(errors[0]) == "rank 1 failed: out of disk"


class _Store:
    """A key-value store with the methods of ``torch.distributed.Store`` that the store rendezvous uses."""

    def __init__(self):
        self.data, self.lock = {}, threading.Lock()

    def set(self, key, value):
        with self.lock:
            self.data[key] = value if isinstance(value, bytes) else str(value).encode()

    def get(self, key):
        with self.lock:
            return self.data[key]

    def check(self, keys):
        with self.lock:
            return all(k in self.data for k in keys)

    def add(self, key, amount):
        with self.lock:
            self.data[key] = str(int(self.data.get(key, b"0")) + amount).encode()
            return int(self.data[key])

    def delete_key(self, key):
        with self.lock:
            return self.data.pop(key, None) is not None


def test_the_store_rendezvous_meets_and_gathers():
    store = _Store()

    def rank(r):
        with StoreRendezvous(store, Place(r, 2, r, None, "run")) as rdv:
            rdv.meet(IDENT, 20)
            return rdv.gather("s", np.full(3, r, dtype=np.uint32), 20)
    out, errors = _ranks(rank, 2)
    assert not errors and [a.tolist() for a in out[0]] == [[0, 0, 0], [1, 1, 1]] and out[1] is None
    assert not [k for k in store.data if k.startswith("m")]  # every value read is removed


def test_the_store_refuses_a_second_process_at_a_rank_and_tells_the_first():
    store = _Store()
    first = StoreRendezvous(store, Place(0, 2, 0, None, "run"))
    with pytest.raises(Disagreement, match="two processes are rank 0 of 2"):
        StoreRendezvous(store, Place(0, 2, 0, None, "run"))
    with pytest.raises(ExecutionError, match="another process at rank 0 failed: the ranks disagree: two processes"):
        first.receive(1, "hello", 10)


def test_the_cpu_fabric_over_messages_matches_one_process(tmp_path):
    """A 2-chip program as two ranks (threads) over the file rendezvous: the reference's outputs."""
    from caramel.api import output_digest, prepare_inputs, run_program
    from caramel.ckks.keyset import generate_keyset
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context

    program = load_program(REPO / "programs" / "Mul_4L_2c")
    want = run_program(program, n=1024, backend="cpu", check=None)
    ctx = Context(n=1024)
    memory = prepare_inputs(program, ctx, generate_keyset(program, ctx, 0), 0).memory
    plan = build_plan(program)

    def rank(r):
        place = Place(r, 2, r, tmp_path / "rdv.json", "run")
        with FileRendezvous(place, beat=0.05) as rdv:
            rdv.meet(IDENT, 20)
            return run_distributed(plan, ctx, memory, "exact", place, rdv, backend="cpu-plan", timeout=60)
    out, errors = _ranks(rank, 2, timeout=120)
    assert not errors and out[1] is None
    assert output_digest(program, out[0].memory) == want.digest


def test_more_processes_than_chips_is_refused(tmp_path):
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.ring import Context

    plan = build_plan(load_program(REPO / "programs" / "Mul_4L_2c"))
    with pytest.raises(ExecutionError, match="3 processes for a 2-chip program"):
        run_distributed(plan, Context(n=1024), {}, "exact", Place(0, 3, 0, tmp_path / "ids.json"), None,
                        backend="cpu-plan")


def test_process_mode_end_to_end_on_the_cpu():
    """`caramel launch --nproc 2` runs a 2-chip program in two processes (file rendezvous, NumPy),
    gathers at rank 0 and gives the reference's digest and a passing check."""
    from tests.conftest import check_launch

    check_launch(str(REPO / "programs" / "Mul_4L_2c"), 1024, "cpu-plan", env={"CARAMEL_PROGRESS": "0"})
