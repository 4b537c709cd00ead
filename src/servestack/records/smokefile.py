"""Smoke's record as a typed value with one reader and one writer: build/<stack>/smoke.json.

`status` and `counts` are written for readers outside Python (the workflow summary, a person); they
follow from the checks, so the reader refuses a file where they disagree rather than trust either.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from servestack.records.codec import Record, decode, encode, json_quirks, one_of
from servestack.records.fields import Fields, read_record, write_record

PASS, FAIL, NOT_RUN = "pass", "fail", "not_run"
STATUSES = (PASS, FAIL, NOT_RUN)


@dataclass(frozen=True, kw_only=True)
class Check(Record):
    """One smoke check: pass, fail or not run, with the reason."""
    probe: str
    name: str
    status: str = field(metadata=json_quirks(check=one_of(*STATUSES)))
    detail: str = ""
    time_s: float | None = None


def _count(checks: tuple[Check, ...]) -> dict[str, int]:
    out = {PASS: 0, FAIL: 0, NOT_RUN: 0}
    for c in checks:
        out[c.status] = out.get(c.status, 0) + 1
    return out


@dataclass(frozen=True, kw_only=True)
class SmokeRecord(Record):
    stack: str
    image: str  # REPO@sha256:<hex>, the digest smoke tested
    platform: str
    lock_sha256: str
    wall_s: float
    metrics: dict[str, Any]  # what the probes measured; the probes own its fields
    checks: tuple[Check, ...]
    # Per PR of the stack: present (its evidence check), exercised (the check it names), by smoke/ablation.
    prs: tuple[dict[str, Any], ...] = field(default=(), metadata=json_quirks(omit=True))

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def served(self) -> bool:
        """Whether any serving check ran: a PASS of the static probe alone (`smoke --no-serve`, a GPU model
        on a host without one, an arm64 image on x86) is not a PASS of a server."""
        return any(c.probe != "static" and c.status != NOT_RUN for c in self.checks)

    @property
    def status(self) -> str:
        return PASS if self.ok else FAIL

    def counts(self) -> dict[str, int]:
        return _count(self.checks)

    def to_json(self) -> dict[str, Any]:
        return {**encode(self), "wall_s": round(self.wall_s, 2), "status": self.status, "counts": self.counts()}

    @classmethod
    def from_json(cls, f: Fields) -> Self:
        record = decode(cls, f, also=("status", "counts"))
        if f.str("status") != record.status:
            raise f.error("status", f"expected {record.status!r} (what the checks say), found {f.str('status')!r}")
        written = f.obj("counts")
        written.only(*STATUSES)
        found = {k: written.int(k) for k in written.data}
        if found != record.counts():
            raise f.error("counts", f"expected {record.counts()} (what the checks say), found {found}")
        return record


def read_smoke(path: Path, remedy: str = "", shown: Path | str | None = None) -> SmokeRecord:
    return read_record(path, SmokeRecord.from_json, remedy, shown)


def write_smoke(path: Path, record: SmokeRecord) -> None:
    write_record(path, record.to_json())
