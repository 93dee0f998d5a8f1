"""``python -m bench coldstart``'s steps and checks with a stand-in for ``caramel`` (its runs need a GPU): with
``--rounds`` every round's figures are recorded and the checks take the medians."""

from __future__ import annotations

import json
import subprocess

from bench import coldstart
from bench.harness import Record

DIGEST = "output digest (sha256): " + "ab" * 32


def _run(monkeypatch, tmp_path, walls: list[float], *args: str) -> tuple[int, dict, list[list[str]]]:
    """coldstart.main(args) with each ``caramel`` call taking the next of ``walls`` seconds; (exit status, record,
    the calls' arguments)."""
    calls: list[list[str]] = []
    left = iter(walls)

    def caramel(argv, env, timeout):
        calls.append(list(argv))
        return next(left), subprocess.CompletedProcess(argv, 0, stdout=DIGEST + "\ntime: load 0.1 s\n", stderr="")

    monkeypatch.setattr(coldstart, "caramel", caramel)
    monkeypatch.setattr(coldstart, "program_path", lambda name: name)
    monkeypatch.setattr(coldstart, "Record", lambda command, argv, backend: Record(command, argv))  # no GPU to name
    path = tmp_path / "record.json"
    rc = coldstart.main([*args, "--program", "Prog", "--new", "Other", "--json", str(path)])
    return rc, json.loads(path.read_text()), calls


def test_rounds_record_every_round_and_check_the_medians(monkeypatch, tmp_path):
    """Three rounds (cold, again, the new program's first and second run each), then compile and the run after it:
    a cold run over the limit in one round and a ratio over 2 in another pass on their medians (9.5 s, 2.0x)."""
    walls = [12, 3, 8, 4] + [9, 3, 9, 3] + [9.5, 3, 7, 4] + [20, 3]
    rc, doc, calls = _run(monkeypatch, tmp_path, walls, "--rounds", "3")
    figures = {f["what"]: f["value"] for f in doc["figures"]}
    assert rc == 0 and doc["failures"] == [] and len(calls) == 14
    assert [c[0] for c in calls] == ["run"] * 12 + ["compile", "run"]
    assert [figures[f"cold #{r}: caramel run Prog"] for r in (1, 2, 3)] == [12, 9, 9.5]
    assert [figures[f"Other (not seen before): first run / second run #{r}"] for r in (1, 2, 3)] == [2.0, 3.0, 1.75]
    assert figures["cold run within 10 s (median of the rounds)"] == "ok"


def test_a_median_over_the_limit_fails(monkeypatch, tmp_path):
    """Two rounds of three over the limit fail the cold check; one round has no marks and checks its own figures."""
    walls = [12, 3, 8, 4] + [11, 3, 8, 4] + [9, 3, 8, 4] + [20, 3]
    rc, doc, _ = _run(monkeypatch, tmp_path, walls, "--rounds", "3")
    assert rc == 1 and doc["failures"] == ["cold run within 10 s (median of the rounds) (11.00 s)"]
    rc, doc, calls = _run(monkeypatch, tmp_path, [9, 3, 9, 3, 20, 3])
    figures = {f["what"]: f["value"] for f in doc["figures"]}
    assert rc == 1 and len(calls) == 6 and figures["cold: caramel run Prog"] == 9
    assert doc["failures"] == ["Other: first run within 2x its second (3.00x)"]
