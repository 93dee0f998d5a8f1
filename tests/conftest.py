"""Shared fixtures: where the compiled corpus lives (``../shared/programs`` beside the checkout,
or ``$CARAMEL_SHARED_PROGRAMS``), and the unpacked BootstrapLike_51L archive."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_PROGRAMS = Path(os.environ.get("CARAMEL_SHARED_PROGRAMS", REPO.parent / "shared" / "programs"))


def corpus(pattern: str = "*_*c") -> list[Path]:
    """Program folders of the shared corpus matching ``pattern`` (empty when it is absent)."""
    if not SHARED_PROGRAMS.is_dir():
        return []
    return sorted(p for p in SHARED_PROGRAMS.glob(pattern) if p.is_dir())


@pytest.fixture(scope="session")
def bootstrap51(tmp_path_factory) -> Path:
    """The folder holding BootstrapLike_51L_{1,2,4,8}c, unpacked once per session."""
    archive = SHARED_PROGRAMS / "BootstrapLike_51L.tar.xz"
    if not archive.exists():
        pytest.skip("BootstrapLike_51L.tar.xz not found")
    where = tmp_path_factory.mktemp("bootstrap51")
    with tarfile.open(archive) as tar:
        tar.extractall(where, filter="data")
    return where


def caramel_cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m caramel.cli ARGS`` from the repository root (output captured)."""
    return subprocess.run([sys.executable, "-m", "caramel.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def check_launch(program: str, n: int, backend: str, nproc: int = 2, timeout: float = 300,
                 env: dict | None = None) -> subprocess.CompletedProcess:
    """``caramel launch --nproc P -- run PROGRAM`` on ``backend`` against the reference
    (``--backend cpu``): both succeed, the same output digest, P processes, a passing check.
    Returns the launch's result for further checks."""
    want = caramel_cli("run", program, "--n", str(n), "--backend", "cpu", "-q", timeout=timeout, env=env)
    have = caramel_cli("launch", "--nproc", str(nproc), "--", "run", program, "--n", str(n), "--backend", backend,
                       "-q", timeout=timeout, env=env)
    assert want.returncode == 0 and have.returncode == 0, (want.stderr + have.stderr)[-3000:]
    digest = [line for line in want.stdout.splitlines() if line.startswith("output digest")]
    assert digest and digest[0] in have.stdout
    assert f"{nproc} processes" in have.stdout and "PASS" in have.stdout
    return have


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """One line when the compiled corpus is absent: where it was looked for and how many tests
    skipped for it (the README's Development section)."""
    if SHARED_PROGRAMS.is_dir():
        return
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if "not found" in str(getattr(r, "longrepr", "")) or "corpus" in str(getattr(r, "longrepr", ""))]
    terminalreporter.write_line(
        f"caramel: compiled corpus not found at {SHARED_PROGRAMS} (set CARAMEL_SHARED_PROGRAMS); "
        f"{len(skipped)} test(s) that read it were skipped")
