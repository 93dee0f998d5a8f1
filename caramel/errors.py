"""Every error caramel raises on purpose derives from :class:`CaramelError`.

Errors about a place in a compiled program carry a :class:`Location` (file, line, column) so that
the message always names where the problem is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Location:
    """A place in a source file: 1-based line and column (column 0 = whole line)."""

    path: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if not self.line:
            return self.path
        if not self.column:
            return f"{self.path}:{self.line}"
        return f"{self.path}:{self.line}:{self.column}"


class CaramelError(Exception):
    """Base class of caramel's errors."""


class LocatedError(CaramelError):
    """An error at a known place: ``str(err)`` is ``path:line:col: reason``."""

    def __init__(self, location: Location, reason: str):
        self.location = location
        self.reason = reason
        super().__init__(f"{location}: {reason}")


class ParseError(LocatedError):
    """A line, file or folder that is not a well-formed compiled program."""


class ValidationError(CaramelError):
    """One or more static errors found by :mod:`caramel.validate`, reported together."""

    def __init__(self, problems: list[LocatedError], truncated: bool = False):
        self.problems = problems
        self.truncated = truncated
        head = f"{len(problems)}{'+' if truncated else ''} validation error(s):"
        super().__init__("\n".join([head] + [f"  {p}" for p in problems]))


class UnsupportedError(LocatedError):
    """A well-formed instruction that caramel does not execute (``rec``, ``snd``)."""


class BindingError(CaramelError):
    """Inputs, keys or data arrays that do not match what a program's manifest asks for."""


class ExecutionError(CaramelError):
    """A failure while a program runs (deadlock, missing value, resource limit)."""


class DeadlockError(ExecutionError):
    """Every chip is blocked on communication: names each chip's blocking instruction."""


class DeviceMemoryError(ExecutionError):
    """A program does not fit in GPU memory: names the bytes needed and available."""


class ArgumentError(CaramelError, ValueError):
    """A value given to a public function that it does not accept (an argument out of range, of the
    wrong kind); also a :class:`ValueError`, its natural base."""


class MissingLimbError(CaramelError, KeyError):
    """A limb asked of an object (a ciphertext, a plaintext, a key) that does not hold it; also a
    :class:`KeyError`, its natural base."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
