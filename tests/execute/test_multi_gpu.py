"""caramel.execute.cuda_graph (several GPUs) against the reference interpreter: K-chip programs on K GPUs (NCCL
broadcast and reduce inside one CUDA graph per GPU) and on fewer GPUs than chips, identical limb
for limb to ``run_reference`` on fresh random inputs; clean shutdown. Skipped without CuPy, NCCL
or enough CUDA devices. Programs come from ``<repo>/.data/corpus``, ``<repo>/.data`` or the
shared corpus."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.api import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("no CUDA device", allow_module_level=True)
try:
    from cupy.cuda import nccl  # noqa: E402,F401
except Exception:  # noqa: BLE001
    pytest.skip("CuPy has no NCCL", allow_module_level=True)

from caramel.ckks.check import check_path, prepare_check  # noqa: E402
from caramel.execute.cuda_graph import MultiGpuRun, run_multi_gpu  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan  # noqa: E402
from caramel.ring import Context  # noqa: E402
from tests.corpus import SHARED_PROGRAMS  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SEARCH = [ROOT / ".data" / "corpus", ROOT / ".data", SHARED_PROGRAMS]
GPUS = cp.cuda.runtime.getDeviceCount()
PROGRAMS = ["Mul_10L_2c", "MulRotate_10L_4c", "PolyX8_10L_8c", "BootstrapModRaise_10L_4c", "RotMulAdd_10L_8c"]


def find_program(name: str):
    for d in SEARCH:
        if (d / name).is_dir():
            return load_program(d / name)
    pytest.skip(f"program {name} not found")


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


@lru_cache(maxsize=8)
def prepared(name: str, n: int):
    program = find_program(name)
    memory = prepare_check(check_path(program.name), program, context(n), rng=np.random.default_rng(11)).memory
    return program, build_plan(program), memory, run_reference(program, context(n), memory).stores


def assert_same(want, have):
    assert len(want) == len(have.stores)
    for c, (w, h) in enumerate(zip(want, have.stores)):
        assert w.keys() == h.keys(), f"chip {c}: stores differ"
        for m in w:
            assert np.array_equal(w[m], h[m]), f"chip {c}: {m} differs"


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("graph", [True, False])
def test_k_chips_on_k_gpus(name, graph):
    program, plan, memory, want = prepared(name, 4096)
    if program.chips > GPUS:
        pytest.skip(f"{program.chips} GPUs needed, {GPUS} present")
    assert_same(want, run_multi_gpu(plan, context(4096), memory, "exact", program.chips, graph=graph))


@pytest.mark.parametrize("name", PROGRAMS)
def test_fewer_gpus_than_chips(name):
    program, plan, memory, want = prepared(name, 4096)
    for g in sorted({1, min(2, GPUS), min(program.chips // 2, GPUS)}):
        if 1 <= g < program.chips:
            assert_same(want, run_multi_gpu(plan, context(4096), memory, "exact", g))


@pytest.mark.parametrize("streams", [2, 3])
@pytest.mark.parametrize("name", PROGRAMS)
def test_several_streams_per_gpu(name, streams):
    """Collectives on a stream of their own, kernels on the others: graph and eager runs."""
    program, plan, memory, want = prepared(name, 4096)
    g = min(program.chips, GPUS)
    for graph in (True, False):
        assert_same(want, run_multi_gpu(plan, context(4096), memory, "exact", g, graph=graph, streams=streams))


@pytest.mark.parametrize("name", ["BootstrapModRaise_10L_4c", "MulRotate_10L_4c"])
def test_a_capture_allocates_nothing(name):
    """Every chip hosted on one GPU (captures of one device pool in threads, thread-local capture mode) with CuPy's
    pool emptied after the eager run: any allocation inside the capture is a cudaMalloc, which the capture refuses
    (rsv's accumulator copy once was one)."""
    program, plan, memory, want = prepared(name, 4096)
    with MultiGpuRun(plan, context(4096), memory, "exact", 1) as run:
        run.eager()
        cp.cuda.Device(0).synchronize()
        cp.get_default_memory_pool().free_all_blocks()
        run.capture()
        run.replay(1)
        assert_same(want, run.result())


def test_process_mode_on_gpus():
    """`caramel launch --nproc 2`: two processes, one GPU each, NCCL ids through the rendezvous
    file; the reference's digest, a passing check and a clean exit."""
    if GPUS < 2:
        pytest.skip("2 GPUs needed")
    from tests.conftest import check_launch

    have = check_launch(str(find_program("Mul_10L_2c").path), 4096, "gpu", timeout=240,
                        env={"NCCL_NVLS_ENABLE": "0"}, quiet=False)
    assert "communicators destroyed" in have.stderr


def test_replays_are_repeatable_and_timed():
    program, plan, memory, want = prepared("MulRotate_10L_4c", 4096)
    with MultiGpuRun(plan, context(4096), memory, "exact", min(4, GPUS)) as run:
        run.replay(3)
        assert_same(want, run.result())
        t = run.time(repeats=3)
        assert t.repeats == 3 and 0 < t.min_ms <= t.median_ms <= t.max_ms
        marks = run.instrument()
        assert len(marks) == run.gpus and all(len(m) == len(r.calls) for m, r in zip(marks, run.runs))
        assert_same(want, run.result())


def test_n65536_two_gpus():
    if GPUS < 2:
        pytest.skip("2 GPUs needed")
    program, plan, memory, want = prepared("PolyX8_10L_2c", 65536)
    assert_same(want, run_multi_gpu(plan, context(65536), memory, "exact", 2))


def test_process_exits_cleanly_after_a_multi_gpu_run():
    if GPUS < 2:
        pytest.skip("2 GPUs needed")
    code = (
        "import numpy as np, sys\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from caramel.parse import load_program\n"
        "from caramel.plan import build_plan\n"
        "from caramel.ring import Context\n"
        "from caramel.api import default_spec\n"
        "from caramel.ckks.check import prepare_check\n"
        "from caramel.execute.cuda_graph import run_multi_gpu\n"
        f"p = load_program({str(find_program('Mul_10L_2c').path)!r})\n"
        "ctx = Context(n=4096)\n"
        "m = prepare_check(default_spec(p), p, ctx, rng=1).memory\n"
        "run_multi_gpu(build_plan(p), ctx, m, 'exact', 2)\n"
        "print('done')\n"
    )
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180,
                         env={**os.environ, "NCCL_NVLS_ENABLE": "0"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "done" in out.stdout
    assert time.monotonic() - start < 180
