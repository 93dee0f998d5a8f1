"""caramel.outfiles and every output option of every command: only regular files of this user are
written (a FIFO, a device, a folder, a symbolic link is refused, never replaced), every path is
checked before any work, two outputs on one path are refused, '-' means stdout where allowed,
and every error names the user's path (never a temporary file)."""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat

import numpy as np
import pytest

from caramel import cli
from caramel.outfiles import Output, OutputError, check_output, check_outputs, write_output

from tests.conftest import REPO

MUL = str(REPO / "programs" / "Mul_4L_2c")
MUL1 = str(REPO / "programs" / "Mul_4L_1c")
FAMILY = str(REPO / "programs" / "Mul_4L")

#: Every output option of every subcommand, with the arguments that make the command run (small N).
OUTPUTS = [
    ("validate", "--json", [MUL]),
    ("stats", "--json", [MUL, "--n", "256"]),
    ("plan", "--json", [MUL]),
    ("plan", "--dag-json", [MUL]),
    ("plan", "--dot", [MUL]),
    ("run", "--json", [MUL1, "--n", "256", "--backend", "cpu"]),
    ("run", "--save-outputs", [MUL1, "--n", "256", "--backend", "cpu"]),
    ("profile", "--json", [MUL1, "--n", "256", "--backend", "cpu-plan", "--repeats", "1"]),
    ("profile", "--trace", [MUL1, "--n", "256", "--backend", "cpu-plan", "--repeats", "1"]),
    ("profile", "--plot", [FAMILY, "--gpus", "1,2", "--n", "256", "--backend", "cpu-plan", "--repeats", "1"]),
]
SUFFIX = {"--save-outputs": ".npz", "--plot": ".png"}


def _no_work(monkeypatch):
    """Any load of a program fails the test: the command must stop before any work."""
    def load(*a, **k):
        raise AssertionError("work started before the output paths were checked")

    monkeypatch.setattr(cli, "_load", load)
    monkeypatch.setattr("caramel.scaling.profile_scaling", load)


def _run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _make(kind: str, path):
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "symlink":
        target = path.parent / "victim"
        target.write_text("keep")
        path.symlink_to(target)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("making a device node needs root")
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # a /dev/null of our own


def _unchanged(kind: str, path) -> bool:
    st = os.lstat(path)
    return {"fifo": stat.S_ISFIFO, "folder": stat.S_ISDIR, "symlink": stat.S_ISLNK, "device": stat.S_ISCHR}[kind](
        st.st_mode) and (kind != "symlink" or (path.parent / "victim").read_text() == "keep")


@pytest.mark.parametrize("kind", ["fifo", "device", "folder", "symlink"])
@pytest.mark.parametrize("command,option,args", OUTPUTS, ids=[f"{c}{o}" for c, o, _ in OUTPUTS])
def test_every_output_refuses_what_is_not_a_regular_file_before_any_work(capsys, monkeypatch, tmp_path, command,
                                                                         option, args, kind):
    _no_work(monkeypatch)
    target = tmp_path / f"out{SUFFIX.get(option, '.json')}"
    _make(kind, target)
    code, out, err = _run(capsys, command, *args, "-q", option, target)
    assert code == 2 and f"{option} {target}" in err and "caramel: error:" in err, err
    assert _unchanged(kind, target)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


@pytest.mark.parametrize("command,option,args", OUTPUTS, ids=[f"{c}{o}" for c, o, _ in OUTPUTS])
def test_every_output_names_a_missing_folder_before_any_work(capsys, monkeypatch, tmp_path, command, option, args):
    _no_work(monkeypatch)
    target = tmp_path / "no" / f"out{SUFFIX.get(option, '.json')}"
    code, _, err = _run(capsys, command, *args, "-q", option, target)
    assert code == 2 and str(target) in err and "does not exist" in err and ".tmp" not in err


