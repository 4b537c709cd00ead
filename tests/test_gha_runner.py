"""The step runner the workflow e2e test uses: it must behave as GitHub's runner does, or that test proves nothing."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from fixtures.gha_expr import Context, Status, condition, evaluate, render
from fixtures.gha_runner import Event, Runner, parse_command_file


def test_expressions_follow_github_semantics():
    ctx = Context(values={"needs": {"image": {"outputs": {"dev-cpu-image": "r@sha256:1"}}}, "github": {"event_name": "Push"}})
    assert evaluate("needs.image.outputs.dev-cpu-image", ctx) == "r@sha256:1"
    assert evaluate("needs['image'].outputs['dev-cpu-image']", ctx) == "r@sha256:1"
    assert evaluate("needs.missing.outputs.x", ctx) is None
    assert evaluate("github.event_name == 'push'", ctx) is True  # strings compare case-insensitively
    assert evaluate("'' || 'fallback'", ctx) == "fallback" and evaluate("1 && 'x'", ctx) == "x"
    assert evaluate("format('{0}-{1}', 'a', 2)", ctx) == "a-2"
    assert evaluate("fromJSON('[\"a\", \"b\"]')[1]", ctx) == "b"
    assert render("x-${{ github.event_name }}-${{ 1 == 1 }}", ctx) == "x-Push-true"
    assert render("${{ 1 == 1 }}", ctx) is True
    # An `if:` without a status function means success() && (...).
    failed = Context(values=ctx.values, status=Status(failed=True))
    assert condition("github.event_name == 'push'", ctx) and not condition("github.event_name == 'push'", failed)
    assert condition("always()", failed) and condition("failure()", failed) and not condition("cancelled()", failed)


def test_command_files():
    assert parse_command_file("a=1\nb<<EOF\nline 1\nline=2\nEOF\nc=x=y\n") == {"a": "1", "b": "line 1\nline=2", "c": "x=y"}
    with pytest.raises(ValueError):
        parse_command_file("b<<EOF\nno end\n")


def _repo(tmp_path: Path, workflow: str, action: str | None = None) -> tuple[Path, str]:
    repo = tmp_path / "repo"
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "w.yml").write_text(workflow)
    if action:
        (repo / ".github" / "actions" / "tool").mkdir(parents=True)
        (repo / ".github" / "actions" / "tool" / "action.yml").write_text(action)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "w"], check=True)
    sha = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return repo, sha


WORKFLOW = """
on: push
permissions: {contents: read}
env: {WHO: world}
jobs:
  first:
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    outputs:
      digest: ${{ steps.out.outputs.digest }}
      empty: ${{ steps.out.outputs.nothing }}
    steps:
      - uses: actions/checkout@0000000000000000000000000000000000000000 # v0.0.0
      - uses: ./.github/actions/tool
        with: {greeting: hi}
      - id: out
        env: {STACK: "${{ github.ref_name }}"}
        run: |
          test -f .github/workflows/w.yml
          tool-on-path
          echo "to stderr" >&2
          echo "digest=repo@sha256:$STACK-$GITHUB_SHA" >> "$GITHUB_OUTPUT"
          echo "FROM_ENV=set by a step" >> "$GITHUB_ENV"
          echo "## hello $WHO" >> "$GITHUB_STEP_SUMMARY"
      - run: test "$FROM_ENV" = "set by a step"
      - run: exit 3
      - name: skipped after a failure
        run: echo never
      - name: always
        if: always()
        run: echo "ran after failure" >> "$GITHUB_STEP_SUMMARY"
  second:
    needs: first
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    env: {IMAGE: "${{ needs.first.outputs.digest }}"}
    steps:
      - run: echo "got=$IMAGE" >> "$GITHUB_OUTPUT"
        id: got
    outputs:
      got: ${{ steps.got.outputs.got }}
"""

ACTION = """
name: tool
inputs: {greeting: {default: hello}}
runs:
  using: composite
  steps:
    - shell: bash
      env: {GREETING: "${{ inputs.greeting }}"}
      run: |
        mkdir -p "$RUNNER_TEMP/bin"
        printf '#!/bin/sh\\necho %s\\n' "$GREETING" > "$RUNNER_TEMP/bin/tool-on-path"
        chmod +x "$RUNNER_TEMP/bin/tool-on-path"
        echo "$RUNNER_TEMP/bin" >> "$GITHUB_PATH"
