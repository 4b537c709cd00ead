"""The checks pull makes before it trusts a candidate, on their own: the signed time, the recipes'
binding, titles, and the bounded read, without a registry."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest

from servestack.errors import InputError, Overflow, PublishError
from servestack.publish.binding import check_bindings
from servestack.publish.bundle import BundleFile, titles_problem
from servestack.publish.candidates import deduplicated
from servestack.publish.signedtime import MAX_CLOCK_SKEW, not_before, parse_rfc3339, published_instant
from servestack.sources.registry import Descriptor
from servestack.sources.registry.limits import declared_problem, read_bounded

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
IMAGE = "servestack/dev-cpu@sha256:" + "a" * 64
LOCK = "b" * 64


def _statement(finished_on: str) -> dict:
    return {"predicate": {"runDetails": {"metadata": {"finishedOn": finished_on}}}}


def test_an_offset_time_is_the_same_instant_in_utc_and_orders_by_it():
    assert parse_rfc3339("2026-12-01T17:00:00+05:00") == NOW.replace(hour=12)
    assert parse_rfc3339("2026-12-01T12:00:00.123456789Z") == NOW.replace(microsecond=123456)
    assert parse_rfc3339("2026-12-01T16:00:00+05:00") < parse_rfc3339("2026-12-01T12:00:00Z")


@pytest.mark.parametrize("text", ["9999", "", "2026-12-01", "2026-13-01T00:00:00Z", "2026-12-01T12:00:00",
                                  "tomorrow", "2026-12-01T12:00:00Z" + " " * 60])
def test_a_malformed_time_is_refused_naming_it(text):
    with pytest.raises(PublishError, match="is not an RFC 3339 time"):
        published_instant(_statement(text), NOW)


def test_a_time_past_the_clock_and_its_skew_is_refused_and_one_within_is_taken():
    within = NOW + MAX_CLOCK_SKEW - timedelta(seconds=1)
    assert published_instant(_statement(within.isoformat()), NOW) == within
    with pytest.raises(PublishError, match="is in the future"):
        published_instant(_statement("2030-01-01T00:00:00Z"), NOW)


@pytest.mark.parametrize("text", ["9999-12-31T23:59:59-01:00", "0001-01-01T00:00:00+23:59"])
def test_a_time_whose_utc_instant_is_out_of_range_is_refused_with_the_value_never_a_crash(text):
    with pytest.raises(PublishError, match=rf"finishedOn {re.escape(text)} is out of range"):
        published_instant(_statement(text), NOW)
    with pytest.raises(InputError, match=rf"--not-before.*'{re.escape(text)}' is out of range"):
        not_before(text)


@pytest.mark.parametrize("text", ["2026-12-01T12:00:00+24:00", "2026-12-01T12:00:00+99:99", "2026-12-01T12:00:00-05:60"])
def test_an_offset_past_23_59_is_not_a_time(text):
    with pytest.raises(PublishError, match="is not an RFC 3339 time"):
        published_instant(_statement(text), NOW)


def test_not_before_takes_a_time_or_a_date_and_refuses_anything_else():
    assert not_before("2026-12-01") == NOW.replace(hour=0)
    assert not_before("2026-12-01T17:00:00+05:00") == NOW
    with pytest.raises(InputError, match="--not-before"):
        not_before("last tuesday")


def _recipe(reference: str, lock: str = LOCK) -> BundleFile:
    text = (f"# image: {reference}\n# lock-sha256: {lock}\nmodel:\n  container: {reference}\n"
            f"identity:\n  container:\n    image: {reference}\n")
    return BundleFile(title="recipes/agg.yaml", data=text.encode())


def test_recipes_must_bind_the_pulled_repository_and_digest_and_the_lock_on_any_host():
    assert check_bindings((_recipe(f"mirror.example:5000/{IMAGE}"),), IMAGE, LOCK) == 1
    for reference in (f"registry/servestack/dev-cpu@sha256:{'c' * 64}", "registry/other@" + IMAGE.split("@")[1],
                      "registry/servestack/dev-cpu:latest"):
        with pytest.raises(PublishError, match=rf"recipes/agg.yaml binds '{reference}', not {IMAGE}"):
            check_bindings((_recipe(reference),), IMAGE, LOCK)
    with pytest.raises(PublishError, match="records lock-sha256 'c+'"):
        check_bindings((_recipe(IMAGE, "c" * 64),), IMAGE, LOCK)


def test_a_64_kb_title_is_a_clean_error_not_a_traceback():
    problem = titles_problem(["pins/dev-cpu.lock", "x" * 65536])
    assert problem and "65536 characters" in problem and len(problem) < 200
    assert titles_problem(["runs/a", "runs/a/b.json"]) == "file title 'runs/a' is also the directory of 'runs/a/b.json'"


def test_referrers_listed_many_times_are_one_candidate_each():
    attestation = Descriptor(media_type="m", digest="sha256:" + "d" * 64, size=10, artifact_type="attestation")
    relisted = Descriptor(media_type="m", digest=attestation.digest, size=10,
                          artifact_type="sbom")  # another type never hides the attestation
    assert deduplicated([relisted] + [attestation] * 10_000) == [attestation, relisted]


def test_a_body_stops_at_its_limit_and_a_declared_size_has_a_ceiling():
    assert read_bounded([b"ab", b"c"], 3).data == b"abc"
    with pytest.raises(Overflow, match="more than 3 bytes"):
        read_bounded(iter(lambda: b"x" * 2, None), 3)
    assert declared_problem(2 << 30, 4 << 20, "its envelope") == (
        "its envelope declares 2147483648 bytes, over the 4194304-byte ceiling for its kind")
    assert "not a byte count" in declared_problem("12", 100, "a file")


@pytest.mark.parametrize("title", ["publication.json", "publication.json/x"])
def test_a_title_where_pull_writes_its_own_record_is_refused_by_name(title):
    assert titles_problem(["pins/dev-cpu.lock", title]) == (
        f"file title {title!r} is where pull writes its own record; a bundle cannot hold it")
