"""The `servestack` command line: a thin layer over the library, one subcommand per nox session."""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from servestack.commands import COMMANDS, check_stack, command, platform_arg, same_platform
from servestack.commands import image_arg as _image_arg
from servestack.errors import InputError, ServestackError, Terminated
from servestack.util.console import console
from servestack.util.interrupts import exit_code, signals_unwind
from servestack.util.project import DEFAULT_STACK, Project

if TYPE_CHECKING:
    from servestack.runners.interface import Runner

# --------------------------------------------------------------------------- lock


def _lock_args(p: argparse.ArgumentParser) -> None:
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="offline: fail when the lock no longer matches the stack file "
                                                           "or patches (with --online: would a relock today change anything?)")
    mode.add_argument("--upgrade", nargs="*", metavar="PACKAGE", default=None,
                      help="take newer releases, of every package or of those named: resolved_at moves to now, "
                           "every other locked version is kept; prints what changed")
    p.add_argument("--online", action="store_true", help="with --check: resolve as a relock and as --upgrade would, "
                                                         "naming each difference and its cause; writes nothing")


@command("lock", "resolve pins/<stack>.yaml into pins/<stack>.lock (a relock keeps every locked version)", _lock_args)
def _lock(args: argparse.Namespace, project: Project) -> int:
    from servestack.lock import check as lockcheck
    from servestack.lock import relock
    from servestack.lock.preferences import Upgrade

    if args.online and not args.check:
        raise ServestackError("--online goes with --check")
    if args.check:
        report = lockcheck.check(project, args.stack)
        for warning in report.warnings:
            console.result(f"warning: {warning}")
        for problem in report.problems:
            console.result(f"error: {problem}")
        online = relock.check_online(project, args.stack) if args.online else None
        for line in online.lines() if online else []:
            console.result(f"  {line}")
        ok = report.ok and (online is None or online.ok)
        console.result(f"lock {args.stack}: {'ok' if ok else 'out of date'}")
        return 0 if ok else 1
    for line in relock.relock(project, args.stack, upgrade=Upgrade.of(args.upgrade)).summary(project):
        console.result(line)
    return 0


# --------------------------------------------------------------------------- build, image


def _build_args(p: argparse.ArgumentParser) -> None:
    platform_arg(p)
    p.add_argument("--allow-unverified", action="store_true", help="build even when the lock has PRs nothing verified")
    p.add_argument("--rehash", action="store_true", help="read every cached input in full, even those unchanged "
                                                         "(same inode, size, mtime, ctime) since the last full read")


@command("build", "fetch and verify every locked input, apply PR overlays: build/<stack>/build.json", _build_args)
def _build(args: argparse.Namespace, project: Project) -> int:
    from servestack import inputs

    started = time.monotonic()
    path = inputs.build(project, args.stack, platform=args.platform, allow_unverified=args.allow_unverified, rehash=args.rehash)
    record = inputs.load_build(project, args.stack)
    overlays = sum(len(o.prs) for o in record.overlays)
    console.result(f"build {args.stack}: {len(record.inputs)} wheels verified, {overlays} PR overlays applied, "
         f"input hash {record.input_hash[:16]} ({time.monotonic() - started:.1f} s) -> {path.relative_to(project.root)}")
    if record.unverified_prs:
        console.result(f"warning: built with {len(record.unverified_prs)} unverified PRs (--allow-unverified): "
             + ", ".join(record.unverified_prs))
    return 0


def _image_args(p: argparse.ArgumentParser) -> None:
    platform_arg(p)
    p.add_argument("--update-expected", action="store_true",
                   help="record this build's digest as the expected one: pins/<stack>.image.json (commit it)")


@command("image", "write the image's layers, push what the registry lacks, check the expected digest: "
                  "build/<stack>/image.json", _image_args)
def _image(args: argparse.Namespace, project: Project) -> int:
    from servestack import image
    from servestack.inputs import load_build
    from servestack.lock import load_lock

    same_platform(project, args.stack, args.platform, "build.json", load_build(project, args.stack).platform,
                   f"nox -s build -- --stack {args.stack} --platform {args.platform}")
    result = image.build_image(project, args.stack)
    digest = result.digest
    if args.update_expected:
        locked = load_lock(project, args.stack)
        path = image.write_expected(project, args.stack, result, image.interpreter_version(locked, result.platform),
                                    sorted(locked.platforms))
        console.result(f"image {args.stack}: expected digest {digest} for {result.platform} written to {path.relative_to(project.root)}")
    index = image.record_index(project, args.stack, result)
    if index:
        console.result(f"image {args.stack}: image index {index} over every platform of the lock")
    if args.update_expected:
        return 0
    expected = result.expected
    assert expected is not None  # build_image always checks
    fix = image.UPDATE_COMMAND.format(stack=args.stack)
    verdicts = {
        "reproduced": f"reproduced the expected digest of {expected.file}",
        "none": f"no expected digest committed ({expected.file}); record one with `{fix}`",
        "stale": f"{expected.file} is for another lock: if the image changed on purpose, run `{fix}` and commit it",
        "different": f"DIFFERENT from the expected {expected.digest} of {expected.file} (same lock): this "
                     f"machine or this code made other bytes (bytecode compiled by Python {result.compiled_by}); "
                     f"if the change is deliberate, run `{fix}` and commit it",
    }
    console.result(f"image {args.stack}: {digest} {verdicts[expected.status]}")
    return 1 if expected.status in ("different", "stale") else 0


