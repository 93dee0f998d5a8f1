"""Files caramel reads (programs, check files, inputs, cache entries, key stores): regular files
only, each with a bound before a byte of it is read; the reading twin of :mod:`caramel.outfiles`.

* :func:`open_regular`: a path is opened non-blocking, so that a FIFO or a device is refused at
  once instead of hanging the open or the read, and checked with ``fstat`` on the open descriptor
  (no race between the check and the read) before any byte is read; with ``follow=False`` a
  symbolic link is refused too (``O_NOFOLLOW``).
* :func:`read_bounded`: the bytes of a regular file of at most ``limit`` bytes (its size is
  checked before the read, and the read stops at ``limit`` + 1 in case it grows).
* :func:`parse_json`: JSON text with a bound on nesting and on the digits of an integer (a deeply
  nested or huge-integer document is an error, never a ``RecursionError`` or a slow conversion).
* :func:`npz_arrays`: the arrays of an ``.npz`` whose every member's header (dtype, shape) is read
  and checked against a byte budget before any of its data is decompressed, so a small file
  that declares 10^10 values (or a zip bomb) is refused without allocating them.

Each raises its own exception (:class:`NotRegularFile`, :class:`TooLarge`, :class:`BadData`);
the caller turns it into its error, naming the file.
"""

from __future__ import annotations

import json
import math
import os
import stat
import zipfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterator

#: Deepest nesting :func:`parse_json` accepts (a caramel document nests a few levels).
JSON_MAX_DEPTH = 64
#: Most digits of an integer in :func:`parse_json` (a 64-bit integer has 20).
JSON_MAX_DIGITS = 40
#: Bytes of a ``.npy`` header read at most (NumPy writes 128; its own reader allows 10,000).
NPY_HEADER_MAX = 10000
#: Largest file of caramel's own package read (its sources, hashed for cache keys; the grammar).
PACKAGE_FILE_MAX = 4 << 20


class NotRegularFile(Exception):
    """``path`` is a folder (``is_dir``), a device, a FIFO or a socket."""

    def __init__(self, path: str | os.PathLike, is_dir: bool):
        self.path, self.is_dir = Path(path), is_dir
        super().__init__(f"{path}: " + ("is a folder where a file was expected" if is_dir
                                        else "not a regular file (a device, FIFO or socket)"))


class TooLarge(Exception):
    """A file (or what it declares) beyond the bound its reader sets."""

    def __init__(self, path, size: int, limit: int, what: str = "file", grown: bool = False):
        self.path, self.size, self.limit, self.grown = path, size, limit, grown
        super().__init__(f"{path}: {what} of {_size(size)} is larger than the {_size(limit)} this file can need")


class BadData(ValueError):
    """Content that is not what its reader accepts (malformed JSON or ``.npz``, a bound exceeded)."""


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


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


