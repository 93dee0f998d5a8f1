"""Files caramel writes (results, plots, traces, cache entries, key stores) atomically: a temporary
file created exclusively in the target's folder (``mkstemp``: never an existing path, never a planted
symlink), then renamed over the target, so that a reader never sees a half-written file and an error
leaves no file behind. ``os.replace`` replaces a symbolic link at the target; it never writes
through one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable

Data = bytes | str | Callable[[BinaryIO], None]


def replace_atomically(path: str | os.PathLike, data: Data, *, mode: int | None = None, prefix: str | None = None,
                       suffix: str = ".tmp", sync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically and return the path: bytes, text (UTF-8), or a function
    that fills the open binary file (``np.savez``, say). ``mode``: the file's permissions (default
    an ordinary file's, 0666 less the umask; 0o600 for private files); ``prefix``/``suffix``: the
    temporary file's name (default ``.<name>.`` / ``.tmp``); ``sync``: fsync before the rename."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}." if prefix is None else prefix, suffix=suffix,
                               dir=target.parent or ".")
    try:
        if mode is None:
            umask = os.umask(0o022)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode() if isinstance(data, str) else data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def write_atomic(path: str | os.PathLike, data: Data) -> Path:
    """A result file the user named (:func:`replace_atomically`, an ordinary file's mode); a target
    that is a symbolic link is refused rather than replaced."""
    target = Path(path)
    if target.is_symlink():
        raise OSError(f"{target} is a symbolic link; refusing to write through it")
    return replace_atomically(target, data)
