"""Smoke's record as a typed value with one reader and one writer: build/<stack>/smoke.json.

`status` and `counts` are written for readers outside Python (the workflow summary, a person); they
follow from the checks, so the reader refuses a file where they disagree rather than trust either.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servestack.records.fields import Fields, read_record, write_record

PASS, FAIL, NOT_RUN = "pass", "fail", "not_run"
STATUSES = (PASS, FAIL, NOT_RUN)


@dataclass(frozen=True, kw_only=True)
class Check:
    """One smoke check: pass, fail or not run, with the reason."""
    probe: str
    name: str
    status: str
    detail: str = ""
    time_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "name": self.name, "status": self.status, "detail": self.detail,
                "time_s": self.time_s}

    @classmethod
    def from_json(cls, f: Fields) -> "Check":
        f.only("probe", "name", "status", "detail", "time_s")
        status = f.str("status")
        if status not in STATUSES:
            raise f.error("status", f"expected one of {', '.join(STATUSES)}, found {status!r}")
        time_s = f.json("time_s")
        if time_s is not None:
            time_s = f.number("time_s")
        return cls(probe=f.str("probe"), name=f.str("name"), status=status, detail=f.str("detail"), time_s=time_s)


def _count(checks: tuple[Check, ...]) -> dict[str, int]:
    out = {PASS: 0, FAIL: 0, NOT_RUN: 0}
    for c in checks:
        out[c.status] = out.get(c.status, 0) + 1
    return out


@dataclass(frozen=True, kw_only=True)
class SmokeRecord:
    stack: str
    image: str  # REPO@sha256:<hex>, the digest smoke tested
    platform: str
    lock_sha256: str
    wall_s: float
    metrics: dict[str, Any]  # what the probes measured; the probes own its fields
    checks: tuple[Check, ...]
    # Per PR of the stack: present (its evidence check), exercised (the check it names), by smoke/ablation.
    prs: tuple[dict[str, Any], ...] = ()

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
        return {"stack": self.stack, "image": self.image, "platform": self.platform, "lock_sha256": self.lock_sha256,
                "status": self.status, "counts": self.counts(), "wall_s": round(self.wall_s, 2),
                "metrics": self.metrics, "checks": [c.to_json() for c in self.checks],
                **({"prs": [dict(p) for p in self.prs]} if self.prs else {})}

    @classmethod
    def from_json(cls, f: Fields) -> "SmokeRecord":
        f.only("stack", "image", "platform", "lock_sha256", "status", "counts", "wall_s", "metrics", "checks", "prs")
        f.obj("metrics")
        record = cls(stack=f.str("stack"), image=f.str("image"), platform=f.str("platform"), lock_sha256=f.str("lock_sha256"), wall_s=f.number("wall_s"),
                     metrics=dict(f.json("metrics")), checks=f.items("checks", Check.from_json),
                     prs=f.items("prs", lambda p: dict(p.data), ()))
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
