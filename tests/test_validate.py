"""Tests of caramel.validate: the corpus validates clean; every rule fires, located, on a crafted program."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from caramel.errors import LocatedError, UnsupportedError, ValidationError
from caramel.parse import load_program
from caramel.validate import check, validate

from tests.conftest import corpus

CORPUS = corpus()
BOOTSTRAP = [f"BootstrapLike_51L_{k}c" for k in (1, 2, 4, 8)]

# A global manifest that provides i1, i2 (ciphertext), s3 (scalar) and k5 (key) on limbs 0..3, no outputs.
MANIFEST = """\
Ciphertext Stream:
i1 | x:c0 | [0,1,2,3]
i2 | x:c1 | [0,1,2,3]
;
Plaintext Stream:
;
Scalar Stream:
s3 | a:s | [0,1,2,3]
;
Output Stream:
;
Evalkey Stream:
k5 | K:0:4:2:0:c0:[0,1,2,3] | [0,1,2,3,62,63]
;
"""


def make(root: Path, *streams: str, manifest: str | None = MANIFEST):
    """Write a program folder: stream p gets header ``Instruction Stream p:`` (line 1), then its lines."""
    root.mkdir(parents=True, exist_ok=True)
    for p, body in enumerate(streams):
        lines = "".join(f"{line}\n" for line in textwrap.dedent(body).strip("\n").split("\n") if line)
        (root / f"instructions{p}").write_text(f"Instruction Stream {p}:\n{lines}")
    if manifest is not None:
        (root / "program_inputs").write_text(manifest)
        return load_program(root, cache=False)
    # A folder without program_inputs is refused by load_program; build the manifest-less program directly.
    from dataclasses import replace

    from caramel.parse import build_program, read_source

    (root / "program_inputs").write_text(MANIFEST)
    files = read_source(root)
    files.files.pop("program_inputs")
    return build_program(replace(files, single=True))


def problems(program, limit: int = 50) -> list[str]:
    return [str(p) for p in check(program, limit)]


# ------------------------------------------------------------------------------------ the corpus


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_corpus_program_validates_clean(path):
    program = load_program(path)
    assert problems(program, limit=5) == []
    validate(program, n=65536)  # the ring the corpus was compiled for: every rotation step fits


@pytest.mark.parametrize("name", BOOTSTRAP)
def test_bootstrap_like_validates_clean(name, bootstrap51):
    """Clean; how long it takes is a benchmark's question (scripts/bench_load.py), not a unit test's."""
    program = load_program(bootstrap51 / name)
    assert problems(program, limit=5) == []


# ------------------------------------------------------------------------------------ def-use


def test_register_read_before_write(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        add r2: r0, r1 | 0
        ads r3: r0, s1 | 0
    """)
    assert problems(program) == [
        f"{d}/instructions0:3:13: register r1 is read before it is written",
        f"{d}/instructions0:4:13: register s1 is read before it is written",
    ]


def test_same_register_read_twice_is_reported_once(tmp_path):
    d = tmp_path / "p"
    program = make(d, "add r1: r0, r0 | 0")
    assert problems(program) == [f"{d}/instructions0:2:9: register r0 is read before it is written"]


