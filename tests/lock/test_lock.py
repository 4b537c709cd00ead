"""`servestack lock` resolves a stack into a lock of hashes; `--check` verifies it offline.

Everything here is real and local: a git repository with real PRs served through GitHub's REST
endpoints, a PEP 503 package index over HTTP, the machine's Debian archive for the base (a base given
as an image, locked through the Debian docker-registry on loopback: test_lock_e2e.py).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from fixtures.tinystack import DEBIAN_BASE, github, make_project, pr_items, tinyserve_stack
from servestack import lock
from servestack.errors import InputError, InputErrors, NetworkError
from servestack.lock import check as lockcheck
from servestack.sources.github import GitHub
from servestack.sources.registry import transfer
from servestack.util.console import console
from servestack.util.project import Project


def pr_entries(project: Project) -> dict[int, dict]:
    return {e["number"]: e for e in lock.load_lock(project, "tiny").to_json()["pull_requests"]}


def test_prs_are_classified_included_or_overlay_by_real_ancestry(tmp_path, world):
    project = make_project(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    prs = pr_entries(project)
    pkg = world["pkg"]

    assert prs[1]["status"] == "included"  # merged before the release the wheel records
    assert prs[1]["merge_commit"] == pkg.prs[1].merge
    assert "patch" not in prs[1]

    assert prs[2]["status"] == "overlay"  # merged after the release: its diff is stored and hashed
    patch = project.root / prs[2]["patch"]["path"]
    assert patch.read_text() == pkg.prs[2].patch
    assert prs[2]["patch"]["python_only"] is True
    assert prs[2]["files"] == sorted(prs[2]["files"]) and "tinyserve/server.py" in prs[2]["files"]

    assert prs[3]["status"] == "overlay"
    assert prs[3]["patch"]["python_only"] is False
    assert prs[3]["patch"]["native_files"] == ["csrc/kernel.cu"]


def test_the_lock_records_wheels_the_debian_release_and_the_stack_hash(tmp_path, world):
    project = make_project(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    document = lock.load_lock(project, "tiny").to_json()
    (wheel,) = document["platforms"]["linux/amd64"]
    assert wheel["name"] == "tinyserve" and wheel["index"] == "local"
    assert "url" not in wheel and wheel["size"] == world["pkg"].wheel.stat().st_size  # portable: index name + file
    assert wheel["sha256"] == __import__("hashlib").sha256(world["pkg"].wheel.read_bytes()).hexdigest()
    assert len(document["base"]["debian"]["release_sha256"]) == 64
    assert document["packages"]["tinyserve"]["commit"] == world["pkg"].base[:9]
    assert document["stack"]["sha256"] == __import__("hashlib").sha256(
        (project.pins / "tiny.yaml").read_bytes()).hexdigest()


def test_a_found_wheel_goes_into_the_lock_in_the_lock_s_own_spelling():
    """sources.pypi finds a wheel with its URL and upload time; the lock keeps neither, and the one
    spelling of a lock's wheel entry is records.lockfile.LockedWheel's (a FoundWheel is one)."""
    from dataclasses import fields

    from servestack.records.lockfile import LockedWheel
    from servestack.sources.pypi import FoundWheel

    entry = LockedWheel(name="tinyserve", version="1.0", filename="tinyserve-1.0-py3-none-any.whl", sha256="ab" * 32, size=1234,
                        index="local")
    found = FoundWheel(**{f.name: getattr(entry, f.name) for f in fields(entry)},
                       url="https://index.example/tinyserve-1.0-py3-none-any.whl", upload_time=1_700_000_000)
    assert isinstance(found, LockedWheel)
    assert found.to_json() == entry.to_json()


def test_locking_twice_gives_byte_identical_files(tmp_path, world):
    project = make_project(tmp_path, world)
    first = lock.lock(project, "tiny", github(world)).read_bytes()
    second = lock.lock(project, "tiny", github(world)).read_bytes()
    assert first == second


def test_a_pr_that_does_not_exist_names_it_and_keeps_the_previous_lock(tmp_path, world):
    project = make_project(tmp_path, world)
    before = lock.lock(project, "tiny", github(world)).read_bytes()
    stack = project.pins / "tiny.yaml"
    stack.write_text(stack.read_text().replace("number: 3", "number: 99"))
    with pytest.raises(InputError, match=r"packages\[0\]\.prs\[2\]: example/tinyserve#99 does not exist"):
        lock.lock(project, "tiny", github(world))
    assert project.lock_file("tiny").read_bytes() == before


def test_an_unreachable_registry_is_reported_after_retries_and_keeps_the_previous_lock(tmp_path, world, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(transfer, "sleep", waits.append)
    project = make_project(tmp_path, world)
    before = lock.lock(project, "tiny", github(world)).read_bytes()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    stack = project.pins / "tiny.yaml"
    stack.write_text(stack.read_text().replace(DEBIAN_BASE, f"  image: 127.0.0.1:{closed_port}/nothing:1"))
    with pytest.raises(NetworkError, match=rf"image 127.0.0.1:{closed_port}/nothing:1: could not reach"):
        lock.lock(project, "tiny", github(world))
    assert waits == [0.5, 1.0, 2.0, 4.0]  # each retry waits twice as long as the one before
    assert project.lock_file("tiny").read_bytes() == before


def test_an_unreachable_github_records_prs_as_unverified(tmp_path, world):
    project = make_project(tmp_path, world, prs=(2,))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    lock.lock(project, "tiny", GitHub(api=closed, token="", retries=0))
    assert pr_entries(project)[2]["status"] == "unverified"
    report = lockcheck.check(project, "tiny")
    assert report.ok and any("unverified" in w for w in report.warnings)


def test_check_passes_on_a_fresh_lock_and_names_an_edited_patch(tmp_path, world):
    project = make_project(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    assert lockcheck.check(project, "tiny").ok

    patch = project.root / pr_entries(project)[2]["patch"]["path"]
    patch.write_text(patch.read_text().replace("hello", "hellO", 1))
    report = lockcheck.check(project, "tiny")
    assert not report.ok
    (problem,) = report.problems
    assert "pull_requests[example/tinyserve#2].patch" in problem and "sha256" in problem


def test_check_names_the_stack_file_when_it_changed_by_one_character(tmp_path, world):
    project = make_project(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    stack = project.pins / "tiny.yaml"
    stack.write_text(stack.read_text().replace("name: tiny\n", "name: tiny \n", 1))
    (problem,) = lockcheck.check(project, "tiny").problems
    assert "stack.sha256" in problem and "pins/tiny.yaml changed since the lock" in problem


def test_check_names_a_missing_entry(tmp_path, world):
    project = make_project(tmp_path, world)
    path = lock.lock(project, "tiny", github(world))
    document = json.loads(path.read_text())
    document["pull_requests"] = [e for e in document["pull_requests"] if e["number"] != 1]
    path.write_text(json.dumps(document))
    (problem,) = lockcheck.check(project, "tiny").problems
    assert "pull_requests[example/tinyserve#1]: entry missing" in problem


@pytest.mark.parametrize("stack", ["dev-cpu", "qwen35-gb200"])
def test_the_committed_locks_match_their_stacks(stack):
    report = lockcheck.check(Project(root=ROOT), stack)
    assert report.ok, report.problems


def test_the_github_token_is_sent_but_never_written_or_logged(tmp_path, world, monkeypatch, caplog, capsys):
    secret = "ghp_" + "s3cr3t" * 6
    monkeypatch.setenv("GITHUB_TOKEN", secret)
    monkeypatch.setattr(console, "verbose", True)  # all servestack says, `-v` included
    caplog.set_level("DEBUG")  # and all the libraries log
    project = make_project(tmp_path, world, prs=(2,))
    world["github"].authorizations.clear()
    lock.lock(project, "tiny", GitHub(api=world["github"].url, retries=1))
    assert world["github"].authorizations and all(a == f"Bearer {secret}" for a in world["github"].authorizations)
    written = b"".join(p.read_bytes() for p in project.root.rglob("*") if p.is_file())
    assert secret.encode() not in written
    shown = capsys.readouterr()
    assert secret not in caplog.text + shown.out + shown.err


KERNELS = ("  - name: tinykernels\n    version: 1.0.0\n    index: kernels\n"
           "    if_unavailable: the server JIT-compiles these kernels at first start instead\n")


def kernels_project(tmp_path: Path, world, package: str = KERNELS) -> Project:
    """The tiny stack plus a package pinned on index `kernels`, which it lets go if it cannot be had."""
    (tmp_path / "pins").mkdir()
    text = tinyserve_stack(world, "tiny", pr_items(world, (1,)), package=package)
    (tmp_path / "pins" / "tiny.yaml").write_text(text.replace("indexes:\n", "indexes:\n  - name: kernels\n", 1))
    return Project(root=tmp_path)


@pytest.fixture
def kernels_index_unconfigured(tmp_path, monkeypatch):
    """No location for index `kernels` on this machine: no variable, no [[index]] in uv.toml."""
    monkeypatch.delenv("SERVESTACK_INDEX_KERNELS", raising=False)
    (tmp_path / "uv.toml").write_text("")
    monkeypatch.setenv("UV_CONFIG_FILE", str(tmp_path / "uv.toml"))


def test_a_package_its_index_cannot_give_is_locked_as_unavailable_by_name_with_the_stack_s_reason(
        tmp_path, world, kernels_index_unconfigured):
    project = kernels_project(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    (entry,) = lock.load_lock(project, "tiny").to_json()["unavailable"]
    assert (entry["package"], entry["version"], entry["index"]) == ("tinykernels", "1.0.0", "kernels")
    assert "index 'kernels' has no location here: set SERVESTACK_INDEX_KERNELS" in entry["why"]
    assert entry["accepted_because"] == "the server JIT-compiles these kernels at first start instead"
    assert "tinykernels" not in lock.load_lock(project, "tiny").packages

    report = lockcheck.check(project, "tiny")  # what `build` runs first
    assert report.ok, report.problems
    assert any("tinykernels 1.0.0 is not in the image" in w and "accepted because" in w for w in report.warnings)


def test_an_index_that_answers_without_the_pinned_version_is_named_in_the_lock(tmp_path, world, monkeypatch):
    monkeypatch.setenv("SERVESTACK_INDEX_KERNELS", world["index"])  # a real index, without tinykernels
    project = kernels_project(tmp_path, world)
    lock.lock(project, "tiny", github(world))
    (entry,) = lock.load_lock(project, "tiny").unavailable
    assert "gave no wheel of tinykernels==1.0.0 for linux/amd64" in entry.why and "SERVESTACK_INDEX_KERNELS" in entry.why


def test_a_package_its_index_does_give_is_locked_like_any_other(tmp_path, world, monkeypatch):
    monkeypatch.setenv("SERVESTACK_INDEX_KERNELS", world["index"])  # the index that has tinyserve
    project = kernels_project(tmp_path, world, package="")
    stack = project.pins / "tiny.yaml"
    stack.write_text(stack.read_text().replace("    index: local\n", "    index: kernels\n    if_unavailable: "
                                               "never needed, this index answers\n", 1))
    lock.lock(project, "tiny", github(world))
    locked = lock.load_lock(project, "tiny")
    assert not locked.unavailable and [(w.name, w.index) for w in locked.wheels("linux/amd64")] == [("tinyserve", "kernels")]


def test_a_lock_that_lets_a_package_go_without_the_stack_s_reason_is_refused_before_the_build(
        tmp_path, world, kernels_index_unconfigured):
    project = kernels_project(tmp_path, world)
    path = lock.lock(project, "tiny", github(world))
    stack = project.pins / "tiny.yaml"
    stack.write_text(stack.read_text().replace(
        "    if_unavailable: the server JIT-compiles these kernels at first start instead\n", ""))
    problems = lockcheck.check(project, "tiny").problems
    assert any("unavailable[0]: tinykernels 1.0.0 could not be had from index 'kernels'" in p
               and "does not accept that" in p and "if_unavailable" in p for p in problems)

    document = json.loads(path.read_text())
    document["unavailable"][0]["accepted_because"] = " "
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"unavailable\[0\]\.accepted_because: empty"):
        lock.load_lock(project, "tiny")


def test_if_unavailable_is_only_for_a_package_on_a_named_index(tmp_path, world):
    project = kernels_project(tmp_path, world, KERNELS.replace("    index: kernels\n", ""))
    with pytest.raises(InputErrors, match=r"tiny.yaml:\d+:\d+: packages\[1\]: `if_unavailable` is for a `version` pinned "
                                          "on a named index"):
        lock.lock(project, "tiny", github(world))


def test_a_relock_keeps_the_locked_base_without_reading_the_archive_and_only_refresh_reads_it(tmp_path, world, monkeypatch):
    project = make_project(tmp_path, world)
    before = lock.lock(project, "tiny", github(world)).read_bytes()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    monkeypatch.setenv("SERVESTACK_INDEX_DEBIAN", f"http://127.0.0.1:{closed_port}/debian")
    assert lock.lock(project, "tiny", github(world)).read_bytes() == before
    with pytest.raises(NetworkError, match=rf"Debian bookworm InRelease \(http://127.0.0.1:{closed_port}/debian/dists/"):
        lock.lock(project, "tiny", github(world), refresh_base=True)
    assert project.lock_file("tiny").read_bytes() == before


def test_the_debian_leg_fetches_the_release_and_each_index_once_then_resolves_from_their_text(monkeypatch):
    """Down once (the signed Release, each architecture's Packages), back once (the pure resolver); a second
    lock from the same Release parses no index again."""
    from servestack.debian import closure
    from servestack.lock import debian_base
    from servestack.sources import debian

    release = debian.Release(suite="bookworm", date=1_700_000_000, sha256="ab" * 32, files={})
    calls: list[str] = []

    def packages(given: debian.Release, arch: str) -> str:
        assert given is release
        calls.append(f"packages {arch}")
        return "".join(f"Package: {name}\nVersion: 1\nArchitecture: {arch}\nSize: 1\nSHA256: {sha * 64}\n"
                       f"Filename: pool/main/{name}_{arch}.deb\n{more}\n"
                       for name, sha, more in (("bash", "1", "Essential: yes\nDepends: libc6\n"), ("libc6", "2", ""),
                                               ("python3", "3", "Depends: libc6\n"), ("curl", "4", "")))

    real_resolve = closure.resolve
    monkeypatch.setattr(debian_base, "_INDEXES", {})
    monkeypatch.setattr(debian, "release", lambda suite: calls.append(f"release {suite}") or release)
    monkeypatch.setattr(debian, "packages", packages)
    monkeypatch.setattr(closure, "resolve", lambda stanzas, wanted, what: calls.append(f"resolve {what}")
                        or real_resolve(stanzas, wanted, what))
    entry = debian_base.resolve_suite("bookworm", ["python3"], ["linux/amd64", "linux/arm64"])
    assert calls == ["release bookworm", "packages amd64", "packages arm64",
                     "resolve Debian bookworm amd64", "resolve Debian bookworm arm64"]
    assert entry.release_date == 1_700_000_000 and entry.release_sha256 == "ab" * 32
    assert entry.index == "debian" and entry.packages == ("python3",)
    assert {p: [d.name for d in debs] for p, debs in entry.resolved.items()} == {
        "linux/amd64": ["bash", "libc6", "python3"], "linux/arm64": ["bash", "libc6", "python3"]}
    assert entry.resolved["linux/arm64"][1].filename == "pool/main/libc6_arm64.deb"
    calls.clear()
    assert debian_base.resolve_suite("bookworm", ["python3"], ["linux/amd64", "linux/arm64"]) == entry
    assert calls == ["release bookworm", "resolve Debian bookworm amd64", "resolve Debian bookworm arm64"]


def test_a_stack_resolved_as_of_the_future_is_refused_naming_the_file_and_field(tmp_path, world):
    """A date not yet come lets in whatever is uploaded until then: the same stack would relock to other wheels."""
    (tmp_path / "pins").mkdir()
    (tmp_path / "pins" / "tiny.yaml").write_text(
        tinyserve_stack(world, "tiny", pr_items(world, (1,)), top='resolved_at: "2999-01-01T00:00:00Z"\n'))
    project = Project(root=tmp_path)
    with pytest.raises(InputError, match=r"tiny\.yaml: resolved_at: is 2999-01-01T00:00:00Z, later than now"):
        lock.lock(project, "tiny", github(world))
    assert not project.lock_file("tiny").exists()
