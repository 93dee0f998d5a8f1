"""The opcode table of :mod:`caramel.program`: one entry per opcode, consistent with the parsed
syntax of every opcode, and the facts derived from it."""

from __future__ import annotations

from caramel.parse import parse_instruction
from caramel.program import (
    COMMUNICATION, ELEMENTWISE_OP, OPCODES, BcuSlot, Mem, Opcode, SReg, VReg,
)

#: One line of every opcode in the compiler's syntax (ISA.md 2.1).
LINES = {
    Opcode.LOAD: "load r1: i0(3)", Opcode.EVG: "evg r1: k0(3){F}", Opcode.LOAS: "loas s1: s3(3)",
    Opcode.STORE: "store r1: t0(3)", Opcode.SPILL: "spill r1[X]: t0(3)",
    Opcode.ADD: "add r3: r1, r2 | 3", Opcode.SUB: "sub r3: r1, r2 | 3", Opcode.MUL: "mul r3: r1, r2 | 3",
    Opcode.MUP: "mup r3: r1, r2 | 3", Opcode.ADS: "ads r3: r1, s2 | 3", Opcode.SUS: "sus r3: r1, s2 | 3",
    Opcode.MUS: "mus r3: r1, s2 | 3", Opcode.NEG: "neg r3: r1 | 3", Opcode.MOV: "mov r3: r1 | 3",
    Opcode.CON: "con r3: r1 | 3", Opcode.INT: "int r3: r1 | 3", Opcode.ROT: "rot -5 r3: r1 | 3",
    Opcode.NTT: "ntt r3: b0{1} | 3", Opcode.SUD: "sud r3: r1, r2 | 3", Opcode.BCI: "bci B0: [3,4], [1,2]",
    Opcode.PL1: "pl1 B0: r1 | 1", Opcode.BCW: "bcw B1: r1 | 1", Opcode.RSI: "rsi {r1, r2}",
    Opcode.RSV: "rsv {r1, r2}: r3: [1,2] | 1", Opcode.MOD: "mod r4: {r1, r2} | 2",
    Opcode.DIS: "dis @ 65539:2 : r1", Opcode.RCV: "rcv @ 65539:2 r1: ", Opcode.JOI: "joi @ 3:2 r1: r2 | 3",
    Opcode.REC: "rec r1: i0(3) | 3", Opcode.SND: "snd r1: t0(3) | 3",
}
_KIND = {VReg: "r", SReg: "s", Mem: "m", BcuSlot: "b"}


def test_every_opcode_has_one_entry():
    assert set(OPCODES) == set(Opcode) == set(LINES)


def test_operand_kinds_match_the_parsed_syntax():
    for op, line in LINES.items():
        ins = parse_instruction(line)
        info = OPCODES[op]
        assert ins.op is op
        if info.reads == ("r*",):
            assert ins.srcs and all(type(s) is VReg for s in ins.srcs)
        else:
            assert len(ins.srcs) == len(info.reads), op
            for s, kind in zip(ins.srcs, info.reads):
                assert _KIND[type(s)] in kind, (op, s, kind)
        assert (_KIND[type(ins.dst)] if ins.dst is not None else "") == info.writes.rstrip("?"), op
        assert bool(ins.group) == bool(info.group), op
        assert (ins.unit >= 0) == bool(info.unit), op


def test_the_limb_an_instruction_works_on_follows_the_table():
    assert parse_instruction("load r1: i0(7)").limb == 7
    assert parse_instruction("store r1: t0(9)").limb == 9
    assert parse_instruction("rcv @ 65541:2 r1: ").limb == 5
    assert parse_instruction("add r3: r1, r2 | 4").limb == 4
    assert parse_instruction("rsi {r1}").limb is None


def test_derived_sets():
    assert COMMUNICATION == {Opcode.DIS, Opcode.RCV, Opcode.JOI}
    assert ELEMENTWISE_OP[Opcode.MUP] == "mul" and ELEMENTWISE_OP[Opcode.SUS] == "sub"
    assert Opcode.MOV not in ELEMENTWISE_OP
    assert {op for op, i in OPCODES.items() if not i.supported} == {Opcode.REC, Opcode.SND}
    assert {op for op, i in OPCODES.items() if not i.frees} == {Opcode.STORE, Opcode.SPILL, Opcode.PL1, Opcode.BCW}
