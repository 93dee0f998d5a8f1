"""Tests of the ``caramel`` command, run in-process through ``caramel.cli.main``."""

from __future__ import annotations

import json
import shutil

import pytest

from caramel import __version__
from caramel.cli import main

from tests.conftest import REPO, SHARED_PROGRAMS

ADD = SHARED_PROGRAMS / "Add_4L_2c"
pytestmark = pytest.mark.skipif(not ADD.is_dir(), reason="shared corpus not found")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def broken_copy(tmp_path):
    d = tmp_path / "Add_4L_2c"
    shutil.copytree(ADD, d)
    for f in d.iterdir():
        f.chmod(0o644)
    return d


def test_validate_ok(capsys):
    code, out, err = run(capsys, "validate", str(ADD), "-q")
    assert (code, out, err) == (0, "ok: 40 instructions on 2 chips\n", "")


def test_validate_reports_every_problem_and_exits_2(capsys, tmp_path):
    """An invalid program is bad input, like one that does not parse: exit 2."""
    d = broken_copy(tmp_path)
    text = (d / "instructions0").read_text()
    text = text.replace("add r2: r0[X], r1 | 2", "add r2: r0[X], r7 | 2")
    text = text.replace("load r1: i3(2){F}", "load r1: i9(2){F}")
    (d / "instructions0").write_text(text)
    code, out, err = run(capsys, "validate", str(d), "--no-cache", "-q")
    assert code == 2 and err == ""
    assert out.splitlines() == [
        f"{d}/instructions0:3:10: load of i9(2): no manifest entry provides it and no earlier store or spill of "
        "this stream wrote it",
        f"{d}/instructions0:4:16: register r7 is read before it is written",
        f"2 error(s) in {d}",
    ]


def test_validate_limit(capsys, tmp_path):
    d = broken_copy(tmp_path)
    (d / "instructions1").write_text("Instruction Stream 1:\n" + "neg r1: r0 | 1\n" * 5)
    code, out, _ = run(capsys, "validate", str(d), "--no-cache", "-q", "--limit", "2")
    assert code == 2
    assert out.splitlines()[-1] == f"2+ error(s) in {d} (stopped at 2; use --limit to see more)"


def test_parse_error_exits_2_without_traceback(capsys, tmp_path):
    d = broken_copy(tmp_path)
    (d / "instructions1").write_bytes(b"Instruction Stream 1:\nadd r1: r0 |")
    code, out, err = run(capsys, "validate", str(d), "--no-cache", "-q")
    assert code == 2 and out == ""
    assert err.startswith(f"caramel: error: {d}/instructions1:2:")
    assert "Traceback" not in err


def test_missing_program_exits_2(capsys, tmp_path):
    code, out, err = run(capsys, "stats", str(tmp_path / "nope"))
    assert (code, out, err) == (2, "", f"caramel: error: {tmp_path}/nope: no such file or folder\n")


def test_stats_table_has_a_column_per_chip(capsys):
    code, out, _ = run(capsys, "stats", str(ADD), "--n", "4096", "-q")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Add_4L_2c: 40 instructions on 2 chip(s), N = 4096"
    assert lines[2].split() == ["chip", "0", "chip", "1", "total"]
    rows = {line[:16].strip(): line[16:].split() for line in lines[4:] if line and not line.startswith("-")}
    assert rows["load"] == ["8", "8", "16"]
    assert rows["add"] == ["8", "8", "16"]
    assert rows["store"] == ["4", "4", "8"]
    assert rows["instructions"] == ["20", "20", "40"]
    assert rows["limbs touched"] == ["2", "2", "4"]
    # 16 limb reads + 12 writes per chip (loads 8 reads 8 writes, adds 16 reads 8 writes, stores 4+4) at 16 KiB
    assert rows["memory traffic"] == ["768", "KiB", "768", "KiB", "1.5", "MiB"]


def test_stats_json(capsys):
    code, out, _ = run(capsys, "stats", str(SHARED_PROGRAMS / "Rescale_4L_2c"), "--json", "-", "-q", "--n", "1024")
    assert code == 0
    data = json.loads(out)
    assert data["name"] == "Rescale_4L_2c" and data["chips"] == 2 and data["n"] == 1024
    chip0, chip1 = data["per_chip"]
    # Rescale on 2 chips: chip 1 owns the top limb 3 and sends it (INTT'd) for both components to chip 0.
    assert (chip0["dis"], chip0["rcv"], chip1["dis"], chip1["rcv"]) == (0, 2, 2, 0)
    assert (chip0["limbs_received"], chip1["limbs_sent"]) == (2, 2)
    assert (chip0["comm_bytes"], chip1["comm_bytes"]) == (2 * 1024 * 4, 0)
    assert data["totals"]["comm_bytes"] == 2 * 1024 * 4
    assert data["totals"]["instructions"] == chip0["instructions"] + chip1["instructions"]


