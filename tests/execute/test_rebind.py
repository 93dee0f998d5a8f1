"""DeviceRun.rebind: the same lowered run takes another instance's inputs (keys kept in place)."""

from pathlib import Path

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
