"""Errors a user can act on, each with the exit code the command line ends with.

Every error raised for bad input names where the input lives (file, line, column when known),
which field is wrong, and what was expected, so that the message alone is enough to fix it.

This module is the one owner of the exit codes (README, "Exit codes", repeats the table and
tests/test_errors.py holds the two equal). A class either owns a code, a number no other class
writes, or borrows one by name (`exit_code = InputError.exit_code`), which says it means the same:

    code  class                          meaning
       0  (none)                         success; for a comparison: no regression at every gated point
       1  ServestackError, StageFailed,  a check failed, or a step could not finish
          PushStopped
       2  InputError, InputErrors,       bad input: the message names the file, line and field
          ImageRefError
       3  NetworkError                   a remote service could not be reached after retries
       4  VerdictFailed, StageFailed     regression: a gated point is worse than the threshold
       5  VerdictFailed, StageFailed     undecided: the budget ran out before a gated point was decided
       6  CommandError                   an external program failed; its output ends the message
       7  IntegrityError                 a downloaded or cached file lacks the sha256 its lock or index records
       8  SignatureError                 a signed envelope does not verify with the given key
       9  RegistryError                  a registry answered, but not with what was asked (404, a refusal,
                                         a digest that does not match, a body past its limit)
      10  PublishError                   a publication cannot be made, found or trusted
      11  PullRequestNotFound            a pull request is not on GitHub or in its git mirror
      12  OverlayError,                  a pull request cannot be overlaid onto its pinned wheel
          PatchDoesNotApply
      13  WheelError                     a wheel cannot be read or written
      14  ClusterToolsMissing            a vendored source, or a tool the cluster chain needs, is not here
     130  (KeyboardInterrupt)            interrupted (Ctrl-C), after cleaning up (util/interrupts.py)
     143  (Terminated)                   terminated (SIGTERM), after cleaning up

4 and 5 are a verdict's (VERDICT_EXIT_CODES), set per instance; the command line turns any error
into its code in one place, `cli.main`. The last section holds signals that never reach a user:
the library raises and catches them, and turns them into one of the errors above.

Nothing here imports from servestack: every module may raise these.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path


class ServestackError(Exception):
    """An error the command line prints without a traceback and exits with `exit_code` on."""

    exit_code = 1  # something that was checked failed, or a step could not finish


# ---------------------------------------------------------------- bad input


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


class InputErrors(ServestackError):
    """Several problems found in one pass, so the user fixes them all at once."""

    exit_code = InputError.exit_code

    def __init__(self, errors: list[InputError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


class ImageRefError(InputError):
    """An image reference that is not a digest reference (records/imageref.py); the message says why."""

    exit_code = InputError.exit_code

    def __init__(self, problem: str):
        super().__init__("image reference", "", problem)


# ---------------------------------------------------------------- verdicts


# A comparison's verdict on its gated metric, as the exit code of `compare`, the throughput stage held
# to a baseline, and `bump` (README, "Exit codes"): one code per verdict, apart from the codes of
# failures that are not verdicts.
VERDICT_EXIT_CODES = {"no regression": 0, "regression": 4, "undecided": 5}
BASELINE_GATES = frozenset({"regression", "undecided"})  # the gates a baseline's verdicts fail (stages/baseline.py)


def verdict_exit_code(verdict: str) -> int:
    return VERDICT_EXIT_CODES[verdict]


class VerdictFailed(ServestackError):
    """A comparison decided against B, or could not decide within its budget."""

    def __init__(self, verdict: str, message: str):
        self.verdict = verdict
        self.exit_code = verdict_exit_code(verdict)
        super().__init__(message)


class StageFailed(ServestackError):
    """A stage ran but its gates failed; `.result` holds the numbers and the verdict (a stages.StageResult,
    which this module cannot name). When every failed gate is a baseline's verdict, the exit code is
    that verdict's: a regression's when any point regressed."""

    exit_code = ServestackError.exit_code

    def __init__(self, message: str, *, failed_gates: Collection[str], result: object = None):
        self.result = result
        gates = set(failed_gates)
        if gates and gates <= BASELINE_GATES:
            self.exit_code = verdict_exit_code("regression" if "regression" in gates else "undecided")
        super().__init__(message)


# ---------------------------------------------------------------- the outside world


class NetworkError(ServestackError):
    """A remote service could not be reached after retries."""

    exit_code = 3


class CommandError(ServestackError):
    """An external program (util/proc.py runs them) exited with an error; the message ends with its output."""

    exit_code = 6

    def __init__(self, argv: Sequence[str], returncode: int, output: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-20:])
        super().__init__(f"`{shlex.join(self.argv)}` exited with {returncode}" + (f":\n{tail}" if tail else ""))


class IntegrityError(ServestackError):
    """A downloaded or cached file does not have the sha256 that its lock, index or archive records."""

    exit_code = 7


class SignatureError(ServestackError):
    """An envelope that does not verify with the given key, or is not what it claims to be."""

    exit_code = 8


class RegistryError(ServestackError):
    """The registry answered, but not what the operation needs (404, 400, a digest mismatch)."""

    exit_code = 9


class PublishError(ServestackError):
    """A publication that cannot be made, found or trusted; the message says which part and why."""

    exit_code = 10


class PullRequestNotFound(ServestackError):
    """A pull request GitHub or the git mirror does not have (the lock names it in the stack file instead)."""

    exit_code = 11


# ---------------------------------------------------------------- what the steps make


class OverlayError(ServestackError):
    """A PR that cannot be overlaid onto a wheel."""

    exit_code = 12


class PatchDoesNotApply(OverlayError):
    exit_code = OverlayError.exit_code

    def __init__(self, pr: str, file: str, hunk: str | None, detail: str):
        self.pr, self.file, self.hunk, self.detail = pr, file, hunk, detail
        where = f"{file}, hunk `{hunk}`" if hunk else file
        super().__init__(
            f"{pr}: patch does not apply to the wheel at {where}: {detail.strip()}\n"
            "The wheel's files differ from the PR's base there; rebase the PR's diff onto the "
            "wheel's commit or drop the overlay."
        )


class WheelError(ServestackError):
    """A wheel that cannot be read or written."""

    exit_code = 13


class PushStopped(ServestackError):
    """A push given up because the build is stopping (an interrupt, a failure, or a blob no longer used)."""

    # The build stopped for another reason, whose own error is the one to report.
    exit_code = ServestackError.exit_code


class ClusterToolsMissing(ServestackError):
    """A vendored source (or a tool the cluster chain needs) is not on this machine."""

    exit_code = 14


# ---------------------------------------------------------------- interrupts


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like KeyboardInterrupt so the same cleanup runs (util/interrupts.py raises it
    and gives both their exit codes, 128 + the signal)."""


# ---------------------------------------------------------------- signals inside the library


class Overflow(Exception):
    """The body went past its limit; the registry client turns this into a RegistryError naming what it read."""

    def __init__(self, read: int, limit: int):
        super().__init__(f"more than {limit} bytes (stopped after {read})")
        self.read, self.limit = read, limit


class Stalled(Exception):
    """A registry's deadline passed or its response stopped moving (sources/registry/transfer.py); the
    registry client turns this into a NetworkError naming the registry and what it was reading."""


class OutOfRange(ValueError):
    """An RFC 3339 time whose UTC instant is outside years 1 to 9999 (publish/signedtime.py turns it
    into a PublishError or an InputError naming the value)."""


class FieldProblem(ValueError):
    """A validator's complaint about a value below the one it validates (e.g. a model validator
    that checks one key of a mapping field): util/yamlfile.py turns it into an InputError at PATH,
    relative to the validated value. A ValueError, because that is what pydantic collects."""

    def __init__(self, path: tuple[str | int, ...], problem: str):
        self.path = tuple(path)
        super().__init__(problem)
