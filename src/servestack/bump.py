"""`nox -s bump`: move a stack's pins forward, and say what that did to the image and to serving.

lock --upgrade, build, image, smoke, the pipeline's stages, then the new run held to the last
published baseline for the stack (build/<stack>/publish.json: the image it published, with the
run whose results went in the bundle; or the baseline given), each throughput point measured
at least compare.MIN_REPEATS times so the verdict can be reached. One drift report,
build/<stack>/bump/drift.md (and .json): the lock's changes (versions, PRs now upstream, overlays
that can go), the digest before and after, each step's outcome, the stages' verdicts and the
performance verdict (compare.py). A step that fails ends the bump there and the report says
which; the relocked pins stay, for whoever reads why.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servestack import compare
from servestack.errors import InputError, ServestackError
from servestack.records.codec import Record, encode
from servestack.util.console import console
from servestack.util.fsutil import atomic_write_json, atomic_write_text
from servestack.util.project import Project

SCHEMA = "servestack.drift/1"


@dataclass(kw_only=True)
class Step(Record):
    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass(kw_only=True)
class Drift(Record):
    stack: str
    baseline: str | None = None
    digest_before: str | None = None
    digest_after: str | None = None
    lock_changes: list[str] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)  # what `lock --upgrade` was asked to move, and moved
    moved_anyway: list[str] = field(default_factory=list)  # what moved unasked: drift (servestack.lock.drift)
    steps: list[Step] = field(default_factory=list)
    stages: list[dict[str, Any]] = field(default_factory=list)
    comparison: dict[str, Any] | None = None
    comparison_report: str | None = None
    verdict: str | None = None  # the gated metric's (verdicts.py), once compared

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)

    @property
    def image_after(self) -> str:
        """The bumped image: the steps after `image` run only once it is made."""
        if self.digest_after is None:
            raise ServestackError(f"bump {self.stack}: a step after `image` ran before the bumped image was made")
        return self.digest_after

    def to_json(self) -> dict[str, Any]:
        return {**encode(self), "schema": SCHEMA, "passed": self.passed}


def last_published(project: Project, stack: str) -> str:
    """The image the stack last published with a run's results (its baseline by default)."""
    record = project.artifacts(stack) / "publish.json"
    published = project.read_json(record, f"publish the stack with a run (`nox -s publish -- --stack {stack} --run "
                                          "RUN_ID`) or name a baseline (--baseline)") if record.exists() else None
    if not published:
        raise InputError(record, "", "no publication of this stack to hold the bump to: name a baseline (--baseline "
                                     "RUN_ID | DIR | REF@sha256:...)")
    if not published.get("run"):
        raise InputError(record, "run", f"the last publication ({published.get('image')}) carries no run's results "
                                        "(publish --run RUN_ID), so nothing to compare with: name a baseline")
    return str(published["image"])