def read_bounded(path: str | os.PathLike, limit: int, *, follow: bool = True,
                 check: Callable[[os.stat_result], None] | None = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (:func:`open_regular`).
    ``check``: called with the open file's status before any read (ownership checks raise there).

    Raises :class:`NotRegularFile`, :class:`TooLarge` (the file is larger than ``limit``, or
    grew beyond it while read) or the open's ``OSError``."""
    with open_regular(path, follow=follow) as (f, st):
        if check is not None:
            check(st)
        if st.st_size > limit:
            raise TooLarge(path, st.st_size, limit)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(path, len(data), limit, "file (grown while read)", grown=True)
    return data


def read_package_file(path: str | os.PathLike) -> bytes:
    """A file of caramel's own package (a source file, the grammar): :func:`read_bounded` at
    :data:`PACKAGE_FILE_MAX`."""
    return read_bounded(path, PACKAGE_FILE_MAX)


def parse_json(text: str | bytes, *, max_depth: int = JSON_MAX_DEPTH, max_digits: int = JSON_MAX_DIGITS) -> Any:
    """A JSON document (strict: no NaN or Infinity) nested at most ``max_depth`` levels, its
    integers of at most ``max_digits`` digits; :class:`BadData` for anything else."""
    def integer(s: str) -> int:
        if len(s.lstrip("-")) > max_digits:
            raise BadData(f"an integer of {len(s.lstrip('-'))} digits (at most {max_digits})")
        return int(s)

    def constant(s: str):
        raise BadData(f"{s} is not a JSON number")

    try:
        doc = json.loads(text, parse_int=integer, parse_constant=constant)
    except BadData:
        raise
    except RecursionError:  # the C decoder's own guard, far deeper than max_depth
        raise BadData(f"nested more than {max_depth} levels deep") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadData(f"not valid JSON ({exc})") from None
    if _depth(doc, max_depth) > max_depth:
        raise BadData(f"nested more than {max_depth} levels deep")
    return doc


def _depth(doc: Any, stop: int) -> int:
    """How deep lists and objects nest in ``doc`` (a walk with a stack of containers only; it stops
    once beyond ``stop``)."""
    top = 0
    stack = [(doc, 1)] if isinstance(doc, (list, dict)) else []
    while stack:
        node, depth = stack.pop()
        top = max(top, depth)
        if top > stop:
            break
        for child in node.values() if isinstance(node, dict) else node:
            if isinstance(child, (list, dict)):
                stack.append((child, depth + 1))
    return top


def npz_arrays(source: str | os.PathLike | BinaryIO, *, max_bytes: int, max_members: int = 4096) -> dict:
    """The arrays of the ``.npz`` ``source`` (a path or an open binary file), never object arrays:
    each member's ``.npy`` header is read and its data size (dtype x shape) checked against what
    is left of ``max_bytes`` before any of its data is read, and no more data than that is
    decompressed. :class:`BadData` for a malformed archive, a pickle, too many members;
    :class:`TooLarge` for arrays beyond ``max_bytes`` in all."""
    import numpy as np

    arrays = {}
    total = 0
    try:
        with zipfile.ZipFile(source) as z:
            infos = z.infolist()
            if len(infos) > max_members:
                raise BadData(f"{len(infos)} members (at most {max_members})")
            for info in infos:
                name = info.filename
                if not name.endswith(".npy"):
                    raise BadData(f"member {name[:60]!r} is not an .npy array")
                with z.open(info) as m:
                    shape, fortran, dtype = _npy_header(m, name)
                    count = math.prod(shape)
                    nbytes = count * dtype.itemsize
                    if nbytes > max_bytes - total:
                        raise TooLarge(getattr(source, "name", source), total + nbytes, max_bytes,
                                       f"member {name[:60]!r} declares {count} values: arrays")
                    data = m.read(nbytes + 1)
                if len(data) != nbytes:
                    raise BadData(f"member {name[:60]!r} holds {len(data)} bytes of data, its header says {nbytes}")
                arr = np.frombuffer(data, dtype=dtype, count=count).reshape(shape, order="F" if fortran else "C")
                arrays[name[:-4]] = arr
                total += nbytes
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, NotImplementedError) as exc:
        raise BadData(f"not a readable .npz ({exc})") from None
    return arrays


def _npy_header(f: BinaryIO, name: str):
    """(shape, fortran, dtype) of the ``.npy`` stream ``f``, left at its data; no object dtype."""
    import numpy as np

    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=NPY_HEADER_MAX)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=NPY_HEADER_MAX)
        else:
            raise BadData(f"member {name[:60]!r}: unknown .npy version {version}")
    except (ValueError, TypeError) as exc:
        if isinstance(exc, BadData):
            raise
        raise BadData(f"member {name[:60]!r} is not an .npy array ({exc})") from None
    if dtype.hasobject:
        raise BadData(f"member {name[:60]!r} holds Python objects (dtype {dtype}); only numbers are read")
    return tuple(int(d) for d in shape), bool(fortran), dtype
