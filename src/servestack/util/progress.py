"""Showing what long work is doing: a live line on a terminal, periodic plain lines in CI logs.

`Progress` keeps byte counters (tarred, compressed, pushed, ...) against an optional total and a
current step ("layer 3 of 12: pkg-torch"); a background thread redraws one line every half
second on a TTY, or prints a full line every `interval` seconds otherwise (a CI log gets a line
every 15 s, not a wall of carriage returns). `phase` is the light form for steps that have no
byte count (smoke's probes, a stage's runs): a start line and a done line with the time taken.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from servestack import settings


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest:02d} s" if seconds >= 120 else f"{seconds:.0f} s"


class Progress:
    """Counters for one long step, shown while it runs (use as a context manager)."""

    def __init__(self, title: str, counters: tuple[str, ...], *, total: int = 0, paced_by: str = "",
                 stream: TextIO | None = None, live: bool | None = None, interval: float | None = None):
        self.title = title
        self.counters = dict.fromkeys(counters, 0)
        self.total = total  # bytes of `paced_by` expected: gives the rate and the time left
        self.paced_by = paced_by or counters[0]
        self.step = ""
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.interval = interval if interval is not None else (
            0.5 if self.live else float(settings.value("SERVESTACK_PROGRESS_SECONDS")))
        self.started = self.pacing_from = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, counter: str, n: int) -> None:
        with self._lock:
            if counter == self.paced_by and not self.counters[counter]:
                self.pacing_from = time.monotonic()  # the rate counts from the first byte, not from start-up
            self.counters[counter] += n

    def expect(self, n: int) -> None:
        """`n` more bytes of `paced_by` to come than the total said (work found to be needed on the way)."""
        with self._lock:
            self.total += n

    def set_step(self, text: str) -> None:
        with self._lock:
            self.step = text

    def line(self) -> str:
        with self._lock:
            counters, step = dict(self.counters), self.step
        elapsed = time.monotonic() - self.started
        parts = []
        for name, value in counters.items():
            total = f" of {_gb(self.total)}" if name == self.paced_by and self.total else ""
            parts.append(f"{name} {_gb(value)}{total}")
        paced = counters.get(self.paced_by, 0)
        pacing = time.monotonic() - self.pacing_from
        if pacing > 1 and paced:
            rate = paced / pacing
            parts.append(f"{rate / 1e6:.0f} MB/s")
            if self.total and paced < self.total:
                parts.append(f"~{_duration((self.total - paced) / rate)} left")
        parts.append(f"{_duration(elapsed)} elapsed")
        return f"{self.title}: " + (f"{step} | " if step else "") + ", ".join(parts)

    def _show(self, final: bool = False) -> None:
        text = self.line()
        if self.live:
            self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._show()

    def __enter__(self) -> Progress:
        self._thread = threading.Thread(target=self._run, name="progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self._show(final=True)


@contextmanager
def phase(title: str, what: str, stream: TextIO | None = None) -> Iterator[None]:
    """`title: what ...` when it starts, `title: what done (12 s)` when it ends (or `failed`)."""
    out = stream or sys.stderr
    started = time.monotonic()
    out.write(f"{title}: {what} ...\n")
    out.flush()
    try:
        yield
    except BaseException:
        out.write(f"{title}: {what} failed after {_duration(time.monotonic() - started)}\n")
        out.flush()
        raise
    out.write(f"{title}: {what} done ({_duration(time.monotonic() - started)})\n")
    out.flush()
