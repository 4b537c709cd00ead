"""`python -m servestack.recipes render|check|validate [...]` until cli.py grows the commands."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import ServestackError
from ..project import Project
from . import check_rendered, render_committed, render_recipes, validate_committed, validate_paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m servestack.recipes")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="render committed (unbound) sets, or bind one stack's set to an image")
    r.add_argument("--stack")
    r.add_argument("--image", help="repo@sha256:<64 hex> to bind to (needs --stack)")
    r.add_argument("--out", type=Path)
    sub.add_parser("check", help="committed recipes equal their renders and validate")
    v = sub.add_parser("validate", help="validate recipe files or directories")
    v.add_argument("paths", nargs="+", type=Path)
    v.add_argument("--engine", type=Path, help="pins/<stack>.engine.json")
    args = p.parse_args(argv)
    project = Project.find()
    try:
        if args.cmd == "render":
            if args.image:
                if not args.stack:
                    p.error("--image needs --stack")
                paths = render_recipes(project, args.stack, args.image, out_dir=args.out)
            else:
                paths = render_committed(project, [args.stack] if args.stack else None)
            for path in paths:
                print(path)
            return 0
        errors = check_rendered(project) + validate_committed(project) if args.cmd == "check" else validate_paths(args.paths, args.engine)
    except ServestackError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
