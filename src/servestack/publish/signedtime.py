"""When a publication says it was made, as a time pull can order and bound.

The signed statement's `finishedOn` is RFC 3339 (SLSA provenance v1); pull parses it into a UTC
instant, refuses one it cannot parse, and refuses one later than its own clock plus MAX_CLOCK_SKEW:
a signer's clock may run a little ahead, but a publication dated in the future would otherwise
outrank every later genuine one. Candidates are ordered by the instant, never by the string (an
earlier time written with an offset sorts after a later one written in UTC).

What this cannot give, and TUF's timestamp role does: freshness. A registry (or anyone who can
delete from it) can hide the newest publication, and pull then takes the newest it can see; no
signature on the older one can say a newer one exists. TUF closes that with a short-lived signed
statement of the latest version, re-signed on a schedule. We go as far as a pull can without a
second online key: the signed time is bounded above by the verifier's clock, and `--not-before`
lets a cluster that knows what it last ran (or which run it expects) refuse anything older: a
rollback floor, set by the one who knows it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from servestack.errors import InputError, OutOfRange, PublishError

MAX_CLOCK_SKEW = timedelta(minutes=5)  # how far a signer's clock may run ahead of the verifier's
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")


def parse_rfc3339(text: str) -> datetime | None:
    """TEXT as a UTC instant, or None when it is not an RFC 3339 date-time (fractions past
    microseconds are dropped: ordering finer than that means nothing across machines). OutOfRange
    when it is one but its UTC instant is before year 1 or after 9999 (9999-12-31T23:59:59-01:00);
    an offset is at most 23:59, as RFC 3339's grammar allows two digits of hours."""
    if not isinstance(text, str) or len(text) > 40:
        return None
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second, fraction, zone = m.groups()
    if zone not in ("Z", "z") and (int(zone[1:3]) > 23 or int(zone[4:6]) > 59):
        return None
    offset = timedelta(0) if zone in ("Z", "z") else (
        (1 if zone[0] == "+" else -1) * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
    try:
        local = datetime(int(year), int(month), int(day), int(hour), int(minute), min(int(second), 59),
                         int((fraction or ".0")[1:7].ljust(6, "0")), tzinfo=timezone(offset))
    except ValueError:
        return None
    try:
        return local.astimezone(UTC)
    except OverflowError:
        raise OutOfRange(f"{text} is outside years 1 to 9999 in UTC") from None


def signed_time_text(statement: dict[str, Any]) -> str:
    """The time a statement says it was published: finishedOn (older ones only have the lock's startedOn)."""
    metadata = (statement.get("predicate") or {}).get("runDetails", {}).get("metadata") or {}
    return metadata.get("finishedOn") or metadata.get("startedOn") or ""


def published_instant(statement: dict[str, Any], now: datetime) -> datetime:
    """The statement's signed time as a UTC instant; PublishError when it is malformed or in the future."""
    text = signed_time_text(statement)
    try:
        instant = parse_rfc3339(text)
    except OutOfRange:
        raise PublishError(f"finishedOn {text} is out of range: its UTC instant is outside years 1 to 9999") from None
    if instant is None:
        raise PublishError(f"finishedOn {str(text)[:60]!r} is not an RFC 3339 time")
    if instant > now + MAX_CLOCK_SKEW:
        raise PublishError(f"finishedOn {text} is in the future (this machine's clock: {utc_text(now)}, "
                           f"{int(MAX_CLOCK_SKEW.total_seconds() // 60)} min skew allowed)")
    return instant


def not_before(text: str | None) -> datetime | None:
    """`--not-before`: an RFC 3339 time, or a date (midnight UTC)."""
    if text is None:
        return None
    try:
        instant = parse_rfc3339(text) or parse_rfc3339(f"{text}T00:00:00Z")
    except OutOfRange:
        raise InputError("--not-before", "", f"{text[:60]!r} is out of range: its UTC instant is outside years 1 to "
                                             "9999") from None
    if instant is None:
        raise InputError("--not-before", "", f"{text[:60]!r} is not an RFC 3339 time (2026-12-01T09:30:00Z) or a date")
    return instant


def utc_text(instant: datetime) -> str:
    return instant.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
