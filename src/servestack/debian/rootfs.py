"""A Debian root file system assembled on the host from locked .deb files, without running anything.

dpkg's unpacking is done here: each package's data archive goes into one in-memory tree, parent
directories are followed through symlinks as dpkg follows them (so the merged-/usr links
`bin -> usr/bin`, made first, put /bin/bash at /usr/bin/bash), files two packages ship must be
the same or one must Replace the other. Then the package database is written as dpkg leaves it
after configuring (status, info/*.list, md5sums, conffiles, triggers), what the maintainer scripts
would have done is done by scripts.py, and the tree is written as one tar: paths in order, parents
first, every mtime clamped to the archive's date, owners and modes as the packages give them.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from servestack.debian.debfile import DebPackage, read_deb
from servestack.errors import ServestackError

# Top-level directories that are links into /usr (what usrmerge's convert-usrmerge makes); a link
# is made for each one some package ships files below.
MERGED = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


@dataclass(kw_only=True)
class Node:
    kind: str  # "dir" | "file" | "symlink" | "hardlink"
    mode: int = 0o755
    uid: int = 0
    gid: int = 0
    uname: str = "root"
    gname: str = "root"
    mtime: float = 0  # a member's own, as its tar header gives it: a pax header's may be fractional
    data: bytes = b""
    link: str = ""  # a symlink's target; a hard link's (canonical) path
    owner: str = ""  # the package that shipped it, "" for what the assembly made


@dataclass(kw_only=True)
class Root:
    """The tree being assembled: canonical path (no leading slash, "" the root) -> node."""

    epoch: int
    nodes: dict[str, Node] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes.setdefault("", Node(kind="dir", mtime=self.epoch))

    def canonical(self, path: str) -> str:
        """`path` with every parent directory followed through symlinks (the last part is not followed)."""
        parts = [p for p in path.strip("/").split("/") if p not in ("", ".")]
        done: list[str] = []
        for depth, part in enumerate(parts):
            if part == "..":
                if done:
                    done.pop()
                continue
            done.append(part)
            if depth == len(parts) - 1:
                break
            node = self.nodes.get("/".join(done))
            hops = 0
            while node is not None and node.kind == "symlink":
                hops += 1
                if hops > 40:
                    raise ServestackError(f"/{'/'.join(done)}: too many levels of symbolic links")
                target = node.link if node.link.startswith("/") else posixpath.join("/", *done[:-1], node.link)
                done = [p for p in posixpath.normpath(target).strip("/").split("/") if p]
                node = self.nodes.get("/".join(done))
        return "/".join(done)

    def resolve(self, path: str) -> str | None:
        """The canonical path `path` finally names (its last part followed too), None if nothing is there."""
        path = self.canonical(path)
        for _ in range(40):
            node = self.nodes.get(path)
            if node is None:
                return None
            if node.kind != "symlink":
                return path
            parent = posixpath.dirname("/" + path)
            path = self.canonical(node.link if node.link.startswith("/") else posixpath.join(parent, node.link))
        return None

    def exists(self, path: str) -> bool:
        return self.resolve(path) is not None

    def read(self, path: str) -> bytes:
        real = self.resolve(path)
        node = self.nodes.get(real) if real is not None else None
        if node is not None and node.kind == "hardlink":
            node = self.nodes[node.link]
        if node is None or node.kind != "file":
            raise ServestackError(f"the base has no file /{path}")
        return node.data

    def add(self, path: str, node: Node, *, replace: bool = True) -> str:
        """Put `node` at `path` (parents followed, missing parents made); returns its canonical path."""
        where = self.canonical(path)
        if not replace and where in self.nodes:
            return where
        parent = posixpath.dirname(where)
        if parent and parent not in self.nodes:
            self.add(parent, Node(kind="dir", mtime=self.epoch))
        if node.mtime == 0:
            node.mtime = self.epoch
        self.nodes[where] = node
        return where

    def file(self, path: str, data: bytes, mode: int = 0o644, *, gid: int = 0, gname: str = "root",
             replace: bool = True) -> str:
        return self.add(path, Node(kind="file", mode=mode, gid=gid, gname=gname, data=data), replace=replace)

    def symlink(self, path: str, target: str, *, replace: bool = True) -> str:
        return self.add(path, Node(kind="symlink", mode=0o777, link=target), replace=replace)

    def dir(self, path: str, mode: int = 0o755, *, gid: int = 0, gname: str = "root") -> str:
        return self.add(path, Node(kind="dir", mode=mode, gid=gid, gname=gname), replace=False)


def _replaces(package: DebPackage) -> set[str]:
    text = package.fields.get("Replaces", "")
    return {clause.split("(")[0].split(":")[0].strip() for clause in text.split(",") if clause.strip()}


def unpack(root: Root, package: DebPackage) -> list[str]:
    """dpkg's unpack of one package into `root`; returns the paths it owns, as its .list names them."""
    listed: list[str] = []
    replaces = _replaces(package)
    for member in package.members:
        info = member.info
        name = "/" + info.name.removeprefix("./").rstrip("/")
        listed.append("/." if name == "/" else name)
        if name == "/":
            continue
        if info.isdir():
            kind = "dir"
        elif info.isfile():
            kind = "file"
        elif info.issym():
            kind = "symlink"
        elif info.islnk():
            kind = "hardlink"
        else:
            raise ServestackError(f"{package.name}: {name}: a {info.type!r} member; expected files, links and "
                                  "directories (device nodes come from the container runtime)")
        where = root.canonical(name)
        existing = root.nodes.get(where)
        if kind == "dir":
            if existing is None:
                root.add(where, Node(kind="dir", mode=info.mode, uid=info.uid, gid=info.gid, uname=info.uname, gname=info.gname,
                                     mtime=info.mtime,
                                     owner=package.name))
            elif existing.kind not in ("dir", "symlink"):
                raise ServestackError(f"{package.name}: {name} is a directory, but {existing.owner} ships a file there")
            continue
        link = info.linkname
        if kind == "hardlink":
            link = root.canonical(info.linkname)
            if root.nodes.get(link, Node(kind="")).kind != "file":
                raise ServestackError(f"{package.name}: {name} is a hard link to {info.linkname}, which is not a file")
        node = Node(kind=kind, mode=info.mode, uid=info.uid, gid=info.gid, uname=info.uname, gname=info.gname, mtime=info.mtime,
                    data=member.data or b"",
                    link=link, owner=package.name)
        if existing is not None and existing.kind != "dir":
            same = (existing.kind, existing.data, existing.link, existing.mode) == (kind, node.data, link, node.mode)
            if not same and existing.owner and existing.owner not in replaces:
                raise ServestackError(f"{package.name}: {name} is also shipped, differently, by {existing.owner}, "
                                      f"which {package.name} does not Replace")
            if same:
                continue  # shared, as dpkg allows for identical files; the first owner stays
        elif existing is not None:
            raise ServestackError(f"{package.name}: {name} is a file, but a directory is there")
        root.add(where, node)
    return listed


