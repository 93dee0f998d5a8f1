"""DeviceRun.rebind: the same lowered run takes another instance's inputs (keys kept in place)."""

from pathlib import Path

import pytest

import numpy as np

import caramel
from caramel.api import default_spec
from caramel.backends.numpy_backend import NumpyBackend
from caramel.batch import key_mems
from caramel.ckks.check import prepare_check
from caramel.ckks.keyset import generate_keyset, input_rng
from caramel.execute.placement import gpu_device_programs
from caramel.execute.runner import DeviceRun
from caramel.plan import build_plan
from caramel.ring import Context, Mode

EXAMPLES = Path(__file__).resolve().parents[2] / "programs"


def _images(program, ctx, seeds):
    keys = generate_keyset(program, ctx, 7)
    spec = default_spec(program)
    return [prepare_check(spec, program, ctx, rng=input_rng(s), secrets=keys.secrets, keys=dict(keys.keys)).memory
            for s in seeds]


def test_rebind_gives_a_fresh_runs_outputs_with_keys_kept():
    program = caramel.load_program(EXAMPLES / "MulRotate_4L_1c")
    ctx = Context(n=1024)
    plan = build_plan(program)
    a, b = _images(program, ctx, (1, 2))
    prog = gpu_device_programs(plan, 1, ctx, 1)[0]  # the GPU's placement: input rows never overwritten
    keep = key_mems(program)
    assert keep and all(m in a for m in keep)

    def fresh(memory):
        run = DeviceRun(prog, plan, ctx, memory, Mode.EXACT, NumpyBackend)
        run.run()
        return run.stores()

    run = DeviceRun(prog, plan, ctx, a, Mode.EXACT, NumpyBackend)
    run.run()
    scalars = run.backend._scalars
    for memory in (b, a, b):
        run.rebind(memory, keep)
        run.run()
        got, want = run.stores(), fresh(memory)
        assert all(np.array_equal(got[0][k], want[0][k]) for k in want[0])
    assert run.backend._scalars is scalars  # rewritten in place: a captured graph would see it
    assert not all(np.array_equal(fresh(a)[0][k], fresh(b)[0][k]) for k in fresh(a)[0])  # the inputs matter


def test_rebind_without_keep_rewrites_the_keys_too():
    program = caramel.load_program(EXAMPLES / "MulRotate_4L_1c")
    ctx = Context(n=1024)
    plan = build_plan(program)
    prog = gpu_device_programs(plan, 1, ctx, 1)[0]
    a = _images(program, ctx, (1,))[0]
    other = dict(a)
    for m in key_mems(program):  # another key set's values: kept rows would give the old outputs
        other[m] = (np.asarray(a[m], dtype=np.uint64) * 3 % ctx.q(m.limb)).astype(np.uint32)
    run = DeviceRun(prog, plan, ctx, a, Mode.EXACT, NumpyBackend)
    run.run()
    kept = run.stores()[0]
    run.rebind(other, key_mems(program))
    run.run()
    assert all(np.array_equal(run.stores()[0][k], kept[k]) for k in kept)
    run.rebind(other)
    run.run()
    assert not all(np.array_equal(run.stores()[0][k], kept[k]) for k in kept)


def test_check_of_a_rebound_image_skips_only_the_kept_contents():
    """check_plan_memory(kept=...): kept limbs must be present but are not scanned again; every
    other limb is checked as before."""
    import pytest

    from caramel.errors import BindingError
    from caramel.execute.memory import check_plan_memory

    program = caramel.load_program(EXAMPLES / "MulRotate_4L_1c")
    ctx = Context(n=1024)
    plan = build_plan(program)
    image = _images(program, ctx, (1,))[0]
    keep = key_mems(program)
    key, other = sorted(keep, key=str)[0], sorted(set(image) - keep, key=str)[0]
    bad_key = {**image, key: np.full(ctx.n, ctx.q(key.limb), dtype=np.uint32)}
    check_plan_memory(plan, ctx, bad_key, kept=keep)
    with pytest.raises(BindingError, match="residues must lie"):
        check_plan_memory(plan, ctx, bad_key)
    with pytest.raises(BindingError, match="residues must lie"):
        check_plan_memory(plan, ctx, {**image, other: np.full(ctx.n, ctx.q(other.limb), dtype=np.uint32)}, kept=keep)
    with pytest.raises(BindingError, match="not provided"):
        check_plan_memory(plan, ctx, {m: v for m, v in image.items() if m != key}, kept=keep)


# ------------------------------------------------------------------ K-chip programs (batch slots)

def _fresh_on_devices(plan, ctx, memory, devices):
    from caramel.execute.drive import run_on_devices

    return run_on_devices(plan, ctx, memory, Mode.EXACT, devices)


