"""The CUDA kernels' settings as values (caramel.backends.cuda.config) and the compile cache keyed by source text
(caramel.backends.cuda.compiler), without a GPU: settings parsed from text, sources that are functions of the
settings, and a cache that compiles each distinct source once however many threads ask."""

from __future__ import annotations

import threading
import types

import pytest

from caramel.backends.cuda import compiler, elementwise
from caramel.backends.cuda.config import EpilogueConfig, KernelConfig, NttConfig
from caramel.backends.cuda.ntt.prologue import prologue_source
from caramel.backends.cuda.ntt.transform import transform_source
from caramel.expr import Expr, ExprOp


def test_settings_from_text():
    config = KernelConfig().with_settings(["ntt.warps=2", "ntt.split_from=6/5", "epilogue.min_blocks=3/2",
                                           "elementwise.threads=128"])
    assert config.ntt == NttConfig(warps=2, split_from=(6, 5))
    assert config.epilogue == EpilogueConfig(min_blocks=(3, 2)) and config.elementwise.threads == 128
    assert config.settings() == ["ntt.split_from=6/5", "ntt.warps=2", "epilogue.min_blocks=3/2",
                                 "elementwise.threads=128"]
    assert KernelConfig().with_settings(config.settings()) == config
    assert KernelConfig().settings() == [] and KernelConfig().with_settings([]) == KernelConfig()


@pytest.mark.parametrize("text,message", [
    ("warps=2", "FAMILY.NAME=VALUE"), ("gpu.warps=2", "FAMILY one of ntt, epilogue, elementwise"),
    ("ntt.fused=1/1", "ntt has no setting 'fused'"), ("ntt.warps=four", "'four' is not an integer"),
    ("ntt.split_from=5", "two stages in 0 .. 8"), ("ntt.split_from=5/x", "integers separated by /"),
    ("ntt.warps=3", "1, 2, 4 or 8"), ("epilogue.min_blocks=0", "one or more of 1 .. 8"),
    ("elementwise.threads=100", "power of two")])
def test_bad_settings_are_named(text, message):
    with pytest.raises(ValueError, match=message):
        KernelConfig().with_settings([text])


def test_sources_are_functions_of_the_settings():
    """A setting changes exactly the sources of its family; the defaults are the same text every time."""
    default, warps = KernelConfig(), KernelConfig().with_settings(["ntt.warps=2"])
    assert transform_source(16, True, default.ntt) is transform_source(16, True, NttConfig())
    assert transform_source(16, True, warps.ntt) != transform_source(16, True, default.ntt)
    assert "#define WARPS 2\n" in transform_source(16, True, warps.ntt)
    assert transform_source(12, True, warps.ntt) == transform_source(12, True, default.ntt)  # no row kernel at 4096
    lag = KernelConfig().with_settings(["ntt.fused_lag=7"])
    assert transform_source(16, True, lag.ntt) == transform_source(16, True, default.ntt)  # a launch argument
    epi = Expr(3, 0, (ExprOp("mul", (0, 1)), ExprOp("add", (3, 2))), (4,), transformed=(0,))
    other = EpilogueConfig(split_from=6)
    assert elementwise.epilogue_sources(epi, 16, True, other) != elementwise.epilogue_sources(epi, 16, True)
    assert prologue_source(16, 0, 2, True, True) != prologue_source(16, 0, 2, False, True)  # lazy is the ring's


def test_gathered_programs_are_other_kernels():
    plain = Expr(2, 0, elementwise.ADD.ops, (2,))
    gathered = Expr(2, 0, elementwise.ADD.ops, (2,), (1,))
    assert plain == elementwise.ADD and elementwise.plain_source(plain) is elementwise.plain_source(elementwise.ADD)
    assert elementwise.kernel_name(gathered) != elementwise.kernel_name(plain)
    assert "__brev" in elementwise.plain_source(gathered) and "__brev" not in elementwise.plain_source(plain)
    with pytest.raises(ValueError, match="gathered"):
        Expr(2, 0, elementwise.ADD.ops, (2,), (2,))


class FakeCupy:
    """Just enough of CuPy for the compile cache: a current device per thread (a thread has a context once it set
    one, as with CUDA 12) and RawModules that count their compiles."""

    def __init__(self, fail: str = ""):
        self.compiles: list[str] = []
        self.fail, self.device = fail, threading.local()
        fake = self

        class RawModule:
            def __init__(self, code, options):
                self.code = code

            def compile(self):
                fake.compiles.append(self.code)
                if self.code == fake.fail:
                    raise RuntimeError("nvrtc says no")

            def get_function(self, name):
                return (self.code, name)

        class Device:
            def __init__(self, d):
                self.d = d

            def __enter__(self):
                self.old, fake.device.d = getattr(fake.device, "d", 0), self.d

            def __exit__(self, *exc):
                fake.device.d = self.old

        def set_device(d):
            fake.device.d = d

        self.RawModule = RawModule
        self.cuda = types.SimpleNamespace(
            Device=Device, runtime=types.SimpleNamespace(getDevice=lambda: getattr(fake.device, "d", 0),
                                                         setDevice=set_device),
            driver=types.SimpleNamespace(ctxGetCurrent=lambda: int(hasattr(fake.device, "d")),
                                         CUDADriverError=RuntimeError))


@pytest.fixture
def fake(monkeypatch):
    cp = FakeCupy(fail="broken")
    monkeypatch.setattr(compiler, "_cupy", lambda: cp)
    monkeypatch.setattr(compiler, "_modules", {})
    monkeypatch.setattr(compiler, "_functions", {})
    monkeypatch.setattr(compiler, "_pools", {})
    monkeypatch.setattr(compiler, "_queued", {})
    return cp


def test_each_source_compiles_once_per_device(fake):
    """Sixteen threads asking for four sources compile each once; another device compiles it again; a failure is
    raised after every job ran, and a later request tries again."""
    jobs = [lambda k=k: compiler.function(f"source {k % 4}", "f") for k in range(16)]
    assert compiler.compile_sources(jobs, workers=16, progress=False) == 16
    assert sorted(fake.compiles) == [f"source {k}" for k in range(4)]
    assert compiler.function("source 1", "f") == ("source 1", "f") and len(fake.compiles) == 4
    with fake.cuda.Device(1):
        compiler.compile_sources([lambda: compiler.module("source 1")], progress=False)
    assert fake.compiles.count("source 1") == 2
    with pytest.raises(RuntimeError, match="nvrtc says no"):
        compiler.compile_sources([lambda: compiler.module("broken"), lambda: compiler.module("fine")], workers=2,
                                 progress=False)
    assert "fine" in fake.compiles
    with pytest.raises(RuntimeError):
        compiler.module("broken")
    assert fake.compiles.count("broken") == 2  # not cached as a failure


def test_options_are_part_of_the_key(fake):
    compiler.module("same")
    compiler.module("same", ())
    assert fake.compiles == ["same", "same"]