def check_inputs(project: Project, stack: str, baseline: str | None, key: Path | None, alongside: bool) -> str | None:
    """The baseline a bump will be held to and the key that verifies it, checked before the bump relocks,
    builds or pushes anything (a missing key found at the end cost the whole bump, and changed the lock)."""
    from servestack.records.imageref import ImageRef

    if baseline is None:
        try:
            chosen = last_published(project, stack)
        except InputError:  # nothing published here: the bump still reports the drift, its compare step says why
            return None
    else:
        chosen = baseline
    by_digest = ("@" in chosen or ":" in chosen) and not Path(chosen).exists()  # a tag is refused by the parse
    if by_digest:
        ImageRef.parse(chosen)
        if key is None or not key.is_file():
            raise InputError(key or "--key", "--key", f"no such file: the publisher's public key (PEM) verifies the "
                                                      f"baseline {chosen}; pass --key PATH (servestack keygen writes one)")
    elif alongside:
        raise InputError("--baseline", "--alongside", f"measuring alongside needs a baseline by digest "
                                                      f"(REF@sha256:...), not {chosen}")
    elif not Path(chosen).is_dir() and not (project.artifacts(stack) / "runs" / chosen).is_dir():
        runs = project.artifacts(stack) / "runs"
        known = sorted(p.name for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []
        raise InputError("--baseline", "--baseline", f"{chosen!r} is not a run under build/{stack}/runs/, a directory, "
                                                     f"or REF@sha256:... (runs here: {', '.join(known[-5:]) or 'none'})")
    return chosen


def markdown(d: Drift) -> str:
    lines = [f"# Drift report: {d.stack}", "", f"**{'PASS' if d.passed else 'FAIL'}**", "",
             f"- digest before: `{d.digest_before or '-'}`", f"- digest after: `{d.digest_after or '-'}`",
             f"- baseline: `{d.baseline or '-'}`", "", "## The lock", ""]
    lines += [f"- {c}" for c in d.lock_changes] or ["- (not relocked)"]
    lines += ["", "### Asked to move (lock --upgrade)", ""] + ([f"- {c}" for c in d.asked] or ["- nothing"])
    lines += ["", "### Moved anyway (a plain relock would have moved these too)", ""]
    lines += [f"- {c}" for c in d.moved_anyway] or ["- nothing"]
    lines += ["", "## Steps", "", "| step | outcome | seconds | detail |", "|---|---|---:|---|"]
    for s in d.steps:
        lines.append(f"| {s.name} | {'ok' if s.ok else '**FAIL**'} | {s.seconds:.0f} | {s.detail.replace('|', '/')} |")
    if d.stages:
        lines += ["", "## Stages", ""] + [f"- {s['stage']}: {'pass' if s['passed'] else '**FAIL**'}" for s in d.stages]
    lines += ["", "## Performance", ""]
    if d.comparison is None:
        lines.append("not compared (the bump stopped before, or there was no baseline)")
    else:
        n, reported = d.comparison["gated_regressions"], d.comparison["regressions"] - d.comparison["gated_regressions"]
        verdict = f"**{d.comparison['verdict']}** ({d.comparison['measured']})"
        lines.append(f"{verdict}, {n} gated point(s) regressed, against `{d.baseline}` "
                     f"({reported} in the metrics reported beside it): "
                     f"{len(d.comparison['changes'])} metric values compared, {len(d.comparison['not_compared'])} "
                     f"not compared ({d.comparison_report})")
    return "\n".join(lines) + "\n"


def write(project: Project, d: Drift) -> Path:
    out = project.artifacts(d.stack) / "bump"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "drift.json", d.to_json())
    report = out / "drift.md"
    atomic_write_text(report, markdown(d))
    return report


def _steps(project: Project, stack: str, d: Drift, run_id: str | None) -> list[tuple[str, Callable[[], tuple[bool, str]]]]:
    """Each step as (name, action -> (ok, detail)); they run in order and the first failure ends the bump."""
    from servestack import image, inputs
    from servestack.lock import relock
    from servestack.lock.preferences import Upgrade
    from servestack.smoke import run_smoke
    from servestack.stages import run_pipeline

    def relocked() -> tuple[bool, str]:
        # Drift first: what a relock without asking would move is not the upgrade's doing.
        anyway = relock.drift_now(project, stack)
        outcome = relock.relock(project, stack, upgrade=Upgrade(everything=True))
        unasked = {(m.platform, m.name) for m in anyway}
        d.lock_changes = list(outcome.lines)
        d.moved_anyway = [m.line() for m in anyway] + [m.line() for m in outcome.moves if not m.asked]
        d.asked = [m.line() for m in outcome.moves if m.asked and (m.platform, m.name) not in unasked]
        return True, f"{len(d.asked)} asked to move, {len(d.moved_anyway)} moved anyway"

    def built() -> tuple[bool, str]:
        inputs.build(project, stack)
        return True, "every locked input fetched and verified"

    def imaged() -> tuple[bool, str]:
        record = image.build_image(project, stack)
        d.digest_after = record.reference
        return True, record.reference

    def smoked() -> tuple[bool, str]:
        with console.quiet():  # the bump says the step's outcome itself
            result = run_smoke(project, stack, d.image_after)
        return result.exit_code == 0, f"smoke exit status {result.exit_code}"

    def staged() -> tuple[bool, str]:
        from servestack.compare import MIN_REPEATS

        results = run_pipeline(project, stack, d.image_after, run_id=run_id, min_repeats=MIN_REPEATS)
        d.stages = [{"stage": r.stage, "passed": r.passed, "dir": str(r.out_dir)} for r in results]
        return bool(results) and all(r.passed for r in results), ", ".join(
            f"{r.stage} {'pass' if r.passed else 'FAIL'}" for r in results)

    return [("lock --upgrade", relocked), ("build", built), ("image", imaged), ("smoke", smoked), ("stages", staged)]


