"""A minimal progress bar on stderr (no dependency): redrawn in place on a terminal, sparse lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: float, desc: str, *, enabled: bool = True, stream: TextIO | None = None,
                 unit: str = ""):
        self.total = max(float(total), 1e-12)
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.done = 0.0
        self.t0 = time.perf_counter()
        self._last_draw = 0.0
        self._last_decile = -1
        self.note = ""

    def update(self, n: float = 1, note: str = "") -> None:
        self.done += n
        if note:
            self.note = note
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.tty:
            if now - self._last_draw >= 0.1 or self.done >= self.total:
                self._draw(now, end="\r")
                self._last_draw = now
        else:
            decile = int(10 * self.done / self.total)
            if decile != self._last_decile and decile < 10:
                self._last_decile = decile
                self._draw(now, end="\n")

    def _draw(self, now: float, end: str) -> None:
        frac = min(self.done / self.total, 1.0)
        width = 30
        filled = int(frac * width)
        bar = "#" * filled + "-" * (width - filled)
        elapsed = now - self.t0
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        line = f"{self.desc} [{bar}] {100 * frac:5.1f}% {elapsed:6.1f}s eta {eta:5.1f}s {self.note[:40]}"
        self.stream.write(line.ljust(110)[:110] + end if self.tty else line + end)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.done = max(self.done, self.total)
            self._draw(time.perf_counter(), end="\n")
