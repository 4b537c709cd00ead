"""Layers as content: a layer is a sorted list of entries, its key says everything that decides its
bytes, and the compressed blob for a key is written once, deterministically, and cached.

The tar is written here, not by BuildKit: entries in path order with every parent directory
before them, owner 0:0 with no user or group names, modes 0755 (directories, executables),
0644 (other files) or 0777 (symlinks), every mtime SOURCE_DATE_EPOCH, POSIX pax format. It is
compressed with zstd at a fixed level in multi-threaded mode: zstd's multi-threaded output does
not depend on the number of threads, so a 2-core and a 64-core machine write the same bytes, and
all cores are used. The zstd library's version is part of the key: another version may write
other bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import zstandard

from .cache import blob_path
from .fsutil import atomic_write_json, canonical_json, sha256_bytes, sha256_file
from .project import cache_home

# Bump when the tar recipe below changes: every layer key changes with it.
TAR_RECIPE = 1
ZSTD_LEVEL = 3
BLOB_NAME = "layer.tar.zst"


@dataclass(frozen=True)
class Entry:
    """One file, symlink or directory of a layer (`path` as in the image, without a leading slash)."""

    path: str
    kind: str  # "file" | "symlink" | "dir"
    mode: int
    size: int = 0
    sha256: str = ""
    link: str = ""
    # Where the bytes are on this host (files only), not part of the key: the file `source` itself, or,
    # from `offset` on, `size` bytes of an installed tree's pack (trees.py).
    source: Path | None = None
    offset: int = -1

    def identity(self) -> list[object]:
        return [self.path, self.kind, self.mode, self.size, self.sha256, self.link]


def entry_for(source: Path, path: str) -> Entry:
    """The entry for a host file or symlink, its content hashed."""
    info = source.lstat()
    if stat.S_ISLNK(info.st_mode):
        return Entry(path, "symlink", 0o777, link=os.readlink(source))
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{source}: only regular files and symlinks go into a layer")
    return Entry(path, "file", 0o755 if info.st_mode & 0o100 else 0o644, info.st_size, sha256_file(source), source=source)


def scan_tree(root: Path, prefix: str = "") -> list[Entry]:
    """Every file and symlink under `root`, as entries under `prefix`, their content hashed."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]):
            full = Path(dirpath, name)
            out.append(entry_for(full, f"{prefix}{full.relative_to(root).as_posix()}"))
    return sorted(out, key=lambda e: e.path)


def copy_content(e: Entry, out: BinaryIO) -> None:
    """A file entry's bytes, from its host file or its tree's pack, into `out`, a MB at a time (a GPU
    stack's libraries are GBs)."""
    with open(e.source, "rb") as source:
        source.seek(max(e.offset, 0))
        left = e.size
        while left:
            chunk = source.read(min(left, 1 << 20))
            if not chunk:
                raise ValueError(f"{e.source}: ends before the {e.size} bytes of {e.path}")
            out.write(chunk)
            left -= len(chunk)


def content(e: Entry) -> bytes:
    """A file entry's bytes."""
    out = io.BytesIO()
    copy_content(e, out)
    return out.getvalue()


def save_entries(path: Path, entries: list[Entry], root: Path) -> None:
    """A tree's entry list beside it (sources relative to `root`), so a cached tree is never re-hashed."""
    atomic_write_json(path, [[*e.identity(), e.source.relative_to(root).as_posix() if e.source else "", e.offset]
                             for e in entries])


def load_entries(path: Path, root: Path) -> list[Entry]:
    return [Entry(p, kind, mode, size, sha, link, root / src if src else None, offset)
            for p, kind, mode, size, sha, link, src, offset in json.loads(path.read_text())]


# --------------------------------------------------------------------------- keys


