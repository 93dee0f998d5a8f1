"""Shared fixtures: the compiled corpus (found by :mod:`tests.corpus`: ``../shared/programs`` beside
the checkout or ``$CARAMEL_SHARED_PROGRAMS``), the unpacked BootstrapLike_51L archive, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.corpus import REPO, SHARED_PROGRAMS, corpus, load_corpus, needs, shared  # noqa: F401 (re-exported)


@pytest.fixture(scope="session")
def bootstrap51(tmp_path_factory) -> Path:
    """The folder holding BootstrapLike_51L_{1,2,4,8}c, unpacked once per session."""
    archive = shared("BootstrapLike_51L.tar.xz")
    where = tmp_path_factory.mktemp("bootstrap51")
    with tarfile.open(archive) as tar:
        tar.extractall(where, filter="data")
    return where


def read_at_once(mapping, key, readers: int = 2) -> list:
    """``mapping[key]`` read by ``readers`` threads at once; what each got."""
    import threading

    got: list = []
    threads = [threading.Thread(target=lambda: got.append(mapping[key])) for _ in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return got


def caramel_cli(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m caramel.cli ARGS`` from the repository root (output captured)."""
    return subprocess.run([sys.executable, "-m", "caramel.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def check_launch(program: str, n: int, backend: str, nproc: int = 2, timeout: float = 300,
                 env: dict | None = None, quiet: bool = True) -> subprocess.CompletedProcess:
    """``caramel launch --nproc P -- run PROGRAM`` on ``backend`` against the reference
    (``--backend cpu``): both succeed, the same output digest, P processes, a passing check.
    Returns the launch's result for further checks (with ``quiet=False`` its stderr holds the
    ranks' log lines)."""
    want = caramel_cli("run", program, "--n", str(n), "--backend", "cpu", "-q", timeout=timeout, env=env)
    have = caramel_cli("launch", "--nproc", str(nproc), "--", "run", program, "--n", str(n), "--backend", backend,
                       *(["-q"] if quiet else []), timeout=timeout, env=env)
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


#: One instruction line of every syntax form of the grammar (tests of the parser and of the load cache).
SYNTAX_FORMS = [
    "load r0: i1(4){F}", "evg r48: k50(63){F}", "loas s0: s3(4)", "store r2[X]: v5(4)", "spill r4[X]: v49(63)",
    "add r8: r0, r0[X] | 4", "mup r26: r2[X], r25 | 4", "sus r55: r0[X], s0[X] | 4", "rot -2 r1: r0[X] | 2",
    "ntt r45: b0{4} | 63", "sud r45: r3[X], b1{4} | 4", "sud r6: r18[X], r34 | 3",
    "bci B0: [59,60,61,62,63], [0,1,2,3,4]", "pl1 B1: r47[X] | 63", "bcw B0: r20[X] | 4",
    "rsi {r37, r36, r39}", "rsv {r37, r36, r39}: r21[X]: [0,1,2] | 2", "mod r55: {r37[X], r36[X], r39[X]} | 0",
    "dis @ 65540:4 : r18", "rcv @ 65539:4 r21: ", "joi @ 65540:4 r35: r22[X] | 4", "joi @ 65539:4 : r61[X] | 3",
    "joi @ 65538:4 :  | 2", "rec r0: i1(0) | 0", "snd r0[X]: v1(0) | 0",
]  # fmt: skip


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty private cache folder (``CARAMEL_CACHE``) for the load and plan caches, and no
    remembered warnings before or after the test; yields the folder (not yet created)."""
    from caramel import cache

    folder = tmp_path / "cache"
    monkeypatch.setenv("CARAMEL_CACHE", str(folder))
    cache._warned.clear()
    yield folder
    cache._warned.clear()
