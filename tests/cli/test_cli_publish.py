"""`pull` prints the published smoke's verdict with its counts (issue 53), and says so when serving never
ran: a PASS of the static probe alone is not a PASS of a server."""

from __future__ import annotations

from fixtures.records import write_smoke_record
from servestack.cli_publish import smoke_verdict
from servestack.records.smokefile import Check

IMAGE = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "a" * 64


def test_the_verdict_counts_the_checks_and_names_a_smoke_that_served_nothing(tmp_path):
    static = Check(probe="static", name="imports", status="pass")
    served = write_smoke_record(tmp_path / "served.json", IMAGE, checks=(
        static, Check(probe="serving", name="completion", status="pass"), Check(probe="serving", name="gpu", status="not_run")))
    assert smoke_verdict(tmp_path / "served.json") == (
        f"smoke of {IMAGE} (linux/amd64): {served.status.upper()} (2 pass, 0 fail, 1 not run)")
    write_smoke_record(tmp_path / "static.json", IMAGE, checks=(
        static, Check(probe="serving", name="completion", status="not_run", detail="--no-serve")))
    assert smoke_verdict(tmp_path / "static.json").endswith("(1 pass, 0 fail, 1 not run); serving did not run: "
                                                            "the static probe alone")
    assert smoke_verdict(tmp_path / "absent.json") is None
