"""The README's opening as a newcomer reads it (issue 53): a contents list, the quick start and the
exit-code table in the first screenful of sections, and every quick-start command one that exists:
each `nox -s` names a session of noxfile.py and its arguments parse as that servestack command."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

from servestack import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
REF = "127.0.0.1:5000/servestack/dev-cpu@sha256:" + "0" * 64


def _sessions() -> dict[str, str | None]:
    """Each nox session and the servestack command it runs (None: not a servestack command)."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    out: dict[str, str | None] = {}
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and any(ast.unparse(d) == "nox.session" for d in fn.decorator_list):
            calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and ast.unparse(c.func) == "_servestack"]
            out[fn.name] = ast.literal_eval(calls[0].args[1]) if calls else None
    return out


def _quick_start() -> str:
    section = README.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```bash\n", 1)[1].split("```", 1)[0]


def test_the_readme_opens_with_contents_then_the_quick_start_and_its_exit_codes():
    sections = re.findall(r"^(##+) (.+)$", README, re.M)
    assert [title for _, title in sections[:3]] == ["Contents", "Quick start", "Exit codes"], sections[:4]
    contents = README.split("\n## Contents\n", 1)[1].split("\n## ", 1)[0]
    for level, title in sections:
        if level == "##" and title != "Contents":
            assert f"[{title}](#" in contents, f"the contents list lacks {title!r}"


def test_every_quick_start_command_is_a_session_whose_arguments_parse():
    sessions = _sessions()
    parser = cli.build_parser()
    commands = [line.split("#", 1)[0].strip() for line in _quick_start().splitlines()]
    ran = []
    for command in filter(None, commands):
        words = shlex.split(command.replace('"$REF"', REF))
        if words[:2] != ["nox", "-s"]:
            continue
        names = words[2:words.index("--")] if "--" in words else words[2:]
        posargs = words[words.index("--") + 1:] if "--" in words else []
        for name in names:
            assert name in sessions, f"README quick start: no nox session {name!r}"
            if sessions[name]:
                parser.parse_args([sessions[name], *posargs])  # argparse exits 2 on an option it lacks
                ran.append(name)
    assert ran[:3] == ["build", "image", "smoke"] and {"keygen", "publish", "pull", "verify"} <= set(ran), ran