def test_read_after_last_use(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        loas s1: s3(0)
        add r2: r0[X], r0 | 0
        neg r3: r0 | 0
        mov r0: r2 | 0
        neg r4: r0 | 0
        ads r5: r2, s1[X] | 0
        mus r6: r2, s1 | 0
    """)
    assert problems(program) == [
        f"{d}/instructions0:5:9: register r0 is read after its last use [X] at line 4",
        f"{d}/instructions0:9:13: register s1 is read after its last use [X] at line 8",
    ]


def test_destination_may_reuse_a_dying_source(tmp_path):
    program = make(tmp_path / "p", """
        load r0: i1(0)
        add r0: r0[X], r0 | 0
        neg r1: r0[X] | 0
    """)
    assert problems(program) == []


def test_rsv_and_mod_need_an_rsi_group(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        load r1: i1(1)
        int r2: r0 | 0
        rsv {r5, r6}: r2: [0,1] | 0
        mov r5: r0 | 0
        mov r6: r0 | 0
        rsv {r5, r6}: r2: [0,1] | 0
        rsi {r5, r6}
        rsv {r5, r6}: r2: [0,1] | 0
        rsv {r5, r6}: r2: [0,1] | 4
        mod r7: {r5, r6[X]} | 2
        mod r8: {r5, r6} | 2
    """)
    assert problems(program) == [
        f"{d}/instructions0:5:6: register r5 is read before it is written",
        f"{d}/instructions0:5:10: register r6 is read before it is written",
        f"{d}/instructions0:8:6: rsv group register r5 was not initialised by rsi",
        f"{d}/instructions0:8:10: rsv group register r6 was not initialised by rsi",
        f"{d}/instructions0:11:27: rsv base 4 is not in its basis",
        f"{d}/instructions0:13:14: register r6 is read after its last use [X] at line 12",
    ]


def test_sud_must_drop_a_higher_limb(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(2)
        load r1: i1(3)
        int r2: r1 | 3
        int r3: r0 | 2
        sud r4: r0, r2 | 2
        sud r5: r1, r3 | 3
        sud r6: r0, r3 | 2
    """)
    assert problems(program) == [
        f"{d}/instructions0:7:13: sud drops r3, which holds limb 2; the dropped limb must be above the base 3",
        f"{d}/instructions0:8:13: sud drops r3, which holds limb 2; the dropped limb must be above the base 2",
    ]


# ------------------------------------------------------------------------------------ memory and limbs


def test_load_of_unknown_memory_name(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(4)
        load r1: i9(0)
        evg r2: k5(61)
        evg r3: k5(62)
        loas s0: s3(7)
        store r3: v7(0)
        load r4: v7(0)
        load r5: v8(0)
    """)
    tail = "no manifest entry provides it and no earlier store or spill of this stream wrote it"
    assert problems(program) == [
        f"{d}/instructions0:2:10: load of i1(4): {tail}",
        f"{d}/instructions0:3:10: load of i9(0): {tail}",
        f"{d}/instructions0:4:9: evg of k5(61): {tail}",
        f"{d}/instructions0:6:10: loas of s3(7): {tail}",
        f"{d}/instructions0:9:10: load of v8(0): {tail}",
    ]


def test_chip_input_manifest_provides_names_and_stores_are_per_chip(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "inputs0").write_text("Input Stream:\np9 | w:p | [0]\n;\nOutput Stream:\n;\n")
    (d / "inputs1").write_text("Input Stream:\n;\nOutput Stream:\n;\n")
    program = make(d, """
        load r0: p9(0)
        spill r0: v7(0)
    """, """
        load r0: p9(0)
        load r1: v7(0)
    """)
    tail = "no manifest entry provides it and no earlier store or spill of this stream wrote it"
    assert problems(program) == [
        f"{d}/instructions1:2:10: load of p9(0): {tail}",
        f"{d}/instructions1:3:10: load of v7(0): {tail}",
    ]


def test_single_file_without_manifest_skips_the_memory_rule(tmp_path):
    f = tmp_path / "prog.isa"
    f.write_text("Instruction Stream 0:\nload r0: i7(3)\nneg r1: r0[X] | 3\nstore r1[X]: v2(3)\n")
    assert problems(load_program(f, cache=False)) == []


def test_outputs_must_be_stored_or_be_inputs(tmp_path):
    d = tmp_path / "p"
    manifest = MANIFEST.replace("Output Stream:\n;", "Output Stream:\nv4 | z:c0 | [0,1]\ni2 | z:c1 | [0,1]\n;")
    program = make(d, """
        load r0: i1(0)
        store r0: v4(0)
    """, manifest=manifest)
    assert problems(program) == [
        f"{d}/program_inputs:11:1: output v4 (z:c0) limb(s) [1] are never stored by any chip and are not an input",
    ]