def _same_stores(a, b) -> bool:
    return len(a.stores) == len(b.stores) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a.stores, b.stores))


def test_resident_host_slot_rebinds_every_device_with_keys_kept():
    """caramel.batch.ResidentHost (a K-chip slot on simulated devices): one set of device runs
    takes instance after instance; each instance's stores equal a fresh run on its own image."""
    from caramel.batch import ResidentHost

    program = caramel.load_program(EXAMPLES / "Mul_4L_2c")
    ctx = Context(n=1024)
    plan = build_plan(program)
    images = _images(program, ctx, (1, 2, 3, 1))
    for devices, streams in ((2, 1), (1, 1), (2, 2)):
        slot = ResidentHost(plan, ctx, Mode.EXACT, devices, key_mems(program), streams=streams, seed=3)
        for i, memory in enumerate(images):
            assert _same_stores(slot(memory), _fresh_on_devices(plan, ctx, memory, devices)), (devices, streams, i)
        assert slot.instances == 4 and len(slot.runs) == devices
    assert not _same_stores(_fresh_on_devices(plan, ctx, images[0], 2), _fresh_on_devices(plan, ctx, images[1], 2))


def test_resident_host_slot_keeps_the_key_rows_it_wrote_first():
    """Kept rows are not written again: an image whose keys differ gives the first keys' outputs
    (so a batch must keep only what every instance shares)."""
    from caramel.batch import ResidentHost

    program = caramel.load_program(EXAMPLES / "Mul_4L_2c")
    ctx = Context(n=1024)
    plan = build_plan(program)
    a = _images(program, ctx, (1,))[0]
    other = dict(a)
    for m in key_mems(program):
        other[m] = (np.asarray(a[m], dtype=np.uint64) * 3 % ctx.q(m.limb)).astype(np.uint32)
    slot = ResidentHost(plan, ctx, Mode.EXACT, 2, key_mems(program))
    first = slot(a)
    assert _same_stores(slot(other), first)
    assert not _same_stores(_fresh_on_devices(plan, ctx, other, 2), first)


def _gpu_ready() -> bool:
    try:
        from caramel.api import gpu_available

        return gpu_available()
    except Exception:  # noqa: BLE001 - no CuPy
        return False


GPU_SEARCH = [Path(__file__).resolve().parents[2] / ".data" / "corpus", Path(__file__).resolve().parents[2] / ".data"]


def _gpu_program(name: str):
    from tests.conftest import SHARED_PROGRAMS

    for d in [*GPU_SEARCH, SHARED_PROGRAMS]:
        if (d / name).is_dir():
            return caramel.load_program(d / name)
    import pytest

    pytest.skip(f"program {name} not found")


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ready(), reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("name", ["MulRotate_10L_2c", "BootstrapModRaise_10L_2c"])
def test_multi_gpu_run_resident_on_one_gpu_rebinds_instances(name):
    """MultiGpuRun.rebind: a 2-chip program resident on ONE GPU (both chips there), graph
    captured on instance 0, then rebound to 3 more instances (keys kept) and replayed; every
    instance's stores equal the reference's on its own inputs."""
    from caramel.execute.cuda_graph import MultiGpuRun
    from caramel.execute.reference import run_reference

    program = _gpu_program(name)
    ctx = Context(n=4096)
    plan = build_plan(program)
    images = _images(program, ctx, (1, 2, 3, 4))
    keep = key_mems(program)
    with MultiGpuRun(plan, ctx, images[0], Mode.EXACT, 1) as run:
        for i, memory in enumerate(images):
            if i:
                run.rebind(memory, keep)
            run.replay(1)
            have, want = run.result(), run_reference(program, ctx, memory, Mode.EXACT)
            assert _same_stores(have, want), f"{name} instance {i}"
            assert all(np.array_equal(want.memory[k], have.memory[k]) for k in want.memory), f"{name} instance {i}"


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ready(), reason="needs CuPy and a CUDA GPU")
def test_gpu_batch_of_a_two_chip_program_on_one_gpu_equals_single_runs():
    """caramel.batch on the GPU: a batch of 4 of a 2-chip program on one GPU (one resident slot,
    ResidentGpus), each instance's digest equal to a single reference run with seed S + i."""
    from caramel.api import run_program
    from caramel.batch import run_batch

    program = _gpu_program("MulRotate_10L_2c")
    result = run_batch(program, n=4096, backend="gpu", seed=5, batch=4, gpus=1)
    digests = [r["digest"] for r in result.records]
    assert len(set(digests)) == 4 and result.summary.passed is not False
    for i, digest in enumerate(digests):
        assert digest == run_program(program, n=4096, backend="cpu", seed=5 + i, key_seed=5, client="cpu").digest, i
