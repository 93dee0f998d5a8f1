"""caramel.Executor (:mod:`caramel.executor`) on the CPU: futures in the shape of concurrent.futures,
ready and user inputs, shared inputs written once, instance errors that stay with their instance.
Every digest is compared with a single run's (the reference interpreter on its own image)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError, as_completed

import numpy as np
import pytest

from caramel.api import run_program
from caramel.errors import BindingError, ExecutionError
from caramel.executor import Executor, InstanceResult
from caramel.parse import load_program

from tests.conftest import REPO, SHARED_PROGRAMS, read_at_once

ROT1 = REPO / "programs" / "MulRotate_4L_1c"  # x, y ciphertexts; rotation keys
N = 1024
SEED = 5


@pytest.fixture(scope="module")
def rot1():
    return load_program(ROT1, progress=False)


def single(program, seed: int, key_seed: int = SEED, **fields):
    return run_program(program, n=N, backend="cpu", seed=seed, key_seed=key_seed, **fields)


def test_submit_map_and_as_completed(rot1):
    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED) as ex:
        futures = [ex.submit() for _ in range(3)]
        done = {f.result().index for f in as_completed(futures)}
        mapped = list(ex.map([None, None]))
    assert done == {0, 1, 2} and [r.index for r in mapped] == [3, 4]
    results = [f.result() for f in futures] + mapped
    assert all(isinstance(r, InstanceResult) and r.passed is True for r in results)
    assert [r.seed for r in results] == [SEED + i for i in range(5)]
    for r in results:
        assert r.digest == single(rot1, r.seed).digest
        assert {"encrypt", "upload", "replay", "download", "run", "digest", "check"} <= set(r.timings)
    assert ex.timings.keys() >= {"keys", "shared", "plan"}


def test_ready_inputs_and_decrypted_outputs(rot1):
    """Inputs encrypted ahead (host arrays) run as drawn ones; outputs decrypt at the check's scale."""
    from caramel.userdata import decrypted_outputs

    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED) as ex:
        ready = ex.encrypt(seed=SEED + 7)
        assert set(ready) == {"x", "y"} and isinstance(ready["x"].c0, np.ndarray)
        assert all(isinstance(v.c1, np.ndarray) for v in ready.values()) and set(ready.messages) == {"x", "y"}
        result = ex.submit(ready).result()
    want = single(rot1, SEED + 7)
    assert result.seed == SEED + 7 and result.digest == want.digest and result.passed is True
    expected = decrypted_outputs(want.prepared, want.result.memory)
    assert result.outputs.keys() == expected.keys() == {"z"}
    assert np.array_equal(result.outputs["z"], expected["z"])
    assert set(result.ciphertexts()) == {"z"}


def test_results_keep_their_inputs_only_when_asked(rot1):
    """A result pins no input object by default (on a GPU lane they are the instance's device rows, and a batch
    keeps every result): it still decrypts and passes its check; ``keep_inputs=True`` keeps them."""
    runs = {}
    for keep in (False, True):
        with Executor(rot1, n=N, backend="cpu-plan", seed=SEED, keep_inputs=keep) as ex:
            runs[keep] = ex.submit().result()
    bare, kept = runs[False], runs[True]
    assert bare.objects == {} and bare.prepared.objects == {}
    assert set(kept.objects) == set(kept.prepared.objects) == {"x", "y"}
    assert bare.digest == kept.digest and bare.passed is True and kept.passed is True
    assert np.array_equal(bare.outputs["z"], kept.outputs["z"])


