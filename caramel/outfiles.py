"""Writing result files (plots, traces, JSON, DOT) atomically: a temporary file created
exclusively in the target's folder (``mkstemp``: never an existing path, never a planted symlink),
then renamed over the target, so that a reader never sees a half-written file and an error leaves
no file behind."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` atomically (see the module docstring)."""
    target = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # an ordinary file's mode, not mkstemp's 0600
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
