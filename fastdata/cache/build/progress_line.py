"""The converter's one-line status on stderr."""
from __future__ import annotations

import time
from typing import Optional, TextIO


class ProgressLine:
    """One status line on stderr: images/s, MB/s (read), ETA. Redrawn in place on a TTY."""

    def __init__(self, total: int, done: int, stream: Optional[TextIO]):
        self.total, self.start_done, self.stream = total, done, stream
        self.t0 = self.last = time.monotonic()
        self.tty = bool(stream is not None and stream.isatty())

    def update(self, done: int, bytes_in: int, skipped: int, force: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not force and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        rate = (done - self.start_done) / dt
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        eta_s = time.strftime("%H:%M:%S", time.gmtime(eta)) if eta == eta else "?"
        line = (
            f"fastdata-convert: {done}/{self.total} ({100.0 * done / max(self.total, 1):.1f}%) "
            f"{rate:.0f} img/s {bytes_in / dt / 1e6:.1f} MB/s ETA {eta_s} skipped {skipped}"
        )
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.stream is not None and self.tty:
            self.stream.write("\n")
