"""Files caramel reads (programs, check files, cache entries, key stores): regular files only, the
reading twin of :mod:`caramel.outfiles`. A path is opened non-blocking, so that a FIFO or a device is
refused at once instead of hanging the open or the read, and checked with ``fstat`` on the open
descriptor (no race between the check and the read) before any byte is read; with
``follow=False`` a symbolic link is refused too (``O_NOFOLLOW``). Each caller turns the refusals into
its own error, naming the file."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator


class NotRegularFile(Exception):
    """``path`` is a folder (``is_dir``), a device, a FIFO or a socket."""

    def __init__(self, path: str | os.PathLike, is_dir: bool):
        self.path, self.is_dir = Path(path), is_dir
        super().__init__(f"{path}: " + ("is a folder where a file was expected" if is_dir
                                        else "not a regular file (a device, FIFO or socket)"))


@contextmanager
def open_regular(path: str | os.PathLike, *, follow: bool = True) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """The open binary file at ``path`` and its status, when it is a regular file.

    Raises :class:`NotRegularFile`, or the ``OSError`` of the open (``FileNotFoundError``,
    ``PermissionError``; with ``follow=False`` a symbolic link fails with ``ELOOP``)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except IsADirectoryError:
        raise NotRegularFile(path, True) from None
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise NotRegularFile(path, stat.S_ISDIR(st.st_mode))
    with os.fdopen(fd, "rb") as f:
        yield f, st