def test_chip_outputs_must_be_stored_by_that_chip(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "inputs0").write_text("Input Stream:\n;\nOutput Stream:\nv4 | z:c0 | [0]\n;\n")
    (d / "inputs1").write_text("Input Stream:\n;\nOutput Stream:\nv4 | z:c0 | [1]\n;\n")
    manifest = MANIFEST.replace("Output Stream:\n;", "Output Stream:\nv4 | z:c0 | [0,1]\n;")
    program = make(d, """
        load r0: i1(0)
        store r0: v4(0)
        store r0: v4(1)
    """, "", manifest=manifest)
    assert problems(program) == [f"{d}/inputs1:4:1: output v4 (z:c0) limb(s) [1] are never stored by chip 1"]


def test_limb_indices_must_name_one_of_64_primes(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        neg r1: r0 | 64
        store r0: v9(70)
        dis @ 65600:2 : r0
    """, """
        rcv @ 65600:2 r0: 
    """, manifest=None)
    assert problems(program) == [
        f"{d}/instructions0:3:14: base 64 is outside 0..63",
        f"{d}/instructions0:4:11: memory limb 70 of v9(70) is outside 0..63",
        f"{d}/instructions0:5:7: sync id 65600 names limb 64, outside 0..63",
        f"{d}/instructions1:2:7: sync id 65600 names limb 64, outside 0..63",
    ]


def test_manifest_limbs_and_evaluation_keys(tmp_path):
    d = tmp_path / "p"
    manifest = MANIFEST.replace("i2 | x:c1 | [0,1,2,3]", "i2 | x:c1 | [0,1,64,99]").replace(
        "k5 | K:0:4:2:0:c0:[0,1,2,3] | [0,1,2,3,62,63]",
        "k5 | K:0:4:2:0:c0:[0,1,2,3] | [0,1,2,3,4,61,62,63]\n"
        "k6 | K:0:40:30:0:c0:[0,1,2,3] | [0,1,2,3]\n"
        "k7 | K:0:40:30:0:c1:[0,1,2,3] | [34,35]\n"
        "k8 | K:3:64:1:0:c0:[0,1,2,3] | [63]")
    program = make(d, "load r0: i1(0)", manifest=manifest)
    (d / "inputs0").write_text("Input Stream:\nk9 | K:0:4:0:0:c0:[0,1,2,3] | [3,63]\n;\nOutput Stream:\n;\n")
    program = load_program(d, cache=False)
    assert problems(program) == [
        f"{d}/program_inputs:3:1: i2 (x:c1) lists limb(s) 64,99 outside 0..63",
        f"{d}/program_inputs:13:1: k5 lists limb(s) 4,61, which evaluation key 0:4:2:0:[0,1,2,3] does not have "
        "(data limbs 0..3, extension limbs 62..63; ISA.md 5.3)",
        f"{d}/program_inputs:14:1: evaluation key 0:40:30:0:[0,1,2,3]: level 40 + extension 30 = 70 > 64: its data "
        "limbs 0..39 and extension limbs 34..63 collide on limb(s) 34..39 (ISA.md 5.1, 8.7)",
        f"{d}/program_inputs:16:1: evaluation key 3:64:1:0:[0,1,2,3]: level 64 + extension 1 = 65 > 64: its data "
        "limbs 0..63 and extension limbs 63 collide on limb(s) 63 (ISA.md 5.1, 8.7)",
        f"{d}/inputs0:2:1: k9 lists limb(s) 63, which evaluation key 0:4:0:0:[0,1,2,3] does not have "
        "(data limbs 0..3, extension limbs none; ISA.md 5.3)",
    ]


def test_rotation_steps_must_fit_the_ring(tmp_path):
    d = tmp_path / "p"
    manifest = MANIFEST.replace("K:0:4:2:0:c0", "K:1:4:2:5000:c0")
    program = make(d, """
        load r0: i1(0)
        rot 32767 r1: r0 | 0
        rot -32768 r2: r0 | 0
        rot 4095 r3: r0 | 0
        rot -4096 r4: r0 | 0
    """, manifest=manifest)
    assert problems(program) == [
        f"{d}/instructions0:4:5: rot step -32768 is out of range for every supported ring: |step| must be below "
        "32768 (N/2 at the largest N = 65536), i.e. -32767..32767",
    ]
    reason = "is out of range for N = 8192: |step| must be below N/2 = 4096, i.e. -4095..4095"
    assert [str(p) for p in check(program, n=None)] == problems(program)
    assert [str(p) for p in check(program, n=8192)] == [
        f"{d}/instructions0:3:5: rot step 32767 {reason}",
        f"{d}/instructions0:4:5: rot step -32768 {reason}",
        f"{d}/instructions0:6:5: rot step -4096 {reason}",
        f"{d}/program_inputs:13:1: rotation key 1:4:2:5000:[0,1,2,3]: step 5000 {reason}",
    ]
    for bad in (0, 3, 131072, 4096.0, True, "4096"):
        with pytest.raises(ValueError, match="power of two up to 65536"):
            check(program, n=bad)


def test_rec_and_snd_are_rejected(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        rec r0: i1(0) | 0
        snd r0: v1(0) | 0
    """)
    found = check(program)
    assert [str(p) for p in found] == [
        f"{d}/instructions0:2:1: rec is not supported: the Cinnamon compiler never emits it and its meaning is "
        "unspecified (ISA.md 4.1)",
        f"{d}/instructions0:3:1: snd is not supported: the Cinnamon compiler never emits it and its meaning is "
        "unspecified (ISA.md 4.1)",
    ]
    assert all(isinstance(p, UnsupportedError) for p in found)


