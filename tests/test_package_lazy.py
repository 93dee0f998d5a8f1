"""The package's lazy names (PEP 562 ``caramel.__getattr__``) and the command line's early GPU start
(``caramel.cli._start_gpu``): ``import caramel.cli`` imports no NumPy, client or planner, so that
``caramel run --backend gpu`` starts the GPU before them."""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading

import pytest

import caramel
import caramel.cli as cli

from tests.conftest import REPO


def test_every_public_name_resolves_to_its_module_object():
    for name in caramel.__all__:
        value = getattr(caramel, name)
        module = caramel._LAZY.get(name)
        if name == "validate":
            assert value is importlib.import_module("caramel.validate") and callable(value)
        elif module is not None:
            assert value is getattr(importlib.import_module(module), name)
    assert set(caramel.__all__) <= set(dir(caramel))
    from caramel import Program, load_program, run_program  # noqa: F401  (the from-import form)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        caramel.nonesuch  # noqa: B018


def test_import_caramel_cli_imports_no_numpy_client_or_planner():
    code = ("import sys, caramel.cli; heavy = [m for m in ('numpy', 'caramel.api', 'caramel.ckks', 'caramel.plan', "
            "'cupy') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.fixture
def started(monkeypatch):
    """The names of the early-start steps run (each in its thread), with a fresh process state."""
    ran: list[str] = []
    lock = threading.Lock()

    def step(name):
        def fn():
            with lock:
                ran.append(name)
        return fn
    monkeypatch.setattr(cli, "GPU_START", tuple((name, step(name)) for name, _ in cli.GPU_START))
    monkeypatch.setattr(cli, "_gpu_start", [])
    monkeypatch.delenv("CARAMEL_GPU_WARMUP", raising=False)

    def names():
        for t in cli._gpu_start:
            t.join()
        return sorted(ran)
    return names


@pytest.mark.parametrize("argv", [["run", "P", "--backend", "gpu"], ["run", "P", "--n", "4096", "--backend=gpu"],
                                  ["run", "P", "--backend", "cpu", "--backend", "gpu"]])
def test_early_start_for_a_one_process_gpu_run(started, argv):
    cli._start_gpu(argv)
    assert started() == sorted(name for name, _ in cli.GPU_START)
    assert all(t.daemon for t in cli._gpu_start)
    cli._start_gpu(argv)  # once per process
    assert len(cli._gpu_start) == len(cli.GPU_START)


@pytest.mark.parametrize("argv", [[], ["run", "P"], ["run", "P", "--backend", "cpu"], ["keys", "P", "--backend", "gpu"],
                                  ["run", "P", "--backend", "gpu", "--distributed"],
                                  ["run", "P", "--backend", "gpu", "--backend", "cpu-plan"]])
def test_no_early_start_otherwise(started, argv):
    cli._start_gpu(argv)
    assert started() == [] and cli._gpu_start == []


def test_no_early_start_with_the_warm_up_off(started, monkeypatch):
    monkeypatch.setenv("CARAMEL_GPU_WARMUP", "0")
    cli._start_gpu(["run", "P", "--backend", "gpu"])
    assert started() == []


def test_a_failing_early_step_is_quiet(monkeypatch):
    """No driver, no CuPy: the step's thread ends without an exception reaching threading's hook."""
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args))

    def broken():
        raise OSError("libcuda.so.1: cannot open shared object file")
    t = threading.Thread(target=cli._quietly(broken))
    t.start()
    t.join()
    assert seen == []
