"""Every error caramel raises on purpose, in the situation that raises it: the class, and a message that
names the file, the line and the reason (issue #7). Programs are written by hand into ``tmp_path``.

GPU errors (DeviceMemoryError) are tested with the GPU tests (tests/execute/test_gpu.py): their code
path needs CuPy and a device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from caramel.ckks import Secrets, bind_inputs, encode_plaintext, encrypt_values
from caramel.errors import BindingError, CaramelError, DeadlockError, ParseError, ValidationError
from caramel.execute.memory import check_memory_image
from caramel.execute.reference import run_reference
from caramel.parse import load_program
from caramel.program import Mem
from caramel.ring import Context
from caramel.ring.primes import PRIMES
from caramel.validate import validate

from tests.conftest import REPO, SHARED_PROGRAMS
from tests.test_validate import MANIFEST, make

N = 64
CTX = Context(n=N)


def invalid(program, **kwargs) -> list[str]:
    """The problems ``validate`` raises, one string each (``path:line:col: reason``)."""
    with pytest.raises(ValidationError) as info:
        validate(program, **kwargs)
    return [str(p) for p in info.value.problems]


def zeros() -> np.ndarray:
    return np.zeros(N, dtype=np.uint32)


# ------------------------------------------------------------------------------------ parse errors


def test_unknown_opcode_names_file_line_and_opcode(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "instructions0").write_text("Instruction Stream 0:\nload r0: i1(0)\nfoo r1: r0 | 0\n")
    (d / "program_inputs").write_text(MANIFEST)
    with pytest.raises(ParseError) as info:
        load_program(d, cache=False)
    err = info.value
    assert err.location.path == f"{d}/instructions0" and err.location.line == 3
    assert str(err).startswith(f"{d}/instructions0:3:")
    assert "unknown opcode 'foo'" in err.reason


# ------------------------------------------------------------------------------------ validation errors


def test_register_read_before_written(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        mul r2: r0, r1 | 0
    """)
    [problem] = invalid(program)
    assert problem.startswith(f"{d}/instructions0:3:")
    assert "register r1 is read before it is written" in problem


def test_dis_without_rcv(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        dis @ 65536:2 : r0
    """, "load r0: i1(1)")
    [problem] = invalid(program)
    assert problem.startswith(f"{d}/instructions0:3:")
    assert "dis @ 65536:2 has 0 receiver(s)" in problem and "expected 1" in problem


def test_rcv_without_dis(tmp_path):
    d = tmp_path / "p"
    program = make(d, "load r0: i1(0)", """
        load r0: i1(1)
        rcv @ 65537:2 r1: 
    """)
    [problem] = invalid(program)
    assert problem.startswith(f"{d}/instructions1:3:")
    assert "rcv @ 65537 has no matching dis on any chip" in problem


def test_joi_with_two_destinations(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        joi @ 65536:2 r1: r0 | 0
    """, """
        load r0: i1(0)
        joi @ 65536:2 r1: r0 | 0
    """)
    [problem] = invalid(program)
    assert problem.startswith(f"{d}/instructions1:3:")
    assert "joi @ 65536 has 2 destinations" in problem
    assert "chip 0 (instructions0:3)" in problem and "chip 1 (instructions1:3)" in problem


def test_limb_index_outside_the_prime_list(tmp_path):
    d = tmp_path / "p"
    manifest = MANIFEST.replace("i2 | x:c1 | [0,1,2,3]", "i2 | x:c1 | [0,1,2,70]")
    program = make(d, """
        load r0: i1(0)
        neg r1: r0 | 64
        store r1: v9(65)
    """, manifest=manifest)
    found = invalid(program)
    assert any(p.startswith(f"{d}/instructions0:3:") and "base 64 is outside 0..63" in p for p in found)
    assert any(p.startswith(f"{d}/instructions0:4:") and "memory limb 65 of v9(65) is outside 0..63" in p
               for p in found)
    assert any(p.startswith(f"{d}/program_inputs:3:") and "i2 (x:c1) lists limb(s) 70 outside 0..63" in p
               for p in found)


