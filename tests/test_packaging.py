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


def test_the_cuda_headers_ship_in_the_wheel(tmp_path):
    """The CUDA kernels' shared C (``.cuh`` files beside their modules) is package data: a wheel built from the
    tree holds every one, and the package unpacked from it (not this tree) reads the same texts."""
    import zipfile

    import shutil

    headers = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "caramel").rglob("*.cuh"))
    assert len(headers) >= 4
    source = tmp_path / "source"  # a copy: the build writes beside its sources
    shutil.copytree(REPO / "caramel", source / "caramel", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q", "-w",
                            str(tmp_path / "wheel")], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert set(headers) <= set(z.namelist())
        z.extractall(tmp_path / "site")
    probe = ("import caramel.backends.cuda.context as c, caramel.backends.cuda.ntt.common as n; "
             "print(c.__file__); print(len(c.COMMON_SRC), len(n.header(16, 8, True)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "site"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    where, sizes = out.stdout.splitlines()
    from caramel.backends.cuda import context
    from caramel.backends.cuda.ntt import common

    assert where.startswith(str(tmp_path / "site"))
    assert sizes == f"{len(context.COMMON_SRC)} {len(common.header(16, 8, True))}"
