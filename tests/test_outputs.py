"""What the commands write and log: --json on every command, DAG export, --dot limits, plots,
traces (stream rows, collective flows), logging levels, atomic files."""

from __future__ import annotations

import json
import logging

import networkx as nx
import pytest

from caramel.cli import main
from caramel.errors import CaramelError
from caramel.scaling import ScalingPoint, ScalingResult, bar_split, plot_format, plot_scaling, scaling_trace

from tests.conftest import REPO

MUL = str(REPO / "programs" / "Mul_4L_2c")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("command", ["validate", "stats", "plan"])
def test_json_means_the_same_on_every_command(capsys, tmp_path, command):
    code, out, err = run(capsys, command, MUL, "-q", "--json", "-")
    assert code == 0 and err.strip()  # the text on stderr
    printed = json.loads(out)
    code, out2, _ = run(capsys, command, MUL, "-q", "--json", str(tmp_path / "r.json"))
    assert code == 0 and out2.strip() and not out2.lstrip().startswith("{")  # the text, and the file
    written = json.loads((tmp_path / "r.json").read_text())
    written.pop("timings", None), printed.pop("timings", None)  # plan build times differ run to run
    assert written == printed


def test_validate_json_lists_the_problems(capsys, tmp_path):
    import shutil

    d = tmp_path / "Mul_4L_2c"
    shutil.copytree(MUL, d)
    (d / "instructions1").write_text("Instruction Stream 1:\n" + "neg r1: r0 | 1\n" * 3)
    code, out, _ = run(capsys, "validate", str(d), "-q", "--no-cache", "--json", "-")
    data = json.loads(out)
    assert code == 2 and data["ok"] is False and data["problems"]


def test_dag_json_reloads_with_networkx(capsys, tmp_path):
    code, _, _ = run(capsys, "plan", MUL, "-q", "--dag-json", str(tmp_path / "g.json"))
    assert code == 0
    graph = nx.node_link_graph(json.loads((tmp_path / "g.json").read_text()), edges="edges")
    assert graph.number_of_nodes() == 180 and nx.is_directed_acyclic_graph(graph)
    assert {d["dep"] for _, _, d in graph.edges(data=True)} >= {"raw", "comm"}
    assert graph.nodes["0:0"]["chip"] == 0 and graph.nodes["0:0"]["text"]


