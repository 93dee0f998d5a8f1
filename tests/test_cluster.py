"""caramel on a Dask cluster, on the CPU: a local cluster of 3 worker processes runs a batch (each
worker through one caramel.Executor) and a 2-chip program with the digests of one process, shared
inputs and user inputs as run_batch takes them, a failing instance alone; a worker killed mid-batch
loses no instance and reports none twice; a rank lost with its worker fails the run at once,
naming it, and frees the other; workers with another caramel, or without a GPU for the gpu
backend, are refused."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

distributed = pytest.importorskip("distributed")

import cloudpickle  # noqa: E402  (a dependency of distributed)

from caramel.api import gpu_available  # noqa: E402
from caramel.batch import run_batch  # noqa: E402
from caramel.cluster import ClusterError, ClusterExecutor, WorkerInfo, check_workers, local_cluster  # noqa: E402
from caramel.errors import ArgumentError  # noqa: E402
from caramel.options import RunOptions  # noqa: E402
from caramel.parse import load_program  # noqa: E402

from tests.conftest import REPO, caramel_cli  # noqa: E402

MUL1 = REPO / "programs" / "Mul_4L_1c"
MUL2 = REPO / "programs" / "Mul_4L_2c"
N = 1024
#: Seconds any one test's cluster work may take (a hang fails the test instead of CI).
DEADLINE = 120.0


class _KillOnce(distributed.WorkerPlugin):
    """Test only: the worker that starts executing a task whose key ends with ``suffix`` kills
    itself with SIGKILL (once in the cluster's life: the first to create ``marker``), after
    ``delay`` seconds; ``marker`` then holds its address."""

    def __init__(self, suffix: str, marker: str, delay: float = 0.05):
        self.suffix, self.marker, self.delay = suffix, marker, delay

    def setup(self, worker):
        self.worker = worker

    def transition(self, key, start, finish, **kwargs):
        if finish != "executing" or not str(key).endswith(self.suffix):
            return
        try:
            fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return
        os.write(fd, self.worker.address.encode())
        os.close(fd)

        def die():
            time.sleep(self.delay)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=die, daemon=True).start()


cloudpickle.register_pickle_by_value(__import__(__name__))  # the plugin class travels by value


@pytest.fixture(scope="module")
def client():
    cluster = local_cluster(3, "cpu-plan")
    c = distributed.Client(cluster)
    try:
        c.wait_for_workers(3, timeout=DEADLINE)
        yield c
    finally:
        c.close()
        cluster.close()


def _plugin_off(client, name: str) -> None:
    try:
        client.unregister_worker_plugin(name)
    except Exception:  # noqa: BLE001 (a restarted worker never had it)
        pass


def test_a_batch_on_three_workers_has_the_digests_of_one_process(client):
    program = load_program(MUL1)
    want = run_batch(program, n=N, backend="cpu-plan", batch=6)
    with ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan", outputs=True) as pool:
        have = pool.run_batch(6, timeout=DEADLINE)
        again = [x.digest for x in pool.map([4, 1], timeout=DEADLINE)]  # resident runners, reused
    assert [r["digest"] for r in have.records] == [r["digest"] for r in want.records]
    assert [r["instance"] for r in have.records] == list(range(6))
    assert have.passed and have.summary.processes == 3 and have.body()["devices"] == 3  # one per worker
    assert len({r["worker"] for r in have.records}) > 1  # spread over the workers
    assert all(x.outputs is not None and "z" in x.outputs for x in have.instances)
    assert again == [want.records[4]["digest"], want.records[1]["digest"]]


def test_shared_inputs_and_user_inputs_as_run_batch_takes_them(client):
    """RunOptions in, the shared input drawn once per worker from the key seed (or given), the user's
    stacked values one per instance, a value that does not fit failing its instance alone: the
    records of run_batch on one machine."""
    import numpy as np

    program = load_program(MUL1)
    options = RunOptions(n=N, backend="cpu-plan", seed=3, shared=("y",))
    want = run_batch(program, options, batch=4)
    with ClusterExecutor(program, options, cluster=client) as pool:
        setups = pool.warm_up(timeout=DEADLINE)  # every worker's executor made now, once
        have = pool.run_batch(4, timeout=DEADLINE)
    assert set(setups) == {w.address for w in pool.infos} and all(set(t) == {"keys", "shared", "plan"}
                                                                   for t in setups.values())
    assert [r["digest"] for r in have.records] == [r["digest"] for r in want.records]
    assert have.shared == want.shared == ("y",) and have.timings == pytest.approx({
        k: sum(t[k] for t in setups.values()) for k in ("keys", "shared", "plan")})  # made once per worker
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (3, N // 2))
    x[1, 0] = 1e30  # does not fit the modulus: instance 1 fails, alone
    data = {"x": x, "y": rng.uniform(-1, 1, N // 2)}
    want = run_batch(program, options, batch=3, inputs=data)
    with ClusterExecutor(program, options, cluster=client, inputs=data, batch=3) as pool:
        have = pool.run_batch(3, timeout=DEADLINE)
    assert [r["instance"] for r in have.records] == [0, 2] and set(have.failed) == set(want.failed) == {1}
    assert "does not fit below half the modulus" in have.failed[1] and not have.passed
    assert [r["digest"] for r in have.records] == [r["digest"] for r in want.records]


def test_an_instance_given_its_inputs_is_the_executors(client):
    import numpy as np

    from caramel.executor import Executor

    program = load_program(MUL1)
    x = np.linspace(-1, 1, N // 2)
    with Executor(program, n=N, backend="cpu-plan", seed=2) as ex:
        want = [ex.submit({"x": x}, seed=2 + 5).result().digest, ex.submit(seed=2 + 6).result().digest]
    with ClusterExecutor(program, n=N, backend="cpu-plan", seed=2, cluster=client) as pool:
        address, instance = pool.submit(5, {"x": x}).result(timeout=DEADLINE)
        assert instance.index == 5 and instance.digest == want[0]
        with pytest.raises(ArgumentError, match="nope is not an input of Mul_4L_1c"):
            pool.submit(6, {"nope": 1.0}).result(timeout=DEADLINE)
        assert [x.digest for x in pool.map([6], timeout=DEADLINE)] == want[1:]  # the bad instance failed alone


def test_a_worker_job_runs_instances_through_its_executor_until_closed():
    """The worker side without Dask: instance i through the job's executor has run_batch's record i;
    once the client closed the job, a late task makes no executor again."""
    from caramel.cluster import Job, WorkerJob

    program = load_program(MUL1)
    options = RunOptions(n=N, backend="cpu-plan", seed=4, check=None)
    want = run_batch(program, options, batch=3)
    held = WorkerJob(Job("t" * 32, program, options, None, {}, None, False, "f" * 64))
    assert held.state() is None
    instance = held.run(2)
    assert instance.record() == {**want.records[2], "timings_s": instance.record()["timings_s"]}
    assert held.state()["devices"] == [()] and set(held.state()["timings"]) == {"keys", "shared", "plan"}
    held.close()
    assert held.state() is None
    with pytest.raises(ClusterError, match="was closed"):
        held.run(1)


def test_options_that_a_cluster_cannot_take_are_refused(client):
    program = load_program(MUL1)
    with pytest.raises(ArgumentError, match="unknown option"):
        ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan", gpu=2)
    with pytest.raises(ArgumentError, match="shared: 'w' names no input"):
        ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan", shared="w")
    with pytest.raises(ClusterError, match="device_ids name GPUs of this machine, for a local cluster"):
        ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan", device_ids=[0])
    with pytest.raises(ClusterError, match="3 local workers, 1 device_ids given"):
        local_cluster(3, "gpu", device_ids=[0])
    with ClusterExecutor(load_program(MUL2), cluster=client, n=N, backend="cpu-plan", shared="y") as pool:
        with pytest.raises(ClusterError, match="shared inputs go with a batch"):
            pool.run_partitioned(timeout=DEADLINE)


def test_a_two_chip_program_on_two_workers_has_the_digest_of_one_process(client):
    from caramel.api import run_program

    program = load_program(MUL2)
    want = run_program(program, n=N, backend="cpu")
    with ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan") as pool:
        have = pool.run_partitioned(timeout=DEADLINE)
    assert have.digest == want.digest and have.ranks == 2 and len(set(have.workers)) == 2
    assert have.report is not None and have.report.passed


def test_a_worker_killed_mid_batch_loses_no_instance_and_reports_none_twice(client, tmp_path):
    program = load_program(MUL1)
    want = run_batch(program, n=N, backend="cpu-plan", batch=8)
    marker = tmp_path / "killed"
    client.register_plugin(_KillOnce("-instance-3", str(marker), delay=0.0), name="kill-once")
    try:
        with ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan") as pool:
            seen = [x.index for x in pool.map(range(8), ordered=False, timeout=DEADLINE)]
            have = pool.run_batch(8, timeout=DEADLINE)
            where = dict(pool.where)
    finally:
        _plugin_off(client, "kill-once")
    killed = marker.read_text()  # the worker that started instance 3 died then
    assert sorted(seen) == list(range(8))  # every instance once
    assert where[3] != killed  # instance 3 ran again on another worker
    assert [r["digest"] for r in have.records] == [r["digest"] for r in want.records]
    client.wait_for_workers(3, timeout=DEADLINE)  # the nanny restarted it


def test_a_lost_rank_fails_the_run_naming_it_and_frees_the_other(client, tmp_path):
    program = load_program(MUL2)
    marker = tmp_path / "killed"
    client.wait_for_workers(3, timeout=DEADLINE)
    client.register_plugin(_KillOnce("-rank-1", str(marker), delay=0.0), name="kill-rank")
    try:
        with ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan", timeout=600) as pool:
            rank0 = pool.infos[0].address
            start = time.monotonic()
            rank1 = pool.infos[1].address
            lost = rf"rank 1 was lost with its worker {rank1} .*stopped the other 1 rank"
            with pytest.raises(ClusterError, match=lost):
                pool.run_partitioned(timeout=DEADLINE)
            elapsed = time.monotonic() - start
    finally:
        _plugin_off(client, "kill-rank")
    assert marker.read_text() == rank1  # it died running rank 1
    assert elapsed < 60  # not the ranks' 600 s wait
    # rank 0's worker (one thread) is free: it no longer waits for rank 1's limbs
    assert client.submit(lambda: 7, workers=[rank0], allow_other_workers=False, pure=False).result(timeout=30) == 7
    client.wait_for_workers(3, timeout=DEADLINE)


@pytest.mark.skipif(gpu_available(), reason="the workers here have a GPU")
def test_local_workers_keep_glibcs_memory_defaults(client):
    """Dask's nanny would set MALLOC_TRIM_THRESHOLD_ in each worker (glibc's adaptive mmap threshold off: the
    client's large temporaries each a fresh mmap); a local cluster's workers run without it, as one process does."""
    import os

    seen = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    assert len(seen) == 3 and set(seen.values()) == {None}


def test_a_worker_without_a_gpu_is_refused_for_the_gpu_backend(client):
    with pytest.raises(ClusterError, match=r"backend 'gpu' needs a GPU on every worker; 3 have none"):
        ClusterExecutor(load_program(MUL1), cluster=client, n=N, backend="gpu")


def test_a_worker_with_another_caramel_is_refused(client):
    target = sorted(client.scheduler_info()["workers"])[1]

    def set_version(value):
        import caramel.version

        old, caramel.version.__version__ = caramel.version.__version__, value
        return old

    old = client.run(set_version, "0.0.0-other", workers=[target])[target]
    try:
        with pytest.raises(ClusterError, match=rf"1 worker\(s\) run another caramel .*{target} \(caramel 0.0.0-other"):
            ClusterExecutor(load_program(MUL1), cluster=client, n=N, backend="cpu-plan")
    finally:
        client.run(set_version, old, workers=[target])


def test_check_workers_names_other_files_and_missing_gpus():
    ok = WorkerInfo("tcp://a:1", "a", "1.0", "f" * 64, 1)
    check_workers([ok], "gpu", "1.0", "f" * 64)
    with pytest.raises(ClusterError, match=r"tcp://b:1 \(caramel 1.0, files eeeeeeeeeeee\)"):
        check_workers([ok, WorkerInfo("tcp://b:1", "b", "1.0", "e" * 64, 1)], "gpu", "1.0", "f" * 64)
    with pytest.raises(ClusterError, match=r"1 have none .*tcp://c:1 on c"):
        check_workers([ok, WorkerInfo("tcp://c:1", "c", "1.0", "f" * 64, 0)], "gpu", "1.0", "f" * 64)
    check_workers([WorkerInfo("tcp://c:1", "c", "1.0", "f" * 64, 0)], "cpu-plan", "1.0", "f" * 64)
    with pytest.raises(ClusterError, match="no workers"):
        check_workers([], "cpu", "1.0", "f" * 64)


def test_a_program_of_more_chips_than_workers_runs_several_chips_per_rank(client):
    from caramel.api import run_program

    program = load_program(REPO / "programs" / "Mul_4L_4c")
    want = run_program(program, n=N, backend="cpu", check=None)
    with ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan", check=None) as pool:
        have = pool.run_partitioned(timeout=DEADLINE)
    assert have.ranks == 3 and have.digest == want.digest
    with ClusterExecutor(program, cluster=client, n=N, backend="cpu-plan", gpus=4) as pool:
        with pytest.raises(ClusterError, match="as 4 ranks needs 4 workers; the cluster has 3"):
            pool.run_partitioned(timeout=DEADLINE)


def test_the_command_runs_a_batch_on_a_local_cluster(tmp_path):
    """``caramel run --batch 3 --cluster local --gpus 2``: the digests and outputs of one process, with
    the options of the local batch (``--shared`` among them)."""
    args = ["run", str(MUL1), "--n", str(N), "--backend", "cpu-plan", "--batch", "3", "--shared", "y", "-q"]
    want = caramel_cli(*args, "--save-outputs", str(tmp_path / "one.npz"))
    have = caramel_cli(*args, "--cluster", "local", "--gpus", "2", "--save-outputs", str(tmp_path / "two.npz"),
                       timeout=DEADLINE * 2)
    assert want.returncode == 0 and have.returncode == 0, (want.stderr + have.stderr)[-3000:]
    digests = [line.rsplit(" ", 1)[1] for line in want.stdout.splitlines() if line.startswith("instance")]
    assert len(digests) == 3 and all(d in have.stdout for d in digests)
    assert "in 2 processes" in have.stdout and "Traceback" not in have.stderr
    import numpy as np

    with np.load(tmp_path / "one.npz") as a, np.load(tmp_path / "two.npz") as b:
        assert sorted(a.files) == sorted(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_the_command_refuses_cluster_with_distributed():
    r = caramel_cli("run", str(MUL2), "--n", str(N), "--cluster", "local", "--distributed")
    assert r.returncode == 2 and "--cluster and --distributed" in r.stderr and "Traceback" not in r.stderr


def test_the_benchmark_runs_on_the_cpu_at_small_n(client, tmp_path):
    """``bench/cluster.py`` on simulated devices (its path, not its figures: the target is 0 here)."""
    import json

    bench = pytest.importorskip("bench.cluster")
    record = tmp_path / "cluster.json"
    code = bench.main(["--backend", "cpu-plan", "--n", str(N), "--gpus", "3", "--batch", "4", "--program", "Mul_4L_1c",
                       "--partitioned", "Mul_4L_2c", "--cluster", client.scheduler.address, "--target", "0",
                       "--json", str(record)])
    data = json.loads(record.read_text())
    assert code == 0 and data["failures"] == [], data
    checks = {f["what"]: f["value"] for f in data["figures"] if f["value"] in ("ok", "FAIL")}
    assert checks == {"cluster throughput >= 0 x one process": "ok",
                      "cluster digests = one-process digests, instance for instance": "ok",
                      "Mul_4L_2c on the cluster has the reference digest": "ok"}
    digest = next(f for f in data["figures"] if f["what"] == "Mul_4L_2c digest")
    assert digest["note"] == "against the CPU reference run"  # none stored at this N
    assert data["commit"] and data["device"].startswith("CPU") and data["devices"] == 3 and data["date"]


def test_ranks_on_workers_that_see_several_gpus_take_their_devices_in_turn():
    from caramel.cluster import rank_devices

    one = [WorkerInfo(f"tcp://h{i}:1", f"h{i}", "1", "f", 1) for i in range(3)]
    assert rank_devices(one) == [0, 0, 0]  # one worker per GPU: each its only device
    shared = [WorkerInfo(f"tcp://a:{i}", "a", "1", "f", 4) for i in range(3)]
    shared.append(WorkerInfo("tcp://b:1", "b", "1", "f", 4))
    assert rank_devices(shared) == [0, 1, 2, 0]


@pytest.mark.skipif(gpu_available(), reason="the workers here have a GPU")
def test_auto_is_the_workers_choice(client):
    with ClusterExecutor(load_program(MUL1), cluster=client, n=N) as pool:
        assert pool.backend == "cpu" and pool.job.options.backend == "cpu"
