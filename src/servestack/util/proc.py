"""The one place that runs external commands (docker, skopeo, sbatch, git, uv), each shown with `-v`."""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from servestack.errors import CommandError
from servestack.util.console import console

_SECRET_ENV_MARKERS = ("TOKEN", "PASSWORD", "SECRET")


# Callers catch a command's timeout by this name, so none of them needs subprocess.
TimeoutExpired = subprocess.TimeoutExpired


def _prepare(argv: Sequence[str | os.PathLike[str]], env: Mapping[str, str] | None,
             base_env: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """The argv as strings and the full environment (`base_env`, default this process's, plus `env`),
    the command shown (with `-v`) with secrets hidden."""
    args = [os.fspath(a) for a in argv]
    full_env = dict(os.environ if base_env is None else base_env)
    if env:
        full_env.update(env)
    shown_env = " ".join(
        f"{k}=***" if any(m in k.upper() for m in _SECRET_ENV_MARKERS) else f"{k}={shlex.quote(v)}"
        for k, v in (env or {}).items()
    )
    console.detail("servestack.util.proc", f"$ {f'{shown_env} ' if shown_env else ''}{shlex.join(args)}")
    return args, full_env


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
    args, full_env = _prepare(argv, env)
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


def pipe(argv: Sequence[str | os.PathLike[str]], *, env: Mapping[str, str] | None = None,
         base_env: Mapping[str, str] | None = None, stderr: int | IO[bytes] | None = None) -> subprocess.Popen[bytes]:
    """A long-lived command spoken to through bytes on its standard input and output pipes. Its
    environment is `base_env` (default: the caller's) plus `env`."""
    args, full_env = _prepare(argv, env, base_env)
    return subprocess.Popen(args, env=full_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)


def output_bytes(
    argv: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,
    timeout: float | None = None,
) -> bytes:
    """A command's standard output as bytes (a signature, a DER certificate), its error output kept apart
    so it cannot corrupt them; a failure raises CommandError with that error output."""
    args, full_env = _prepare(argv, env)
    proc = subprocess.run(args, env=full_env, input=input, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        raise CommandError(args, proc.returncode, proc.stderr.decode(errors="replace"))
    return proc.stdout