def test_user_values_per_instance_and_shared(rot1):
    """x shared as values given to the executor, y given per instance: as a single run given both
    with x shared."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, N // 2)
    ys = [rng.uniform(-1, 1, N // 2) for _ in range(2)]
    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED, shared={"x": x}) as ex:
        assert ex.shared == ("x",) and ex.varying == ("y",)
        results = list(ex.map([{"y": y} for y in ys]))
        with pytest.raises(Exception, match="shared by every instance"):
            ex.submit({"x": x}).result()
    for i, (y, r) in enumerate(zip(ys, results)):  # x encrypted once (key seed's randomness), y per instance
        assert r.digest == single(rot1, SEED + i, inputs={"x": x, "y": y}, shared="x").digest
        assert np.allclose(r.prepared.values["x"], x, atol=1e-6)
    assert results[0].digest != single(rot1, SEED, inputs={"x": x, "y": ys[0]}).digest  # x encrypted per run


def test_shared_inputs_come_from_the_key_seed(rot1):
    """``shared="y"``: y drawn once from the key seed K, x per instance from S + i, as x is drawn in the
    S + i single run (x comes first: a later input never changes an earlier one's draws). Checked
    against an image assembled independently (x from ``prepare_inputs(S + i)``, y the executor's shared
    object) and run by the reference; the instances pass their decryption checks."""
    from caramel.api import output_digest, prepare_inputs, resolve_check
    from caramel.ckks.bind import requirements
    from caramel.ckks.keyset import generate_keyset
    from caramel.execute.reference import run_reference
    from caramel.instance import input_image
    from caramel.ring import Context

    key_seed = 11
    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED, key_seed=key_seed, shared="y", keep_inputs=True) as ex:
        results = list(ex.map([None, None]))
        y = ex.shared_objects["y"]
    ctx = Context(n=N)
    keys = generate_keyset(rot1, ctx, key_seed)
    for i, r in enumerate(results):
        own = prepare_inputs(rot1, ctx, keys, SEED + i, resolve_check(rot1, "auto"))
        assert np.array_equal(r.objects["x"].c0, own.objects["x"].c0) and set(r.objects) == {"x"}
        image = {**own.memory, **input_image(requirements(rot1), {"y": y})}
        assert r.digest == output_digest(rot1, run_reference(rot1, ctx, image).memory)
        assert r.passed is True
        assert r.digest == single(rot1, SEED + i, key_seed, shared="y").digest  # the single run with --shared
    assert results[0].digest != single(rot1, SEED, key_seed).digest  # sharing changes the instance
    assert np.array_equal(results[0].prepared.values["y"], results[1].prepared.values["y"])


def test_a_bad_instance_fails_alone(rot1):
    """A ready ciphertext lacking a limb, and one with a residue at its prime: each fails with a
    BindingError naming it; the instances around them run."""
    from caramel.ckks.encrypt import Ciphertext

    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED) as ex:
        good = ex.encrypt(seed=SEED)
        y = good["y"]
        short = dict(good, y=Ciphertext(y.c0[:-1], y.c1[:-1], y.limbs[:-1], y.scale))
        c0 = np.array(y.c0)
        c0[1, 7] = ex.ctx.q(y.limbs[1])
        high = dict(good, y=Ciphertext(c0, y.c1, y.limbs, y.scale))
        futures = [ex.submit(good), ex.submit(short), ex.submit(high), ex.submit(good)]
        with pytest.raises(BindingError, match=r"input y lacks limbs \[3\]"):
            futures[1].result()
        with pytest.raises(BindingError, match="residues must lie in"):
            futures[2].result()
        digests = [futures[k].result().digest for k in (0, 3)]
    assert digests[0] == digests[1] == single(rot1, SEED).digest


def test_a_device_error_stops_the_executor(rot1, monkeypatch):
    """A lane that fails (not an input's fault): that instance has the error, every later one fails
    with an ExecutionError naming it, and shutdown returns."""
    from caramel.execute import pipeline

    real, calls = pipeline.HostRowLane.start, []

    def start(self, feed):
        calls.append(1)
        if len(calls) == 2:
            raise ExecutionError("device lost")
        return real(self, feed)
    monkeypatch.setattr(pipeline.HostRowLane, "start", start)
    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED, workers=1) as ex:
        first = ex.submit().result()
        second, third = ex.submit(), ex.submit()
        with pytest.raises(ExecutionError, match="device lost"):
            second.result()
        with pytest.raises(ExecutionError, match="not run: the executor stopped after an error.*device lost"):
            third.result()
        with pytest.raises(ExecutionError, match="executor stopped"):
            ex.submit().result()
    assert first.digest == single(rot1, SEED).digest


def test_shutdown_cancels_what_has_not_started(rot1, monkeypatch):
    import caramel.executor as executor_mod

    go, real = threading.Event(), executor_mod.draw_inputs

    def draw(*a, **k):
        go.wait(60)
        return real(*a, **k)
    monkeypatch.setattr(executor_mod, "draw_inputs", draw)
    ex = Executor(rot1, n=N, backend="cpu-plan", seed=SEED, workers=1)
    futures = [ex.submit() for _ in range(4)]
    while not futures[0].running():
        threading.Event().wait(0.01)
    ex.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit()
    go.set()
    assert futures[0].result().digest == single(rot1, SEED).digest
    assert all(f.cancelled() for f in futures[1:])
    with pytest.raises(CancelledError):
        futures[1].result()
    ex.shutdown(wait=True)


def test_ctrl_c_leaves_the_executor_at_once(rot1, monkeypatch):
    """A KeyboardInterrupt in the ``with`` block leaves without waiting for the instance that runs (its lane
    finishes and closes in the background) and cancels those not started; an ordinary exception waits for it."""
    import caramel.executor as executor_mod

    go, running, real = threading.Event(), threading.Event(), executor_mod.draw_inputs

    def draw(*a, **k):
        running.set()
        go.wait(60)
        return real(*a, **k)
    monkeypatch.setattr(executor_mod, "draw_inputs", draw)
    for stop, waits in ((KeyboardInterrupt, False), (ValueError, True)):
        go.clear()
        running.clear()
        futures = []
        with pytest.raises(stop):
            with Executor(rot1, n=N, backend="cpu-plan", seed=SEED, workers=1) as ex:
                futures = [ex.submit() for _ in range(3)]
                assert running.wait(30)
                threading.Timer(1.0, go.set).start()  # the running instance goes on a second later
                t0 = time.monotonic()
                raise stop
        left = time.monotonic() - t0
        assert futures[0].done() is waits and all(f.cancelled() for f in futures[1:])
        assert (left >= 1.0) is waits
        assert futures[0].result(timeout=60).digest == single(rot1, SEED).digest


def test_the_capacity_is_what_the_executor_works_on_at_once(rot1, monkeypatch):
    """capacity = lanes x (depth + 1) + preparers: with the lane held, that many instances are drawn and
    the others wait in the queue, not drawn (a front end sizes its threads by it)."""
    import time

    import caramel.executor as executor_mod
    from caramel.execute import pipeline
    from caramel.execute.gpu_pipeline import DEFAULT_DEPTH
    from caramel.executor import capacity, preparers
    from caramel.options import RunOptions

    assert preparers(RunOptions(workers=3)) == 3 and capacity(RunOptions(workers=3, depth=2), lanes=2) == 2 * 3 + 3
    assert capacity(RunOptions(workers=1)) == DEFAULT_DEPTH + 1 + 1  # a GPU lane's default depth
    go, drawn = threading.Event(), []
    real_start, real_draw = pipeline.HostRowLane.start, executor_mod.draw_inputs

    def start(self, feed):
        go.wait(60)
        return real_start(self, feed)

    def draw(*a, **k):
        drawn.append(1)
        return real_draw(*a, **k)
    monkeypatch.setattr(pipeline.HostRowLane, "start", start)
    monkeypatch.setattr(executor_mod, "draw_inputs", draw)
    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED, workers=2) as ex:
        assert ex.capacity == capacity(ex.options, lanes=1, depth=1) == 1 * 2 + 2
        futures = [ex.submit() for _ in range(7)]
        deadline = time.monotonic() + 30
        while len(drawn) < ex.capacity and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # time for a fifth draw, were there a permit for it
        assert len(drawn) == ex.capacity
        go.set()
        assert [f.result().seed for f in futures] == [SEED + i for i in range(7)] and len(drawn) == 7


def test_the_executor_refuses_what_it_cannot_run(rot1):
    from caramel.errors import ArgumentError

    with pytest.raises(ArgumentError, match="not an input"):
        Executor(rot1, n=N, backend="cpu-plan", shared={"w": 1.0})
    with pytest.raises(ArgumentError, match="'w' names no input"):
        Executor(rot1, n=N, backend="cpu-plan", shared="w")
    with pytest.raises(ArgumentError, match="needs a Program"):
        Executor("programs/MulRotate_4L_1c", n=N)
    with Executor(rot1, n=N, backend="cpu-plan") as ex:
        with pytest.raises(ArgumentError, match="a mapping of input name"):
            ex.submit([1, 2])
        with pytest.raises(ArgumentError, match="z is not an input"):
            ex.submit({"z": 1.0}).result()


def _corpus(name: str):
    path = SHARED_PROGRAMS / name
    if not path.is_dir():
        pytest.skip(f"{name} not found in the corpus")
    return load_program(path, progress=False)


@pytest.mark.parametrize(("name", "shared", "fed"), [
    ("MulAdd_4L_1c", "plaintexts", {"x", "y"}),  # a plaintext shared, resident
    ("AddScalar_4L_1c", "", {"x", "s"}),  # a scalar per instance: the lane writes the scalar table
    ("AddScalar_4L_1c", "scalars", {"x"}),
])
def test_plaintexts_and_scalars_shared_or_per_instance(name, shared, fed, monkeypatch):
    """Each instance of a cpu-plan batch equals the reference's single run with the same options; the
    lane's instance rows and scalar entries are those of the inputs not shared."""
    from caramel.execute import pipeline

    program = _corpus(name)
    lanes, real = [], pipeline.HostRowLane.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        lanes.append(self)
    monkeypatch.setattr(pipeline.HostRowLane, "__init__", init)
    with Executor(program, n=N, backend="cpu-plan", seed=SEED, shared=shared) as ex:
        results = list(ex.map([None] * 3))
    (lane,) = lanes
    written = {k[0] for k in (*lane.layout.groups, *lane.layout.scalar_groups)}
    assert written == fed
    for i, r in enumerate(results):
        assert r.digest == single(program, SEED + i, shared=shared).digest, i
    assert len({r.digest for r in results}) == 3


def test_a_scalar_residue_at_its_prime_fails_its_instance_alone():
    """A ready Scalar whose residue on a limb is that limb's prime: the lane's scalar table refuses it with a
    BindingError naming the input, the residue and the limb; the instances around it run."""
    from caramel.ckks.plaintext import Scalar

    program = _corpus("AddScalar_4L_1c")
    with Executor(program, n=N, backend="cpu-plan", seed=SEED) as ex:
        good = ex.encrypt(seed=SEED)
        s = good["s"]
        residues = np.array(s.residues)
        residues[1] = ex.ctx.q(s.limbs[1])
        bad = dict(good, s=Scalar(s.value, residues, s.limbs, s.scale))
        futures = [ex.submit(good), ex.submit(bad), ex.submit(good)]
        with pytest.raises(BindingError, match=rf"scalar input s: residue {residues[1]} on limb {s.limbs[1]} is not "
                                               rf"below q_{s.limbs[1]}"):
            futures[1].result()
        digests = {futures[k].result().digest for k in (0, 2)}
    assert digests == {single(program, SEED).digest}


def test_the_plan_is_built_while_the_keys_are_made(rot1, monkeypatch):
    """The plan (cpu-plan backend) is built on a thread of its own at the same time as the keys are made: each waits
    for the other to have started (built one after the other, the first would wait in vain); the digest is the single
    run's."""
    import caramel.ckks.keyset as keyset
    import caramel.plan_cache as plan_cache

    plan_started, keys_started = threading.Event(), threading.Event()
    seen: dict = {}
    real_plan, real_keys = plan_cache.cached_plan, keyset.generate_keyset

    def plan(*args, **kwargs):
        plan_started.set()
        seen["keys begun during the plan"] = keys_started.wait(10)
        seen["plan thread"] = threading.current_thread().name
        return real_plan(*args, **kwargs)

    def keys(*args, **kwargs):
        keys_started.set()
        seen["plan begun during the keys"] = plan_started.wait(10)
        return real_keys(*args, **kwargs)

    monkeypatch.setattr(plan_cache, "cached_plan", plan)
    monkeypatch.setattr(keyset, "generate_keyset", keys)
    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED) as ex:
        result = ex.submit().result()
    assert seen == {"keys begun during the plan": True, "plan begun during the keys": True,
                    "plan thread": "caramel-plan"}
    assert result.digest == single(rot1, SEED).digest


def test_fusion_picks_the_plan_and_auto_fuses_once_a_fused_plan_is_cached(fresh_cache, monkeypatch):
    """``fusion``: ``off`` plans one kernel per instruction, ``on`` the fused plan, ``auto`` the fused one only once its
    entry is in the plan cache (written by the ``on`` executor); every digest is the single run's."""
    import caramel.plan_cache as plan_cache
    from caramel.plan import build_plan

    program = load_program(ROT1, progress=False)  # from the load cache's side: its plan can be cached
    reference = single(program, SEED).digest
    planned, real = [], plan_cache.cached_plan

    def spy(*args, **kwargs):
        plan = real(*args, **kwargs)
        planned.append(plan.kernels)
        return plan

    monkeypatch.setattr(plan_cache, "cached_plan", spy)
    seen = []
    for fusion in ("auto", "off", "on", "auto"):
        with Executor(program, n=N, backend="cpu-plan", seed=SEED, fusion=fusion) as ex:
            seen.append((fusion, ex.fused, ex.submit().result().digest == reference))
    assert seen == [("auto", False, True), ("off", False, True), ("on", True, True), ("auto", True, True)]
    unfused, fused = build_plan(program, fuse=False).kernels, build_plan(program).kernels
    assert unfused != fused and planned == [unfused, unfused, fused, fused]


def test_the_reference_backend_has_no_plan_to_fuse(rot1):
    with Executor(rot1, n=N, backend="cpu", seed=SEED, fusion="off") as ex:
        assert ex.fused is None


def test_an_error_of_the_plan_is_the_constructors(rot1, monkeypatch):
    """A plan that fails on its thread fails the executor's constructor with its own error (after the keys)."""
    import caramel.plan_cache as plan_cache

    def broken(*args, **kwargs):
        raise ExecutionError("no plan today")

    monkeypatch.setattr(plan_cache, "cached_plan", broken)
    with pytest.raises(ExecutionError, match="no plan today"):
        Executor(rot1, n=N, backend="cpu-plan", seed=SEED)


def test_an_object_input_is_decoded_once_whichever_threads_read_it(monkeypatch):
    """The message of an input given as an object is decoded when a check first reads it: two threads reading it at
    once (the checks of two instances sharing it) decode it once and both get it."""
    import caramel.executor as executor

    calls = []

    def slow(obj, plan, name, secrets):
        calls.append(name)
        time.sleep(0.2)
        return np.full(4, 0.25)

    monkeypatch.setattr(executor, "_decode_object", slow)
    values = executor._ObjectValues({"x": object()}, None, None)
    got = read_at_once(values, "x")
    assert calls == ["x"] and len(got) == 2 and all(np.array_equal(g, np.full(4, 0.25)) for g in got)


def test_a_setup_that_fails_leaves_no_thread(rot1):
    """The preparers start before the keys and lanes are made (to make their buffers meanwhile); a key set that
    lacks the program's rotation keys fails the constructor, and its preparers stop with it."""
    from caramel.ckks.keyset import generate_keyset
    from caramel.ring import Context

    mul = load_program(REPO / "programs" / "Mul_4L_1c", progress=False)
    keys = generate_keyset(mul, Context(n=N), SEED)
    before = set(threading.enumerate())
    with pytest.raises(BindingError, match="lacks"):
        Executor(rot1, n=N, backend="cpu-plan", seed=SEED, keys=keys)

    def preparers():
        return [t.name for t in threading.enumerate() if t not in before and t.name.startswith("caramel-prepare")]

    deadline = time.monotonic() + 10
    while preparers() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not preparers()


def _in_generations(obj) -> bool:
    """Whether the cyclic collector's generations hold ``obj`` (a frozen object is in none of them)."""
    import gc

    return any(o is obj for o in gc.get_objects())


@pytest.fixture
def long_lived(monkeypatch):
    """The executors' hold on gc.freeze, fresh, in a process with nothing frozen (an executor that another test left
    open froze its objects: unfrozen here, which only costs collections)."""
    import gc

    from caramel import executor

    gc.unfreeze()
    fresh = executor._LongLived()
    monkeypatch.setattr(executor, "LONG_LIVED", fresh)
    yield fresh
    gc.unfreeze()


def test_an_open_executors_setup_is_frozen_until_the_last_shuts_down(rot1, long_lived):
    """A full collection during a batch would walk the program, plan and keys with the interpreter held: while an
    executor is open they are frozen (gc.freeze); the last executor to shut down unfreezes them."""
    import gc

    first = Executor(rot1, n=N, backend="cpu-plan", seed=SEED)
    assert not _in_generations(first) and not _in_generations(rot1) and long_lived.holders == 1
    second = Executor(rot1, n=N, backend="cpu-plan", seed=SEED)
    first.shutdown()
    assert not _in_generations(second) and not _in_generations(first)  # the second still holds the freeze
    assert second.submit().result().digest == single(rot1, SEED).digest
    second.shutdown()
    second.shutdown()  # a second shutdown releases nothing more
    assert long_lived.holders == 0 and gc.get_freeze_count() == 0
    assert _in_generations(first) and _in_generations(rot1)


def test_a_setup_that_fails_holds_no_freeze(rot1, long_lived):
    from caramel.ckks.keyset import generate_keyset
    from caramel.ring import Context

    keys = generate_keyset(load_program(REPO / "programs" / "Mul_4L_1c", progress=False), Context(n=N), SEED)
    with pytest.raises(BindingError, match="lacks"):
        Executor(rot1, n=N, backend="cpu-plan", seed=SEED, keys=keys)
    assert long_lived.holders == 0


def test_the_processs_own_frozen_objects_stay_frozen(rot1, long_lived):
    """A process that froze objects itself (e.g. before forking workers) keeps them frozen after the executors."""
    import gc

    mine = [object(), {}]
    gc.freeze()
    with Executor(rot1, n=N, backend="cpu-plan", seed=SEED):
        pass
    assert not _in_generations(mine) and long_lived.holders == 0
    gc.unfreeze()
    assert _in_generations(mine)