# ------------------------------------------------------------------------------------ base conversion units


def test_bcu_discipline(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        load r1: i1(1)
        pl1 B0: r0 | 0
        bci B0: [2,3], [0,1]
        pl1 B0: r0 | 0
        ntt r2: b0{0} | 2
        pl1 B0: r1 | 1
        pl1 B0: r1 | 1
        pl1 B0: r1 | 3
        ntt r3: b0{0} | 2
        sud r4: r0, b0{1} | 2
        ntt r5: b0{2} | 3
        sud r6: r0, b1{0} | 0
    """)
    assert problems(program) == [
        f"{d}/instructions0:4:1: pl1 B0 before any bci B0",
        f"{d}/instructions0:7:9: b0{{0}} is read before every input of bci B0 at line 5 is written "
        "(missing limbs [1])",
        f"{d}/instructions0:9:14: pl1 B0 writes input limb 1 twice (first at line 8)",
        f"{d}/instructions0:10:14: pl1 B0 writes limb 3, which is not an input of bci B0 at line 5 ([0,1])",
        f"{d}/instructions0:11:9: b0{{0}} is read twice (first read at line 7)",
        f"{d}/instructions0:12:21: b0{{1}} holds limb 3 (bci B0 at line 5) but is read with base 2",
        f"{d}/instructions0:13:9: b0{{2}} is out of range: bci B0 at line 5 has 2 output limb(s)",
        f"{d}/instructions0:14:13: b1{{0}} is read before any bci B1",
    ]


def test_bcu_reset_and_lists(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        bci B0: [1,2], [0]
        bcw B0: r0 | 0
        ntt r1: b0{0} | 1
        bci B0: [3,1], [0]
        bci B1: [0,63], [0,62]
        bci B0: [63], [0]
        bcw B0: r0 | 0
        ntt r2: b0{0} | 63
    """)
    assert problems(program) == [
        f"{d}/instructions0:6:1: bci B0 resets the unit before every slot of bci B0 at line 3 was read "
        "(unread slots 1)",
        f"{d}/instructions0:6:1: bci B0 output list is not strictly increasing",
        f"{d}/instructions0:7:1: bci B1 output and input lists overlap on limb(s) 0: limb index collision, "
        "level + extension > 64 (ISA.md 8.7)",
        f"{d}/instructions0:7:1: bci B1: slot(s) 0,1 are never read before the stream ends",
        f"{d}/instructions0:8:1: bci B0 resets the unit before every slot of bci B0 at line 6 was read "
        "(unread slots 0,1)",
    ]


