"""The commit a wheel was built from, as the wheel itself records it (the lock's PR evidence reads it)."""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

from servestack.wheels import escape_name, read_wheel

_HEX = r"[0-9a-f]{7,40}"


def _scm_version_commit(text: str) -> str | None:
    """A setuptools-scm `_version.py`: `__commit_id__ = 'g1a2b3c4'`, or `g<hex>` in the
    version / version tuple (`0.6.4.dev12+g1a2b3c4.d20240101`, `(0, 6, 4, 'dev12', 'g1a2b3c4.d2024')`)."""
    m = re.search(r"^(?:__commit_id__|commit_id)\s*(?::[^=]*)?=\s*['\"]g?(" + _HEX + r")['\"]", text, re.M)
    if m:
        return m[1]
    m = re.search(r"['\"+.]g(" + _HEX + r")(?=['\".])", text)
    return m[1] if m else None


def _assigned_hex(*names: str) -> Callable[[str], str | None]:
    """A module assigning a commit: `__commit__ = "<sha>"`, `git_version = '<sha>'`, ..."""
    pattern = re.compile(
        r"^(?:" + "|".join(re.escape(n) for n in names) + r")\s*(?::[^=]*)?=\s*['\"]g?(" + _HEX + r")['\"]", re.M
    )

    def parse(text: str) -> str | None:
        m = pattern.search(text)
        return m[1] if m else None

    return parse


# Where known packages record the commit they were built from: (path in the wheel, parser).
# Keys are escaped distribution names. Extend here for new packages.
COMMIT_SOURCES: dict[str, list[tuple[str, Callable[[str], str | None]]]] = {
    "vllm": [
        ("vllm/_version.py", _scm_version_commit),  # setuptools-scm
        ("vllm/commit_id.py", _assigned_hex("__commit__")),  # vLLM <= 0.5
    ],
    "flashinfer_python": [("flashinfer/_build_meta.py", _assigned_hex("__git_commit__", "__git_version__"))],
    "torch": [("torch/version.py", _assigned_hex("git_version"))],
}

# Tried for every package, after its own entries; `{pkg}` is each top-level package of the wheel.
GENERIC_COMMIT_SOURCES: list[tuple[str, Callable[[str], str | None]]] = [
    ("{pkg}/_version.py", _scm_version_commit),
    ("{pkg}/version.py", _scm_version_commit),
    ("{pkg}/_version.py", _assigned_hex("__commit__", "__git_version__", "git_version", "commit")),
    ("{pkg}/version.py", _assigned_hex("__commit__", "__git_version__", "git_version", "commit")),
]


def _direct_url_commit(text: str) -> str | None:
    try:
        commit = json.loads(text).get("vcs_info", {}).get("commit_id")
    except (ValueError, AttributeError):
        return None
    return commit.lower() if isinstance(commit, str) and re.fullmatch(_HEX, commit.lower()) else None


def read_wheel_commit(wheel: Path) -> str | None:
    """The commit (hex, possibly abbreviated) the wheel records it was built from, or None.

    Looks at the package's own entry in COMMIT_SOURCES, then the generic `_version.py` /
    `version.py` of each top-level package, then `*.dist-info/direct_url.json`, then a
    `+g<hex>` local label in the version itself."""
    info = read_wheel(wheel)
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        tops = sorted({n.split("/", 1)[0] for n in names if "/" in n and not n.split("/", 1)[0].endswith((".dist-info", ".data"))})
        sources = list(COMMIT_SOURCES.get(escape_name(info.name), []))
        sources += [(p.format(pkg=top), parse) for p, parse in GENERIC_COMMIT_SOURCES if "{pkg}" in p for top in tops]
        sources.append((f"{info.dist_info}/direct_url.json", _direct_url_commit))
        for member, parse in sources:
            if member in names:
                commit = parse(zf.read(member).decode("utf-8", "replace"))
                if commit:
                    return commit.lower()
    m = re.search(r"\+(?:.*\.)?g(" + _HEX + r")(?:\.|$)", info.version)
    return m[1] if m else None
