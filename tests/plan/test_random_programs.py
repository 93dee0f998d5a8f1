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
