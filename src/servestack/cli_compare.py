"""`servestack compare`, `bump` and `ablate`: the commands that end in a verdict.

Their exit code is the gated metric's verdict (errors.VERDICT_EXIT_CODES): 0 no regression,
4 regression, 5 undecided (0 instead when the pipeline's gate lets undecided pass); the failing
points are printed before it, one line each. `ablate` compares an image with its variants without
each PR: 1 where a PR's named check passes without it too.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from servestack.commands import command
from servestack.compare.verdicts import Policy
from servestack.errors import VerdictFailed
from servestack.util.console import console
from servestack.util.project import Project


def _compare_args(p: argparse.ArgumentParser) -> None:
    for side in ("a", "b"):
        p.add_argument(side, help=f"{side.upper()}: with --measure an image REGISTRY/REPO@sha256:<64 hex> to run; "
                                  "else a run id (build/<stack>/runs/<id>), a run directory, a directory `pull` "
                                  "wrote, or REGISTRY/REPO@sha256:<64 hex> (its verified publication's results)")
    p.add_argument("--measure", action="store_true", help="run A and B by digest in one session, interleaved "
                                                          "(ABBA rounds per point until decided), then compare")
    p.add_argument("--pipeline", help="with --measure: whose throughput stage (default: the stack's name)")
    p.add_argument("--pipeline-b", help="with --measure: B's server flags from this pipeline instead (the same image "
                                        "with other flags is a comparison too; the workload must not differ)")
    p.add_argument("--recipes", type=lambda s: tuple(x for x in s.split(",") if x), help="with --measure: only these")
    run = p.add_mutually_exclusive_group()
    run.add_argument("--run-id", help="with --measure: resume this session (its points on disk are not measured again)")
    run.add_argument("--fresh", action="store_true", help="with --measure: a new session (the default)")
    p.add_argument("--key", type=Path, help="the publisher's public key (PEM), for a stored side named by digest")
    p.add_argument("--out", type=Path, help="where comparison.md, .json and .png go "
                                            "(default: build/<stack>/comparisons/<A digest>.<run>-vs-<B digest>.<run>)")
    p.add_argument("--threshold", type=float, default=None, help="relative change a regression must exceed "
                                                                 "(default: the pipeline's gate, else 0.10)")
    p.add_argument("--alpha", type=float, default=None, help="each one-sided bound's level (default 0.05)")


def _policy(project: Project, name: str, args: argparse.Namespace) -> Policy:
    """The pipeline's regression policy, with the command line's threshold and alpha over it."""
    from servestack.stages.pipeline import regression_policy

    changes = {k: v for k, v in (("threshold", args.threshold), ("alpha", args.alpha)) if v is not None}
    return Policy(**{**regression_policy(project, name).__dict__, **changes})


@command("compare", "two images side by side, measured alongside (--measure) or from stored results; "
                    "exit 0 no regression, 4 regression, 5 undecided", _compare_args)
def _compare(args: argparse.Namespace, project: Project) -> int:
    from servestack.compare import comparisons
    from servestack.stages import interleave

    name = args.pipeline or args.stack
    if args.measure:  # both images by digest, before a container starts or a comparison folder is made
        from servestack.records.imageref import ImageRef

        for side in (args.a, args.b):
            ImageRef.parse(side)
    policy = _policy(project, name, args)
    if args.measure:
        run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")  # a fresh session unless one is named
        _, result, report = interleave.measure_and_compare(
            project, args.stack, interleave.pair(args.a, args.b, name, args.pipeline_b), run_id, ("A", "B"), policy,
            out=args.out, recipes=args.recipes)
    else:
        result, report = comparisons.compare_references(project, args.stack, args.a, args.b, key=args.key,
                                                        out=args.out, policy=policy)
    console.result(report.read_text())
    console.result(f"-> {report}")
    failing = comparisons.failing_points(result)
    for line in failing:
        console.result(line)
    if failing:
        raise VerdictFailed(result.verdict(), f"{result.verdict()}: {len(failing)} gated point(s) fail ({report})")
    return 0


def _bump_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baseline", help="what to hold the bumped image to: a run id, a directory, or REF@sha256:... "
                                      "(default: the image build/<stack>/publish.json records, with its run)")
    p.add_argument("--alongside", action="store_true", help="measure the baseline image and the bumped one in one "
                                                            "interleaved session (the baseline must be REF@sha256:...)")
    p.add_argument("--key", type=Path, default=Path("servestack.pub"), help="the publisher's public key, for a "
                                                                           "baseline by digest (default: servestack.pub)")
    p.add_argument("--run-id", help="the bumped image's run (default: derived from its digest and the pipeline)")


@command("bump", "lock --upgrade, build, image, smoke, stages, compare with the last published baseline: "
                 "build/<stack>/bump/drift.md", _bump_args)
def _bump(args: argparse.Namespace, project: Project) -> int:
    from servestack import bump

    bump.check_inputs(project, args.stack, args.baseline, args.key, args.alongside)  # before anything changes
    drift, report = bump.bump(project, args.stack, baseline=args.baseline, key=args.key, run_id=args.run_id,
                              alongside=args.alongside)
    console.result(report.read_text())
    console.result(f"-> {report}")
    return bump.exit_code(drift)


def _ablate_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pr", type=int, action="append", default=[], metavar="N",
                   help="only this PR (by number; repeatable); default: every PR whose stack entry names a check")


@command("ablate", "each PR's check on the image and on the stack's variant without the PR (run smoke first): "
                   "build/<stack>/prs.json", _ablate_args)
def _ablate(args: argparse.Namespace, project: Project) -> int:
    from servestack.smoke.ablation import ablate

    results = ablate(project, args.stack, args.pr)
    for n in results:
        console.result(f"  {n.pr:<32} {n.check:<20} with: {n.with_pr:<8} without: {n.without_pr:<8} {n.necessary}")
    # A check named for a PR that passes without it too is a wrong claim in the stack file.
    return 1 if any(n.necessary == "not shown" for n in results) else 0