@pytest.mark.parametrize("first,second,args", [
    ("--save-outputs", "--json", [MUL1, "--n", "256", "--backend", "cpu"]),
    ("--json", "--dot", [MUL]), ("--dag-json", "--dot", [MUL]), ("--json", "--dag-json", [MUL]),
    ("--json", "--trace", [MUL1, "--n", "256", "--backend", "cpu-plan"]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_two_outputs_on_one_path_are_refused(capsys, monkeypatch, tmp_path, first, second, args):
    _no_work(monkeypatch)
    command = "run" if "--backend" in args and "cpu" in args and "--save-outputs" in (first, second) else (
        "profile" if "--trace" in (first, second) else "plan")
    target = tmp_path / "r.npz"
    code, _, err = _run(capsys, command, *args, "-q", first, target, second, tmp_path / "." / "r.npz")
    assert code == 2 and "both write" in err and first in err and second in err
    assert list(tmp_path.iterdir()) == []


def test_two_outputs_on_stdout_are_refused(capsys, monkeypatch):
    _no_work(monkeypatch)
    code, out, err = _run(capsys, "plan", MUL, "--json", "-", "--dot", "-")
    assert code == 2 and "both write standard output" in err and out == ""


@pytest.mark.parametrize("option,args", [("--save-outputs", [MUL1, "--n", "256", "--backend", "cpu"])])
def test_binary_outputs_refuse_stdout(capsys, monkeypatch, option, args):
    _no_work(monkeypatch)
    code, out, err = _run(capsys, "run", *args, option, "-")
    assert code == 2 and "cannot go to standard output" in err and out == ""


def test_plot_refuses_stdout_and_an_unknown_format_before_any_work(capsys, monkeypatch, tmp_path):
    _no_work(monkeypatch)
    for target, message in (("-", "cannot go to standard output"), (tmp_path / "p.gif", "must end in")):
        code, _, err = _run(capsys, "profile", FAMILY, "--gpus", "1,2", "--plot", target)
        assert code == 2 and message in err


def test_an_output_never_overwrites_a_file_the_command_reads(capsys, monkeypatch, tmp_path):
    _no_work(monkeypatch)
    inputs = tmp_path / "in.json"
    inputs.write_text("{}")
    code, _, err = _run(capsys, "run", MUL1, "--n", "256", "--inputs", inputs, "--json", inputs)
    assert code == 2 and "reads" in err and inputs.read_text() == "{}"
    program = tmp_path / "single" / "instructions0"
    program.parent.mkdir()
    program.write_text("Instruction Stream 0:\n")
    code, _, err = _run(capsys, "stats", program, "--json", program)
    assert code == 2 and "reads" in err and program.read_text() == "Instruction Stream 0:\n"


def test_an_output_inside_the_key_store_is_refused(capsys, monkeypatch, tmp_path):
    _no_work(monkeypatch)
    store = tmp_path / "keys"
    store.mkdir()
    code, _, err = _run(capsys, "run", MUL1, "--keys", store, "--json", store / "r.json")
    assert code == 2 and "folder this command reads" in err


@pytest.mark.parametrize("command,args", [("validate", [MUL]), ("stats", [MUL]), ("plan", [MUL]),
                                          ("run", [MUL1, "--n", "256", "--backend", "cpu"]),
                                          ("profile", [MUL1, "--n", "256", "--backend", "cpu-plan", "--repeats", "1"])])
def test_json_dash_is_the_result_alone_on_stdout_on_every_command(capsys, tmp_path, command, args):
    code, out, err = _run(capsys, command, *args, "-q", "--json", "-")
    assert code == 0
    assert json.loads(out)  # stdout holds the JSON and nothing else; the text went to stderr
    assert err.strip()
    code, out2, _ = _run(capsys, command, *args, "-q", "--json", tmp_path / "r.json")
    assert code == 0 and f"written to {tmp_path / 'r.json'}" in out2
    assert json.loads((tmp_path / "r.json").read_text()).keys() == json.loads(out).keys()


@pytest.mark.parametrize("command,option,args", [c for c in OUTPUTS if c[1] != "--json"],
                         ids=[f"{c}{o}" for c, o, _ in OUTPUTS if o != "--json"])
def test_every_output_written_is_named_on_stdout(capsys, tmp_path, command, option, args):
    target = tmp_path / f"out{SUFFIX.get(option, '.json')}"
    if option == "--plot":
        pytest.importorskip("matplotlib")
        if not os.path.isdir(FAMILY + "_2c"):
            pytest.skip("no family")
    code, out, err = _run(capsys, command, *args, "-q", option, target)
    assert code == 0, err
    assert f"written to {target}" in out and target.is_file() and target.stat().st_size > 0


def test_every_file_option_is_a_registered_output_or_a_known_input():
    """A new option naming a file is checked like the others: every option whose metavar names a
    file or folder is registered with cli._add_output, or is one of the inputs listed here."""
    inputs = {"--inputs", "--check", "--keys", "--out"}  # --out: a key store folder (caramel.ckks.keystore)
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        registered = {o.flag for o in p.get_default("outputs") or ()}
        for action in p._actions:
            meta = str(action.metavar or "")
            if any(w in meta for w in ("FILE", "DIR", ".npz", ".png", ".toml")):
                flag = action.option_strings[-1]
                assert flag in registered or flag in inputs, f"{name} {flag} ({meta}) is neither output nor input"


# The helper itself


def test_check_output_refuses_another_users_file(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file away")
    target = tmp_path / "theirs.json"
    target.write_text("theirs")
    os.chown(target, 65534, 65534)
    with pytest.raises(OutputError, match="belongs to another user"):
        check_output(Output("--json", str(target)))


def test_write_errors_name_the_users_path_never_the_temporary_file(tmp_path):
    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".r.json.abcd.tmp"))

    with pytest.raises(OutputError, match=r"--json .*r\.json: cannot be written \(no space left") as exc:
        write_output(tmp_path / "r.json", full, "--json")
    assert ".tmp" not in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_write_output_dash_writes_text_and_bytes_to_the_stream_given(tmp_path):
    import io

    class Stream(io.StringIO):
        buffer = io.BytesIO()

    s = Stream()
    assert write_output("-", "text\n", stdout=s) == "-" and s.getvalue() == "text\n"
    write_output("-", lambda f: np.save(f, np.arange(3)), stdout=s)
    assert s.buffer.getvalue().startswith(b"\x93NUMPY")


def test_check_outputs_compares_files_not_spellings(tmp_path):
    (tmp_path / "d").mkdir()
    a, b = Output("--json", str(tmp_path / "r.json")), Output("--trace", str(tmp_path / "d" / ".." / "r.json"))
    with pytest.raises(OutputError, match="--json and --trace both write"):
        check_outputs([a, b])
    check_outputs([a, Output("--trace", str(tmp_path / "t.json"))])
