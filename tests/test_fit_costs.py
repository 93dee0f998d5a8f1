"""scripts/fit_costs.py: the kernel-time lines refitted from a roofline's records (no GPU needed: the records are
made here from the current lines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from caramel.parse import load_program
from caramel.plan.cost import estimate_us, family
from caramel.plan_cache import cached_plan
from tests.conftest import REPO
from tests.corpus import needs, shared

pytestmark = needs("BootstrapModRaise_4L_1c")


def fit_costs(tmp_path, records):
    path = tmp_path / "roofline.json"
    path.write_text(json.dumps(records))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "fit_costs.py"), str(path), "--program",
                           str(shared("BootstrapModRaise_4L_1c"))],
                          capture_output=True, text=True, env=env, cwd=tmp_path)


def test_a_table_from_matching_records_and_exit_2_on_a_stranger(tmp_path):
    kernels = cached_plan(load_program(shared("BootstrapModRaise_4L_1c"))).chips[0].kernels
    records = [{"index": i, "kind": family(k), "rows": len(k.rows), "dur_ms": estimate_us(k) / 1000}
               for i, k in enumerate(kernels)]
    r = fit_costs(tmp_path, records)
    assert r.returncode == 0, r.stderr
    fitted = {line.split('"')[1] for line in r.stdout.splitlines() if line.startswith('    "')}
    assert fitted and fitted <= {family(k) for k in kernels}
    assert all("R^2 1.000" in line for line in r.stdout.splitlines() if line.startswith('    "'))
    records[0]["rows"] += 1
    r = fit_costs(tmp_path, records)
    assert r.returncode == 2 and "does not match the plan" in r.stderr