@pytest.mark.parametrize("command", ["validate", "stats", "run", "keys", "plan", "profile"])
def test_help_of_every_subcommand(capsys, command):
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: caramel {command} ")
    assert "PROGRAM" in out
    assert "exit status: 0 success, 1 a decryption check failed, 2 bad input" in out.replace("\n", " ")


def test_top_level_help_and_version(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0 and all(c in out for c in ("validate", "stats", "run", "plan", "profile"))
    assert run(capsys, "--version")[:2] == (0, f"caramel {__version__}\n")


def test_usage_errors_exit_2(capsys):
    assert run(capsys)[0] == 2
    assert run(capsys, "frobnicate", str(ADD))[0] == 2
    code, _, err = run(capsys, "stats", str(ADD), "--n", "1000")
    assert code == 2 and "N must be a power of two" in err


def test_profile_runs_on_the_cpu_plan_engine(capsys):
    code, out, _ = run(capsys, "profile", str(ADD), "--n", "256", "--backend", "cpu-plan", "--repeats", "1", "-q")
    assert code == 0, out
    assert all(v in out for v in ("eager", "graph", "graph+fusion", "time per kernel kind"))


def test_run_checks_by_decryption(capsys):
    code, out, _ = run(capsys, "run", str(REPO / "programs" / "Mul_4L_2c"), "--n", "1024", "-q", "--seed", "4")
    assert code == 0, out
    assert "backend cpu" in out and "PASS z: precision" in out and "output digest (sha256): " in out


@pytest.mark.parametrize("backend", ["cpu", "cpu-plan"])
def test_run_writes_the_load_and_plan_entries_by_its_end(capsys, fresh_cache, backend):
    """A first run writes its load-cache entry after the plan (the executor's plan thread), or at its end."""
    code, out, _ = run(capsys, "run", str(REPO / "programs" / "Mul_4L_2c"), "--n", "256", "-q", "--no-check",
                       "--backend", backend)
    assert code == 0, out
    suffixes = sorted(p.suffix for p in fresh_cache.iterdir())
    assert suffixes == ([".entry", ".plan", ".valid"] if backend == "cpu-plan" else [".entry", ".valid"]), suffixes


def test_run_fails_when_the_check_fails(capsys, tmp_path):
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(
        '[inputs.x]\nkind = "ciphertext"\nscale = "S"\n[inputs.y]\nkind = "ciphertext"\nscale = "S"\n'
        '[outputs.z]\nformula = "x + y"\nscale = "S**2 / q[L-1]"\ntolerance_bits = 10\n'
    )
    code, out, _ = run(capsys, "run", str(REPO / "programs" / "Mul_4L_2c"), "--n", "1024", "-q", "--check", str(wrong))
    assert code == 1 and "FAIL z" in out


def test_run_digest_is_reproducible_from_the_seed(capsys):
    args = ("run", str(REPO / "programs" / "PolyX8_4L_4c"), "--n", "256", "-q", "--no-check")
    digests = [run(capsys, *args, "--seed", s)[1].split("sha256): ")[1].split()[0] for s in ("1", "1", "2")]
    assert digests[0] == digests[1] != digests[2]


def test_plan_prints_kernels_and_exports(capsys, tmp_path):
    code, out, _ = run(capsys, "plan", str(REPO / "programs" / "MulRotate_4L_1c"), "-q", "--json", str(tmp_path / "p.json"),
                       "--dot", str(tmp_path / "g.dot"), "--dag-json", str(tmp_path / "g.json"))
    assert code == 0, out
    assert "kernels" in out and "critical path" in out
    assert json.loads((tmp_path / "p.json").read_text())
    assert json.loads((tmp_path / "g.json").read_text())
    assert (tmp_path / "g.dot").read_text().startswith("digraph")


def test_stats_and_plan_count_traffic_with_one_model():
    """``caramel stats`` and ``caramel plan`` report the same per-instruction traffic."""
    from caramel.parse import load_program
    from caramel.plan import build_plan
    from caramel.plan.report import plan_stats
    from caramel.stats import program_stats

    program = load_program(SHARED_PROGRAMS / "AddScalar_10L_2c")  # scalar loads (loas) on two chips
    stats = program_stats(program, n=1024)
    plan = plan_stats(build_plan(program), program, n=1024)
    assert stats.total("traffic_bytes") == plan["instruction_bytes"], f"stats {stats.total('traffic_bytes')}, plan {plan}"


# ----------------------------------------------------------------------------------------------
# Issue 12: argument checks before any work, the run header, Ctrl-C
# ----------------------------------------------------------------------------------------------

MUL2 = str(SHARED_PROGRAMS / "Mul_4L_2c")


@pytest.mark.parametrize("n", ["8", "16", "3000", "131072", "x", "-4"])
@pytest.mark.parametrize("command", ["run", "keys", "profile"])
def test_n_must_be_a_supported_power_of_two(capsys, tmp_path, command, n):
    """Every N that --help allows makes its keys (the ephemeral secret has Hamming weight 32, so
    N = 16, which stats and plan accept, is refused here at once)."""
    code, _, err = run(capsys, command, MUL2, "--n", n, "--out", str(tmp_path / "k"))
    assert code == 2 and "power of two from 32 to 65536" in err and "Traceback" not in err
    assert not (tmp_path / "k").exists()


def test_the_smallest_n_that_help_allows_runs(capsys):
    code, out, err = run(capsys, "run", str(REPO / "programs" / "Mul_4L_1c"), "--n", "32", "--backend", "cpu", "-q")
    assert code == 0, err


@pytest.mark.parametrize("command,option", [("run", "--seed"), ("run", "--key-seed"), ("profile", "--seed"),
                                            ("keys", "--seed")])
@pytest.mark.parametrize("value", ["-1", "x", str(2**63)])
def test_seeds_must_be_in_range(capsys, tmp_path, command, option, value):
    code, _, err = run(capsys, command, MUL2, option, value, "--out", str(tmp_path / "k"))
    assert code == 2 and "expected a seed from 0 to 2^63 - 1" in err and "Traceback" not in err


def test_gpus_with_the_cpu_backend_is_refused(capsys):
    code, out, err = run(capsys, "run", MUL2, "--n", "1024", "--backend", "cpu", "--gpus", "2")
    assert code == 2 and "no effect with backend 'cpu'" in err and "output digest" not in out


def test_more_devices_than_chips_is_refused(capsys):
    code, _, err = run(capsys, "run", MUL2, "--n", "1024", "--backend", "cpu-plan", "--gpus", "16")
    assert code == 2 and "16 devices for Mul_4L_2c, a 2-chip program" in err


def test_run_header_says_how_many_devices_ran(capsys):
    code, out, _ = run(capsys, "run", MUL2, "--n", "1024", "--backend", "cpu-plan", "--gpus", "2", "-q")
    assert code == 0 and "backend cpu-plan on 2 device(s)" in out
    code, out, _ = run(capsys, "run", MUL2, "--n", "1024", "--backend", "cpu", "-q")
    assert code == 0 and "backend cpu on 1 device(s)" in out


def test_plot_without_matplotlib_fails_before_any_work(capsys, monkeypatch, tmp_path):
    import importlib.util

    import caramel.scaling

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    monkeypatch.setattr(caramel.scaling, "profile_scaling", lambda *a, **k: pytest.fail("profiled before the check"))
    code, _, err = run(capsys, "profile", str(SHARED_PROGRAMS / "Mul_4L"), "--gpus", "1,2", "--plot",
                       str(tmp_path / "s.png"))
    assert code == 2 and "--plot needs matplotlib" in err
    code, _, err = run(capsys, "profile", MUL2, "--plot", str(tmp_path / "s.png"))
    assert code == 2 and "give --gpus too" in err


def test_dot_of_a_too_large_program_leaves_no_file(capsys, monkeypatch, tmp_path):
    from caramel.plan import dag

    real = dag.to_dot
    monkeypatch.setattr(dag, "to_dot", lambda graph, program, max_nodes=2000: real(graph, program, max_nodes=10))
    target = tmp_path / "g.dot"
    code, _, err = run(capsys, "plan", MUL2, "--dot", str(target))
    assert code == 2 and "too many for DOT" in err and not target.exists()


def test_a_second_ctrl_c_while_reporting_the_first_is_no_traceback(capsys, monkeypatch):
    import caramel.cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(caramel.cli, "cmd_validate", interrupted)
    calls = []
    real_print = print

    def print_interrupted(*a, **k):  # the second Ctrl-C arrives while the first is reported
        if not calls:
            calls.append(1)
            raise KeyboardInterrupt
        real_print(*a, **k)

    monkeypatch.setattr("builtins.print", print_interrupted)
    parser = caramel.cli.build_parser()
    monkeypatch.setattr(caramel.cli, "build_parser", lambda: parser)
    parser._subparsers._group_actions[0].choices["validate"].set_defaults(func=interrupted)
    assert main(["validate", MUL2]) == 130
