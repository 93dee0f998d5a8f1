"""The GPU lane (:mod:`caramel.execute.gpu_pipeline`) through caramel.Executor: every instance's digest
equal to the reference's single run, with the client on the host (rows uploaded from pinned slots) and
on the GPU (rows copied from the client's arrays), shared inputs resident, a K-chip program on one GPU,
a residue out of range found on the device failing its instance alone, and instances over two GPUs (the GPU
client on each lane's GPU). Skipped without a GPU."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.options import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.api import run_program  # noqa: E402
from caramel.errors import BindingError  # noqa: E402
from caramel.executor import Executor  # noqa: E402
from caramel.parse import load_program  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SEARCH = [ROOT / ".data", ROOT / ".data" / "corpus", Path(os.environ.get("CARAMEL_PROGRAMS", "/work/shared/programs")),
          ROOT / "programs"]
N = 4096


def find_program(name: str):
    for d in SEARCH:
        if (d / name).is_dir():
            return load_program(d / name, progress=False)
    pytest.skip(f"program {name} not found")


def single(program, seed: int, key_seed: int, **fields) -> str:
    return run_program(program, n=N, backend="cpu", seed=seed, key_seed=key_seed, client="cpu", check=None,
                       **fields).digest


@pytest.mark.parametrize("client", ["cpu", "gpu"])
@pytest.mark.parametrize("name", ["MulRotate_10L_1c", "BootstrapModRaise_10L_1c", "MulAdd_10L_1c"])
def test_gpu_lane_instances_equal_single_runs(name, client):
    program = find_program(name)
    with Executor(program, n=N, backend="gpu", seed=3, check=None, client=client, depth=2) as ex:
        results = list(ex.map([None] * 5))
    assert [r.device_ids for r in results] == [(0,)] * 5
    for i, r in enumerate(results):
        assert r.digest == single(program, 3 + i, 3), f"{name} instance {i}"
        assert r.timings["replay"] > 0 and r.timings["download"] >= 0


@pytest.mark.parametrize("name", ["MulAdd_10L_1c", "AddScalar_10L_1c"])
def test_gpu_lane_serving_shared_plaintexts_and_scalars(name):
    """Serving: plaintexts and scalars shared and resident, ciphertexts encrypted ahead on the host."""
    program = find_program(name)
    shared = "plaintexts,scalars"
    with Executor(program, n=N, backend="gpu", seed=4, check=None, shared=shared) as ex:
        ready = [ex.encrypt(seed=4 + i) for i in range(4)]
        assert all(isinstance(v.c0, np.ndarray) for x in ready for v in x.values())
        results = list(ex.map(ready))
    for i, r in enumerate(results):
        assert r.digest == single(program, 4 + i, 4, shared=shared), f"{name} instance {i}"


@pytest.mark.parametrize("client", ["cpu", "gpu"])
def test_instances_over_two_gpus_equal_single_runs(client):
    """A 1-chip program on two GPUs, a lane on each: with the GPU client an instance is prepared on its lane's GPU
    (its rows read there in place) and checked there; every digest is its single run's, every check passes."""
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("2 GPUs needed")
    program = find_program("MulRotate_10L_1c")
    with Executor(program, n=N, backend="gpu", seed=5, check="auto", client=client, gpus=2, depth=2) as ex:
        results = list(ex.map([None] * 8))
    assert {r.device_ids for r in results} == {(0,), (1,)}
    for i, r in enumerate(results):
        want = run_program(program, n=N, backend="cpu", seed=5 + i, key_seed=5, client="cpu", check="auto")
        assert r.passed is True and r.digest == want.digest, f"instance {i} on GPU {r.device_ids}"
        assert client == "cpu" or r.client.cuda == r.device_ids[0]


