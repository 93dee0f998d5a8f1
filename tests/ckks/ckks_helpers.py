"""Helpers of the CKKS client tests: cached ring contexts, real compiled programs."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest

from caramel.program import EvalKeyId, KeyType
from caramel.ring import Context
from tests.corpus import SHARED_PROGRAMS

PROGRAMS = SHARED_PROGRAMS

#: One evaluation key of every type (digits on a part of the Q limbs, rotations both ways).
KEY_IDS = [
    EvalKeyId(KeyType.RELIN, 4, ext=2, rot=0, digits=(0, 1, 2, 3)),
    EvalKeyId(KeyType.ROTATION, 4, ext=2, rot=3, digits=(0, 2)),
    EvalKeyId(KeyType.ROTATION, 3, ext=1, rot=-5, digits=(1,)),
    EvalKeyId(KeyType.CONJUGATION, 4, ext=1, rot=0, digits=(0, 1, 2, 3)),
    EvalKeyId(KeyType.EPHEMERAL, 3, ext=1, rot=0, digits=(0,)),
    EvalKeyId(KeyType.BOOTSTRAP, 5, ext=3, rot=4, digits=(0, 1, 2, 3, 4)),
    EvalKeyId(KeyType.BOOTSTRAP2, 4, ext=2, rot=3, digits=(1, 3)),
]


@lru_cache(maxsize=None)
def context(n: int) -> Context:
    """One Context per N for the whole session (NTT tables are built lazily and kept)."""
    return Context(n)


def gpu() -> bool:
    """Whether CuPy imports and sees a CUDA device (the GPU tests skip otherwise)."""
    from caramel.api import gpu_available

    return gpu_available()


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