def test_key_term_with_a_limb_the_key_does_not_have(tmp_path):
    d = tmp_path / "p"
    manifest = MANIFEST.replace("[0,1,2,3,62,63]", "[0,1,2,3,40,62,63]")
    [problem] = invalid(make(d, "load r0: k5(40)", manifest=manifest))
    assert problem.startswith(f"{d}/program_inputs:13:")
    assert "k5 lists limb(s) 40, which evaluation key 0:4:2:0:[0,1,2,3] does not have" in problem
    assert "data limbs 0..3, extension limbs 62..63" in problem


def test_level_plus_extension_above_64_is_a_limb_collision(tmp_path):
    d = tmp_path / "p"
    # A relinearisation key for level 60 with 8 extension primes: data 0..59, extension 56..63.
    manifest = MANIFEST.replace("k5 | K:0:4:2:0:c0:[0,1,2,3] | [0,1,2,3,62,63]",
                                "k5 | K:0:60:8:0:c0:[0,1,2,3] | [0,1,2,3,56,57]")
    [problem] = invalid(make(d, "load r0: k5(56)", manifest=manifest))
    assert problem.startswith(f"{d}/program_inputs:13:")
    assert "level 60 + extension 8 = 68 > 64" in problem
    assert "collide on limb(s) 56..59" in problem and "ISA.md 5.1, 8.7" in problem


def test_level_plus_extension_of_64_is_fine(tmp_path):
    manifest = MANIFEST.replace("k5 | K:0:4:2:0:c0:[0,1,2,3] | [0,1,2,3,62,63]",
                                "k5 | K:0:56:8:0:c0:[0,1,2,3] | [0,1,2,3,55,56]")
    validate(make(tmp_path / "p", "load r0: k5(56)", manifest=manifest))


def test_rotation_step_out_of_range_for_every_ring(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        rot 40000 r1: r0 | 0
        rot -32768 r2: r0 | 0
        rot 32767 r3: r0 | 0
        rot -3072 r4: r0 | 0
    """)
    found = invalid(program)
    assert [p.split(": ")[0] for p in found] == [f"{d}/instructions0:3:5", f"{d}/instructions0:4:5"]
    assert "rot step 40000 is out of range for every supported ring" in found[0]
    assert "-32767..32767" in found[0]
    assert "rot step -32768 is out of range" in found[1]


def test_rotation_step_out_of_range_for_a_known_ring(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        rot 2047 r1: r0 | 0
        rot -2048 r2: r0 | 0
        rot 3072 r3: r0 | 0
    """)
    validate(program)  # N unknown: steps below 32768 may be meant for a larger ring
    found = invalid(program, n=4096)
    assert [p.split(": ")[0] for p in found] == [f"{d}/instructions0:4:5", f"{d}/instructions0:5:5"]
    assert all("is out of range for N = 4096: |step| must be below N/2 = 2048, i.e. -2047..2047" in p
               for p in found)
    validate(program, n=8192)
    with pytest.raises(ValueError, match="power of two"):
        validate(program, n=3000)


def test_rotation_key_step_out_of_range(tmp_path):
    d = tmp_path / "p"
    manifest = MANIFEST.replace("K:0:4:2:0:c0", "K:1:4:2:-40000:c0")
    [problem] = invalid(make(d, "load r0: k5(0)", manifest=manifest))
    assert problem.startswith(f"{d}/program_inputs:13:")
    assert "rotation key 1:4:2:-40000:[0,1,2,3]: step -40000 is out of range" in problem


# ------------------------------------------------------------------------------------ binding errors


TWO_INPUTS = """\
Ciphertext Stream:
i1 | x:c0 | [0,1]
i2 | x:c1 | [0,1]
;
Plaintext Stream:
p3 | y:p | [0,1]
;
Scalar Stream:
;
Output Stream:
;
Evalkey Stream:
;
"""