# --------------------------------------------------------------------------- smoke and the measured stages


def _image_ref(args: argparse.Namespace, project: Project) -> str:
    if args.image:
        from servestack.records.imageref import ImageRef

        ImageRef.parse(args.image)  # a tag is refused before a stage starts
        return args.image
    from servestack.image import load_image

    return load_image(project, args.stack).reference


def _smoke_args(p: argparse.ArgumentParser) -> None:
    _image_arg(p)
    platform_arg(p)
    p.add_argument("--no-serve", action="store_true", help="the static probe only")
    p.add_argument("--require-serving", action="store_true", help="a serving check that cannot run fails (the GPU canary)")


@command("smoke", "prove the image is exactly its lock, and that it serves: build/<stack>/smoke.json", _smoke_args)
def _smoke(args: argparse.Namespace, project: Project) -> int:
    from servestack.smoke import run_smoke

    if args.platform and not args.image:
        from servestack.image import load_image

        same_platform(project, args.stack, args.platform, "image.json", load_image(project, args.stack).platform,
                       f"nox -s build image -- --stack {args.stack} --platform {args.platform}")
    return run_smoke(project, args.stack, args.image, serve=not args.no_serve, require_serving=args.require_serving).exit_code


class _RunnerNames:
    """`--runner`'s choices, read from the runner registry only when argparse asks: every command
    builds every subcommand's parser, and importing the runners costs a no-op build 0.4 s."""

    def _names(self) -> list[str]:
        from servestack.runners.selection import RUNNERS

        return list(RUNNERS)

    def __contains__(self, name: object) -> bool:
        return name in self._names()

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())


def _stage_args(p: argparse.ArgumentParser) -> None:
    _image_arg(p)
    p.add_argument("--pipeline", help="pipelines/<name>.yaml (default: the stack's name)")
    # A metavar: argparse would otherwise list the choices (import the registry) when the option is added.
    p.add_argument("--runner", choices=_RunnerNames(), metavar="RUNNER", help="override the pipeline's runner (%(choices)s)")
    p.add_argument("--recipes", type=lambda s: tuple(x for x in s.split(",") if x),
                   help="only these of the pipeline's recipes, comma-separated (e.g. agg-acc,agg)")
    run = p.add_mutually_exclusive_group()
    run.add_argument("--run-id", help="results directory build/<stack>/runs/<run id> (default: derived from the "
                                      "image digest and the pipeline file, so a rerun resumes)")
    run.add_argument("--fresh", action="store_true", help="measure again under a new run id instead of resuming")
    p.add_argument("--skip-preflight", action="store_true",
                   help="start servers without the GPU node preflight (named in each job record), e.g. a GPU stack "
                        "on CPU nodes")


def _runner(project: Project, pipeline_name: str, kind: str) -> Runner:
    """The pipeline's runner, of another kind than the file says (the CLI's --runner)."""
    from servestack.runners.selection import make_runner
    from servestack.stages.pipeline import load_pipeline

    return make_runner(load_pipeline(project.pipelines / f"{pipeline_name}.yaml", project.root), kind)


def _run_stages(args: argparse.Namespace, project: Project, stages: tuple[str, ...]) -> int:
    from servestack.stages import format_verdict, run_pipeline

    name = args.pipeline or args.stack
    image = _image_ref(args, project)
    runner = _runner(project, name, args.runner) if args.runner else None
    started = time.monotonic()
    run_id = time.strftime("%Y%m%d-%H%M%S") if args.fresh else args.run_id
    results = run_pipeline(project, name, image, runner, stages, run_id=run_id,
                           recipes=args.recipes, skip_preflight=args.skip_preflight)
    for result in results:
        console.result(format_verdict(result.verdict))
        if result.comparison:
            console.result(f"  -> {result.comparison}")
        console.result(f"  -> {project.shown(result.out_dir)}")
    if results:
        client = sum(r.timing.get("client_seconds") or 0.0 for r in results)
        wall = time.monotonic() - started
        console.result(f"{results[0].runner} runner: wall {wall:.1f} s, inside the benchmark clients {client:.1f} s, "
             f"overhead {wall - client:.1f} s")
    failed = [r for r in results if not r.passed]
    if failed:
        from servestack.stages import stage_failed

        raise stage_failed(failed[0])  # main exits with its code: a baseline gate's verdict has its own
    return 0 if results else 1


