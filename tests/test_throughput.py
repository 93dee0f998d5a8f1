"""`caramel profile PROGRAM --throughput` (:func:`caramel.profile.profile_throughput`) on cpu-plan: both
rates, the time of each phase of an instance, the table and the JSON record; every instance's digest that
of its single run."""

from __future__ import annotations

import json

from caramel.api import run_program
from caramel.cli import main
from caramel.parse import load_program
from caramel.profile import INSTANCE_PHASES, profile_throughput, render_throughput

from tests.conftest import REPO

ROT1 = REPO / "programs" / "MulRotate_4L_1c"
N = 1024


def test_profile_throughput_rates_and_digests():
    program = load_program(ROT1, progress=False)
    result = profile_throughput(program, n=N, backend="cpu-plan", seed=4, instances=3)
    serving, end = result.rates
    assert (serving.name, end.name) == ("serving", "end to end") and serving.shared == ()  # no plaintexts here
    assert all(r.instances == 3 and r.per_second > 0 and set(r.phases_s) == set(INSTANCE_PHASES) for r in result.rates)
    assert end.phases_s["encrypt"] > 0 and end.phases_s["replay"] > 0
    singles = [run_program(program, n=N, backend="cpu", seed=4 + i, check=None, key_seed=4).digest for i in range(3)]
    assert serving.digests == singles  # the same instances encrypted ahead
    assert end.digests == [run_program(program, n=N, backend="cpu", seed=4 + i, key_seed=4).digest for i in range(3)]
    text = render_throughput(result)
    assert "serving" in text and "end to end" in text and "replay ms" in text


def test_cli_profile_throughput_table_and_json(capsys):
    code = main(["profile", str(ROT1), "--n", str(N), "--backend", "cpu-plan", "--throughput", "--repeats", "2", "-q",
                 "--json", "-"])
    out, err = capsys.readouterr()
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "throughput" and set(doc["per_second"]) == {"serving", "end to end"}
    assert [r["instances"] for r in doc["rates"]] == [2, 2] and "environment" in doc
    assert "instances/s" in err and "encrypt ms" in err
