"""Packaging and conventions: ``python -m caramel``, ``--version``, the check files as package data,
short reprs of large objects, family names with a hyphen, "not checked" runs."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import caramel
from caramel.ckks.check import CHECKS_DIR, check_path, family_of

from tests.conftest import REPO, caramel_cli


def test_python_dash_m_caramel_and_version():
    out = subprocess.run([sys.executable, "-m", "caramel", "--version"], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"caramel {caramel.__version__}"


def test_distribution_name_license_and_package_data():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = meta["project"]
    assert project["name"] == "caramel-fhe" and project["license"] == "Apache-2.0"
    assert project["authors"] and "Topic :: Security :: Cryptography" in project["classifiers"]  # pip show
    assert "Apache License" in (REPO / "LICENSE").read_text()
    assert any(d.startswith("tqdm") for d in project["dependencies"])
    assert "checks/*.toml" in meta["tool"]["setuptools"]["package-data"]["caramel"]
    assert all("[ctk]" in d for e in ("cuda12", "cuda13") for d in project["optional-dependencies"][e]
               if d.startswith("cupy"))


def test_check_files_live_inside_the_package():
    assert CHECKS_DIR.parent == REPO / "caramel"
    assert (CHECKS_DIR / "Mul.toml").is_file()
    assert check_path("Mul_4L_2c") == CHECKS_DIR / "Mul.toml"


def test_family_with_a_hyphen_resolves_to_its_own_check_file():
    assert family_of("MatVec16-kspass_10L_1c") == "MatVec16-kspass"
    assert check_path("MatVec16-kspass_10L_1c").name == "MatVec16-kspass.toml"
    assert family_of("Mul_4L_1c") == "Mul"


def test_short_reprs_of_large_objects():
    program = caramel.load_program(REPO / "programs" / "Mul_4L_2c")
    assert repr(program).startswith("Program('Mul_4L_2c', 2 chips, ")
    assert len(repr(program)) < 200 and len(repr(program.streams[0])) < 200 and len(repr(program.manifest)) < 200
    outcome = caramel.run_program(program, n=1024, backend="cpu", check="auto")
    for obj in (outcome, outcome.result, outcome.prepared):
        assert len(repr(obj)) < 300, type(obj)
    assert "PASS" in repr(outcome)


def test_a_run_without_a_check_says_not_checked():
    out = caramel_cli("run", "programs/Mul_4L_2c", "--n", "1024", "--backend", "cpu", "--no-check", "-q")
    assert out.returncode == 0 and "not checked" in out.stdout


def test_programs_holds_one_family_for_1_2_and_4_chips():
    for chips in (1, 2, 4):
        folder = REPO / "programs" / f"Mul_4L_{chips}c"
        assert (folder / "program_inputs").is_file()
        assert sum(f.stat().st_size for f in folder.iterdir()) < 64 * 1024
