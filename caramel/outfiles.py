"""Files caramel writes: the one place that owns the rules.

Result files a user names (``--json``, ``--save-outputs``, ``--trace``, ``--plot``, ``--dag-json``,
``--dot``, every output option of every command):

* are checked, all of them, before any work (:func:`check_outputs`): the folder exists and can be
  written; an existing path is a regular file of this user (never a device, a FIFO, a socket, a
  folder or a symbolic link, which are refused, not replaced); no two outputs name one file, and
  no output names a file the command reads;
* are written atomically (:func:`write_output`): a temporary file created exclusively in the
  target's folder (``mkstemp``: never an existing path, never a planted symlink), then renamed
  over the target, so that a reader never sees a half-written file and an error leaves no file
  behind; an error names the user's path, never the temporary file;
* ``-`` means standard output where the option allows it (:attr:`Output.stdout`); the command's
  text then goes to standard error, so that standard output carries the result alone.

Caramel's own files (cache entries, key stores, process-mode records) use
:func:`replace_atomically`, the same atomic write with a private mode.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterable, TextIO

from caramel.errors import CaramelError

Data = bytes | str | Callable[[BinaryIO], None]

#: The path that means standard output.
STDOUT = "-"


class OutputError(CaramelError):
    """An output path that caramel will not write (it names the path and the option)."""


@dataclass(frozen=True)
class Output:
    """One output a command will write: the ``option`` that names it (for messages), the ``path``
    as the user gave it, whether ``-`` (standard output) is accepted, and the file name endings
    accepted (empty: any)."""

    option: str
    path: str
    stdout: bool = True
    suffixes: tuple[str, ...] = ()

    @property
    def to_stdout(self) -> bool:
        return self.path == STDOUT


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse(option: str, path, reason: str):
    raise OutputError(f"{option} {path}: {reason}")


def check_output(out: Output) -> None:
    """Raise :class:`OutputError` unless ``out`` can be written as a result file (module docstring):
    nothing is created or changed."""
    opt, text = out.option, out.path
    if text == STDOUT:
        if not out.stdout:
            _refuse(opt, text, "this output cannot go to standard output; give a file name")
        return
    if not text or "\0" in text:
        _refuse(opt, repr(text), "not a file name")
    path = Path(text)
    if out.suffixes and not text.lower().endswith(out.suffixes):
        _refuse(opt, text, f"the file name must end in {' or '.join(out.suffixes)}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        _refuse(opt, text, f"cannot be written ({exc.strerror})")
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            _refuse(opt, text, "is a symbolic link; caramel writes only regular files and never through a link")
        if not stat.S_ISREG(st.st_mode):
            _refuse(opt, text, f"is {_what(st.st_mode)}; caramel writes only regular files and never replaces "
                               "anything else")
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            _refuse(opt, text, f"belongs to another user (uid {st.st_uid}); caramel does not replace it")
    folder = path.parent
    try:
        fst = os.stat(folder)
    except FileNotFoundError:
        _refuse(opt, text, f"the folder {folder} does not exist")
    except OSError as exc:
        _refuse(opt, text, f"the folder {folder} cannot be used ({exc.strerror})")
    if not stat.S_ISDIR(fst.st_mode):
        _refuse(opt, text, f"{folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        _refuse(opt, text, f"the folder {folder} is not writable")


def _identity(path: str | os.PathLike) -> str:
    """What two paths that name one file share: the real path of the folder and the name."""
    p = Path(path)
    return os.path.join(os.path.realpath(p.parent), p.name)


def check_outputs(outputs: Iterable[Output], reads: Iterable[str | os.PathLike] = (),
                  folders: Iterable[str | os.PathLike] = ()) -> list[Output]:
    """Check every output (:func:`check_output`) before any work; refuse two outputs on one path
    (standard output included), an output that is a file the command reads (``reads``), and an output
    inside a folder the command reads whole (``folders``: a key store). Returns the outputs given."""
    outputs = [o for o in outputs if o.path is not None]
    for out in outputs:
        check_output(out)
    seen: dict[str, Output] = {}
    for out in outputs:
        key = STDOUT if out.to_stdout else _identity(out.path)
        if key in seen:
            where = "standard output" if out.to_stdout else out.path
            raise OutputError(f"{seen[key].option} and {out.option} both write {where}; give each its own file")
        seen[key] = out
    read_ids = {_identity(r): r for r in reads if r is not None}
    for out in outputs:
        if not out.to_stdout and _identity(out.path) in read_ids:
            _refuse(out.option, out.path, "is a file this command reads; caramel does not overwrite its inputs")
    for folder in folders:
        if folder is None:
            continue
        real = os.path.realpath(folder)
        for out in outputs:
            parent = os.path.realpath(Path(out.path).parent)
            if not out.to_stdout and (parent == real or parent.startswith(real.rstrip(os.sep) + os.sep)):
                _refuse(out.option, out.path, f"is inside {folder}, a folder this command reads")
    return outputs


def _umask_mode() -> int:
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def replace_atomically(path: str | os.PathLike, data: Data, *, mode: int | None = None, prefix: str | None = None,
                       suffix: str = ".tmp", sync: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically and return the path: bytes, text (UTF-8), or a function
    that fills the open binary file (``np.savez``, say). ``mode``: the file's permissions (default
    an ordinary file's, 0666 less the umask; 0o600 for private files); ``prefix``/``suffix``: the
    temporary file's name (default ``.<name>.`` / ``.tmp``); ``sync``: fsync before the rename.
    ``os.replace`` replaces a symbolic link at the target; it never writes through one."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}." if prefix is None else prefix, suffix=suffix,
                               dir=target.parent or ".")
    try:
        os.fchmod(fd, _umask_mode() if mode is None else mode)
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


def write_output(path: str | os.PathLike, data: Data, option: str = "output", *,
                 stdout: TextIO | None = None) -> Path | str:
    """Write the result file ``path`` that the user named (with ``option``): checked again
    (:func:`check_output`), then written atomically with an ordinary file's mode. ``-`` writes to
    ``stdout`` (default ``sys.stdout``): text as it is, bytes to its binary buffer. Returns the
    path (or ``-``). Every failure is an :class:`OutputError` naming ``path``."""
    text = os.fspath(path)
    check_output(Output(option, text))
    if text == STDOUT:
        stream = stdout or sys.stdout
        if callable(data):
            import io

            buf = io.BytesIO()
            data(buf)
            data = buf.getvalue()
        if isinstance(data, bytes):
            stream.flush()
            getattr(stream, "buffer", stream).write(data)
        else:
            stream.write(data)
        stream.flush()
        return STDOUT
    try:
        return replace_atomically(text, data)
    except OutputError:
        raise
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOSPC:
            reason = "no space left on the device"
        raise OutputError(f"{option} {text}: cannot be written ({reason})") from None


def write_atomic(path: str | os.PathLike, data: Data, option: str = "output") -> Path:
    """A result file the user named, never ``-``: :func:`write_output`."""
    if os.fspath(path) == STDOUT:
        raise OutputError(f"{option}: '-' (standard output) is not accepted here; give a file name")
    return write_output(path, data, option)