def test_dot_refuses_large_programs_before_writing(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr("caramel.cli.DOT_MAX_NODES", 100)
    target = tmp_path / "g.dot"
    code, out, err = run(capsys, "plan", MUL, "-q", "--dot", str(target))
    assert code == 2 and "too many for Graphviz" in err and not target.exists()
    assert list(tmp_path.iterdir()) == []


def _result() -> ScalingResult:
    points = [ScalingPoint("F_1c", 1, 10.0, 9.0, 11.0, 3, 0, 0, 12.0, 0.0),
              ScalingPoint("F_2c", 2, 6.0, 5.5, 7.0, 3, 4, 4096, 4.0, 4.0),
              ScalingPoint("F_4c", 4, 4.0, 3.5, 4.5, 3, 6, 8192, 1.0, 3.0)]
    trace = [(2, 0, "chip 0 ntt level 0", False, 0.0, 1.0, 0, ()),
             (2, 0, "comm level 1: 1 collective(s)", True, 1.0, 0.5, 1, ((1, 7),)),
             (2, 1, "comm level 1: 1 collective(s)", True, 1.2, 0.3, 1, ((1, 7),)),
             (2, 1, "chip 1 ntt level 2", False, 1.5, 1.0, 0, ())]
    return ScalingResult("programs/F", 1024, "exact", "cpu-plan", "host", "wall clock", "today", points, trace)


def test_bars_split_the_replay_in_the_measured_proportion():
    """The plot's bars show the replay (median) split as compute : communication were measured in
    the instrumented run (not, say, the raw compute ms with the rest called communication)."""
    import dataclasses

    for p in _result().points:
        compute, comm = bar_split(p)
        assert compute + comm == pytest.approx(p.median_ms)
        if p.comm_ms == 0:
            assert (compute, comm) == (p.median_ms, 0.0)
        else:
            assert compute / comm == pytest.approx(p.compute_ms / p.comm_ms)
    point = _result().points[1]  # compute 4 ms, comm 4 ms measured; replay 6 ms: 3 + 3, not 4 + 2
    assert bar_split(point) == pytest.approx((3.0, 3.0))
    assert bar_split(dataclasses.replace(point, compute_floor_ms=1.0, comm_wait_ms=3.0)) == pytest.approx((1.5, 4.5))
    assert bar_split(dataclasses.replace(point, compute_floor_ms=0.0, comm_wait_ms=0.0)) == (6.0, 0.0)


@pytest.mark.parametrize("ext,magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_plot_format_follows_the_extension(tmp_path, ext, magic):
    pytest.importorskip("matplotlib")
    import matplotlib

    backend = matplotlib.get_backend()
    path = tmp_path / f"s{ext}"
    plot_scaling(_result(), path)
    assert path.read_bytes().startswith(magic)
    assert matplotlib.get_backend() == backend  # the global backend is left alone
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_plot_refuses_unknown_extensions():
    with pytest.raises(CaramelError, match="must end in"):
        plot_format("scaling.jpeg")


def test_trace_rows_per_device_and_stream_and_collective_flows():
    events = scaling_trace(_result())["traceEvents"]
    rows = {(e["pid"], e["tid"]) for e in events if e["ph"] == "X"}
    assert rows == {(0, 0), (0, 1), (1, 0), (1, 1)}
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names[(1, 1)] == "stream 1"
    flows = [e for e in events if e["ph"] in ("s", "f")]
    assert [e["ph"] for e in flows] == ["s", "f"] and flows[0]["id"] == flows[1]["id"]
    assert (flows[0]["pid"], flows[1]["pid"]) == (0, 1)


def test_logging_levels_follow_v_and_q(capsys, monkeypatch):
    """-q / (nothing) / -v set the caramel logger to WARNING / INFO / DEBUG while the command runs,
    and main() leaves the logger as it found it."""
    import caramel.cli

    logger = logging.getLogger("caramel")
    before = (logger.level, logger.propagate, list(logger.handlers))
    seen = []
    real = caramel.cli._load
    monkeypatch.setattr(caramel.cli, "_load", lambda args: (seen.append(logger.getEffectiveLevel()), real(args))[1])
    for flag in ("-q", None, "-v"):
        run(capsys, "validate", MUL, *([flag] if flag else []))
    assert seen == [logging.WARNING, logging.INFO, logging.DEBUG]
    assert (logger.level, logger.propagate, list(logger.handlers)) == before


def test_profile_logs_phases_unless_quiet(capsys, tmp_path):
    args = ["profile", str(REPO / "programs" / "Mul_4L"), "--gpus", "1,2", "--n", "1024", "--repeats", "1",
            "--backend", "cpu-plan", "--trace", str(tmp_path / "t.json")]
    code, out, err = run(capsys, *args)
    assert code == 0 and "device(s): loading" in err
    code, out, err = run(capsys, *args, "-q")
    assert code == 0 and err == ""
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]


# Words that fit the machine: on the CPU, devices and calls (not GPUs and launches), no roofline.


def test_cpu_tables_say_devices_and_calls(capsys):
    code, out, _ = run(capsys, "profile", str(REPO / "programs" / "Mul_4L_1c"), "--n", "256", "--backend", "cpu-plan",
                       "--repeats", "1", "-q")
    assert code == 0
    head = next(line for line in out.splitlines() if line.startswith("mode "))
    assert "calls" in head.split() and "launches" not in head
    assert "GB/s" not in out and "no roofline on the CPU" in out
    assert "graph+fusion can be slower than graph" in " ".join(out.split())


def test_cpu_scaling_tables_say_devices(capsys):
    code, out, _ = run(capsys, "profile", str(REPO / "programs" / "Mul_4L"), "--gpus", "1,2", "--n", "256",
                       "--backend", "cpu-plan", "--repeats", "1", "--throughput", "-q")
    assert code == 0
    heads = [line for line in out.splitlines() if "program" in line and "speedup" in line]
    assert len(heads) == 2 and all(h.split()[0] == "devices" for h in heads) and "GPUs" not in out


def test_gpu_tables_keep_gpus_and_launches():
    from caramel.profile import words

    assert (words("gpu").devices, words("gpu").calls) == ("GPUs", "launches")
    assert (words("cpu-plan").devices, words("cpu-plan").calls) == ("devices", "calls")
