"""caramel.backends.cuda.backend: the device tables that the backend makes lazily and every stream reads (base
conversions, CRT bases, prologue tables) are complete before any stream reads them.

A run's streams are non-blocking: work queued on stream A behind A's kernels has not run when a kernel of stream B
does (eager runs of a 2-chip program on one GPU, whose tasks spread over three streams, read such tables that way
and gave wrong limbs under load). A busy kernel holds stream A while a table is made there; stream B then reads it
at once. Skipped without CuPy or a CUDA device."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.backends.cuda import available  # noqa: E402

if not available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.backends.cuda.backend import CupyBackend  # noqa: E402

pytestmark = pytest.mark.gpu

_SPIN = cp.RawKernel(r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}""", "spin")


def _busy(stream, cycles: int = 400_000_000) -> None:
    """Hold ``stream`` for ``cycles`` GPU clocks (a fraction of a second)."""
    with stream:
        _SPIN((1,), (1,), (np.int64(cycles),))


@pytest.fixture
def streams():
    return cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)


def test_shared_tables_are_settled_before_they_are_cached(streams):
    """A table that a kernel of stream A makes is cached only once A has made it: stream B reads it whole."""
    a, b = streams
    cache: dict = {}
    _busy(a)
    with a:
        CupyBackend._shared(cache, "t", lambda: cp.full(4096, 7, dtype=np.int32))
    with b:
        got = CupyBackend._shared(cache, "t", lambda: pytest.fail("made twice")).copy()
    b.synchronize()
    assert (got.get() == 7).all()
