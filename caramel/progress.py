"""A minimal progress bar for long steps (parsing, planning, capture), written to stderr.

Shown only when stderr is a terminal, or when ``CARAMEL_PROGRESS=1``; ``CARAMEL_PROGRESS=0`` hides it.
"""

from __future__ import annotations

import os
import sys
import time


def _enabled() -> bool:
    flag = os.environ.get("CARAMEL_PROGRESS")
    if flag is not None:
        return flag not in ("", "0", "false", "no")
    return sys.stderr.isatty()


class Progress:
    """``with Progress("parse", total) as p: p.advance(n)`` draws ``parse  42% 12000/28000  0.8s``."""

    def __init__(self, label: str, total: int, enabled: bool | None = None):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.enabled = _enabled() if enabled is None else enabled
        self._start = self._last = time.perf_counter()

    def __enter__(self) -> "Progress":
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and now - self._last > 0.1:
            self._last = now
            self._draw(now)

    def _draw(self, now: float, end: str = "") -> None:
        pct = 100 * self.done // self.total
        sys.stderr.write(f"\r{self.label:<10} {pct:3d}% {self.done}/{self.total} {now - self._start:6.1f}s{end}")
        sys.stderr.flush()

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._draw(time.perf_counter(), "\n")
