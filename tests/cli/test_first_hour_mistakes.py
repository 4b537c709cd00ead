"""A user's first hour (issue 53): each mistake a newcomer makes is refused with the documented exit code
and a message naming what to fix, before any file changes, and never with a traceback."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack import cli
from servestack.errors import InputError

DIGEST = "sha256:" + "0" * 64
REF = f"127.0.0.1:9/servestack/dev-cpu@{DIGEST}"
BAD = InputError.exit_code

# What each subcommand needs besides --stack to get as far as reading the stack.
EXTRA = {
    "cancel": ["--run-id", "r1"],
    "recipes": ["check"],
    "services": ["docker"],
    "compare": ["a", "b"],
    "pull": [REF, "--key", "k.pub"],
    "verify": [REF, "--key", "k.pub", "--rebuild"],
}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    for name in ("pins", "recipes", "pipelines", "containers"):
        shutil.copytree(ROOT / name, root / name)
    return root


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def _refused(project: Path, capsys, *argv: str) -> str:
    before = _tree(project)
    code = cli.main(["--project", str(project), *argv])
    err = capsys.readouterr().err
    assert code == BAD, err
    assert "Traceback" not in err
    assert _tree(project) == before, "a refused command changed a file"
    return err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_subcommand_refuses_an_unknown_stack_naming_the_stacks_there_are(project, capsys, command):
    argv = [command, *EXTRA.get(command, [])]
    if command == "recipes":
        argv += ["--stack", "qwen35-gb20"]
    else:
        argv[1:1] = ["--stack", "qwen35-gb20"]
    err = _refused(project, capsys, *argv)
    assert err.startswith(f"servestack {command}: pins/qwen35-gb20.yaml: --stack: no such stack "
                          "(did you mean qwen35-gb200?); stacks are: dev-cpu, qwen35-gb200"), err


def test_a_variant_without_a_pr_the_stack_names_no_check_for_is_refused_naming_the_variants(project, capsys):
    err = _refused(project, capsys, "build", "--stack", "dev-cpu.without-4")
    assert "pins/dev-cpu.yaml: --stack: dev-cpu.without-4: no PR numbered 4 names a check" in err
    assert "dev-cpu.without-41869" in err
    err = _refused(project, capsys, "lock", "--stack", "dev-cpu.without-41869")
    assert "is a variant of dev-cpu, built from dev-cpu's lock: lock dev-cpu" in err


def test_services_without_arguments_takes_its_default():
    args = cli.build_parser().parse_args(["services"])
    assert not args.which  # starts docker and registry (the help says so)


def test_a_platform_the_lock_lacks_leaves_the_last_build_record_as_it_was(project, capsys):
    record = project / "build" / "dev-cpu" / "build.json"
    record.parent.mkdir(parents=True)
    record.write_text('{"the last build": true}\n')
    err = _refused(project, capsys, "build", "--stack", "dev-cpu", "--platform", "linux/arm65")
    assert "pins/dev-cpu.lock: --platform: no platform linux/arm65; it has linux/amd64" in err


def test_a_tag_is_refused_before_a_stage_or_a_measured_comparison_starts(project, capsys):
    tag = "127.0.0.1:9/servestack/dev-cpu:latest"
    for argv in (["pipeline", "--image", tag], ["accuracy", "--image", tag], ["compare", "--measure", tag, REF],
                 ["compare", "--measure", REF, tag], ["smoke", "--image", tag], ["publish", "--image", tag],
                 ["pull", tag, "--key", "k.pub"], ["verify", tag, "--key", "k.pub", "--rebuild"]):
        err = _refused(project, capsys, *argv)
        assert "image reference" in err and "latest" in err, err


def test_bump_refuses_a_missing_key_before_it_relocks(project, capsys):
    err = _refused(project, capsys, "bump", "--baseline", REF, "--key", str(project / "missing.pub"))
    assert "missing.pub: --key: no such file: the publisher's public key" in err
    err = _refused(project, capsys, "bump", "--baseline", "some-run", "--alongside")
    assert "--alongside: measuring alongside needs a baseline by digest" in err
    err = _refused(project, capsys, "bump", "--baseline", "no-such-run")
    assert "--baseline: 'no-such-run' is not a run under build/dev-cpu/runs/, a directory, or REF@sha256:..." in err


@pytest.fixture
def repository(project: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    return project


def test_keygen_refuses_a_path_git_would_commit_and_writes_an_ignored_one(repository, capsys):
    err = _refused(repository, capsys, "keygen", "--key", str(repository / "signing.pem"))
    assert "signing.pem: --key: inside the repository and not covered by .gitignore" in err
    assert cli.main(["--project", str(repository), "keygen", "--key", str(repository / "servestack.key")]) == 0
    assert (repository / "servestack.key").is_file() and (repository / "servestack.pub").is_file()
    ignored = subprocess.run(["git", "-C", str(repository), "status", "--porcelain", "--ignored", "servestack.key"],
                             capture_output=True, text=True, check=True).stdout
    assert ignored.startswith("!! servestack.key"), ignored


def test_image_and_smoke_take_the_main_jobs_platform_and_refuse_one_the_build_is_not_for(project, capsys):
    from fixtures.records import write_build_record, write_image_record

    out = project / "build" / "qwen35-gb200"
    out.mkdir(parents=True)
    write_build_record(out / "build.json", "qwen35-gb200")  # built for linux/amd64
    write_image_record(out / "image.json", REF.replace("dev-cpu", "qwen35-gb200"), "qwen35-gb200")
    err = _refused(project, capsys, "image", "--stack", "qwen35-gb200", "--platform", "linux/arm64")
    assert ("build/qwen35-gb200/build.json: --platform: the last build of qwen35-gb200 is for linux/amd64, not "
            "linux/arm64; run `nox -s build -- --stack qwen35-gb200 --platform linux/arm64` first") in err, err
    err = _refused(project, capsys, "smoke", "--stack", "qwen35-gb200", "--platform", "linux/arm64")
    assert ("build/qwen35-gb200/image.json: --platform: the last build of qwen35-gb200 is for linux/amd64, not "
            "linux/arm64; run `nox -s build image -- --stack qwen35-gb200 --platform linux/arm64` first") in err, err


def test_bump_checks_the_key_of_the_last_publication_but_leaves_a_stack_never_published_to_its_report(project, capsys):
    from servestack import bump
    from servestack.util.project import Project

    checkout = Project(root=project)
    assert bump.check_inputs(checkout, "dev-cpu", None, project / "missing.pub", False) is None
    record = project / "build" / "dev-cpu" / "publish.json"
    record.parent.mkdir(parents=True)
    record.write_text(f'{{"image": "{REF}", "run": "r1", "bundle_digest": "{DIGEST}"}}\n')
    err = _refused(project, capsys, "bump", "--key", str(project / "missing.pub"))
    assert f"missing.pub: --key: no such file: the publisher's public key (PEM) verifies the baseline {REF}" in err
