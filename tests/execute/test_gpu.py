"""caramel.execute.cuda_graph (one GPU) against the reference interpreter: GPU outputs (one CUDA graph of the fused
plan, and eager one-launch-per-instruction runs of the unfused plan) identical limb for limb to
``run_reference`` on fresh random inputs. Skipped without CuPy or a CUDA device.

Programs come from ``<repo>/.data`` (copied there for the GPU machine) or the corpus (:mod:`tests.corpus`)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from caramel.api import gpu_available  # noqa: E402
from caramel.execute.cuda_graph import GpuRun, gpu_executor, run_gpu  # noqa: E402

if not gpu_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from caramel.ckks.check import check_path, prepare_check  # noqa: E402
from caramel.errors import DeviceMemoryError  # noqa: E402
from caramel.execute.reference import run_reference  # noqa: E402
from caramel.parse import load_program  # noqa: E402
from caramel.plan import build_plan, fusion  # noqa: E402
from caramel.ring import Context  # noqa: E402
from tests.corpus import SHARED_PROGRAMS  # noqa: E402

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
SEARCH = [ROOT / ".data", SHARED_PROGRAMS, ROOT / "programs"]
ONE_CHIP = ["Mul_10L_1c", "MulRotate_10L_1c", "PolyX8_10L_1c", "BootstrapModRaise_10L_1c"]
TWO_CHIP = ["Mul_10L_2c"]
SIZES = [4096, 65536] if os.environ.get("CARAMEL_GPU_FULL", "1") != "0" else [4096]


def find_program(name: str):
    for d in SEARCH:
        if (d / name).is_dir():
            return load_program(d / name)
    pytest.skip(f"program {name} not found in {', '.join(map(str, SEARCH))}")


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    return Context(n=n)


@lru_cache(maxsize=4)
def case(name: str, n: int):
    program = find_program(name)
    memory = prepare_check(check_path(program.name), program, context(n), rng=11).memory
    want = run_reference(program, context(n), memory, "exact")
    return program, memory, want


def mismatches(want, have) -> list[str]:
    problems = []
    for chip, (w, h) in enumerate(zip(want.stores, have.stores)):
        if w.keys() != h.keys():
            problems.append(f"chip {chip}: stored names differ")
        for m in w:
            if m in h and not np.array_equal(w[m], h[m]):
                problems.append(f"chip {chip} {m}: {int(np.count_nonzero(w[m] != h[m]))} residues differ")
    if len(want.stores) != len(have.stores):
        problems.append(f"{len(want.stores)} chips vs {len(have.stores)}")
    return problems


@pytest.mark.parametrize("graph", [True, False], ids=["graph", "eager"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("name", ONE_CHIP + TWO_CHIP)
def test_bit_exact(name, n, graph):
    program, memory, want = case(name, n)
    have = run_gpu(program, context(n), memory, "exact", graph=graph)
    problems = mismatches(want, have)
    assert not problems, f"{name} N={n} graph={graph}: " + "; ".join(problems[:4])
    for key in want.memory:
        assert np.array_equal(want.memory[key], have.memory[key]), key


def test_replays_are_repeatable_and_executor():
    program, memory, want = case("MulRotate_10L_1c", 4096)
    run = GpuRun(build_plan(program), context(4096), memory, "exact")
    run.run(graph=True)
    timing = run.time(graph=True, repeats=3)
    assert timing.repeats == 3 and timing.min_ms <= timing.median_ms <= timing.max_ms
    assert not mismatches(want, run.result())
    have = gpu_executor(program, context(4096), "exact")(memory)
    assert not mismatches(want, have)


def test_other_modes_graph():
    program = find_program("Mul_10L_1c")
    ctx = context(4096)
    memory = prepare_check(check_path(program.name), program, ctx, rng=3).memory
    for mode in ("textbook", "emulator"):
        want = run_reference(program, ctx, memory, mode)
        assert not mismatches(want, run_gpu(program, ctx, memory, mode)), mode


def test_arena_too_large_is_a_clear_error():
    from caramel.backends.cuda.backend import CupyBackend

    free, _ = cp.cuda.runtime.memGetInfo()
    rows = int(free // (4 * 65536)) * 4 + 1024
    with pytest.raises(DeviceMemoryError, match="bytes"):
        CupyBackend(context(65536), rows)


@pytest.mark.parametrize("streams", [2, 4])
@pytest.mark.parametrize("name", ONE_CHIP)
def test_multi_stream_bit_exact(name, streams):
    """The kernel DAG on several streams (caramel.plan.streams): eager, captured as one graph
    with parallel branches, and replayed, identical to the reference."""
    program, memory, want = case(name, 4096)
    # BootstrapModRaise keeps its independent branches apart (sibling rows would merge them)
    plan = build_plan(program, max_outputs=1 if name == "BootstrapModRaise_10L_1c" else fusion.MAX_OUTPUTS)
    run = GpuRun(plan, context(4096), memory, "exact", streams=streams)
    assert run.schedule is not None and run.schedule.n_streams == streams
    for graph in (False, True, True):
        run.run(graph=graph)
        problems = mismatches(want, run.result())
        assert not problems, f"{name} streams={streams} graph={graph}: " + "; ".join(problems[:4])
    if name == "BootstrapModRaise_10L_1c":
        assert len(set(run.schedule.stream)) > 1


def test_multi_stream_eager_per_row_and_executor():
    program, memory, want = case("PolyX8_10L_1c", 4096)
    have = run_gpu(program, context(4096), memory, "exact", graph=False, streams=2)  # unfused, per row
    assert not mismatches(want, have)
    have = gpu_executor(program, context(4096), "exact", streams=4)(memory)
    assert not mismatches(want, have)


def test_residue_out_of_range_found_on_the_device_is_the_host_error():
    """A 1-GPU run scans the residues of uint32 limbs on the device after the upload: a residue
    >= q raises the host check's :class:`BindingError`, word for word."""
    from caramel.errors import BindingError
    from caramel.execute.memory import check_plan_memory

    program, memory, _ = case("Mul_10L_1c", 4096)
    plan = build_plan(program)
    mem = next(iter(plan.chips[0].inputs))
    bad = dict(memory)
    bad[mem] = np.array(memory[mem], dtype=np.uint32)
    bad[mem][7] = context(4096).q(mem.limb)
    with pytest.raises(BindingError) as host:
        check_plan_memory(plan, context(4096), bad)
    with pytest.raises(BindingError) as device:
        GpuRun(plan, context(4096), bad, "exact")
    assert str(device.value) == str(host.value)
