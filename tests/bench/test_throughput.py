"""bench/throughput.py at a small N on cpu-plan, with this tree as its own base: every figure taken, the
batch's digests equal to single runs' and the same in both trees, one JSON record."""

from __future__ import annotations

import json

from tests.conftest import REPO


def test_throughput_bench_runs_both_trees_and_checks_digests(tmp_path, capsys, monkeypatch):
    from bench.throughput import main

    monkeypatch.setenv("BENCH_COMMIT", "c0ffee1")  # a device's copy names its commit so (bench.harness.commit)

    out = tmp_path / "tp"
    code = main(["--out", str(out), "--program", str(REPO / "programs" / "MulRotate_4L_1c"), "--n", "1024",
                 "--backend", "cpu-plan", "--batch", "3", "--instances", "3", "--rounds", "1", "--singles", "2",
                 "--base", str(REPO)])
    text = capsys.readouterr().out
    assert code == 0, text
    record = json.loads((out / "throughput.json").read_text())
    assert set(record["trees"]) == {"before", "after"} and record["checks"]["singles_equal"] is True
    assert record["checks"]["before_equal_after"] is True and len(record["checks"]["singles"]) == 2
    after = record["trees"]["after"]
    for key in ("serving_per_second", "end_to_end_per_second", "batch_per_second", "every_input_per_second"):
        assert after[key] > 0, key
    assert record["trees"]["before"]["batch_per_second"] > 0 and len(after["batch_digests"]) == 3
    assert set(after["phases_s"]["serving"]) >= {"encrypt", "upload", "replay", "download", "digest", "check"}
    assert all(c["exit"] == 0 for c in record["commands"]) and "environment" in record
    assert after["commit"] == "c0ffee1"
    assert "serving instances/s" in text and "batch == single runs: yes" in text


def test_throughput_bench_takes_the_batch_in_several_processes(tmp_path, capsys):
    """``--nproc 2``: the batch in one process, under ``caramel launch --nproc 2``, and twice the batch under it (each
    process the one process's load), alternating; each round's rate, the ratios of the medians, and every digest of
    an instance the same in each form."""
    from bench.throughput import main

    out = tmp_path / "tp"
    code = main(["--out", str(out), "--program", str(REPO / "programs" / "MulRotate_4L_1c"), "--n", "1024",
                 "--backend", "cpu-plan", "--batch", "4", "--instances", "2", "--singles", "1", "--skip-family",
                 "--nproc", "2", "--nproc-rounds", "2"])
    text = capsys.readouterr().out
    assert code == 0, text
    record = json.loads((out / "throughput.json").read_text())
    scaled = record["processes"]
    assert scaled["nproc"] == 2 and scaled["rounds"] == 2 and record["checks"]["processes_equal"] is True
    assert set(scaled["per_second"]) == {"one", "launched", "launched_each"} and scaled["batch_each"] == 8
    assert all(len(v) == 2 and all(x > 0 for x in v) for v in scaled["per_second"].values())
    assert scaled["ratio"] == scaled["medians"]["launched"] / scaled["medians"]["one"] > 0
    assert scaled["ratio_each"] == scaled["medians"]["launched_each"] / scaled["medians"]["one"] > 0
    launched = [c for c in record["commands"] if " launch --nproc 2 -- run " in c["command"]]
    assert len(launched) == 4 and all(c["exit"] == 0 for c in launched)
    assert sum(" --batch 8 " in c["command"] for c in launched) == 2  # each process the one process's 4
    each = json.loads((out / "processes-launched_each-0.json").read_text())
    assert [r["rank"] for r in each["instances"]] == [0, 1] * 4
    assert "2 processes, --batch 8 (4 each)" in text and "2 processes == one: yes" in text
