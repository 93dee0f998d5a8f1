"""An instance's inputs drawn by parts (caramel.instance.draw_inputs) against prepare_check, which draws
every input one at a time: the same objects, messages and generator state, bit for bit, for drawn and
supplied inputs, any subset of the inputs, each magnitude and realness, on the host client and on the GPU
client's code (posed on NumPy here; on CuPy and caramel's CUDA kernels where there is a GPU)."""

from __future__ import annotations

from collections import ChainMap
from dataclasses import replace

import numpy as np
import pytest

from caramel import instance
from caramel.ckks.arith import HOST, GpuArith
from caramel.ckks.bind import InputKind
from caramel.ckks.check import prepare_check
from caramel.ckks.device import keeping_inputs, using
from caramel.ckks.encrypt import Ciphertext
from caramel.ckks.keyset import generate_keyset, input_rng
from caramel.ckks.plaintext import Plaintext
from caramel.instance import default_spec, draw_inputs, input_plan
from caramel.parse import load_program
from caramel.ring import Context

from tests.conftest import shared

N = 1024
POSED = GpuArith(array_module=np, cuda_ntt=False)


@pytest.fixture(scope="module")
def setup():
    """BootstrapLike_20L_1c (a ciphertext, 96 plaintexts, 40 scalars), its keys, and a spec whose inputs
    change magnitude and realness along the way (so the draws come in several runs)."""
    program = load_program(shared("BootstrapLike_20L_1c"), progress=False)
    ctx = Context(n=N)
    spec = default_spec(program)
    inputs = {}
    for i, (name, ins) in enumerate(spec.inputs.items()):
        inputs[name] = replace(ins, magnitude=(0.5, 0.5, 2.0, 0.25)[i % 4], real=i % 5 == 1)
    spec = replace(spec, inputs=inputs)
    return program, ctx, spec, generate_keyset(program, ctx, 3)


def host(a):
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def same(a, b) -> bool:
    if type(a) is not type(b) or a.limbs != b.limbs or a.scale != b.scale:
        return False
    if isinstance(a, Ciphertext):
        return np.array_equal(host(a.c0), b.c0) and np.array_equal(host(a.c1), b.c1)
    if isinstance(a, Plaintext):
        return np.array_equal(host(a.data), b.data)
    return a.value == b.value and np.array_equal(a.residues, b.residues)


def reference(setup, seed: int, supplied=None, make_rng=input_rng):
    """prepare_check's objects, messages and generator state after the draws (every key given: binding
    draws nothing)."""
    program, ctx, spec, keys = setup
    rng = make_rng(seed)
    with using(HOST):
        prep = prepare_check(spec, program, ctx, rng=rng, secrets=keys.secrets, keys=ChainMap({}, keys.keys),
                             supplied=supplied)
    return prep.objects, prep.values, rng.bit_generator.state


