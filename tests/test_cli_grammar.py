"""One command-line grammar on every subcommand: exit codes (0 ok, 1 check failed, 2 bad input),
-q/-v before or after the subcommand, --json FILE or '-', and where each file went."""

from __future__ import annotations

import logging
import shutil

import pytest

from caramel import cli

from tests.conftest import REPO

MUL1 = str(REPO / "programs" / "Mul_4L_1c")
MUL2 = str(REPO / "programs" / "Mul_4L_2c")


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("where", ["before", "after"])
@pytest.mark.parametrize("flag,level", [("-q", logging.WARNING), ("--quiet", logging.WARNING), ("-v", logging.DEBUG),
                                        ("--verbose", logging.DEBUG), (None, logging.INFO)])
def test_quiet_and_verbose_work_before_and_after_the_subcommand(monkeypatch, where, flag, level):
    seen = []
    monkeypatch.setattr(cli, "cmd_validate", lambda args: seen.append(logging.getLogger("caramel").level) or 0)
    argv = ["validate", MUL2]
    if flag:
        argv = [flag, *argv] if where == "before" else [*argv, flag]
    assert cli.main(argv) == 0
    assert seen == [level]


def test_invalid_program_is_bad_input_on_every_command(capsys, tmp_path):
    """validate, stats... an invalid program exits 2 wherever it is read (validate used to say 1)."""
    d = tmp_path / "Mul_4L_2c"
    shutil.copytree(MUL2, d)
    (d / "instructions1").write_text("Instruction Stream 1:\n" + "neg r1: r0 | 1\n")
    for argv in (["validate", d], ["plan", d], ["run", d, "--n", "256", "--backend", "cpu"]):
        code, _, err = run(capsys, *argv, "--no-cache", "-q")
        assert code == 2, (argv, err)


def test_a_failed_check_exits_1(capsys, tmp_path):
    check = tmp_path / "bad.toml"
    text = (REPO / "caramel" / "checks" / "Mul.toml").read_text()
    assert 'formula = "x * y"' in text
    check.write_text(text.replace('formula = "x * y"', 'formula = "x * y + 1"'))
    code, out, err = run(capsys, "run", MUL1, "--n", "256", "--backend", "cpu", "--check", check, "-q")
    assert code == 1 and "FAIL" in out, err


def test_usage_errors_exit_2_everywhere(capsys):
    for argv in ([], ["frobnicate"], ["validate"], ["run", MUL1, "--backend", "tpu"], ["keys", MUL1],
                 ["plan", MUL1, "--max-outputs", "0"], ["profile", MUL1, "--warmup", "-1"]):
        assert run(capsys, *argv)[0] == 2, argv


def test_validate_and_plan_say_where_they_wrote(capsys, tmp_path):
    code, out, _ = run(capsys, "validate", MUL2, "-q", "--json", tmp_path / "v.json")
    assert code == 0 and f"results: written to {tmp_path / 'v.json'}" in out
    code, out, _ = run(capsys, "plan", MUL2, "-q", "--json", tmp_path / "p.json", "--dag-json", tmp_path / "g.json",
                       "--dot", tmp_path / "g.dot")
    assert code == 0
    for name in ("p.json", "g.json", "g.dot"):
        assert f"written to {tmp_path / name}" in out


def test_json_needs_a_file_name_or_dash(capsys):
    """``--json`` alone is a usage error (it used to swallow the next word as the file name on some
    subcommands and not on others)."""
    code, _, err = run(capsys, "validate", MUL2, "--json")
    assert code == 2 and "expected one argument" in err