def exit_code(d: Drift) -> int:
    """A failed step is 1; a bump whose only failure is the comparison exits with its verdict's code."""
    from servestack.errors import verdict_exit_code

    failed = [s for s in d.steps if not s.ok]
    if failed and [s.name for s in failed] == ["compare"] and d.verdict is not None:
        return verdict_exit_code(d.verdict)
    return 1 if failed or not d.steps else 0


def _compare(project: Project, stack: str, d: Drift, run: Path, key: Path | None,
             alongside: bool) -> tuple[compare.Comparison, Path]:
    """The bumped run against the baseline: measured again beside it (one interleaved session of both
    images), or against its stored results."""
    from servestack.compare import comparisons
    from servestack.records.imageref import names_a_digest
    from servestack.stages import interleave
    from servestack.stages.pipeline import regression_policy

    policy = regression_policy(project, stack)
    if d.baseline is None:  # the step is planned only with a baseline
        raise InputError(Path("-"), "--baseline", "no baseline to compare the bumped run with")
    if not alongside:
        return comparisons.compare_references(project, stack, d.baseline, str(run), key=key, policy=policy)
    if not names_a_digest(d.baseline):
        raise InputError(Path(d.baseline or "-"), "--baseline", "measured alongside needs the baseline image by digest")
    with console.quiet():  # bump reports the verdict, not the session's progress
        _, result, report = interleave.measure_and_compare(project, stack, interleave.pair(d.baseline, d.image_after, stack),
                                                           run.name, ("baseline", "bumped"), policy)
    return result, report


def bump(project: Project, stack: str, *, baseline: str | None = None, key: Path | None = None,
         run_id: str | None = None, alongside: bool = False,
         steps: Callable[[Drift], list[tuple[str, Callable[[], tuple[bool, str]]]]] | None = None,
         ) -> tuple[Drift, Path]:
    """`steps(drift)`: the steps to run, each filling in its part of the drift (default: the real ones)."""
    from servestack.image import load_image

    d = Drift(stack=stack, baseline=baseline)
    try:
        d.digest_before = load_image(project, stack).reference
    except ServestackError:
        d.digest_before = None  # never built here
    for name, action in (steps or (lambda drift: _steps(project, stack, drift, run_id)))(d):
        started = time.monotonic()
        try:
            ok, detail = action()
        except ServestackError as exc:
            ok, detail = False, str(exc).splitlines()[0]
        d.steps.append(Step(name=name, ok=ok, detail=detail, seconds=round(time.monotonic() - started, 1)))
        console.progress(f"bump {stack}: {name}: {'ok' if ok else 'FAIL'}: {detail}")
        if not ok:
            return d, write(project, d)
    run = Path(d.stages[0]["dir"]).parent if d.stages else None
    if run is not None:
        started = time.monotonic()
        try:
            d.baseline = d.baseline or last_published(project, stack)
            result, report = _compare(project, stack, d, run, key, alongside)
            d.comparison, d.comparison_report = result.to_dict(), str(report)
            d.verdict = result.verdict()
            failing = compare.gate_failures(result)
            ok = bool(result.gated()) and not failing
            detail = (f"{d.verdict}: {len(result.gated_regressions())} gated point(s) regressed "
                      f"({len(result.regressions)} in all metrics), "
                      f"{sum(1 for ch in result.gated() if ch.verdict == 'undecided')} undecided, "
                      f"against {d.baseline}") if result.gated() else (
                f"nothing in common with {d.baseline} to compare: " + ("; ".join(result.not_compared) or "no point"))
        except ServestackError as exc:
            ok, detail = False, str(exc).splitlines()[0]
        d.steps.append(Step(name="compare", ok=ok, detail=detail, seconds=round(time.monotonic() - started, 1)))
    return d, write(project, d)
