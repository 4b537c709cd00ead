"""A stack's `resolved_at`, kept honest: never later than the resolution, and said where it cannot hold.

uv's `--exclude-newer` filters by each file's PEP 700 `upload-time`. A date in the future lets in
whatever is uploaded until then, so relocking the same stack file later takes newer releases: such a
stack is refused, and `lock --upgrade` writes the moment it resolves. An index that serves no upload
times (a directory of wheels, a PEP 503 HTML-only index, many mirrors) cannot be filtered at all
(uv then drops every file of it), so there the date is not applied, the lock records that, and
stability rests on the previous lock's versions (servestack.lock.preferences).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from servestack.errors import InputError, NetworkError, ServestackError
from servestack.records.lockfile import UndatedIndex
from servestack.sources.indexes import IndexLocation
from servestack.util.console import console

FORMAT = "%Y-%m-%dT%H:%M:%SZ"
JSON_TYPE = "application/vnd.pypi.simple.v1+json"


def stamp(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime(FORMAT)


def refuse_future(resolved_at: str | None, stack_file: Path, now: datetime | None = None) -> None:
    if resolved_at is None:
        return
    moment = datetime.strptime(resolved_at, FORMAT).replace(tzinfo=UTC)
    current = now or datetime.now(UTC)
    if moment > current:
        raise InputError(stack_file, "resolved_at",
                         f"is {resolved_at}, later than now ({stamp(current)}): a lock resolved as of a moment that "
                         "has not come takes whatever is uploaded until then, so the same stack file relocks to other "
                         "wheels; set it to a past moment, or run `lock --upgrade`, which writes the moment it resolves")


def set_resolved_at(text: str, moment: str) -> str:
    """The stack file's text with `resolved_at` set to `moment` (added after `python:` if absent)."""
    line = f'resolved_at: "{moment}"'
    if re.search(r"^resolved_at:.*$", text, re.M):
        return re.sub(r"^resolved_at:.*$", line, text, count=1, flags=re.M)
    if not re.search(r"^python:.*$", text, re.M):
        raise ServestackError("the stack file has no top-level `python:` line to put `resolved_at` after")
    return re.sub(r"^(python:.*)$", rf"\1\n{line}", text, count=1, flags=re.M)


def serves_upload_times(location: IndexLocation, project: str) -> bool:
    """Whether LOCATION's page for PROJECT gives each file's upload time (PEP 691 JSON, PEP 700 API 1.1).

    uv's own default index (no location configured) is the public index, which serves them."""
    import requests

    if location.url is None:
        return True
    if location.flat:
        return False  # a directory or flat page of files: no upload times to read
    url = f"{location.url.rstrip('/')}/{project}/"
    try:
        answer = requests.get(url, headers={"Accept": JSON_TYPE}, timeout=60)
    except requests.RequestException as exc:
        raise NetworkError(f"{location.describe()}: could not be reached ({exc})") from None
    if answer.status_code == 404:
        return True  # the project lives elsewhere: nothing learned about this index
    if answer.status_code != 200:
        raise NetworkError(f"{location.describe()}: {url} answered HTTP {answer.status_code}")
    if JSON_TYPE not in answer.headers.get("Content-Type", ""):
        return False  # HTML only (PEP 503): it has no place for an upload time
    files = answer.json().get("files") or []
    return bool(files) and all(f.get("upload-time") for f in files)


def undated(location: IndexLocation, resolved_at: str) -> UndatedIndex:
    entry = UndatedIndex(index=location.name, why=(
        f"serves no upload times (PEP 700 `upload-time`), so resolved_at {resolved_at} could not be enforced "
        "there; the previous lock's versions were kept, and a package new to the lock took its newest release"))
    console.warning("servestack.lock", f"{location.describe()}: {entry.why}")
    return entry
