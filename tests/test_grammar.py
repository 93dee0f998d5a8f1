"""The Lark grammar of record accepts every line of the corpus, and the fast parser agrees with it.

* ``load_program(fast=False)`` is the Lark path: every instruction line goes through
  ``grammar().parse(line, start="instr")`` and the tree transformer, so comparing it with
  ``load_program(fast=True)`` checks both that the grammar accepts every instruction line (a rejected
  line fails with the ParseError naming it) and that the two parsers build identical programs.
  Headers and manifest lines are parsed with the grammar directly.
* BootstrapLike_51L (856k lines, unpacked once per session): every line through the grammar directly
  (about 25 s); the full Lark-path comparison takes over a minute and is marked ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from caramel.parse import grammar, load_program

from tests.conftest import corpus

CORPUS = corpus()
BOOTSTRAP = [f"BootstrapLike_51L_{k}c" for k in (1, 2, 4, 8)]


def _files(folder: Path, prefix: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(prefix))


def assert_grammar_accepts(folder: Path, instructions: bool = True) -> int:
    """Parse every line of ``folder``'s files with the grammar (instruction lines only if ``instructions``,
    headers and manifests always); returns the number of lines parsed."""
    from lark.exceptions import LarkError

    parse = grammar().parse
    failures, count = [], 0
    for path in _files(folder, "instructions"):
        lines = path.read_text().split("\n")
        assert lines[-1] == "", f"{path} does not end with a newline"
        try:
            parse(lines[0], start="header")
        except LarkError as exc:
            failures.append(f"{path}:1: {exc}")
        seen: set[str] = set()
        for number, line in enumerate(lines[1:-1] if instructions else (), start=2):
            count += 1
            if line in seen:
                continue
            seen.add(line)
            try:
                parse(line, start="instr")
            except LarkError as exc:
                failures.append(f"{path}:{number}: {line!r}: {type(exc).__name__}")
    for path in _files(folder, "inputs") + _files(folder, "program_inputs"):
        for number, line in enumerate(path.read_text().split("\n")[:-1], start=1):
            count += 1
            try:
                parse(line, start="manifest_line")
            except LarkError as exc:
                failures.append(f"{path}:{number}: {line!r}: {type(exc).__name__}")
    assert not failures, f"{len(failures)} line(s) rejected, first: " + "; ".join(failures[:5])
    return count


def assert_paths_agree(folder: Path) -> None:
    fast = load_program(folder, cache=False, fast=True)
    lark = load_program(folder, cache=False, fast=False)
    for a, b in zip(fast.streams, lark.streams):
        for x, y in zip(a.instructions, b.instructions):
            assert x == y, f"{a.path}:{x.line}: fast path {x!r} != Lark path {y!r}"
    assert fast == lark


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_grammar_accepts_and_fast_path_equals_lark_path(path):
    assert_grammar_accepts(path, instructions=False)
    assert_paths_agree(path)


@pytest.mark.parametrize("name", BOOTSTRAP)
def test_grammar_accepts_every_line_of_bootstrap_like(name, bootstrap51):
    assert assert_grammar_accepts(bootstrap51 / name) > 100_000


@pytest.mark.slow
@pytest.mark.parametrize("name", BOOTSTRAP)
def test_fast_path_equals_lark_path_on_bootstrap_like(name, bootstrap51):
    assert_paths_agree(bootstrap51 / name)


def test_grammar_rejects_what_the_compiler_never_prints():
    from lark.exceptions import LarkError

    parse = grammar().parse
    for bad in [
        "add r1: r0, r2 |4",  # separators are exact
        "add r1:r0, r2 | 4",
        "rcv @ 65536:2 r0:",  # the trailing space of rcv is part of the syntax
        "ntt r1: b0{1}[X] | 3",  # BCU slots never carry [X]
        "load r1: r2",
        "bci B0: [], [1]",
        "dis @ 65536:2 : s0",
        "add r1: r0, r2 | -4",
    ]:
        with pytest.raises(LarkError):
            parse(bad, start="instr")
    for bad in ["i1 | x:c0 | []", "Foo Stream:", "i1 | x | [0]", "i1 | K:9:x | [0]"]:
        with pytest.raises(LarkError):
            parse(bad, start="manifest_line")