@command("accuracy", "GSM8K on the image by digest through the pipeline's runner, gated", _stage_args)
def _accuracy(args: argparse.Namespace, project: Project) -> int:
    return _run_stages(args, project, ("accuracy",))


@command("throughput", "the throughput sweep on the image by digest, gated per concurrency point", _stage_args)
def _throughput(args: argparse.Namespace, project: Project) -> int:
    return _run_stages(args, project, ("throughput",))


@command("pipeline", "accuracy then throughput on one image digest (run smoke first)", _stage_args)
def _pipeline(args: argparse.Namespace, project: Project) -> int:
    return _run_stages(args, project, ("accuracy", "throughput"))


def _cancel_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run-id", required=True, help="the run whose jobs to cancel (build/<stack>/runs/<run id>)")
    p.add_argument("--pipeline", help="pipelines/<name>.yaml (default: the stack's name)")


@command("cancel", "cancel the jobs a run left live (after its process was killed: the CI backstop)", _cancel_args)
def _cancel(args: argparse.Namespace, project: Project) -> int:
    from servestack.runners.driver import cancel_recorded

    run_dir = project.artifacts(args.stack) / "runs" / args.run_id
    cancelled = cancel_recorded(run_dir, lambda kind: _runner(project, args.pipeline or args.stack, kind))
    console.result(f"cancel {args.run_id}: {', '.join(cancelled) if cancelled else 'no live job recorded'}")
    return 0


# --------------------------------------------------------------------------- CI workflows


@command("outputs", "the stack's digests as GitHub step outputs, its records and reports as the step summary",
         lambda p: p.add_argument("--run-id", help="also summarize this run's stage reports"))
def _outputs(args: argparse.Namespace, project: Project) -> int:
    from servestack import ci as workflow

    outputs = workflow.step_outputs(project, args.stack)
    workflow.write_step(outputs, workflow.summary(project, args.stack, args.run_id))
    for name, value in outputs.items():
        console.result(f"{name}={value}")
    return 0


# --------------------------------------------------------------------------- recipes


def _recipes_args(p: argparse.ArgumentParser) -> None:
    # The stack is optional here: validate prefers the stack a recipe names in its header.
    p.set_defaults(stack=None)
    actions = p.add_subparsers(dest="action", required=True, metavar="{render,check,validate,compare}")

    def action(name: str, help: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help, description=help)
        sub.add_argument("--stack", default=argparse.SUPPRESS, help="stack name in pins/")
        return sub

    render = action("render", "the committed sets from their families, or (with --image) the stack's set bound to a digest")
    render.add_argument("--image", help="REPO@sha256:<64 hex> to bind the stack's recipes to ('last': this stack's image.json)")
    action("check", "committed recipes equal their renders and validate against their stack's engine")
    validate = action("validate", "validate recipe files; flags and environment against an engine description")
    validate.add_argument("paths", nargs="*", type=Path, help="recipe files or directories (default: the committed sets)")
    validate.add_argument("--engine", type=Path, help="an engine description (default: pins/<stack>.engine.json of --stack, "
                                                      "else of the stack the recipe's header names, else of the default stack)")
    compare = action("compare", "print every semantic difference between our recipes and a directory of upstream ones")
    compare.add_argument("theirs", type=Path, help="directory of upstream recipes (e.g. NVIDIA's srt-slurm-recipes)")
    compare.add_argument("--against", type=Path, help="our recipe directory (default: the committed set sharing the most file names)")


def _recipe_standin(project: Project) -> Callable[[str], dict | None]:
    """The model the engine judges a stack's recipes with: its smoke model's config.json (the checkpoint's
    architecture and head shapes at toy size; no weights are read), as the build makes it."""
    def standin(stack: str) -> dict | None:
        from servestack.inputs.tinymodel import TinyModelSpec, model_config
        from servestack.records.stack import load_stack

        file = project.pins / f"{stack}.yaml"
        smoke = load_stack(file).smoke_model if file.is_file() else None
        if smoke is None or smoke.make is None:
            return None
        return model_config(TinyModelSpec.from_dict({"name": smoke.name.rsplit("/", 1)[-1], **smoke.make}, stack_file=file))

    return standin


