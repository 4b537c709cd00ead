"""The registry the command line is built from: each subcommand's help, arguments and function.

`cli.py` registers most commands and builds the parser; a few live in modules of their own
(`cli_compare`, `cli_publish`) and register here, so none of them imports the command line.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from servestack.util.project import Project

Command = Callable[[argparse.Namespace, Project], int]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None] = lambda p: None):
    def register(fn: Command) -> Command:
        COMMANDS[name] = (help, configure, fn)
        return fn

    return register


def say(text: str = "") -> None:
    print(text, flush=True)


def image_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--image", help="REPO@sha256:<64 hex> (default: the digest the last `image` session recorded)")