def merged_usr(root: Root, packages: Iterable[DebPackage]) -> None:
    tops = {m.info.name.removeprefix("./").split("/")[0] for p in packages for m in p.members}
    for top in MERGED:
        if top in tops:
            root.dir(f"usr/{top}")
            root.symlink(top, f"usr/{top}")


def read_packages(paths: list[Path]) -> list[DebPackage]:
    """The packages, read in parallel (xz decompression releases the GIL), sorted by name."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        packages = list(pool.map(read_deb, paths))
    return sorted(packages, key=lambda p: p.name)


def _members(root: Root) -> list[tuple[str, Node]]:
    """The nodes in tar order, hard links pointing at the first of their group in that order."""
    ordered = sorted(root.nodes.items(), key=lambda item: item[0].split("/") if item[0] else [])
    first: dict[str, str] = {}  # a hard-linked file -> the path that carries its bytes
    for path, node in ordered:
        target = node.link if node.kind == "hardlink" else path if node.kind == "file" else None
        if target is not None:
            first.setdefault(target, path)
    out = []
    for path, node in ordered:
        target = node.link if node.kind == "hardlink" else path if node.kind == "file" else None
        if target is not None:
            carrier = first[target]
            data = root.nodes[target]
            if carrier == path:
                node = Node(kind="file", mode=data.mode, uid=data.uid, gid=data.gid, uname=data.uname, gname=data.gname, mtime=data.mtime,
                            data=data.data,
                            link="", owner=data.owner)
            else:
                node = Node(kind="hardlink", mode=data.mode, uid=data.uid, gid=data.gid, uname=data.uname, gname=data.gname,
                            mtime=data.mtime,
                            link=carrier, owner=data.owner)
        out.append((path, node))
    return out


def write_tar(root: Root, out: Path) -> None:
    """The tree as a tar, written whole into place."""
    kinds = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        _write_members(root, tmp, kinds)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def _write_members(root: Root, path: Path, kinds: dict[str, bytes]) -> None:
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, node in _members(root):
            info = tarfile.TarInfo("./" + name if name else "./")
            info.type, info.mode, info.uid, info.gid = kinds[node.kind], node.mode, node.uid, node.gid
            info.uname, info.gname, info.mtime = node.uname, node.gname, min(node.mtime, root.epoch)
            if node.kind in ("symlink", "hardlink"):
                info.linkname = node.link if node.kind == "symlink" else "./" + node.link
            if node.kind == "file":
                info.size = len(node.data)
                tar.addfile(info, io.BytesIO(node.data))
            else:
                tar.addfile(info)


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()

