"""The ``caramel`` process's exit (``caramel.cli.console``): main's code; after CuPy was loaded, an
immediate exit once the logs and stdout/stderr are flushed, with nothing the command wrote lost."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from caramel import cli

from tests.conftest import REPO


class _Left(Exception):
    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@pytest.mark.parametrize("code", [0, 1, 2])
def test_without_cupy_the_process_exits_normally(monkeypatch, code):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(cli, "main", lambda: code)
    monkeypatch.setattr(os, "_exit", lambda c: pytest.fail("os._exit without CuPy"))
    with pytest.raises(SystemExit) as exc:
        cli.console()
    assert exc.value.code == code


@pytest.mark.parametrize("code", [0, 1, 2, 130])
def test_after_cupy_the_process_leaves_with_the_code_after_flushing(monkeypatch, code):
    flushed = []

    class Handler(logging.Handler):
        def emit(self, record):
            pass

        def flush(self):
            flushed.append("log")

    class Stream:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def flush(self):
            if self.fail:
                raise BrokenPipeError("closed")
            flushed.append(self.name)

    def leave(c):
        raise _Left(c)

    logger = logging.getLogger("caramel.test_cli_exit")
    handler = Handler()
    logger.addHandler(handler)
    try:
        monkeypatch.setitem(sys.modules, "cupy", object())
        monkeypatch.setattr(cli, "main", lambda: code)
        monkeypatch.setattr(sys, "stdout", Stream("stdout", fail=code == 130))  # a closed pipe is passed over
        monkeypatch.setattr(sys, "stderr", Stream("stderr"))
        monkeypatch.setattr(os, "_exit", leave)
        with pytest.raises(_Left) as exc:
            cli.console()
    finally:
        logger.removeHandler(handler)
    assert exc.value.code == code
    assert "log" in flushed and "stderr" in flushed and ("stdout" in flushed) == (code != 130)
    assert flushed.index("log") < flushed.index("stderr")


_SCRIPT = """
import sys, types
sys.modules["cupy"] = types.ModuleType("cupy")  # as after a GPU run
from caramel.cli import console
sys.argv = ["caramel"] + sys.argv[1:]
console()
"""


def test_the_leaving_process_loses_no_output(tmp_path):
    # stdout is a pipe (block-buffered): what was printed last and the JSON file must both be there.
    out = tmp_path / "validate.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), CARAMEL_PROGRESS="0", CARAMEL_CACHE=str(tmp_path / "cache"))
    env.pop("PYTHONUNBUFFERED", None)
    res = subprocess.run([sys.executable, "-c", _SCRIPT, "validate", "programs/Mul_4L_1c", "--json", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert res.stdout == f"ok: {doc['instructions']} instructions on 1 chip\nresults: written to {out}\n" and doc["ok"]
    bad = subprocess.run([sys.executable, "-c", _SCRIPT, "run", str(tmp_path / "missing")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.startswith("caramel: error: ")
