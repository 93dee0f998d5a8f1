"""Writing result files (JSON, plots, traces, DOT, saved outputs) atomically: a temporary file
created exclusively in the target's folder (``mkstemp``: never an existing path, never a planted
symlink), then renamed over the target, so that a reader never sees a half-written file and an
error leaves no file behind. A target that is a symbolic link is refused."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable


def write_atomic(path: str | os.PathLike, data: bytes | str | Callable[[BinaryIO], None]) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring) and return the path:
    bytes, text (UTF-8), or a function that fills the open binary file (``np.savez``, say).
    The file gets an ordinary file's mode (0666 less the umask), not ``mkstemp``'s 0600."""
    target = Path(path)
    if target.is_symlink():  # a planted link: refuse rather than silently replace what it names
        raise OSError(f"{target} is a symbolic link; refusing to write through it")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent or ".")
    try:
        umask = os.umask(0o022)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target
