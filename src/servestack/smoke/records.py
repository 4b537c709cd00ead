"""What smoke produces: checks (pass, fail or not run, with the reason) and the result written to smoke.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PASS, FAIL, NOT_RUN = "pass", "fail", "not_run"


@dataclass
class Check:
    probe: str
    name: str
    status: str
    detail: str = ""
    time_s: float | None = None


@dataclass
class SmokeResult:
    stack: str
    image: str
    platform: str
    checks: list[Check]
    metrics: dict[str, Any]
    wall_s: float
    smoke_json: Path
    junit_xml: Path
    lock_sha256: str = ""

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def passed(self) -> bool:
        return self.ok

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def counts(self) -> dict[str, int]:
        out = {PASS: 0, FAIL: 0, NOT_RUN: 0}
        for c in self.checks:
            out[c.status] = out.get(c.status, 0) + 1
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "stack": self.stack,
            "image": self.image,
            "platform": self.platform,
            "lock_sha256": self.lock_sha256,
            "status": "pass" if self.ok else "fail",
            "counts": self.counts(),
            "wall_s": round(self.wall_s, 2),
            "metrics": self.metrics,
            "checks": [asdict(c) for c in self.checks],
        }

    def summary(self) -> str:
        counts = self.counts()
        lines = [
            f"smoke {self.stack}: {'PASS' if self.ok else 'FAIL'}  "
            f"({counts[PASS]} passed, {counts[FAIL]} failed, {counts[NOT_RUN]} not run; {self.wall_s:.0f} s)",
            f"  image    {self.image} ({self.platform})",
        ]
        m = self.metrics
        if m.get("time_to_ready_s") is not None:
            lines.append(
                f"  serving  ready in {m['time_to_ready_s']:.1f} s, first token {m.get('first_token_latency_s') or 0:.3f} s"
            )
        d = m.get("disagg") or {}
        if d.get("time_to_ready_s") is not None:
            lines.append(
                f"  disagg   ready in {d['time_to_ready_s']:.1f} s, first token {d.get('first_token_latency_s') or 0:.3f} s, "
                f"KV transfers over NIXL {d.get('kv_transfers', 0)} (failed {d.get('kv_transfers_failed', 0)})"
            )
        for c in self.checks:
            if c.status == FAIL:
                lines.append(f"  FAIL     {c.probe}/{c.name}: {_first_lines(c.detail, 12)}")
        not_run = [c for c in self.checks if c.status == NOT_RUN]
        for c in not_run[:10]:
            lines.append(f"  not run  {c.probe}/{c.name}: {_first_lines(c.detail, 1)[:200]}")
        if len(not_run) > 10:
            lines.append(f"  not run  ... and {len(not_run) - 10} more (see {self.smoke_json})")
        lines.append(f"  wrote    {self.smoke_json}, {self.junit_xml}")
        return "\n".join(lines)


def _first_lines(text: str, n: int) -> str:
    lines = text.strip().splitlines()
    return "\n           ".join(lines[:n]) + (" ..." if len(lines) > n else "")
