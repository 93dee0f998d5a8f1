"""caramel.api.max_limb and check_prime_count: the one-pass maximum equals the limbs that the check
collects instruction by instruction (base or sync limb, bci/rsv lists, memory operands)."""

from __future__ import annotations

import pytest

from caramel.api import check_prime_count, max_limb
from caramel.errors import BindingError
from caramel.parse import load_program
from caramel.program import Instruction, Mem, Opcode, Program
from caramel.ring import Context
from caramel.ring.primes import PRIMES
from tests.conftest import REPO, corpus


def collected_max(program: Program) -> int:
    """The largest limb of the lists that check_prime_count builds (its definition, spelled out)."""
    top = -1
    for stream in program.streams:
        for ins in stream.instructions:
            limbs = [ins.limb] if ins.limb is not None else []
            limbs += list(ins.in_limbs) + list(ins.out_limbs)
            limbs += [op.limb for op in (ins.dst, *ins.srcs) if isinstance(op, Mem)]
            top = max([top, *limbs])
    return top


PROGRAMS = [p for p in corpus("*_4L_*c") if p.name.split("_")[0] in
            {"Mul", "MulRotate", "BootstrapModRaise", "AddScalar", "Rotate", "MatVec16-kspass"}]


@pytest.mark.parametrize("path", PROGRAMS or [REPO / "programs" / "Mul_4L_2c"], ids=lambda p: p.name)
def test_max_limb_equals_the_collected_limbs(path):
    if not path.is_dir():
        pytest.skip(f"{path} not found")
    program = load_program(path, cache=False)
    top = max_limb(program)
    assert top == collected_max(program)
    assert top >= 0


def test_check_prime_count_at_the_boundary():
    path = REPO / "programs" / "Mul_4L_2c"
    if not path.is_dir():
        pytest.skip("programs/Mul_4L_2c not found")
    program = load_program(path, cache=False)
    top = max_limb(program)
    check_prime_count(program, Context(n=1024, primes=PRIMES[:top + 1]))  # just enough primes
    with pytest.raises(BindingError, match=f"limb {top} is beyond the context's {top} primes"):
        check_prime_count(program, Context(n=1024, primes=PRIMES[:top]))


def test_max_limb_reads_sync_ids_and_limb_lists():
    from caramel.program import Stream

    def program_of(*instructions):
        stream = Stream(chip=0, path="instructions0", instructions=tuple(instructions))
        return Program("p", "p", (stream,), None)

    sync = Instruction(Opcode.DIS, sync=(3 << 16) | 40)  # the limb is the low 16 bits of the sync id
    assert max_limb(program_of(sync)) == 40
    bci = Instruction(Opcode.BCI, out_limbs=(1, 7), in_limbs=(2, 9))
    assert max_limb(program_of(bci, sync)) == 40
    assert max_limb(program_of(bci)) == 9
    load = Instruction(Opcode.LOAD, srcs=(Mem("i1", 12),))
    assert max_limb(program_of(load, bci)) == 12
    assert max_limb(program_of()) == -1
