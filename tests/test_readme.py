"""The README tells the truth and is short: its first lines are the two commands, it fits in about
200 lines, its Python example runs and gives what it says, every command it shows parses, the pages
it links exist, and no message tells a user to install from PyPI (there is no release)."""

from __future__ import annotations

import re
import shlex

import numpy as np
import pytest

from caramel import cli

from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_the_first_lines_are_the_two_commands_and_it_is_short():
    assert README.splitlines()[3:5] == [
        'pip install -e ".[test]" && caramel run programs/Mul_4L_2c --n 4096 --check caramel/checks/Mul.toml',
        "python -m pytest tests"]
    assert len(README.splitlines()) <= 200


def test_it_says_where_to_install_from_and_where_the_corpus_comes_from():
    head = "\n".join(README.splitlines()[:60])
    assert "not on PyPI" in head and "pip install -e" in head
    assert "../shared" in README and "CARAMEL_SHARED_PROGRAMS" in README and "skip" in README
    assert "outcome.outputs" in README


def test_the_python_examples_run_and_give_what_they_say(monkeypatch):
    """The README's Python blocks, one after the other in one scope: run_program with user data, then an
    Executor over user data (its last result decrypts to x * 0.5, as the comment says)."""
    monkeypatch.chdir(REPO)
    single, executor = _blocks("python")
    scope: dict = {}
    exec(compile(single, "README.md", "exec"), scope)  # noqa: S102 (the README's own example)
    x, z = scope["x"], scope["z"]
    assert z.shape == x.shape and np.allclose(z, x * 0.5, atol=1e-3)
    assert scope["outcome"].outputs.keys() == {"z"}
    exec(compile(executor, "README.md", "exec"), scope)  # noqa: S102
    last, jobs = scope["result"], scope["jobs"]
    assert len(jobs) == 8 and last.index == 7
    assert np.allclose(last.outputs["z"], jobs[7]["x"] * 0.5, atol=1e-3)


def _commands() -> list[list[str]]:
    out = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = re.split(r"\s#", line)[0].strip()
            if line.startswith("caramel "):
                out.append(shlex.split(line)[1:])
    return out


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a)[:60])
def test_every_command_it_shows_parses(argv):
    """Each command line of the README is one that caramel accepts (options, values, order)."""
    parser = cli.build_parser()
    argv = [a.replace("PROGRAM", "programs/Mul_4L_1c").replace("FAMILY", "programs/Mul_4L") for a in argv]
    args = parser.parse_args(argv)
    assert args.command == argv[0]
    if argv[0] == "launch":  # and the command it launches, as caramel launch parses it
        rest = [a for a in args.args if a != "--"]
        assert parser.parse_args([*rest, "--distributed"]).command == rest[0]


def test_the_pages_it_links_exist():
    """docs/KERNELS.md is written by the kernels work; the others live here."""
    for page in sorted(set(re.findall(r"(?<![/\w])docs/[A-Z_]+\.md", README)) - {"docs/KERNELS.md"}):
        assert (REPO / page).is_file(), page


def test_no_message_tells_a_user_to_install_from_pypi():
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "caramel").rglob("*.py")
                 if re.search(r"pip install ['\"]?caramel-fhe", p.read_text())]
    assert offenders == []
