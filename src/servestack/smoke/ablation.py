"""Each PR shown to matter: the stack's image against its variant without the PR, on the PR's check.

A PR in the stack file names the check that fails without it (`check`, records/stack.PR_CHECKS). For
each such PR, `ablate` builds the stack's variant without it (`<stack>.without-<N>`: the PR's diff,
held in the lock, taken out of the pinned wheel; nothing else changes), pushes its image, smokes it,
and reads the named check on both images:

    necessary   the check passes with the PR and fails without it
    not shown   it passes without the PR too: this check does not tell them apart
    not run     no verdict on one side (no diff in the lock, a check that needs a GPU here, ...)

The account per PR (present: its evidence in the image; exercised: its check passed in the image's
smoke) is written into every smoke.json; `ablate` adds "necessary" in build/<stack>/prs.json, which
publish puts in the bundle beside smoke.json.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from servestack.errors import ServestackError
from servestack.records.smokefile import Check
from servestack.records.stack import load_stack
from servestack.records.steps import ImageRecord
from servestack.smoke.summary import FAIL, NOT_RUN, PASS
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_json
from servestack.util.project import Project, variant_name

REPORT = "prs.json"


@dataclass(frozen=True, kw_only=True)
class CheckKind:
    """What a named check reads in a smoke record, and what it is in words."""

    name: str
    what: str
    selects: Callable[[Check], bool]
    # Why a smoke that served on no GPU gives this check no verdict (None: it has one anywhere).
    needs_gpu: str | None = None


CHECK_KINDS: dict[str, CheckKind] = {kind.name: kind for kind in (
    CheckKind(name="disaggregated-smoke",
              what="smoke's disaggregated shape (Dynamo's frontend, a prefill and a decode worker over NIXL, its oracle)",
              selects=lambda c: c.probe == "disagg"),
    CheckKind(name="loaded-oracle",
              what="the disaggregated oracle, whose loaded round sends requests while others decode",
              selects=lambda c: c.probe == "disagg" and c.name == "agreement",
              # Read in vLLM 0.31's vllm/platforms/cpu.py: check_and_update_config sets it off, whatever the flag.
              needs_gpu="vLLM's CPU platform turns async scheduling off (CpuPlatform.check_and_update_config), so the "
                        "races these fixes close cannot happen without a GPU; there smoke serves with --async-scheduling"),
    CheckKind(name="gdn-prefill-kernel",
              what="the static probe's GDN prefill kernel choice on a simulated SM100, for every model shape",
              selects=lambda c: c.probe == "static" and c.name.startswith("kernels:gdn-prefill:SM100")),
)}


def verdict(check: str, checks: Iterable[Check]) -> tuple[str, str]:
    """(pass|fail|not_run, detail) of the named check over a smoke's checks: fails if any of its checks
    failed, passes if one passed and none failed."""
    kind, checks = CHECK_KINDS[check], list(checks)
    if kind.needs_gpu and not any(c.name == "gpu" and c.status == PASS for c in checks):
        return NOT_RUN, kind.needs_gpu
    chosen = [c for c in checks if kind.selects(c)]
    failed = [c for c in chosen if c.status == FAIL]
    passed = [c for c in chosen if c.status == PASS]
    if failed:
        return FAIL, "; ".join(f"{c.probe}:{c.name}: {c.detail}"[:400] for c in failed[:3])
    if passed:
        return PASS, f"{len(passed)} check(s) pass: " + ", ".join(f"{c.probe}:{c.name}" for c in passed[:12])
    reasons = sorted({c.detail for c in chosen if c.detail})
    return NOT_RUN, "; ".join(reasons)[:400] or "no such check in this smoke"


def pr_accounts(project: Project, stack: str, checks: Iterable[Check]) -> list[dict[str, Any]]:
    """Per PR of the stack: present (the static probe's evidence check) and exercised (its named check)."""
    file = project.stack_file(stack)
    if not file.is_file():
        return []
    definition, checks = load_stack(file), list(checks)
    by_name = {(c.probe, c.name): c for c in checks}
    accounts = []
    for package in definition.packages:
        for pr in package.prs:
            evidence = by_name.get(("static", f"pr:{pr.label}"))
            exercised = verdict(pr.check, checks) if pr.check else (NOT_RUN, "the stack names no check for it")
            accounts.append({"pr": pr.label, "package": package.name, "check": pr.check,
                             "present": evidence.status if evidence else NOT_RUN,
                             "exercised": exercised[0], "exercised_by": exercised[1]})
    return accounts


@dataclass(frozen=True, kw_only=True)
class Necessity:
    pr: str
    check: str
    with_pr: str  # the check's verdict on the stack's image
    without_pr: str  # ... and on the variant without the PR
    necessary: Literal["necessary", "not shown", "not run"]
    detail: str
    variant: str | None = None  # the variant's image, by digest
    layers_differ: tuple[str, ...] = ()  # titles of the variant's layers whose digest differs


def judge(pr: str, check: str, with_pr: tuple[str, str], without_pr: tuple[str, str], **found: Any) -> Necessity:
    kind = CHECK_KINDS[check].what
    if with_pr[0] == PASS and without_pr[0] == FAIL:
        return Necessity(pr=pr, check=check, with_pr=PASS, without_pr=FAIL, necessary="necessary",
                         detail=f"{kind} passes with it and fails without it: {without_pr[1]}", **found)
    if with_pr[0] == PASS and without_pr[0] == PASS:
        return Necessity(pr=pr, check=check, with_pr=PASS, without_pr=PASS, necessary="not shown",
                         detail=f"{kind} passes without it too: this check does not tell them apart", **found)
    side, (status, why) = ("with", with_pr) if with_pr[0] != PASS else ("without", without_pr)
    return Necessity(pr=pr, check=check, with_pr=with_pr[0], without_pr=without_pr[0], necessary="not run",
                     detail=f"no verdict {side} it ({status}): {why}", **found)


def layers_differ(intact: ImageRecord, variant: ImageRecord) -> tuple[str, ...]:
    """The variant's layers (by title) whose digest is not the intact image's for the same title."""
    ours = {layer.title: layer.digest for layer in intact.layers}
    return tuple(layer.title for layer in variant.layers if ours.get(layer.title) != layer.digest)


def ablate(project: Project, stack: str, numbers: Iterable[int] = ()) -> list[Necessity]:
    """Each PR with a check (or those numbered), on the image and its variant; writes build/<stack>/prs.json."""
    from servestack import inputs
    from servestack.image import build_image, load_image
    from servestack.lock import load_lock
    from servestack.records.smokefile import read_smoke
    from servestack.smoke import run_smoke

    definition = load_stack(project.stack_file(stack))
    wanted = set(numbers)
    named = [pr for pkg in definition.packages for pr in pkg.prs if pr.check and (not wanted or pr.number in wanted)]
    unknown = wanted - {pr.number for pr in named}
    if unknown:
        raise ServestackError(f"pins/{stack}.yaml: no PR numbered {', '.join(map(str, sorted(unknown)))} names a check "
                              f"(PRs with one: {', '.join(pr.label for pr in named) or 'none'})")
    intact = load_image(project, stack)
    smoke_file = project.artifacts(stack) / "smoke.json"
    smoke = read_smoke(smoke_file, f"run `nox -s smoke -- --stack {stack}` first", f"build/{stack}/smoke.json")
    if smoke.image != intact.reference:
        raise ServestackError(f"build/{stack}/smoke.json is for {smoke.image}, not the image {intact.reference}: "
                              f"run `nox -s smoke -- --stack {stack}` first")
    locked = {p.label: p for p in load_lock(project, stack).pull_requests}
    results = []
    for pr in named:
        assert pr.check is not None
        with_pr = verdict(pr.check, smoke.checks)
        entry = locked.get(pr.label)
        if with_pr[0] != PASS or entry is None or entry.patch is None:
            # No variant is built where the image itself gives its check no passing verdict: nothing to compare.
            why = ("not built: the image has no passing verdict" if with_pr[0] != PASS else
                   entry.diff_unavailable if entry and entry.diff_unavailable else "the lock holds no diff for it")
            results.append(judge(pr.label, pr.check, with_pr, (NOT_RUN, f"no variant: {why}")))
            console.progress(f"ablate {stack}: {pr.label}: not run: {results[-1].detail[:300]}")
            continue
        name = variant_name(stack, pr.number)
        console.progress(f"ablate {stack}: {pr.label}: building {name} ...")
        inputs.build(project, name, platform=intact.platform)
        variant = build_image(project, name)
        result = run_smoke(project, name)
        results.append(judge(pr.label, pr.check, with_pr, verdict(pr.check, result.record.checks),
                             variant=variant.reference, layers_differ=layers_differ(intact, variant)))
        console.progress(f"ablate {stack}: {pr.label}: {results[-1].necessary}: {results[-1].detail[:300]}")
    atomic_write_json(project.artifacts(stack) / REPORT,
                      {"stack": stack, "image": intact.reference, "prs": [asdict(n) for n in results]})
    return results