def test_missing_inputs_are_all_listed(tmp_path):
    program = make(tmp_path / "p", """
        load r0: i1(0)
        load r1: p3(1)
    """, manifest=TWO_INPUTS)
    with pytest.raises(BindingError) as info:
        bind_inputs(program, CTX, None, {})
    assert "missing inputs: x, y" in str(info.value)
    assert info.value.missing == ["x", "y"]


def test_missing_input_limbs_are_all_listed(tmp_path):
    d = tmp_path / "p"
    program = make(d, """
        load r0: i1(0)
        load r1: p3(1)
    """, manifest=TWO_INPUTS)
    with pytest.raises(BindingError) as info:
        check_memory_image(program, CTX, {})
    msg = str(info.value)
    assert "2 input limb(s) not provided" in msg
    assert f"i1(0) (first loaded at {d}/instructions0:2)" in msg
    assert f"p3(1) (first loaded at {d}/instructions0:3)" in msg


def test_input_at_the_wrong_ring_dimension(tmp_path):
    program = make(tmp_path / "p", "load r0: i1(0)\nload r1: p3(1)", manifest=TWO_INPUTS)
    rng = np.random.default_rng(1)
    big = Context(n=2 * N)
    x = encrypt_values(big, Secrets.generate(2 * N, rng).s, np.zeros(N), 2.0**20, (0, 1), rng)
    y = encode_plaintext(CTX, np.zeros(N // 2), 2.0**20, (0, 1))
    with pytest.raises(BindingError) as info:
        bind_inputs(program, CTX, None, {"x": x, "y": y})
    assert f"input x has the wrong ring dimension (context N = {N})" in str(info.value)


def test_memory_limb_of_the_wrong_shape(tmp_path):
    program = make(tmp_path / "p", "load r0: i1(0)")
    with pytest.raises(BindingError) as info:
        check_memory_image(program, CTX, {Mem("i1", 0): np.zeros(N - 1, dtype=np.uint32)})
    assert f"i1(0): shape ({N - 1},), expected ({N},)" in str(info.value)


def test_memory_limb_of_the_wrong_dtype(tmp_path):
    program = make(tmp_path / "p", "load r0: i1(0)")
    with pytest.raises(BindingError) as info:
        check_memory_image(program, CTX, {Mem("i1", 0): np.zeros(N, dtype=np.float32)})
    assert "i1(0): dtype float32 is not an integer type" in str(info.value)


def test_memory_residues_at_or_above_q(tmp_path):
    program = make(tmp_path / "p", "load r0: i1(0)\nload r1: i1(1)")
    q1 = CTX.q(1)
    memory = {Mem("i1", 0): zeros(), Mem("i1", 1): np.full(N, q1, dtype=np.uint32)}
    with pytest.raises(BindingError) as info:
        run_reference(program, CTX, memory)
    msg = str(info.value)
    assert f"i1(1): residues must lie in [0, q_1 = {q1})" in msg
    assert "i1(0)" not in msg


def test_memory_limb_beyond_a_short_prime_list(tmp_path):
    program = make(tmp_path / "p", "load r0: i1(3)")
    short = Context(n=N, primes=PRIMES[:3])
    with pytest.raises(BindingError) as info:
        check_memory_image(program, short, {Mem("i1", 3): zeros()})
    assert "i1(3): limb index outside the 3 primes" in str(info.value)


def test_run_with_too_few_primes_for_the_keys():
    import caramel

    path = REPO / "programs" / "Mul_4L_2c"
    if not path.is_dir():
        pytest.skip("programs/Mul_4L_2c not found")
    program = load_program(path, cache=False)
    with pytest.raises(BindingError) as info:
        caramel.run_program(program, ctx=Context(n=1024, primes=PRIMES[:8]), backend="cpu", check=None)
    msg = str(info.value)
    assert "Mul_4L_2c/instructions" in msg and "beyond the context's 8 primes" in msg and "needs at least" in msg


# ------------------------------------------------------------------------------------ execution errors


def test_cpu_deadlock_names_both_chips(tmp_path):
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
    with pytest.raises(DeadlockError) as info:
        run_reference(program, CTX, {Mem("i1", 0): zeros(), Mem("i1", 1): zeros()})
    msg = str(info.value)
    assert msg.startswith("deadlock:")
    assert f"chip 0 waits at {d}/instructions0:3 (rcv @ 65537:2 r1: )" in msg
    assert f"chip 1 waits at {d}/instructions1:3 (rcv @ 65536:2 r1: )" in msg


def test_every_error_is_a_caramel_error():
    for cls in (ParseError, ValidationError, BindingError, DeadlockError):
        assert issubclass(cls, CaramelError)


def test_cli_validate_prints_the_new_checks_and_exits_2(tmp_path, capsys):
    from caramel.cli import main

    d = tmp_path / "p"
    manifest = MANIFEST.replace("K:0:4:2:0:c0", "K:0:63:2:0:c0")
    make(d, "load r0: i1(0)\nrot 65535 r1: r0 | 0", manifest=manifest)
    assert main(["validate", str(d), "--no-cache", "-q"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{d}/instructions0:3:5: rot step 65535 is out of range")
    assert out[1].startswith(f"{d}/program_inputs:13:1: evaluation key 0:63:2:0:[0,1,2,3]: level 63 + extension 2")
    assert out[2] == f"2 error(s) in {d}"


# ------------------------------------------------------------------------------------ Ctrl-C


def test_keyboard_interrupt_in_a_command_exits_130(monkeypatch, capsys):
    import caramel.parse
    from caramel.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(caramel.parse, "load_program", interrupted)
    assert main(["stats", "whatever", "-q"]) == 130
    out, err = capsys.readouterr()
    assert (out, err) == ("", "caramel: interrupted\n")



#: Minutes on the CPU at N = 65536 (keys alone take tens of seconds), so that the interrupt always
#: lands mid-run: PolyX8_51L_1c, with cached loads and compiled NTTs, could end before it, a race.
LONG_RUN = SHARED_PROGRAMS / "BootstrapLike_20L_1c"


@pytest.mark.skipif(not LONG_RUN.is_dir(), reason="shared corpus not found")
@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a process group")
def test_ctrl_c_exits_130_with_one_line_and_leaves_nothing_behind():
    # The same code path as the `caramel` console script (caramel.cli:main), with a line on stdout once
    # the imports are done, so that the signal lands in the command and not in Python's start-up. Ctrl-C's
    # handler as in a terminal's foreground: a background job of a non-interactive shell (a CI script's `&`)
    # inherits SIGINT ignored.
    script = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from caramel.cli import main\nprint('ready', flush=True)\n"
              f"sys.exit(main(['run', {str(LONG_RUN)!r}, '--n', '65536', '--backend', 'cpu', '-q', '--no-check']))\n")
    env = dict(os.environ, CARAMEL_PROGRESS="0", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(1.0)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert err == "caramel: interrupted\n"
    assert out == ""
    assert elapsed < 5.0, f"took {elapsed:.1f} s to stop after SIGINT"
    with pytest.raises(ProcessLookupError):  # nothing of its process group is left
        os.killpg(proc.pid, 0)


# ----------------------------------------------------------------------------------------------
# Issue 12: public functions raise caramel errors; manifests that disagree are refused
# ----------------------------------------------------------------------------------------------


def _public_calls_list(caramel, ntt_primes):
    program = load_program(SHARED_PROGRAMS / "Mul_4L_2c")
    return [
        lambda: Context(n=3),
        lambda: Context(n=1024, primes=[4]),
        lambda: caramel.validate("programs/Mul_4L_2c"),
        lambda: caramel.validate.validate(program, n=1000),
        lambda: validate(program, limit=0),
        lambda: caramel.run_program("programs/Mul_4L_2c"),
        lambda: caramel.run_program(program, n=1024, seed=-1),
        lambda: caramel.run_program(program, n=1024, mode="bogus"),
        lambda: caramel.run_program(program, n=1024, backend="cpu", gpus=2),
        lambda: ntt_primes(0, bits=1),
    ]


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="shared corpus not found")
def test_public_functions_raise_caramel_errors_that_are_value_errors():
    from caramel.errors import ArgumentError

    import caramel
    from caramel.ring.primes import ntt_primes

    for call in _public_calls_list(caramel, ntt_primes):
        with pytest.raises(ArgumentError) as info:
            call()
        assert isinstance(info.value, CaramelError) and isinstance(info.value, ValueError)


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="shared corpus not found")
def test_readme_validate_forms_work():
    import caramel

    program = caramel.load_program(SHARED_PROGRAMS / "Mul_4L_2c")
    caramel.validate(program)
    caramel.validate.validate(program, n=4096)
    import caramel.validate

    caramel.validate(program)
    caramel.validate.validate(program, n=4096)


def _copy(tmp_path, name="Mul_4L_2c"):
    import shutil

    d = tmp_path / name
    shutil.copytree(SHARED_PROGRAMS / name, d)
    for f in d.iterdir():
        f.chmod(0o644)
    return d


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="shared corpus not found")
def test_folder_without_program_inputs_is_refused(tmp_path):
    d = _copy(tmp_path)
    (d / "program_inputs").unlink()
    with pytest.raises(ParseError, match="no 'program_inputs' file"):
        load_program(d, cache=False)


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="shared corpus not found")
def test_inputs_of_a_chip_that_does_not_exist_are_refused(tmp_path):
    d = _copy(tmp_path)
    (d / "inputs5").write_bytes((d / "inputs1").read_bytes())
    with pytest.raises(ParseError, match="inputs5:1: names chip 5, but the program has 2 chip"):
        load_program(d, cache=False)


