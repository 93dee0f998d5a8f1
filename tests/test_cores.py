"""caramel.cores: a process bound to some cores sizes its thread pools by them, not by the machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and 2 cores")
def test_a_process_on_one_core_sizes_its_pools_by_it():
    """Bound to one core (as `taskset -c`, MPI or a batch scheduler would), the encoding threads (of a batch and
    of a checked run), the executor's preparers and the compile pool are sized by that core, though the machine
    has more."""
    code = "\n".join([
        "import json, os",
        "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})",
        "from caramel import cores, instance, executor",
        "from caramel.ckks import check",
        "from caramel.backends.cuda import compiler",
        "from caramel.options import RunOptions",
        "print(json.dumps([cores.available(), instance.DRAW_THREADS, check.ENCODE_THREADS,",
        "                  compiler.default_workers(), executor.preparers(RunOptions())]))",
    ])
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == [1, 1, 1, 1, 1]
