"""The layers above the base: every installed file in exactly one layer, as containers/image.yaml groups them."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from servestack.errors import ServestackError
from servestack.image import layers
from servestack.image.trees import VENV, Tree, site_packages
from servestack.records.lockfile import Lock
from servestack.records.steps import BuildRecord
from servestack.util.console import console
from servestack.util.fsutil import canonical_json, sha256_bytes
from servestack.wheels import normalize

if TYPE_CHECKING:
    from servestack.image.spec import ImagePlan  # pydantic: a build the registry already holds never reads the plan


@dataclass(frozen=True, kw_only=True)
class Layer:
    name: str
    entries: tuple[layers.Entry, ...]

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)


def _chunks(name: str, entries: list[layers.Entry], limit: int) -> list[Layer]:
    """`entries` as one layer, or split by path into layers of at most `limit` bytes."""
    out: list[list[layers.Entry]] = [[]]
    size = 0
    for e in sorted(entries, key=lambda e: e.path):
        if out[-1] and size + e.size > limit:
            out.append([])
            size = 0
        out[-1].append(e)
        size += e.size
    if len(out) == 1:
        return [Layer(name=name, entries=tuple(out[0]))]
    return [Layer(name=f"{name}-{i}", entries=tuple(chunk)) for i, chunk in enumerate(out) if chunk]


def _generated(work: Path, relpath: str, data: bytes, image_path: str) -> layers.Entry:
    path = work / relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)
    os.chmod(path, 0o644)
    return layers.entry_for(path, image_path)


def _venv_entries(work: Path, python: str) -> list[layers.Entry]:
    """A venv is a pyvenv.cfg and links to the interpreter; written here, nothing runs in the image."""
    cfg = f"home = /usr/bin\ninclude-system-site-packages = false\nversion = {python}\nexecutable = /usr/bin/python{python}\n"
    entries = [_generated(work, "venv/pyvenv.cfg", cfg.encode(), f"{VENV}/pyvenv.cfg")]
    entries += [layers.Entry(path=f"{VENV}/bin/{name}", kind="symlink", mode=0o777, link=f"/usr/bin/python{python}")
                for name in ("python", "python3", f"python{python}")]
    return entries


def own_layers(name: str, entries: list[layers.Entry], spec: ImagePlan) -> list[Layer] | None:
    """A package's own layer(s) when it installs more than `own_layer_above` bytes; None when it shares one."""
    if sum(e.size for e in entries) > (spec.source("packages").own_layer_above or 0):
        return _chunks(f"pkg-{name}", entries, spec.max_layer_bytes)
    return None


def plan(record: BuildRecord, lock: Lock, trees: dict[str, Tree], spec: ImagePlan, work: Path) -> list[Layer]:
    """The layers above the base, from the build record, its lock and the installed trees (keyed by wheel sha256).

    Every file lands in exactly one layer. Files an overlay changes or adds go to the top layer and
    leave their package's layer, so a changed PR changes only the top layer.
    """
    python = lock.python
    site = site_packages(python)
    overlay_by_base = {o.base.sha256: o for o in record.overlays}
    overlay_files: dict[str, str] = {}
    top: list[layers.Entry] = []
    packages: list[tuple[str, list[layers.Entry]]] = []
    seen: set[str] = set()
    for item in sorted(record.inputs, key=lambda i: normalize(i.name)):
        entries = list(trees[item.sha256].entries)
        applied = overlay_by_base.get(item.sha256)
        if applied:
            old = {e.path: e.sha256 for e in entries}
            changed = [e for e in trees[applied.wheel.sha256].entries
                       if ".dist-info/" in e.path or old.get(e.path) != e.sha256]
            top += changed
            overlay_files.update({e.path: e.sha256 for e in changed})
            kept = {e.path for e in trees[applied.wheel.sha256].entries} - overlay_files.keys()
            entries = [e for e in entries if e.path in kept]
        unique = [e for e in entries if e.path not in seen]
        if len(unique) != len(entries):
            console.warning("servestack.image", f"{item.name}: {len(entries) - len(unique)} files already installed by "
                           "another package are kept from the first")
        seen.update(e.path for e in unique)
        packages.append((normalize(item.name), unique))

    shared: list[list[layers.Entry]] = [[] for _ in range(spec.source("packages").shared_layers or 1)]
    own: list[Layer] = []
    for name, entries in packages:
        mine = own_layers(name, entries, spec)
        if mine is not None:
            own += mine
        else:
            shared[int(sha256_bytes(name.encode())[:8], 16) % len(shared)] += entries
    package_layers = [layer for i, bucket in enumerate(shared) if bucket
                      for layer in _chunks(f"shared-{i}", bucket, spec.max_layer_bytes)] + own

    model: list[Layer] = []
    if record.model:
        model_dir, name = Path(record.model.path), record.model.name
        model = _chunks("model", [layers.entry_for(p, f"opt/servestack/models/{name}/{p.name}")
                                  for p in sorted(model_dir.iterdir()) if p.is_file()], spec.max_layer_bytes)
    top += link_entries(lock, seen)
    stack_json = canonical_json({
        "lock_sha256": record.lock_sha256,
        "lock": lock.to_json(),
        "overlays": {o.package: {"version": o.wheel.version, "prs": [p["name"] for p in o.prs],
                                    "files": {t[len(site) + 1:] if t.startswith(site) else t: h
                                              for t, h in sorted(overlay_files.items())}}
                     for o in record.overlays},
    })
    top.append(_generated(work, "stack.json", stack_json.encode(), "opt/servestack/stack.json"))
    by_source = {"venv": [Layer(name="venv", entries=tuple(_venv_entries(work, python)))], "packages": package_layers,
                 "model": model, "top": [Layer(name="top", entries=tuple(sorted(top, key=lambda e: e.path)))]}
    # The prebuilt layer is compiled inside the image of these layers (build.py, prebuilt.py).
    return [layer for source in spec.layers if source.source not in ("base", "prebuilt") for layer in by_source[source.source]]


def link_entries(lock: Lock, installed: set[str]) -> list[layers.Entry]:
    """The stack's links, each to the one installed file its target glob matches under site-packages."""
    site = site_packages(lock.python)
    entries = []
    for path, link in sorted(lock.links.items()):
        pattern = f"{site}/{link.target}"
        matches = sorted(p for p in installed if fnmatch.fnmatchcase(p, pattern))
        if len(matches) != 1:
            raise ServestackError(
                f"{lock.file}: links.{path}.target {link.target!r} matches {len(matches)} installed files "
                f"({', '.join(matches[:5]) or 'none'}); expected exactly one under {site}")
        entries.append(layers.Entry(path=path.lstrip("/"), kind="symlink", mode=0o777, link="/" + matches[0]))
    return entries
