"""pyxis (Slurm's container plugin) built against this machine's libslurm, with an importer that caches by digest."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servestack.cluster.enroot import Enroot, ensure_enroot
from servestack.cluster.vendored import built, cache_key, executable, unpack, vendor_archive
from servestack.resources import PYXIS_IMPORTER, script
from servestack.util.proc import run
from servestack.util.project import state_home


@dataclass(frozen=True, kw_only=True)
class Pyxis:
    plugin: Path
    plugstack_line: str
    image_cache: Path


IMAGES_KEPT = 2


def image_cache_dir() -> Path:
    """Squashfs images by digest, shared by every job on this node (and kept between CI runs)."""
    return state_home() / "enroot" / "images"


def _build_pyxis(archive: Path) -> Callable[[Path], None]:
    def build(home: Path) -> None:
        tree = unpack(archive, home / "src")
        run(["make", "-C", str(tree)], timeout=600)
        shutil.copy2(tree / "spank_pyxis.so", home / "spank_pyxis.so")
        shutil.rmtree(tree.parent)

    return build


def ensure_pyxis(root: Path | None = None, enroot: Enroot | None = None) -> Pyxis:
    """pyxis built against this machine's libslurm (4 s once), with an importer that caches by digest.

    Returns the plugstack.conf line; `services.ensure_slurm` includes it.
    """
    enroot = enroot or ensure_enroot(root)
    archive = vendor_archive("pyxis")
    home = built("pyxis", cache_key(archive), _build_pyxis(archive))
    importer = home / "importer.sh"
    cache = image_cache_dir()
    text = (script(PYXIS_IMPORTER).replace("@ENROOT_BIN@", str(enroot.bin_dir)).replace("@CACHE@", str(cache))
            .replace("@KEEP@", str(IMAGES_KEPT)).replace("@LAYERS@", str(state_home() / "enroot" / "cache")))
    if not importer.exists() or importer.read_text() != text:
        executable(importer, text)
    runtime = state_home() / "enroot" / "pyxis"
    for d in (runtime, cache):
        d.mkdir(parents=True, exist_ok=True)  # pyxis creates <runtime>/<uid> only, not its parents
    line = (f"required {home / 'spank_pyxis.so'} runtime_path={runtime} "
            f"importer={importer} use_squashfuse=1 container_scope=job")
    return Pyxis(plugin=home / "spank_pyxis.so", plugstack_line=line, image_cache=cache)
