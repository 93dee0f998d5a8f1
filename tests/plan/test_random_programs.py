"""Property tests: on random ISA-valid programs (register reuse, [X] marks, BCU groups, sud in
both forms, rsi/rsv/mod, store/spill/load, dis/rcv/joi over 1-3 chips) the fused plan, the unfused
plan and a plan with tiny trees all give the reference's stores bit for bit, in every mode."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caramel.execute.drive import run_plan
from caramel.execute.reference import run_reference
from caramel.plan import build_plan
from caramel.ring import Context

from plan_helpers import check_plan, random_memory, random_program, store_mismatches

CTX = Context(n=64)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    chips=st.integers(1, 3),
    mode=st.sampled_from(["exact", "textbook", "emulator"]),
    phases=st.integers(1, 5),
)
def test_plan_matches_reference_on_random_programs(seed, chips, mode, phases):
    program = random_program(seed, chips, phases=phases)
    memory = random_memory(program, CTX, seed)
    want = run_reference(program, CTX, memory, mode)
    for options in ({}, {"fuse": False}, {"max_inputs": 2}):
        plan = build_plan(program, **options)
        check_plan(plan)
        have = run_plan(plan, CTX, memory, mode)
        problems = store_mismatches(want, have)
        assert not problems, f"{program.name} {mode} {options}: " + "; ".join(problems[:3])


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**31 - 1),
    chips=st.integers(2, 3),
    devices=st.integers(2, 3),
    reuse=st.sampled_from(["none", "fifo"]),
    phases=st.integers(1, 5),
)
def test_device_programs_match_reference_on_random_programs(seed, chips, devices, reuse, phases):
    """The device programs (communication in parts; with a row a buffer, calls in place over rows laid out for
    them) on the in-process fabric, each device in a random order of its three-stream schedule: the reference's
    stores bit for bit."""
    import numpy as np

    from caramel.backends.numpy_backend import NumpyBackend
    from caramel.execute.drive import run_threads
    from caramel.execute.fabric.threads import FakeNetwork
    from caramel.execute.placement import device_programs
    from caramel.execute.result import merge_results
    from caramel.execute.runner import DeviceRun
    from caramel.plan.streams import happens_before_order

    program = random_program(seed, chips, phases=phases)
    memory = random_memory(program, CTX, seed)
    want = run_reference(program, CTX, memory, "exact")
    plan = build_plan(program)
    progs = device_programs(plan, devices, CTX.primes, reuse=reuse, keep_inputs=True)
    net = FakeNetwork(len(progs), 30.0)
    runs = [DeviceRun(p, plan, CTX, memory, "exact", NumpyBackend, net.fabric(p.device)) for p in progs]

    def body(r):
        for t in happens_before_order(r.schedule(3), np.random.default_rng((seed, r.prog.device))):
            r.run_task(t)
        return r.prog.chips, r.stores()

    out = run_threads([lambda r=r: body(r) for r in runs], 30.0, net.abort, lambda d: runs[d].position)
    problems = store_mismatches(want, merge_results(plan, memory, out))
    assert not problems, f"{program.name} on {devices} devices, {reuse}: " + "; ".join(problems[:3])
