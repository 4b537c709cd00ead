"""The one place that runs external commands (docker, skopeo, sbatch, git, uv), logging each."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from .errors import ServestackError

log = logging.getLogger("servestack.proc")

_SECRET_ENV_MARKERS = ("TOKEN", "PASSWORD", "SECRET")


class CommandError(ServestackError):
    def __init__(self, argv: Sequence[str], returncode: int, output: str):
        self.argv = list(argv)
        self.returncode = returncode
        self.output = output
        tail = "\n".join(output.strip().splitlines()[-20:])
        super().__init__(f"`{shlex.join(self.argv)}` exited with {returncode}" + (f":\n{tail}" if tail else ""))


def run(
    argv: Sequence[str | os.PathLike[str]],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a command; its environment is the caller's plus `env`. Secrets are never logged."""
    args = [os.fspath(a) for a in argv]
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    shown_env = " ".join(
        f"{k}=***" if any(m in k.upper() for m in _SECRET_ENV_MARKERS) else f"{k}={shlex.quote(v)}"
        for k, v in (env or {}).items()
    )
    log.info("$ %s%s", f"{shown_env} " if shown_env else "", shlex.join(args))
    proc = subprocess.run(
        args,
        cwd=cwd,
        env=full_env,
        input=input.decode() if input is not None else None,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.STDOUT if capture else None,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise CommandError(args, proc.returncode, proc.stdout or "")
    return proc
