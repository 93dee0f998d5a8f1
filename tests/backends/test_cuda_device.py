"""caramel.backends.cuda.device: a host thread that enters one GPU opens no context on another. On the CPU, against
a fake CuPy whose threads have a context once they set a device; on two GPUs, each check in a fresh Python process
(the test process has its contexts already), asking the driver whether device 0's primary context is active
(skipped without CuPy or two CUDA devices)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from caramel.api import gpu_available
from caramel.backends.cuda.device import on_device

from tests.backends.test_config import FakeCupy


def _gpus() -> int:
    if not gpu_available():
        return 0
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


def two_gpus(test):
    """Mark ``test`` as a GPU test that needs two CUDA devices (skipped with fewer)."""
    return pytest.mark.gpu(pytest.mark.skipif(_gpus() < 2, reason="needs two CUDA devices")(test))


def test_a_fresh_thread_stays_on_the_device_it_entered_first():
    """A thread's first device stays current after the block (CuPy's Device would go back to 0); later blocks go back
    to it."""
    cp, seen = FakeCupy(), []

    def work():
        with on_device(1, cp):
            seen.append(cp.cuda.runtime.getDevice())
        seen.append(cp.cuda.runtime.getDevice())
        with on_device(2, cp):
            seen.append(cp.cuda.runtime.getDevice())
        seen.append(cp.cuda.runtime.getDevice())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [1, 1, 2, 1]


def test_a_process_without_cuda_yet_has_no_context():
    """Before any CUDA call the driver answers "not initialized": no context, so the device entered stays."""
    cp = FakeCupy()

    def not_initialized():
        raise cp.cuda.driver.CUDADriverError("CUDA_ERROR_NOT_INITIALIZED")

    cp.cuda.driver.ctxGetCurrent = not_initialized
    with on_device(1, cp):
        pass
    assert cp.cuda.runtime.getDevice() == 1


PROBE = """
import ctypes, threading
import cupy as cp
from caramel.backends.cuda.device import on_device

def device0_active():
    cu = ctypes.CDLL("libcuda.so.1")
    cu.cuInit(0)
    flags, active = ctypes.c_uint(), ctypes.c_int()
    assert cu.cuDevicePrimaryCtxGetState(0, ctypes.byref(flags), ctypes.byref(active)) == 0
    return bool(active.value)
"""


def probe(body: str) -> str:
    """The last line printed by ``body`` run after :data:`PROBE` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", PROBE + textwrap.dedent(body)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@two_gpus
def test_a_new_thread_that_enters_gpu_1_stays_there_and_leaves_gpu_0_alone():
    body = """
    seen = []
    def work(enter):
        with enter(1):
            cp.zeros(4).sum()
        seen.append(cp.cuda.runtime.getDevice())
    t = threading.Thread(target=work, args=({enter},)); t.start(); t.join()
    print(seen[0], device0_active())
    """
    if probe(body.format(enter="cp.cuda.Device")) != "0 True":
        pytest.skip("CUDA makes no context when CuPy returns a thread to device 0: nothing to avoid")
    assert probe(body.format(enter="on_device")) == "1 False"


@two_gpus
def test_a_thread_on_a_device_returns_to_it():
    assert probe("""
    cp.cuda.runtime.setDevice(0)
    with on_device(1):
        inside = cp.cuda.runtime.getDevice()
    print(inside, cp.cuda.runtime.getDevice())
    """) == "1 0"


@two_gpus
def test_an_executor_on_gpu_1_opens_no_context_on_gpu_0():
    """Its preparers, lane, finishers, plan thread and compile pool all work on GPU 1 (as a rank of `caramel launch`
    with LOCAL_RANK 1 does)."""
    from tests.conftest import REPO

    assert probe(f"""
    from caramel.executor import Executor
    from caramel.parse import load_program
    program = load_program({str(REPO / "programs" / "MulRotate_4L_1c")!r}, progress=False)
    with Executor(program, n=1024, backend="gpu", gpus=1, device_ids=(1,), seed=3) as ex:
        results = [f.result() for f in [ex.submit() for _ in range(3)]]
    print([r.passed for r in results], {{tuple(r.device_ids) for r in results}}, device0_active())
    """) == "[True, True, True] {(1,)} False"