def parents(path: str) -> list[str]:
    """Every directory `path` is below, outermost first: "a/b/c" -> ["a", "a/b"]."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def with_parents(entries: Iterable[Entry]) -> list[Entry]:
    """The entries plus every parent directory (0755), sorted so a directory precedes its contents."""
    entries = list(entries)
    dirs = {e.path for e in entries if e.kind == "dir"}
    for e in entries:
        dirs.update(parents(e.path))
    out = {e.path: e for e in entries}
    for d in dirs:
        out.setdefault(d, Entry(d, "dir", 0o755))
    return [out[p] for p in sorted(out)]


def layer_key(entries: list[Entry], epoch: int) -> str:
    """Everything that decides a layer's compressed bytes: its entries and the recipe that writes them."""
    recipe = {"tar": TAR_RECIPE, "epoch": epoch, "zstd_level": ZSTD_LEVEL, "zstd": zstandard.ZSTD_VERSION}
    h = hashlib.sha256(canonical_json(recipe).encode())
    for e in with_parents(entries):
        h.update(json.dumps(e.identity()).encode() + b"\n")
    return h.hexdigest()


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class Blob:
    """A written layer: `digest` of the compressed blob, `diff_id` of the tar, and where it is cached."""

    key: str
    digest: str
    diff_id: str
    size: int
    uncompressed: int
    path: Path

    def to_json(self) -> dict[str, object]:
        return {"key": self.key, "digest": self.digest, "diff_id": self.diff_id, "size": self.size,
                "uncompressed": self.uncompressed}


def _root() -> Path:
    """Layer blobs live apart from downloaded inputs: they can be dropped and made again."""
    return cache_home() / "layers"


def _index(key: str) -> Path:
    return _root() / "keys" / f"{key}.json"


def cached(key: str) -> Blob | None:
    """The blob already written for this key, if its file is still in the cache."""
    try:
        data = json.loads(_index(key).read_text())
    except (OSError, ValueError):
        return None
    path = blob_path(data["digest"].split(":", 1)[1], BLOB_NAME, _root())
    if not path.exists():
        return None
    for used in (_index(key), path.parent):  # last used: cache pruning keeps what builds still use (prune.py)
        os.utime(used)
    return Blob(path=path, **data)


class _Sink:
    """A write-only stream that hashes and counts what passes through it on its way to `out`.

    Small writes (tar headers, small files) are gathered into 1 MB chunks first: the compressor
    and the hash then see few large calls instead of a call per 512-byte header.
    """

    CHUNK = 1 << 20

    def __init__(self, out, on_write: Callable[[int], None] | None = None):
        self.out, self.on_write = out, on_write
        self.sha256 = hashlib.sha256()
        self.count = 0
        self._buffer = bytearray()

    def write(self, data) -> int:
        n = len(data)
        self.count += n
        if n >= self.CHUNK and not self._buffer:
            self._emit(data)
        else:
            self._buffer += data
            if len(self._buffer) >= self.CHUNK:
                self._emit(bytes(self._buffer))
                self._buffer.clear()
        return n

    def _emit(self, data) -> None:
        self.sha256.update(data)
        self.out.write(data)
        if self.on_write:
            self.on_write(len(data))

    def tell(self) -> int:
        return self.count

    def flush(self) -> None:
        if self._buffer:
            self._emit(bytes(self._buffer))
            self._buffer.clear()


def _tarinfo(e: Entry, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(e.path)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = e.mode, epoch, 0, 0, "", ""
    if e.kind == "dir":
        info.type = tarfile.DIRTYPE
    elif e.kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, e.link
    else:
        info.size = e.size
    return info


def write_tar(entries: list[Entry], out, epoch: int) -> None:
    """The layer's tar stream into `out` (anything with write())."""
    # Not tarfile's stream mode ("w|"): it grows one bytes object per write, quadratic on small files.
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT, copybufsize=1 << 20) as tar, \
            contextlib.ExitStack() as packs:
        opened: dict[Path, BinaryIO] = {}
        for e in with_parents(entries):
            info = _tarinfo(e, epoch)
            if e.kind != "file":
                tar.addfile(info)
            elif e.offset < 0:
                with open(e.source, "rb") as f:
                    tar.addfile(info, f)
            else:  # tarfile reads exactly info.size bytes from there, and fails if the pack is shorter
                if e.source not in opened:
                    opened[e.source] = packs.enter_context(open(e.source, "rb"))
                opened[e.source].seek(e.offset)
                tar.addfile(info, opened[e.source])


def tar_size(entries: list[Entry]) -> int:
    """The length of write_tar's stream for `entries`, from their paths and sizes alone (no file read,
    no header built: a build's layers have ~50,000 entries), so a progress total is the bytes tarred:
    every member, two zero blocks, the whole padded to tarfile's 10240-byte record."""
    members = sum(tar_member_size(e) for e in with_parents(entries))
    return _padded(members + 2 * tarfile.BLOCKSIZE, tarfile.RECORDSIZE)


