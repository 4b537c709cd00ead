"""enroot on this machine, built from the vendored source; and the enroot a Slurm node must have."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servestack.cluster.vendored import built, cache_key, install_command, unpack, vendor_archive
from servestack.errors import ClusterToolsMissing, ServestackError
from servestack.util.fsutil import atomic_write_text
from servestack.util.proc import run
from servestack.util.project import state_home

ENROOT_MIN_VERSION = (3, 4, 0)


def parse_enroot_version(text: str) -> tuple[int, ...]:
    """`enroot version` prints e.g. "4.1.2"."""
    words = text.strip().split()
    parts = words[0].split(".") if words else []
    if not parts or not all(p.isdigit() for p in parts):
        raise ServestackError(f"cannot read an enroot version from {text!r}")
    return tuple(int(p) for p in parts)


@dataclass(frozen=True, kw_only=True)
class Enroot:
    """An enroot install: its command, version and the directories it keeps images in."""

    prefix: Path
    version: tuple[int, ...]

    @property
    def binary(self) -> Path:
        return self.prefix / "bin" / "enroot"

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"


def enroot_settings(state: Path) -> dict[str, str]:
    """enroot.conf for this node.

    - ENROOT_ALLOW_HTTP: the test registry is plain HTTP on loopback (production: HTTPS).
    - ENROOT_LOGIN_SHELL no: Debian's /etc/profile resets PATH and drops the image's /opt/venv/bin.
    - ENROOT_SQUASH_OPTIONS: lz4, fast to write and to read back through squashfuse; the dev-cpu
      image is 4 GB unpacked, and a shared CI disk does not hold many of those uncompressed.
    - ENROOT_CACHE_PATH holds the downloaded layers while an import runs; the importer empties
      it afterwards (the squashfs, cached by digest, is what jobs reuse).
    """
    return {
        "ENROOT_RUNTIME_PATH": str(state / "runtime"),
        "ENROOT_CACHE_PATH": str(state / "cache"),
        "ENROOT_DATA_PATH": str(state / "data"),
        "ENROOT_TEMP_PATH": str(state / "tmp"),
        "ENROOT_ALLOW_HTTP": "yes",
        "ENROOT_LOGIN_SHELL": "no",
        "ENROOT_SQUASH_OPTIONS": "-comp lz4 -no-xattrs",
        "ENROOT_MOUNT_HOME": "no",
        "ENROOT_REMAP_ROOT": "no",
        "ENROOT_ROOTFS_WRITABLE": "yes",
    }


def _build_enroot(archive: Path) -> Callable[[Path], None]:
    def build(home: Path) -> None:
        tree = unpack(archive, home / "src")
        # The archive's git submodules are empty: glibc instead of musl, Debian's makeself (the
        # version enroot pins) and the system's kernel headers.
        makeself = shutil.which("makeself") or shutil.which("makeself.sh")
        if not makeself:
            raise ClusterToolsMissing("`makeself` is not installed (enroot's build needs it); run .ci/bootstrap")
        (tree / "deps" / "makeself").mkdir(parents=True, exist_ok=True)
        shutil.copy2(makeself, tree / "deps" / "makeself" / "makeself.sh")
        (tree / "deps" / "linux-headers").mkdir(parents=True, exist_ok=True)
        (tree / "deps" / "linux-headers" / ".stamp").touch()
        run(["make", "-C", str(tree), "FORCE_GLIBC=1", f"prefix={home / 'prefix'}", "install"], timeout=900)
        shutil.rmtree(tree.parent)

    return build


def ensure_enroot(root: Path | None = None) -> Enroot:
    """enroot built from the vendored snapshot (a few seconds once), configured for this node."""
    archive = vendor_archive("enroot")
    home = built("enroot", cache_key(archive), _build_enroot(archive))
    prefix = home / "prefix"
    state = state_home() / "enroot"
    for sub in ("runtime", "cache", "data", "tmp"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    conf = prefix / "etc" / "enroot" / "enroot.conf"
    wanted = "".join(f"{k} {v}\n" for k, v in enroot_settings(state).items())
    if not conf.exists() or conf.read_text() != wanted:
        atomic_write_text(conf, wanted)
    for tool in sorted((prefix / "bin").iterdir()):  # enroot and its helpers (enroot-nsenter, ...)
        install_command(tool)
    out = run([str(prefix / "bin" / "enroot"), "version"], timeout=30).stdout.strip()
    return Enroot(prefix=prefix, version=parse_enroot_version(out))