@command("recipes", "render, bind, check, validate and compare srt-slurm recipes", _recipes_args)
def _recipes(args: argparse.Namespace, project: Project) -> int:
    from servestack import recipes

    stack = args.stack or DEFAULT_STACK
    if args.action == "render":
        if args.image:
            reference = args.image
            if reference == "last":
                from servestack.image import load_image

                reference = load_image(project, stack).reference
            paths = recipes.render_recipes(project, stack, reference)
        else:
            paths = recipes.render_committed(project)
        for path in paths:
            console.result(str(project.shown(path)))
        return 0
    if args.action == "compare":
        committed = recipes.committed_sets(project)
        ours = args.against or recipes.closest_set(committed, args.theirs)
        comparisons = recipes.compare_dirs(ours, args.theirs)
        console.result(f"ours: {ours}\ntheirs: {args.theirs}")
        console.result(recipes.format_comparisons(comparisons))
        same = sum(c.same for c in comparisons)
        console.result(f"recipes compare: {same} of {len(comparisons)} file(s) the same")
        return 0 if same == len(comparisons) else 1
    if args.action == "check":
        notes: list[str] = []
        stale = recipes.check_rendered(project)
        errors = stale + recipes.validate_committed(project, notes=notes, standin=_recipe_standin(project))
        for note in notes:
            console.result(f"note: {note}")
    else:
        stale = []
        committed = recipes.committed_sets(project)
        result = recipes.validate_files(project, args.paths or committed, engine=args.engine, stack=args.stack,
                                        standin=_recipe_standin(project))
        errors = result.errors
        for engine, count in sorted(Counter(result.engines.values()).items()):
            console.result(f"{count} file(s) checked against {project.shown(engine)}")
        for note in result.notes:
            console.result(f"note: {note}")
        for warning in result.warnings:
            console.result(f"warning: {warning}")
    for error in errors:
        console.result(f"error: {error}")
    console.result(f"recipes {args.action}: {'ok' if not errors else f'{len(errors)} problem(s)'}")
    # A recipe the rules refuse is bad input (README, "Exit codes"); a committed file that differs from
    # its render is a check that failed.
    return InputError.exit_code if len(errors) > len(stale) else (1 if errors else 0)


# --------------------------------------------------------------------------- services


_SERVICES = ("docker", "registry", "slurm", "binfmt", "nodes-down")


def _service(name: str) -> str:
    if name not in _SERVICES:
        raise argparse.ArgumentTypeError(f"no service {name!r}; services are: {', '.join(_SERVICES)}")
    return name


def _services_args(p: argparse.ArgumentParser) -> None:
    # Not `choices`: argparse (3.11) checks an empty nargs="*" against them as a whole and refused the
    # command with no arguments; the default is applied after parsing.
    p.add_argument("which", nargs="*", type=_service, metavar="{" + ",".join(_SERVICES) + "}",
                   help="what to start (default: docker registry); "
                        "nodes-down: tear the multi-node cluster down (its nodes' processes, namespaces, bridge)")
    p.add_argument("--nodes", type=int, default=1, help="slurm: this many nodes (more than 1: network namespaces)")


@command("services", "start the embedded services (dockerd, loopback registry, Slurm)", _services_args)
def _services(args: argparse.Namespace, project: Project) -> int:
    from servestack import services
    from servestack.services import slurm_nodes

    starters: dict[str, Callable[[], object]] = {
        "docker": services.ensure_dockerd,
        "registry": services.ensure_registry,
        "slurm": lambda: services.ensure_slurm(nodes=args.nodes)["SLURM_CONF"],
        "binfmt": services.ensure_binfmt_aarch64,
        "nodes-down": slurm_nodes.stop_nodes,
    }
    for name in args.which or ["docker", "registry"]:
        result = starters[name]()
        console.result(f"{name}: {'done' if name == 'nodes-down' else 'up'}{f' ({result})' if isinstance(result, str) else ''}")
    return 0


from servestack import cli_compare, cli_publish  # noqa: E402,F401  (register compare, bump, ablate; publish, pull, verify, keygen)

# --------------------------------------------------------------------------- entry point


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="servestack", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every external command")
    parser.add_argument("--project", type=Path, default=None, help="project root (default: the checkout around the cwd)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help, configure, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help)
        p.add_argument("--stack", default=None, help=f"stack name in pins/ (default: {DEFAULT_STACK})")
        configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console.configure(verbose=args.verbose)
    project = Project(root=args.project.resolve()) if args.project else Project.find()
    try:
        check_stack(args, project)
        with signals_unwind():
            return COMMANDS[args.command][2](args, project)
    except ServestackError as exc:
        console.error(f"servestack {args.command}", str(exc))
        return exc.exit_code
    except KeyboardInterrupt as interrupt:
        console.error(f"servestack {args.command}", "terminated" if isinstance(interrupt, Terminated) else "interrupted")
        return exit_code(interrupt)