"""


def test_a_job_runs_its_steps_like_a_runner(tmp_path):
    repo, sha = _repo(tmp_path, WORKFLOW, ACTION)
    runner = Runner(repo, tmp_path / "runner", Event(name="push", ref="refs/heads/main", sha=sha), log=lambda _m: None)
    wf = repo / ".github" / "workflows" / "w.yml"
    first = runner.run_job(wf, "first")
    assert first.result == "failure"
    assert [s.outcome for s in first.steps] == ["success", "success", "success", "success", "failure", "skipped", "success"]
    assert first.outputs == {"digest": f"repo@sha256:main-{sha}"}  # the empty output is dropped
    assert first.summary == "## hello world\nran after failure\n"
    # A step's log is what it printed, stdout and stderr in order, as the runner records it.
    assert first.steps[2].log == "hi\nto stderr\n"
    second = runner.run_job(wf, "second", needs={"first": first})
    assert second.outputs == {"got": f"repo@sha256:main-{sha}"} and second.result == "success"


CANCEL = """
on: workflow_dispatch
permissions: {contents: read}
jobs:
  long:
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    steps:
      - name: long
        run: exec python3 -c "$SCRIPT"
        env:
          SCRIPT: |
            import signal, sys, time, os
            def on(sig, _f):
                open(os.environ["MARK"], "a").write(f"{signal.Signals(sig).name}\\n")
                if os.environ["OBEY"] == "1": sys.exit(130)
            signal.signal(signal.SIGINT, on); signal.signal(signal.SIGTERM, on)
            open(os.environ["MARK"], "a").write("started\\n")
            while True: time.sleep(0.05)
      - name: not after cancel
        run: echo never
      - name: backstop
        if: cancelled()
        run: echo backstop >> "$MARK"
"""


@pytest.mark.parametrize("obey", ["1", "0"])
def test_cancel_signals_the_step_then_runs_the_cancelled_steps(tmp_path, obey, monkeypatch):
    import fixtures.gha_runner as gha

    monkeypatch.setattr(gha, "SIGINT_GRACE_S", 0.5)  # the real 7.5 s + 2.5 s, shortened for the fast suite
    monkeypatch.setattr(gha, "SIGTERM_GRACE_S", 0.5)
    repo, sha = _repo(tmp_path, CANCEL)
    mark = tmp_path / "mark"
    runner = Runner(repo, tmp_path / "runner", Event(name="workflow_dispatch", ref="refs/heads/main", sha=sha),
                    base_env={"PATH": "/usr/bin:/bin", "MARK": str(mark), "OBEY": obey}, log=lambda _m: None)

    def cancel_when_started():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and "started" not in (mark.read_text() if mark.exists() else ""):
            time.sleep(0.05)
        runner.cancel()

    threading.Thread(target=cancel_when_started, daemon=True).start()
    result = runner.run_job(repo / ".github" / "workflows" / "w.yml", "long")
    assert result.result == "cancelled"
    assert [s.outcome for s in result.steps] == ["cancelled", "skipped", "success"]
    signals = mark.read_text().split()
    # Obeyed: SIGINT ends it. Ignored: SIGINT, then SIGTERM, then a kill it cannot see.
    assert signals == (["started", "SIGINT", "backstop"] if obey == "1" else ["started", "SIGINT", "SIGTERM", "backstop"])


ORPHAN = """
on: push
permissions: {contents: read}
jobs:
  j:
    runs-on: ubuntu-24.04
    timeout-minutes: 5
    steps:
      - run: |
          # Each process writes its pid once it runs with the environment it keeps (sh, then sleep
          # in its place), and the step waits for that: until `env -u` has run, the daemon is a
          # forked bash still carrying the job's id, and a step that ended then had the cleanup kill it.
          start() {  # start NAME PREFIX...: `PREFIX... sh` in the background, its pid in $MARK.NAME
            mkfifo "$MARK.$1.ready"
            mark="$MARK.$1"; shift
            "$@" sh -c 'echo "$$" > "$0"; echo > "$0.ready"; exec sleep 300' "$mark" &
            read -r _ < "$mark.ready"
          }
          start orphan setsid
          start daemon env -u RUNNER_TRACKING_ID setsid
"""


def test_orphans_with_the_tracking_id_are_killed_at_the_end_of_the_job(tmp_path):
    repo, sha = _repo(tmp_path, ORPHAN)
    mark = tmp_path / "mark"
    runner = Runner(repo, tmp_path / "runner", Event(name="push", ref="refs/heads/main", sha=sha),
                    base_env={"PATH": "/usr/bin:/bin", "MARK": str(mark)}, log=lambda _m: None)
    assert runner.run_job(repo / ".github" / "workflows" / "w.yml", "j").result == "success"
    orphan, daemon = (int(Path(f"{mark}.{n}").read_text()) for n in ("orphan", "daemon"))
    try:
        def state(pid: int) -> str:
            try:
                return Path(f"/proc/{pid}/stat").read_text().split()[2]
            except OSError:
                return "gone"

        deadline = time.monotonic() + 5
        while state(orphan) not in ("gone", "Z") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert state(orphan) in ("gone", "Z")  # killed (a zombie until its parent, init, reaps it)
        assert state(daemon) not in ("gone", "Z")  # no tracking id: it survives
    finally:
        for pid in (orphan, daemon):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