# ------------------------------------------------------------------------------------ communication


def test_dis_without_receiver_and_rcv_without_dis(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        dis @ 65536:2 : r0
    """, """
        rcv @ 131072:2 r0: 
    """)
    assert problems(program) == [
        f"{d}/instructions0:3:7: dis @ 65536:2 has 0 receiver(s) (chips none), expected 1",
        f"{d}/instructions1:2:7: rcv @ 131072 has no matching dis on any chip",
    ]


def test_dis_with_two_senders(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        dis @ 65536:3 : r0
    """, """
        load r0: i1(1)
        dis @ 65536:3 : r0
    """, """
        rcv @ 65536:3 r0: 
    """)
    assert problems(program) == [
        f"{d}/instructions0:3:7: dis @ 65536:3 has 1 receiver(s) (chips 2), expected 2",
        f"{d}/instructions1:3:7: dis @ 65536 has two senders: chip 0 (instructions0:3) and chip 1 (instructions1:3)",
    ]


def test_receivers_on_the_sender_or_twice_on_a_chip(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        dis @ 65536:3 : r0
        rcv @ 65536:3 r1: 
    """, """
        rcv @ 65536:3 r0: 
        rcv @ 65536:3 r1: 
    """, "")
    assert problems(program) == [
        f"{d}/instructions0:3:7: dis @ 65536:3 has 1 receiver(s) (chips 1), expected 2",
        f"{d}/instructions0:4:7: rcv @ 65536 is on the sending chip 0 (instructions0:3)",
        f"{d}/instructions1:3:7: rcv @ 65536 is received twice on chip 1 (also at line 2)",
    ]


def test_sizes_must_agree_and_fit_the_machine(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        dis @ 65536:2 : r0
        dis @ 131072:4 : r0
    """, """
        rcv @ 65536:3 r0: 
        rcv @ 131072:4 r1: 
    """)
    assert problems(program) == [
        f"{d}/instructions0:4:7: dis @ 131072 has size 4 but the program has 2 chip(s)",
        f"{d}/instructions0:4:7: dis @ 131072:4 has 1 receiver(s) (chips 1), expected 3",
        f"{d}/instructions1:2:7: rcv @ 65536 has size 3 but instructions0:3 gives size 2",
    ]


def test_joi_pairing(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        joi @ 65536:2 r1: r0 | 0
        joi @ 131073:2 r2: r0 | 0
        joi @ 196610:3 r3: r0 | 2
        joi @ 262147:2 : r0 | 3
        dis @ 327680:2 : r0
    """, """
        load r0: i1(0)
        joi @ 65536:2 r1: r0 | 0
        joi @ 131073:2 : r0 | 1
        joi @ 196610:3 :  | 2
        joi @ 262147:2 : r0 | 3
        joi @ 327680:2 r1: r0 | 0
    """, "")
    assert problems(program) == [
        f"{d}/instructions0:4:25: joi @ 131073 has base 0 but its id names limb 1",
        f"{d}/instructions0:5:7: joi @ 196610:3 has 2 participant(s) (chips 0, 1), expected 3",
        f"{d}/instructions0:6:7: joi @ 262147 has no participant with a destination register",
        f"{d}/instructions0:7:7: sync id 327680 is used by both dis and joi (instructions1:7)",
        f"{d}/instructions0:7:7: dis @ 327680:2 has 0 receiver(s) (chips none), expected 1",
        f"{d}/instructions1:3:7: joi @ 65536 has 2 destinations: chip 0 (instructions0:3), chip 1 (instructions1:3)",
        f"{d}/instructions1:7:7: joi @ 327680:2 has 1 participant(s) (chips 1), expected 2",
    ]


def test_joi_two_participants_on_one_chip(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        joi @ 65536:2 r1: r0 | 0
        joi @ 65536:2 : r0 | 0
    """, "")
    assert problems(program) == [
        f"{d}/instructions0:4:7: joi @ 65536 has two participants on chip 0 (also at line 3)",
    ]


