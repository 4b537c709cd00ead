"""What a smoke run returns: the record written to smoke.json (records.smoke owns its fields) and its summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..records.smoke import FAIL, NOT_RUN, PASS, Check, SmokeRecord


@dataclass
class SmokeResult:
    """A smoke run: its record (what smoke.json holds) and where it was written."""
    record: SmokeRecord
    smoke_json: Path
    junit_xml: Path
    wall_s: float  # unrounded, for the summary

    @property
    def stack(self) -> str:
        return self.record.stack

    @property
    def image(self) -> str:
        return self.record.image

    @property
    def platform(self) -> str:
        return self.record.platform

    @property
    def checks(self) -> tuple[Check, ...]:
        return self.record.checks

    @property
    def metrics(self) -> dict[str, Any]:
        return self.record.metrics

    @property
    def failed(self) -> list[Check]:
        return self.record.failed

    @property
    def ok(self) -> bool:
        return self.record.ok

    @property
    def passed(self) -> bool:
        return self.ok

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def counts(self) -> dict[str, int]:
        return self.record.counts()

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


__all__ = ["FAIL", "NOT_RUN", "PASS", "Check", "SmokeRecord", "SmokeResult"]
