"""Errors a user can act on.

Every error raised for bad input names where the input lives (file, line, column when known),
which field is wrong, and what was expected, so that the message alone is enough to fix it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class ServestackError(Exception):
    """An error the command line prints without a traceback and exits with `exit_code` on."""

    exit_code = 1  # something that was checked failed, or a step could not finish


@dataclass(frozen=True, kw_only=True)
class Location:
    file: Path | str
    line: int | None = None
    column: int | None = None

    def __str__(self) -> str:
        where = str(self.file)
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where


class InputError(ServestackError):
    """Bad input: names the location, the field and what was expected."""

    exit_code = 2

    def __init__(self, location: Location | Path | str, field: str, problem: str):
        self.location = location if isinstance(location, Location) else Location(file=location)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.location}: {field}: {problem}" if field else f"{self.location}: {problem}")


class NetworkError(ServestackError):
    """A remote service could not be reached after retries."""

    exit_code = 3


# A comparison's verdict on its gated metric, as the exit code of `compare`, the throughput stage held
# to a baseline, and `bump` (README, "Exit codes"): one code per verdict, apart from the codes of
# failures that are not verdicts.
VERDICT_EXIT_CODES = {"no regression": 0, "regression": 4, "undecided": 5}


def verdict_exit_code(verdict: str) -> int:
    return VERDICT_EXIT_CODES[verdict]


class VerdictFailed(ServestackError):
    """A comparison decided against B, or could not decide within its budget."""

    def __init__(self, verdict: str, message: str):
        self.verdict = verdict
        self.exit_code = verdict_exit_code(verdict)
        super().__init__(message)


class InputErrors(ServestackError):
    """Several problems found in one pass, so the user fixes them all at once."""

    exit_code = 2

    def __init__(self, errors: list[InputError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))
