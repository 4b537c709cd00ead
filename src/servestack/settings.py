"""Every `SERVESTACK_*` environment variable the host-side library reads: its name, default and meaning.

Configuration is the environment, never the repo or the lock, so a site sets a variable and the same
lock works unchanged. One table says what each variable is; README.md's configuration table is held
to it by tests/test_settings.py, and no other module reads these variables from `os.environ`.
Values are read when asked for, never at import: a test or a step may change the environment between
two calls.

An empty value is returned as set, as `os.environ.get(name, default)` would: most callers treat an
empty value as unset, a few (the cache, the state, certs.d) have always taken it literally.

The in-image packages (`probe/`, `clients/`) run with the standard library only and read their own.
Variables the library only *sets* for a child (the node preflight's, the nvidia hook recorders') are
not configuration, so they are not here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

INDEX_PREFIX = "SERVESTACK_INDEX_"


@dataclass(frozen=True, kw_only=True)
class Setting:
    name: str  # SERVESTACK_INDEX_<NAME> stands for one variable per package index
    default: str | None  # None: no default; a leading ~ is the user's home
    meaning: str  # one line, as README.md's table shows it


SETTINGS: dict[str, Setting] = {s.name: s for s in (
    Setting(name="SERVESTACK_CACHE", default="~/.cache/servestack",
            meaning="downloaded inputs and built layers, content-addressed and shared between checkouts"),
    Setting(name="SERVESTACK_STATE", default="~/.local/state/servestack",
            meaning="the embedded services' state and logs (dockerd, registries, Slurm) and the built cluster tools"),
    Setting(name="SERVESTACK_PROGRESS_SECONDS", default="15",
            meaning="seconds between progress lines when stderr is not a terminal"),
    Setting(name="SERVESTACK_INDEX_<NAME>", default=None,
            meaning="where package index `<NAME>` is (upper-cased, `-` as `_`): a PEP 503 simple URL or a "
                    "directory of wheel files; before uv's configuration and the stack's default"),
    Setting(name="SERVESTACK_INDEX_DEBIAN", default=None,
            meaning="the Debian archive: a mirror or snapshot URL, or a directory laid out as one; "
                    "unset: this machine's apt sources"),
    Setting(name="SERVESTACK_DEBIAN_KEYRING", default="/usr/share/keyrings/debian-archive-keyring.gpg",
            meaning="the keys the Debian archive's InRelease is verified with"),
    Setting(name="SERVESTACK_GIT_MIRROR", default=None,
            meaning="git mirrors for PR history, a template with `{repo}` (`/srv/git/{repo}.git`); "
                    "over the stack's `mirrors`"),
    Setting(name="SERVESTACK_GITHUB_API", default="https://api.github.com",
            meaning="GitHub's REST API, for PR history without a mirror"),
    Setting(name="SERVESTACK_CERTS_D", default="/etc/docker/certs.d",
            meaning="registries' CA certificates as `<host:port>/ca.crt` (Docker's layout)"),
    Setting(name="SERVESTACK_KEY_PASSWORD", default=None,
            meaning="the signing key's password: `keygen` encrypts the key with it, `publish` opens it"),
    Setting(name="SERVESTACK_SRTCTL", default=None,
            meaning="the srtctl command (shell words), over the pipeline's `runner.srtctl.executable`"),
    Setting(name="SERVESTACK_VENDOR", default=None,
            meaning="the directory of the vendored enroot, pyxis and srt-slurm snapshots the cluster tools "
                    "are built from"),
    Setting(name="SERVESTACK_PYTHON312", default=None,
            meaning="a Python 3.12 for srt-slurm's jobs; unset: `python3.12` on PATH, else a pyenv or "
                    "uv-managed one"),
)}


def index_variable(index: str) -> str:
    """The variable that says where package index INDEX is: `pytorch-cpu` -> SERVESTACK_INDEX_PYTORCH_CPU."""
    return INDEX_PREFIX + index.upper().replace("-", "_")


def setting(name: str) -> Setting:
    """NAME's row; any SERVESTACK_INDEX_* without a row of its own is SERVESTACK_INDEX_<NAME>'s."""
    if name in SETTINGS:
        return SETTINGS[name]
    if name.startswith(INDEX_PREFIX):
        return SETTINGS[INDEX_PREFIX + "<NAME>"]
    # A name missing from the table is a bug here, not a user's mistake: it would go undocumented.
    raise KeyError(f"{name} is not in servestack.settings.SETTINGS")


def default(name: str) -> str:
    """NAME's default ("" where it has none), the home directory spelled out."""
    fallback = setting(name).default
    return os.path.expanduser(fallback) if fallback is not None else ""


def value(name: str) -> str:
    """NAME as this process's environment sets it (an empty value too), else its default."""
    found = os.environ.get(name)
    return found if found is not None else default(name)


@contextmanager
def overriding(name: str, new: str) -> Iterator[None]:
    """NAME set to NEW for this process and the children it starts, restored (or unset) after."""
    setting(name)  # an override of a variable nobody reads would silently do nothing
    previous = os.environ.get(name)
    os.environ[name] = new
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous
