"""Files caramel writes: atomically, never through a planted symbolic link."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def _refuse_links(path: Path) -> None:
    if path.is_symlink():
        raise OSError(f"{path} is a symbolic link; refusing to write through it")


def write_atomic(path: str | Path, write: Callable[[Any], None], mode: str = "w") -> Path:
    """Write ``path`` atomically (``mode``: ``"w"`` text, ``"wb"`` bytes): ``write(file)`` fills a fresh temporary file in the same folder
    (created exclusively, never following a link), which then replaces ``path`` (``os.replace``
    replaces a planted symbolic link instead of following it)."""
    path = Path(path)
    _refuse_links(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