def same_state(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    return np.array_equal(a, b)


def check(got, want, names) -> None:
    (objects, values, state), (w_objects, w_values, w_state) = got, want
    assert same_state(state, w_state)
    assert list(objects) == list(values) == [n for n in w_objects if n in set(names)]
    for name in objects:
        assert same(objects[name], w_objects[name]), name
        assert np.array_equal(values[name], w_values[name]), name


@pytest.mark.parametrize("client", [HOST, POSED], ids=["host", "gpu-code-on-numpy"])
@pytest.mark.parametrize("lazy", [False, True], ids=["drawn-at-once", "drawn-where-used"])
def test_every_input_drawn_is_prepare_checks(setup, monkeypatch, client, lazy):
    if lazy:  # at N = 1024 the vectors are shorter than the default length drawn where they are used
        monkeypatch.setattr(instance._Uniform, "LAZY_SIZE", 8)
    plan = input_plan(setup[0], setup[1], setup[2])
    rng = input_rng(11)
    with using(client):
        objects, values = draw_inputs(plan, setup[3].secrets, rng, plan.names)
    check((objects, values, rng.bit_generator.state), reference(setup, 11), plan.names)


def test_where_uniform_fuses_the_draws_take_uniform_itself(setup, monkeypatch):
    """With the probe saying no (a NumPy whose uniform rounds once), the rows drawn where used are uniform's own."""
    monkeypatch.setattr(instance._Uniform, "LAZY_SIZE", 8)
    monkeypatch.setattr(instance, "_scaling_is_uniform", lambda: False)
    monkeypatch.setattr(instance, "_scale_uniform", None)  # never called on this path
    plan = input_plan(setup[0], setup[1], setup[2])
    rng = input_rng(12)
    with using(HOST):
        objects, values = draw_inputs(plan, setup[3].secrets, rng, plan.names)
    check((objects, values, rng.bit_generator.state), reference(setup, 12), plan.names)


def test_another_bit_generator_draws_the_same(setup):
    """A generator whose draws cannot be counted ahead (not PCG64) draws its runs at once, in order."""
    plan = input_plan(setup[0], setup[1], setup[2])

    def mt(seed):
        return np.random.Generator(np.random.MT19937(seed))

    rng = mt(6)
    with using(HOST):
        objects, values = draw_inputs(plan, setup[3].secrets, rng, plan.names)
    check((objects, values, rng.bit_generator.state), reference(setup, 6, make_rng=mt), plan.names)


def test_some_inputs_drawn_the_others_supplied(setup):
    """An instance of an executor with shared inputs: it draws its own inputs (and takes some given values),
    the shared ones draw nothing; prepare_check given the shared values draws the same."""
    program, ctx, spec, keys = setup
    plan = input_plan(program, ctx, spec)
    names = plan.names
    shared_names = [n for i, n in enumerate(names) if i % 3 == 2]
    mine = [n for n in names if n not in shared_names]
    vector = next(n for n in mine if plan.kind(n) == InputKind.PLAINTEXT)
    ct = next(n for n in mine if plan.kind(n) == InputKind.CIPHERTEXT)
    scalar = next(n for n in mine if plan.kind(n) == InputKind.SCALAR)
    rng = np.random.default_rng(0)
    given = {vector: rng.uniform(-1, 1, N // 2) + 0.5j, ct: 0.125, scalar: -0.375}
    shared_values = {n: (0.25 if plan.kind(n) == InputKind.SCALAR else rng.uniform(-1, 1, N // 2))
                     for n in shared_names}
    rng = input_rng(4)
    with using(HOST):
        objects, values = draw_inputs(plan, keys.secrets, rng, mine, given)
    check((objects, values, rng.bit_generator.state), reference(setup, 4, {**shared_values, **given}), mine)


def test_plaintexts_share_one_array(setup):
    """The plaintexts of an instance are consecutive rows of one read-only array (one batched encoding)."""
    program, ctx, spec, keys = setup
    plan = input_plan(program, ctx, spec)
    with using(HOST):
        objects, _ = draw_inputs(plan, keys.secrets, input_rng(1), plan.names)
    plain = [o for o in objects.values() if isinstance(o, Plaintext)]
    base = plain[0].data.base
    assert len(plain) == 96 and base is not None and all(p.data.base is base for p in plain)
    assert not any(p.data.flags.writeable for p in plain)
    rows = [p.data.__array_interface__["data"][0] for p in plain]
    assert all(b - a == len(p.limbs) * N * 4 for a, b, p in zip(rows, rows[1:], plain))  # consecutive rows


@pytest.mark.parametrize("bits", [np.random.PCG64, np.random.MT19937], ids=["pcg64", "mt19937"])
@pytest.mark.parametrize("m", [1.0, 0.25, 3, 2**53 + 1, 1e-300, 1e307], ids=str)
def test_random_scaled_in_place_is_numpys_uniform(bits, m):
    """Where the probe finds it so (every NumPy build that does not fuse uniform's multiply-add), drawn into a row and
    scaled there is NumPy's uniform(-m, m) bit for bit, taking the same words."""
    if not instance._scaling_is_uniform():
        pytest.skip("this NumPy's uniform fuses its multiply-add: the draws take uniform itself")
    for size in (0, 1, 7, 4096):
        a, b = np.random.Generator(bits(5)), np.random.Generator(bits(5))
        want = a.uniform(-m, m, size)
        row = np.full(2 * size + 3, np.nan)
        b.random(out=row[3 : 3 + size])
        instance._scale_uniform(row[3 : 3 + size], m)
        assert np.array_equal(row[3 : 3 + size].view(np.uint64), want.view(np.uint64)), size
        assert np.isnan(row[:3]).all() and np.isnan(row[3 + size :]).all()
        assert same_state(a.bit_generator.state, b.bit_generator.state)


def test_host_rows_are_the_threads_own_and_kept():
    """A thread gets its buffer back (grown when asked for more); another thread gets another."""
    import threading

    first = HOST.host_rows(3, 8)
    again = HOST.host_rows(2, 8)
    assert first.shape == (3, 8) and again.shape == (2, 8) and first.dtype == np.float64
    assert again.__array_interface__["data"][0] == first.__array_interface__["data"][0]
    grown = HOST.host_rows(5, 8)
    assert grown.shape == (5, 8) and np.shares_memory(HOST.host_rows(1, 8), grown)
    other = []
    thread = threading.Thread(target=lambda: other.append(HOST.host_rows(5, 8)))
    thread.start()
    thread.join()
    assert not np.shares_memory(other[0], grown)


def test_reserved_rows_are_those_the_draws_fill(setup):
    """reserve_rows makes the thread's rows as large as draw_inputs asks for: one per plaintext input drawn (not
    the ciphertext's, not a scalar's), so the first draw reuses that buffer instead of making a new one."""
    import threading

    plan = input_plan(setup[0], setup[1], setup[2])
    plain = [n for n in plan.names if plan.kind(n) is InputKind.PLAINTEXT]
    assert 0 < len(plain) < len(plan.names)
    got = []

    def fresh_thread():
        instance.reserve_rows(plan, plan.names)
        reserved = HOST.host_rows(1, N)
        draw_inputs(plan, setup[3].secrets, input_rng(4), plan.names)
        got.append((reserved, HOST.host_rows(1, N), HOST.host_rows(len(plain) + 1, N)))

    thread = threading.Thread(target=fresh_thread)
    thread.start()
    thread.join()
    reserved, after_draw, one_more = got[0]
    assert after_draw.ctypes.data == reserved.ctypes.data  # the draw found its rows made
    assert not np.shares_memory(one_more, reserved)  # and no more than it needs


@pytest.mark.parametrize("client", [HOST, "gpu"], ids=["host", "gpu"])
def test_instances_one_after_another_on_one_thread(setup, client):
    """The thread's host rows reused from instance to instance: each instance still draws prepare_check's."""
    if client == "gpu" and not __import__("caramel.api", fromlist=["gpu_available"]).gpu_available():
        pytest.skip("needs CuPy and a CUDA GPU")
    plan = input_plan(setup[0], setup[1], setup[2])
    for seed in (21, 22):
        rng = input_rng(seed)
        with using(client):
            objects, values = draw_inputs(plan, setup[3].secrets, rng, plan.names)
        check((objects, values, rng.bit_generator.state), reference(setup, seed), plan.names)


@pytest.mark.skipif(not __import__("caramel.api", fromlist=["gpu_available"]).gpu_available(),
                    reason="needs CuPy and a CUDA GPU")
@pytest.mark.parametrize("keep", [False, True], ids=["copied-back", "kept-on-the-gpu"])
def test_gpu_client_draws_the_host_clients_inputs(setup, keep):
    plan = input_plan(setup[0], setup[1], setup[2])
    rng = input_rng(11)
    with using("gpu"), keeping_inputs(keep):
        objects, values = draw_inputs(plan, setup[3].secrets, rng, plan.names)
    check((objects, values, rng.bit_generator.state), reference(setup, 11), plan.names)