@pytest.mark.parametrize("mode", ["exact", "textbook", "emulator"])
@pytest.mark.parametrize("name", ["MulRotate_10L_1c", "BootstrapModRaise_10L_1c"])
def test_one_kernel_per_instruction_equals_the_reference(name, mode):
    """``fusion="off"`` (a first single run's plan): the unfused plan's generic kernels on a GPU lane; every
    instance's digest is its single run's on the reference."""
    program = find_program(name)
    with Executor(program, n=N, backend="gpu", mode=mode, seed=7, check=None, fusion="off", depth=2) as ex:
        assert ex.fused is False
        results = list(ex.map([None] * 3))
    for i, r in enumerate(results):
        assert r.digest == single(program, 7 + i, 7, mode=mode), f"{name} {mode} instance {i}"


def test_one_kernel_per_instruction_over_two_gpus():
    """The unfused plan of a 2-chip program resident on two GPUs (``dis``/``rcv``/``joi`` between them)."""
    if cp.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("2 GPUs needed")
    program = load_program(ROOT / "programs" / "BootstrapModRaise_4L_2c", progress=False)
    with Executor(program, n=N, backend="gpu", seed=8, check=None, fusion="off", gpus=2, client="cpu") as ex:
        results = list(ex.map([None] * 2))
    assert {r.device_ids for r in results} == {(0, 1)}
    for i, r in enumerate(results):
        assert r.digest == single(program, 8 + i, 8), f"instance {i}"


def test_a_k_chip_program_on_one_gpu_lane():
    program = load_program(ROOT / "programs" / "Mul_4L_2c", progress=False)
    with Executor(program, n=N, backend="gpu", seed=2, check="auto", gpus=1, client="cpu") as ex:
        results = list(ex.map([None] * 3))
    for i, r in enumerate(results):
        assert r.passed is True and r.digest == run_program(program, n=N, backend="cpu", seed=2 + i, key_seed=2,
                                                            client="cpu").digest


def test_a_residue_out_of_range_found_on_the_device_fails_alone():
    from caramel.ckks.encrypt import Ciphertext

    program = find_program("MulRotate_10L_1c")
    with Executor(program, n=N, backend="gpu", seed=6, check=None, client="cpu") as ex:
        good = ex.encrypt(seed=6)
        x = good["x"]
        c1 = np.array(x.c1)
        c1[2, 9] = ex.ctx.q(x.limbs[2])
        bad = dict(good, x=Ciphertext(x.c0, c1, x.limbs, x.scale))
        futures = [ex.submit(good), ex.submit(bad), ex.submit(good)]
        with pytest.raises(BindingError, match="found on the device"):
            futures[1].result()
        digests = {futures[k].result().digest for k in (0, 2)}
    assert digests == {single(program, 6, 6)}


SPIN_SRC = r"""
extern "C" __global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""


def test_a_lane_waits_for_its_uploads_on_the_current_stream(monkeypatch):
    """The lane's address tables are uploaded on the caller's current stream, and its own streams are non-blocking:
    built while that stream is still busy (0.3 s of work queued there just before the uploads), the lane's set-up
    copy and its instances wait for the uploads (else they read addresses not yet written), so the set-up ends after
    that work, and the instances equal their single runs."""
    import caramel.execute.gpu_pipeline as pipeline

    spin, addresses, queued = cp.RawKernel(SPIN_SRC, "spin"), pipeline._addresses, []

    def busy_then(*args):
        if not queued:
            spin((1,), (1,), (np.uint64(300_000_000),))
            queued.append(cp.cuda.get_current_stream())
        return addresses(*args)

    init, waited = pipeline.GpuRowLane.__init__, []

    def lane_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        waited.append(queued[0].done)  # the set-up waited for the work ahead of its uploads

    monkeypatch.setattr(pipeline, "_addresses", busy_then)
    monkeypatch.setattr(pipeline.GpuRowLane, "__init__", lane_init)
    program = load_program(ROOT / "programs" / "MulRotate_4L_1c", progress=False)
    with Executor(program, n=N, backend="gpu", seed=4, check=None, client="cpu") as ex:
        results = list(ex.map([None] * 2))
    assert waited == [True]
    assert [r.digest for r in results] == [single(program, 4 + i, 4) for i in range(2)]