@pytest.mark.skipif(not (SHARED_PROGRAMS / "Mul_4L_2c").is_dir(), reason="shared corpus not found")
@pytest.mark.parametrize("old, new, message", [
    (b"i1 | x:c0 | [1,3]", b"i1 | y:c0 | [1,3]", r"inputs1:2: i1 is y:c0 here but x:c0 in .*program_inputs:2"),
    (b"i1 | x:c0 | [1,3]", b"i1 | x:c0 | [1,3,5]", r"inputs1:2: i1 lists limb\(s\) 5 that"),
    (b"v35 | z:c1 | [1]", b"v35 | z:c1 | [1,3]", r"inputs1:12: v35 lists limb\(s\) 3 that"),
])
def test_chip_inputs_that_disagree_with_program_inputs_are_refused(tmp_path, old, new, message):
    d = _copy(tmp_path)
    data = (d / "inputs1").read_bytes()
    assert old in data
    (d / "inputs1").write_bytes(data.replace(old, new))
    with pytest.raises(ParseError, match=message):
        load_program(d, cache=False)


def test_client_functions_raise_caramel_errors():
    """The CKKS client's public functions raise caramel's error types (also ValueError / KeyError)."""
    import numpy as np

    from caramel.ckks import encode, encrypt
    from caramel.ckks.keys import Secrets
    from caramel.ckks.sampling import sparse_ternary
    from caramel.errors import ArgumentError, CaramelError, MissingLimbError
    from caramel.ring import Context

    ctx = Context(n=64)
    with pytest.raises(ArgumentError, match="expected 32 slot values"):
        encode(np.zeros(5), 2.0**20, 64)
    with pytest.raises(ArgumentError, match="Hamming weight"):
        sparse_ternary(64, 65, np.random.default_rng(0))
    ct = encrypt(ctx, Secrets.generate(64, 0).s, encode(np.zeros(32), 2.0**20, 64), [0, 1], np.random.default_rng(0),
                 2.0**20)
    with pytest.raises(MissingLimbError, match="no limb 5") as info:
        ct.limb(0, 5)
    assert isinstance(info.value, (CaramelError, KeyError))
