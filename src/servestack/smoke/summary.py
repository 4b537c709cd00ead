"""What a smoke run returns: the record written to smoke.json (records.smoke owns its fields) and its summary."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servestack.clients import agreement
from servestack.records.smokefile import FAIL, NOT_RUN, PASS, Check, SmokeRecord


@dataclass(kw_only=True)
class SmokeResult:
    """A smoke run: its record (what smoke.json holds; read the run's checks and metrics there) and
    where it was written."""

    record: SmokeRecord
    smoke_json: Path
    junit_xml: Path

    @property
    def exit_code(self) -> int:
        return 0 if self.record.ok else 1

    def summary(self) -> str:
        r = self.record
        counts = r.counts()
        lines = [
            f"smoke {r.stack}: {r.status.upper()}  "
            f"({counts[PASS]} passed, {counts[FAIL]} failed, {counts[NOT_RUN]} not run; {r.wall_s:.0f} s)",
            f"  image    {r.image} ({r.platform})",
        ]
        m = r.metrics
        if m.get("time_to_ready_s") is not None:
            lines.append(
                f"  serving  ready in {m['time_to_ready_s']:.1f} s, first token {m.get('first_token_latency_s') or 0:.3f} s"
            )
        d = m.get("disagg") or {}
        if d.get("time_to_ready_s") is not None:
            # A first request that needed retries is visible here too, not only in ready's detail.
            attempts = (d.get("first_request") or {}).get("attempts") or 0
            retried = f" (served a first request on attempt {attempts})" if attempts > 1 else ""
            lines.append(
                f"  disagg   ready in {d['time_to_ready_s']:.1f} s{retried}, first token "
                f"{d.get('first_token_latency_s') or 0:.3f} s, "
                f"KV transfers over NIXL {d.get('kv_transfers', 0)} (failed {d.get('kv_transfers_failed', 0)})"
            )
        if d.get("gdn_layers"):
            lines.append(f"  hybrid   {d['gdn_layers']} Gated DeltaNet layers served in both shapes")
        a = d.get("agreement") or {}
        if a:
            lines.append(f"  oracle   disagg vs agg: {agreement.summary(a)}")
        for c in r.failed:
            lines.append(f"  FAIL     {c.probe}/{c.name}: {_first_lines(c.detail, 12)}")
        not_run = [c for c in r.checks if c.status == NOT_RUN]
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