def tar_member_size(e: Entry) -> int:
    """The bytes write_tar writes for one entry, as tarfile's PAX format does: a 512-byte header, after
    an extended header (512 bytes and its records padded to 512) when the path (a directory's with its
    "/") or link target is longer than 100 characters or not ASCII, or the size needs more than 11
    octal digits; then a file's contents padded to 512. tests/test_layer_writer.py holds it to the
    members of write_tar's real output."""
    extended = {keyword: value for keyword, value, limit in (
        ("path", e.path + "/" if e.kind == "dir" else e.path, tarfile.LENGTH_NAME),
        ("linkpath", e.link, tarfile.LENGTH_LINK)) if len(value) > limit or not value.isascii()}
    if e.kind == "file" and e.size >= 8 ** 11:
        extended["size"] = str(e.size)
    size = tarfile.BLOCKSIZE + (_padded(e.size, tarfile.BLOCKSIZE) if e.kind == "file" else 0)
    if extended:
        size += tarfile.BLOCKSIZE + _padded(_pax_records_length(extended), tarfile.BLOCKSIZE)
    return size


def _padded(n: int, block: int) -> int:
    return -(-n // block) * block


def _pax_records_length(fields: dict[str, str]) -> int:
    """Bytes of the "<length> <keyword>=<value>\n" records tarfile writes for `fields` (the length counts
    its own digits); a value that is not UTF-8 (undecodable bytes of a file name) goes as raw bytes after
    a hdrcharset=BINARY record, as tarfile does."""
    try:
        values = [value.encode("utf-8") for value in fields.values()]
        total = 0
    except UnicodeEncodeError:
        values = [os.fsencode(value) for value in fields.values()]
        total = len(b"21 hdrcharset=BINARY\n")
    for keyword, value in zip(fields, values):
        bare = len(keyword) + len(value) + 3  # " ", "=", "\n"
        guess = 0
        while (length := bare + len(str(guess))) != guess:  # the length counts its own digits, as tarfile finds it
            guess = length
        total += length
    return total


def _compress(key: str, feed: Callable[[_Sink], None], tarred: Callable[[int], None] | None,
              compressed: Callable[[int], None] | None) -> Blob:
    """Compress what `feed` writes into the blob cache under `key`; the file appears atomically."""
    found = cached(key)
    if found:
        return found
    tmp_dir = _root() / "tmp"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / f"{key}.{os.getpid()}"
    try:
        with open(tmp, "wb") as raw:
            packed = _Sink(raw, compressed)  # flushed below, after the compressor
            # threads=-1: one worker per core; multi-threaded zstd output is the same for any count.
            compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
            with compressor.stream_writer(packed, closefd=False, write_size=1 << 20) as zstd_out:
                plain = _Sink(zstd_out, tarred)
                feed(plain)
                plain.flush()
            packed.flush()
        path = blob_path(packed.sha256.hexdigest(), BLOB_NAME, _root())
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    blob = Blob(key, f"sha256:{packed.sha256.hexdigest()}", f"sha256:{plain.sha256.hexdigest()}", packed.count, plain.count, path)
    atomic_write_json(_index(key), blob.to_json())
    return blob


def write_layer(entries: list[Entry], epoch: int, key: str | None = None,
                tarred: Callable[[int], None] | None = None, compressed: Callable[[int], None] | None = None) -> Blob:
    """Write (or find) the compressed layer for `entries`; the callbacks count bytes for progress."""
    return _compress(key or layer_key(entries, epoch), lambda out: write_tar(entries, out, epoch), tarred, compressed)


def tarball_key(tarball: Path) -> str:
    """A ready-made tar's layer key: its hash and the compressor's recipe."""
    return sha256_bytes(canonical_json({"tarball": sha256_file(tarball), "zstd_level": ZSTD_LEVEL,
                                        "zstd": zstandard.ZSTD_VERSION}).encode())


def compress_tarball(tarball: Path, tarred: Callable[[int], None] | None = None,
                     compressed: Callable[[int], None] | None = None, key: str | None = None) -> Blob:
    """A ready-made deterministic tar (the Debian base) as a layer: compressed as is, keyed by its hash."""
    key = key or tarball_key(tarball)

    def feed(out: _Sink) -> None:
        with open(tarball, "rb") as src:
            while chunk := src.read(1 << 20):
                out.write(chunk)

    return _compress(key, feed, tarred, compressed)
