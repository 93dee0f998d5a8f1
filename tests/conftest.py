"""Shared fixtures: where the compiled corpus lives (``../shared/programs`` beside the checkout,
or ``$CARAMEL_SHARED_PROGRAMS``), and the unpacked BootstrapLike_51L archive."""

from __future__ import annotations

import os
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
