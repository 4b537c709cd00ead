"""Where each package index is: configuration, never the lock.

A lock names every wheel by index name, file name, size and sha256. Where an index *is* comes,
first match wins, from:

1. `SERVESTACK_INDEX_<NAME>` (name upper-cased, `-` -> `_`): a PEP 503 simple URL, or a
   directory / `file://` URL of wheel files (a flat index);
2. uv's configuration: `UV_INDEX` (`name=url` entries), then the `[[index]]` tables of uv.toml
   (`UV_CONFIG_FILE`, else the user's `~/.config/uv/uv.toml`, then the system's
   `/etc/uv/uv.toml`); for the default index `pypi` also `UV_DEFAULT_INDEX`, `UV_INDEX_URL`,
   uv.toml's `index-url` and an `[[index]]` marked `default = true`;
3. the stack's `indexes[].url`, a default location;
4. for `pypi` only: uv's own default index.

So a site behind a mirror sets one variable (or its uv.toml) and the same lock works unchanged;
a file fetched from there must still have the lock's sha256.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from servestack import settings
from servestack.errors import InputError

DEFAULT_INDEX = "pypi"


@dataclass(frozen=True, kw_only=True)
class IndexLocation:
    name: str
    url: str | None  # None: uv's own default index (only for `pypi`)
    flat: bool  # a directory of wheel files (find-links), not a simple index
    source: str  # where this location was configured, for messages

    @property
    def directory(self) -> Path | None:
        """The local directory of a flat index on this machine, else None."""
        if not self.flat or self.url is None:
            return None
        parsed = urlparse(self.url)
        if parsed.scheme in ("", "file"):
            return Path(unquote(parsed.path))
        return None

    def uv_args(self, *, only: bool) -> list[str]:
        """uv arguments that make this index a source; `only`: the one source (no default index)."""
        if self.url is None:
            return []
        if self.flat:
            return (["--no-index"] if only else []) + ["--find-links", self.url]
        return ["--default-index", self.url] if only or self.name == DEFAULT_INDEX else ["--index", self.url]

    def describe(self) -> str:
        return f"index {self.name!r} ({self.url or 'uv default'}, from {self.source})"

    def owns(self, url: str) -> bool:
        """Whether a wheel URL uv resolved comes from this index."""
        if self.url is None:
            return False
        directory = self.directory
        if directory is not None:
            parsed = urlparse(url)
            return parsed.scheme == "file" and Path(unquote(parsed.path)).parent == directory
        root = self.url.rstrip("/").removesuffix("/simple")
        return url.startswith(root + "/") or url.startswith(self.url.rstrip("/") + "/")


def env_name(index: str) -> str:
    return settings.index_variable(index)


def _is_flat(url: str) -> bool:
    return urlparse(url).scheme in ("", "file")


def _uv_config_files() -> list[Path]:
    if os.environ.get("UV_NO_CONFIG"):
        return []
    if os.environ.get("UV_CONFIG_FILE"):
        return [Path(os.environ["UV_CONFIG_FILE"])]
    user = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "uv" / "uv.toml"
    system = [Path(d) / "uv" / "uv.toml" for d in (os.environ.get("XDG_CONFIG_DIRS") or "/etc").split(":") if d]
    return [user, *system]


def _uv_config(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(path, "(uv configuration)", f"cannot be read: {exc}") from None


def _from_uv(name: str) -> IndexLocation | None:
    for entry in (os.environ.get("UV_INDEX") or "").split():
        key, sep, url = entry.partition("=")
        if sep and key == name:
            return IndexLocation(name=name, url=url, flat=_is_flat(url), source="UV_INDEX")
    if name == DEFAULT_INDEX:
        for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
            if os.environ.get(var):
                return IndexLocation(name=name, url=os.environ[var], flat=False, source=var)
    for path in _uv_config_files():
        config = _uv_config(path)
        for table in config.get("index") or []:
            if table.get("name") == name or (name == DEFAULT_INDEX and table.get("default")):
                url = str(table.get("url", ""))
                flat = table.get("format") == "flat" or _is_flat(url)
                return IndexLocation(name=name, url=url, flat=flat, source=f"{path} [[index]]")
        if name == DEFAULT_INDEX and config.get("index-url"):
            return IndexLocation(name=name, url=config["index-url"], flat=False, source=f"{path} index-url")
    return None


def locate(name: str, defaults: dict[str, str | None], *, where: str = "") -> IndexLocation:
    """Where index `name` is; `defaults` are the stack's `indexes` (name -> default url or None)."""
    url = settings.value(env_name(name))
    if url:
        return IndexLocation(name=name, url=url, flat=_is_flat(url), source=env_name(name))
    found = _from_uv(name)
    if found:
        return found
    default = defaults.get(name)
    if default:
        return IndexLocation(name=name, url=default, flat=_is_flat(default), source="the stack's default")
    if name == DEFAULT_INDEX:
        return IndexLocation(name=name, url=None, flat=False, source="uv's default")
    raise InputError(
        where or "(stack)", f"indexes[{name}]",
        f"index {name!r} has no location here: set {env_name(name)} to its simple URL or a directory of its "
        f"wheel files, or add an [[index]] named {name!r} to uv.toml (see servestack.sources.indexes)",
    )
