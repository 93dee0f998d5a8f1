"""Helpers of the CKKS client tests: cached ring contexts, real compiled programs."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from caramel.ring import Context
from tests.corpus import SHARED_PROGRAMS

PROGRAMS = SHARED_PROGRAMS


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    """One Context per N for the whole session (NTT tables are built lazily and kept)."""
    return Context(n)


def program_dir(name: str) -> Path:
    path = PROGRAMS / name
    if not (path / "program_inputs").exists():
        pytest.skip(f"compiled program {name} is not available")
    return path


def load(name: str):
    """The real compiled program (parsed with caramel.parse, no cache)."""
    from caramel.parse import load_program

    return load_program(program_dir(name), cache=False)


def load_manifest(name: str):
    """Only the global manifest ``program_inputs`` of a compiled program."""
    from caramel.parse import parse_manifest

    path = program_dir(name) / "program_inputs"
    return parse_manifest(path.read_bytes(), str(path))
