"""The registry the command line is built from: each subcommand's help, arguments and function; and the
options the steps share (`--stack`, checked against pins/ before any step runs; `--platform`).

`cli.py` registers most commands and builds the parser; a few live in modules of their own
(`cli_compare`, `cli_publish`) and register here, so none of them imports the command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from servestack.errors import InputError
from servestack.util.project import DEFAULT_STACK, Project

Command = Callable[[argparse.Namespace, Project], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help: str,
            configure: Callable[[argparse.ArgumentParser], None] = lambda p: None) -> Callable[[Command], Command]:
    def register(fn: Command) -> Command:
        COMMANDS[name] = (help, configure, fn)
        return fn

    return register


def say(text: str = "") -> None:
    print(text, flush=True)


def image_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", help="REPO@sha256:<64 hex> (default: the digest the last `image` session recorded)")


def platform_arg(p: argparse.ArgumentParser) -> None:
    # Every session of the main job takes it, so `nox -s build image smoke -- --stack S --platform P`
    # hands the same options to each (build chooses; image and smoke check they work on that build).
    p.add_argument("--platform", help="which of the stack's platforms (linux/amd64, linux/arm64); default: this "
                                      "machine's, when the stack has it")


def same_platform(project: Project, stack: str, asked: str | None, record: str, recorded: str, rerun: str) -> None:
    """`--platform` of image or smoke is the one the step before it recorded, or the step is refused."""
    if asked is not None and asked != recorded:
        raise InputError(f"build/{stack}/{record}", "--platform",
                         f"the last build of {stack} is for {recorded}, not {asked}; run `{rerun}` first")


def check_stack(args: argparse.Namespace, project: Project) -> None:
    """A stack named on the command line is one of pins/: checked before any step reads or writes a
    file, so a typo is refused with the stacks there are, not met later as a missing lock or image."""
    if args.stack is None:
        if args.command != "recipes":  # recipes: no --stack means the stack each recipe's header names
            args.stack = DEFAULT_STACK
        return
    if project.stack_file(args.stack).is_file():
        _check_variant(args, project)
        return
    import difflib

    stacks = sorted(p.stem for p in project.pins.glob("*.yaml")) if project.pins.is_dir() else []
    close = difflib.get_close_matches(args.stack, stacks, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise InputError(project.stack_file(args.stack).relative_to(project.root), "--stack",
                     f"no such stack{hint}; stacks are: {', '.join(stacks) or 'none (pins/ has no <stack>.yaml)'}")


def _check_variant(args: argparse.Namespace, project: Project) -> None:
    """A variant (`S.without-N`) names a PR of S's stack file that names a check, and is not locked itself."""
    from servestack.records.stack import load_stack
    from servestack.util.project import variant_name, variant_of

    base, number = variant_of(args.stack)
    if number is None:
        return
    shown = project.stack_file(args.stack).relative_to(project.root)
    if args.command in ("lock", "bump"):
        raise InputError(shown, "--stack", f"{args.stack} is a variant of {base}, built from {base}'s lock: {args.command} {base}")
    named = [pr for package in load_stack(project.stack_file(base)).packages for pr in package.prs if pr.check]
    if number not in {pr.number for pr in named}:
        raise InputError(shown, "--stack", f"{args.stack}: no PR numbered {number} names a check in {base}'s stack; "
                                           f"its variants are: {', '.join(variant_name(base, pr.number) for pr in named) or 'none'}")
