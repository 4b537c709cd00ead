"""Talking to the user: every line servestack shows goes through `console`, which owns where it goes
and whether it is shown.

- `progress`: what a step is doing and what it found on the way, on stdout; silent inside `quiet()`,
  where a step runs inside another that speaks for it (bump's smoke, a comparison's pull).
- `result`: what a command ends with, on stdout, never silenced.
- `warning` and `error`: what went wrong or may have, on stderr as `SOURCE: text`, always shown.
- `detail`: what `-v` adds (every external command, each job submitted), on stderr as `SOURCE: text`.

stdout carries what scripts and CI logs read line by line; stderr what goes wrong and what `-v` adds,
so `servestack ... > out` keeps the warnings in sight. SOURCE is the part of servestack a line comes
from, as the command line has always shown it (`servestack.image: ...`). Counters of long work that
redraw one line are `util.progress`, on stderr.
"""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Console:
    def __init__(self) -> None:
        self.verbose = False
        self._quieted = 0
        # One line at a time (worker threads report too); reentrant, as logging's: a signal may unwind
        # the main thread out of a write and into another line.
        self._lock = threading.RLock()

    def configure(self, *, verbose: bool) -> None:
        """The command line's `-v`; the libraries servestack uses (urllib3, docker) still speak
        through logging, so their lines are shown the same way and as much."""
        self.verbose = verbose
        logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(name)s: %(message)s")
        if not verbose:
            logging.getLogger("urllib3").setLevel(logging.ERROR)

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """No progress while the block runs: its caller reports the outcome itself."""
        self._quieted += 1
        try:
            yield
        finally:
            self._quieted -= 1

    def progress(self, text: str) -> None:
        if not self._quieted:
            self._write(sys.stdout, text)

    def result(self, text: str) -> None:
        self._write(sys.stdout, text)

    def warning(self, source: str, text: str, *, failure: BaseException | None = None) -> None:
        """`failure`: its traceback follows the line (an unexpected error that was survived)."""
        if failure is not None:
            text += "\n" + "".join(traceback.format_exception(failure)).rstrip("\n")
        self._write(sys.stderr, f"{source}: {text}")

    def error(self, source: str, text: str) -> None:
        self._write(sys.stderr, f"{source}: {text}")

    def detail(self, source: str, text: str) -> None:
        if self.verbose:
            self._write(sys.stderr, f"{source}: {text}")

    def _write(self, stream: TextIO, text: str) -> None:
        # The stream is looked up at each line, not kept: pytest's capture swaps sys.stdout.
        with self._lock:
            stream.write(text + "\n")
            stream.flush()


console = Console()