def test_deadlock_cycle_names_both_chips(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        rcv @ 65537:2 r1: 
        dis @ 65536:2 : r0
    """, """
        load r0: i1(1)
        rcv @ 65536:2 r1: 
        dis @ 65537:2 : r0
    """)
    assert problems(program) == [
        f"{d}/instructions0:3:7: deadlock: chip 0 waits at instructions0:3 (rcv @ 65537) for chip 1, "
        "which waits at instructions1:3 (rcv @ 65536) for chip 0",
    ]


def test_deadlock_through_a_joi_destination(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        joi @ 65536:3 r1: r0 | 0
        dis @ 65537:3 : r0
    """, """
        load r0: i1(1)
        rcv @ 65537:3 r1: 
        joi @ 65536:3 : r0 | 0
    """, """
        joi @ 65536:3 :  | 0
        rcv @ 65537:3 r1: 
    """)
    assert problems(program) == [
        f"{d}/instructions0:3:7: deadlock: chip 0 waits at instructions0:3 (joi @ 65536) for chip 1, "
        "which waits at instructions1:3 (rcv @ 65537) for chip 0 (also blocked: chip 2)",
    ]


def test_communication_in_a_consistent_order_passes(tmp_path):
    program = make(tmp_path / "p", """
        load r0: i1(0)
        rcv @ 65537:2 r1: 
        dis @ 65536:2 : r0
        joi @ 131072:2 r2: r1 | 0
    """, """
        load r0: i1(1)
        dis @ 65537:2 : r0
        joi @ 131072:2 :  | 0
        rcv @ 65536:2 r1: 
    """)
    assert problems(program) == []


def test_unmatched_rcv_is_a_pairing_error_not_a_deadlock(tmp_path):
    d = tmp_path / "p"
    program = make(d, "rcv @ 65536:2 r0: ", "rcv @ 65537:2 r0: ")
    assert problems(program) == [
        f"{d}/instructions0:2:7: rcv @ 65536 has no matching dis on any chip",
        f"{d}/instructions1:2:7: rcv @ 65537 has no matching dis on any chip",
    ]


# ------------------------------------------------------------------------------------ collection


def test_error_collection_limit(tmp_path):
    d = tmp_path / "p"
    program = make(d, "\n".join(f"neg r{i + 1}: r0 | 0" for i in range(60)))
    found = check(program)
    assert len(found) == 50
    assert str(found[-1]) == f"{d}/instructions0:51:10: register r0 is read before it is written"
    assert len(check(program, limit=3)) == 3
    with pytest.raises(ValidationError) as info:
        validate(program, limit=10)
    err = info.value
    assert len(err.problems) == 10 and err.truncated
    assert all(isinstance(p, LocatedError) for p in err.problems)
    assert str(err).splitlines()[0] == "10+ validation error(s):"
    assert str(err).splitlines()[1] == f"  {d}/instructions0:2:9: register r0 is read before it is written"


def test_errors_of_several_rules_are_reported_together(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i9(0)
        neg r1: r5 | 0
        rec r2: i1(0) | 0
    """)
    with pytest.raises(ValidationError) as info:
        validate(program)
    assert [p.location.line for p in info.value.problems] == [2, 3, 4]
    assert not info.value.truncated
