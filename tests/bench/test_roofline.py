"""bench/roofline.py without a GPU: the plan's kernel costs refitted from a roofline's records (made here from the
current lines), and ncu's counters summed by kernel family."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from caramel.parse import load_program
from caramel.plan.cost import estimate_us, family
from caramel.plan_cache import cached_plan

from bench.roofline import METRICS, ncu_family, ncu_summary
from tests.conftest import REPO

PROGRAM = str(REPO / "programs" / "BootstrapModRaise_4L_2c")


def fit(tmp_path, records):
    path = tmp_path / "roofline.json"
    path.write_text(json.dumps(records))
    return subprocess.run([sys.executable, "-m", "bench", "roofline", "--fit", str(path), "--program", PROGRAM],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)


def test_a_table_from_matching_records_and_exit_2_on_a_stranger(tmp_path):
    kernels = cached_plan(load_program(PROGRAM)).chips[0].kernels
    records = [{"index": i, "kind": family(k), "rows": len(k.rows), "dur_ms": estimate_us(k) / 1000}
               for i, k in enumerate(kernels)]
    r = fit(tmp_path, {"figures": [], "kernels": records})  # a record of `python -m bench roofline`
    assert r.returncode == 0, r.stderr
    fitted = {line.split('"')[1] for line in r.stdout.splitlines() if line.startswith('    "')}
    assert fitted and fitted <= {family(k) for k in kernels}
    assert all("R^2 1.000" in line for line in r.stdout.splitlines() if line.startswith('    "'))
    records[0]["rows"] += 1
    r = fit(tmp_path, records)  # a bare list of records
    assert r.returncode == 2 and "does not match the plan" in r.stderr


def test_ncu_rows_summed_by_family(tmp_path):
    head = ["ID", "Kernel Name", *METRICS]
    units = ["", "", *("" for _ in METRICS)]

    def row(i, name, us, smem):
        values = {"gpu__time_duration.sum": us * 1000, "dram__bytes.sum": 1e6, "launch__shared_mem_per_block_dynamic":
                  smem}
        return [str(i), name, *(f"{values.get(m, 50)}" for m in METRICS)]

    rows = [head, units, row(0, "ntt_fwd_col(...)", 10, 0), row(1, "ntt_fwd_col(...)", 30, 0),
            row(2, "fused_v3s0(...)", 5, 0), row(3, "fused_v3s0_t(...)", 20, 4096)]
    text = "==PROF== Connected\n" + "".join(",".join(f'"{c}"' for c in r) + "\n" for r in rows)
    (tmp_path / "raw.csv").write_text(text)
    out = ncu_summary(str(tmp_path / "raw.csv")).splitlines()
    by = {line.split()[0]: line.split() for line in out[1:]}
    assert by["ntt"][2] == "2" and by["ntt"][3] == "0.040"  # "ntt column": 2 kernels, 40 us
    assert by["epilogue"][1] == "1" and by["elementwise"][1] == "1"
    assert out[-1].split()[:3] == ["total", "4", "0.065"]
    assert ncu_family("base_convert_tc_3", 0) == "baseconv" and ncu_family("weird", 0).startswith("other")
