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

import hashlib
import io
import json
import os
import stat
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_string  # what json.dumps quotes a str with
from pathlib import Path
from typing import BinaryIO, Protocol, cast

import zstandard

from servestack.records.codec import Record, json_quirks
from servestack.sources.cache import blob_path
from servestack.util.fsutil import atomic_write_bytes, atomic_write_json, canonical_json, sha256_bytes, sha256_file
from servestack.util.project import cache_home

# Bump when the tar recipe below changes: every layer key changes with it.
TAR_RECIPE = 1
ZSTD_LEVEL = 3
BLOB_NAME = "layer.tar.zst"


class Writer(Protocol):  # where a layer's bytes go: a file, a hash, a compressor
    def write(self, data: bytes | memoryview, /) -> object: ...


@dataclass(frozen=True, kw_only=True)
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

    def host_file(self) -> Path:
        """Where this file's bytes are read from; an entry without one was made wrong, not given wrong."""
        if self.source is None:
            raise ValueError(f"{self.path}: a {self.kind} entry with content names no host file")
        return self.source


def entry_for(source: Path, path: str) -> Entry:
    """The entry for a host file or symlink, its content hashed."""
    info = source.lstat()
    if stat.S_ISLNK(info.st_mode):
        return Entry(path=path, kind="symlink", mode=0o777, link=os.readlink(source))
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"{source}: only regular files and symlinks go into a layer")
    return Entry(path=path, kind="file", mode=0o755 if info.st_mode & 0o100 else 0o644, size=info.st_size, sha256=sha256_file(source),
                 source=source)


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
    with open(e.host_file(), "rb") as source:
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


def save_entries(path: Path, entries: Sequence[Entry], root: Path) -> None:
    """A tree's entry list beside it (sources relative to `root`), so a cached tree is never re-hashed.

    A tree's entries share a source or two (its pack): each is made relative once, not per entry, and
    the list is written compact, by json's C encoder (indenting takes the pure-Python one): dev-cpu's
    68,000 entries cost a second of the build's main process either way."""
    relative = {source: source.relative_to(root).as_posix() for source in {e.source for e in entries if e.source}}
    rows = [[*e.identity(), relative[e.source] if e.source else "", e.offset] for e in entries]
    atomic_write_bytes(path, json.dumps(rows, ensure_ascii=False).encode())


def load_entries(path: Path, root: Path) -> list[Entry]:
    """save_entries' list, the entries sharing one Path per source (a Path each costs microseconds)."""
    rows = json.loads(path.read_bytes())
    sources = {src: root / src for src in {row[6] for row in rows} if src}
    return [Entry(path=p, kind=kind, mode=mode, size=size, sha256=sha, link=link, source=sources.get(src), offset=offset)
            for p, kind, mode, size, sha, link, src, offset in rows]


# --------------------------------------------------------------------------- keys


class Members(tuple[Entry, ...]):
    """A layer's tar members: with_parents' result. with_parents hands one back as it is, so a caller
    that keys, sizes and writes a layer computes it once (~70,000 entries a build)."""


def with_parents(entries: Iterable[Entry]) -> Members:
    """The entries plus every parent directory (0755), sorted so a directory precedes its contents."""
    if isinstance(entries, Members):
        return entries
    out = {e.path: e for e in entries}
    implied: set[str] = set()
    for path in list(out):
        end = path.rfind("/")
        while end != -1 and (parent := path[:end]) not in implied:  # its own parents are in once it is
            implied.add(parent)
            out.setdefault(parent, Entry(path=parent, kind="dir", mode=0o755))
            end = path.rfind("/", 0, end)
    return Members(out[p] for p in sorted(out))


def layer_key(entries: Iterable[Entry], epoch: int) -> str:
    """Everything that decides a layer's compressed bytes: its entries and the recipe that writes them."""
    recipe = {"tar": TAR_RECIPE, "epoch": epoch, "zstd_level": ZSTD_LEVEL, "zstd": zstandard.ZSTD_VERSION}
    lines = "".join(map(_identity_line, with_parents(entries)))
    return hashlib.sha256(canonical_json(recipe).encode() + lines.encode()).hexdigest()


def _identity_line(e: Entry) -> str:
    """json.dumps(e.identity()) and a newline, the same characters (ASCII: non-ASCII escaped), for a
    quarter of the time: json.dumps makes an encoder per call, 4 us of the ~70,000 entries every build
    keys, cold or not."""
    return f"[{_json_string(e.path)}, {_json_string(e.kind)}, {e.mode:d}, {e.size:d}, {_json_string(e.sha256)}, " \
           f"{_json_string(e.link)}]\n"


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True, kw_only=True)
class Blob(Record):
    """A written layer: `digest` of the compressed blob, `diff_id` of the tar, and where it is cached."""

    key: str
    digest: str
    diff_id: str
    size: int
    uncompressed: int
    path: Path = field(metadata=json_quirks(written=False))  # the cache's index names the blob by digest


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
    """A write-only stream that hashes and counts what passes through it on its way to `out` (write_tar
    and compress_tarball hand it MB-sized chunks)."""

    def __init__(self, out: Writer, on_write: Callable[[int], None] | None = None):
        self.out, self.on_write = out, on_write
        self.sha256 = hashlib.sha256()
        self.count = 0

    def write(self, data: bytes | memoryview) -> int:
        n = len(data)
        self.count += n
        self.sha256.update(data)
        self.out.write(data)
        if self.on_write:
            self.on_write(n)
        return n


# The tar is written here rather than by tarfile (TarFile.addfile copies each TarInfo, builds its header
# field by field through dicts and checksums it twice, ~80 us an entry; a layer has up to 30,000), in
# exactly tarfile's PAX_FORMAT bytes: tests/image/test_layer_writer.py holds it to tarfile's output.
BLOCK = 512
RECORD = 20 * BLOCK  # the archive is padded to whole records, as tarfile (and tar -b20) does
_NAME = _LINK = 100  # ustar's name and linkname fields
_TYPES = {"file": b"0", "symlink": b"2", "dir": b"5"}
# After the type and link name: magic and version, empty uname and gname, no device numbers, no prefix
# (PAX_FORMAT never splits a long name into prefix and name: the pax header holds it), 12 bytes of padding.
_MAGIC_AND_REST = b"ustar\x0000" + bytes(32 + 32 + 8 + 8 + 155 + 12)
_MAGIC_SUM = sum(_MAGIC_AND_REST)
_CHECKSUM_SPACES = 8 * ord(" ")  # the checksum is taken with its own field as spaces


def _ustar(name: str, mode: int, size: int, mtime: int, kind: bytes, link: str = "") -> bytes:
    """One ustar header block as tarfile's PAX_FORMAT writes it: name and link name in ASCII, anything
    else as "?", cut to 100 bytes (a pax header before it holds them whole); uid and gid 0; numbers as
    zero-padded octal with a NUL; the checksum of the block with its field as spaces, as "%06o\\0 "."""
    name_field, link_field = name.encode("ascii", "replace")[:_NAME], link.encode("ascii", "replace")[:_LINK]
    numbers = b"%07o\x000000000\x000000000\x00%011o\x00%011o\x00" % (mode, size, mtime)
    # The sum of the block's bytes, its NUL padding aside.
    checksum = sum(name_field) + sum(numbers) + _CHECKSUM_SPACES + kind[0] + sum(link_field) + _MAGIC_SUM
    return b"".join((name_field.ljust(_NAME, b"\0"), numbers, b"%06o\x00 " % checksum, kind,
                     link_field.ljust(_LINK, b"\0"), _MAGIC_AND_REST))


def _pax_fields(name: str, link: str, size: int) -> dict[str, str]:
    """What tarfile's PAX_FORMAT puts in an extended header (in its order): the path (a directory's with
    its "/") or link target when longer than its field or not ASCII, the size when it needs more than 11
    octal digits."""
    fields = {}
    if len(name) > _NAME or not name.isascii():
        fields["path"] = name
    if len(link) > _LINK or not link.isascii():
        fields["linkpath"] = link
    if size >= 8 ** 11:
        fields["size"] = str(size)
    return fields


def _pax_records(fields: dict[str, str]) -> bytes:
    """The "<length> <keyword>=<value>\\n" records of an extended header (the length counts its own
    digits); values that are not UTF-8 (undecodable bytes of a file name) go as their raw bytes after a
    hdrcharset=BINARY record, as tarfile does."""
    try:
        values = [value.encode("utf-8") for value in fields.values()]
        records = b""
    except UnicodeEncodeError:
        values = [os.fsencode(value) for value in fields.values()]
        records = b"21 hdrcharset=BINARY\n"
    for keyword, value in zip(fields, values, strict=True):
        bare = len(keyword) + len(value) + 3  # " ", "=", "\n"
        length = 0
        while (longer := bare + len(str(length))) != length:  # as tarfile finds it
            length = longer
        records += b"%d %s=%s\n" % (length, keyword.encode(), value)
    return records


def tar_header(e: Entry, epoch: int) -> bytes:
    """The header blocks write_tar writes before an entry's contents: a pax extended header when
    _pax_fields says so, then the ustar header."""
    name = e.path + "/" if e.kind == "dir" else e.path
    size = e.size if e.kind == "file" else 0
    fields = _pax_fields(name, e.link, size)
    header = _ustar(name, e.mode & 0o7777, size if size < 8 ** 11 else 0, epoch, _TYPES[e.kind], e.link)
    if not fields:
        return header
    records = _pax_records(fields)
    return _ustar("././@PaxHeader", 0, len(records), 0, b"x") + records + bytes(-len(records) % BLOCK) + header


class _Chunks:
    """The tar's bytes gathered in one reused buffer and handed on a CHUNK at a time: the hash and the
    compressor see few large writes, and file contents are read (pread) straight into the buffer."""

    CHUNK = 1 << 20

    def __init__(self, out: Writer):
        self.out = out
        self.view = memoryview(bytearray(self.CHUNK))
        self.fill = 0
        self.count = 0  # bytes handed on or buffered

    def add(self, data: bytes) -> None:
        self.count += len(data)
        if self.fill + len(data) > self.CHUNK:
            self.flush()
            if len(data) > self.CHUNK:
                self.out.write(data)
                return
        self.view[self.fill:self.fill + len(data)] = data
        self.fill += len(data)

    def read(self, fd: int, offset: int, size: int, what: str) -> None:
        """`size` bytes of the open file `fd` from `offset` on."""
        self.count += size
        while size:
            if self.fill == self.CHUNK:
                self.flush()
            got = os.preadv(fd, [self.view[self.fill:self.fill + min(size, self.CHUNK - self.fill)]], offset)
            if not got:
                raise ValueError(f"{what}: ends {size} bytes short")
            self.fill, offset, size = self.fill + got, offset + got, size - got

    def flush(self) -> None:
        """Hand on what is buffered; `out` must be done with it when write returns (the buffer is reused)."""
        if self.fill:
            self.out.write(self.view[:self.fill])
            self.fill = 0


def write_tar(entries: Iterable[Entry], out: Writer, epoch: int) -> None:
    """The layer's tar stream into `out` (anything with write() that has used or copied the bytes by the
    time it returns), byte for byte what tarfile writes in PAX_FORMAT for the same members."""
    if not 0 <= epoch < 8 ** 11:
        raise ValueError(f"SOURCE_DATE_EPOCH {epoch}: expected 0 to 8**11 - 1 (11 octal digits)")
    tar = _Chunks(out)
    fds: dict[str, int] = {}  # packs stay open: a tree's files are read from one pack, in order
    try:
        for e in with_parents(entries):
            tar.add(tar_header(e, epoch))
            if e.kind != "file" or not e.size:
                continue
            source = os.fspath(e.host_file())
            if e.offset < 0:  # a file of its own
                fd = os.open(source, os.O_RDONLY)
                try:
                    tar.read(fd, 0, e.size, f"{source} (for {e.path})")
                finally:
                    os.close(fd)
            else:
                if source not in fds:
                    fds[source] = os.open(source, os.O_RDONLY)
                tar.read(fds[source], e.offset, e.size, f"{source} at {e.offset} (for {e.path})")
            tar.add(_ZEROS[:-e.size % BLOCK])
        tar.add(_ZEROS[:2 * BLOCK])
        tar.add(bytes(-tar.count % RECORD))
        tar.flush()
    finally:
        for fd in fds.values():
            os.close(fd)


_ZEROS = bytes(2 * BLOCK)


def tar_size(entries: Iterable[Entry]) -> int:
    """The length of write_tar's stream for `entries`, from their paths and sizes alone (no file read,
    no header built: a build's layers have ~50,000 entries), so a progress total is the bytes tarred:
    every member, two zero blocks, the whole padded to the 10240-byte record."""
    members = sum(tar_member_size(e) for e in with_parents(entries))
    return _padded(members + 2 * BLOCK, RECORD)


def tar_member_size(e: Entry) -> int:
    """The bytes write_tar writes for one entry: a 512-byte header, after an extended header (512 bytes
    and its records padded to 512) when _pax_fields has any; then a file's contents padded to 512.
    tests/image/test_layer_writer.py holds it to the members of write_tar's real output."""
    contents = e.size if e.kind == "file" else 0
    size = BLOCK + _padded(contents, BLOCK)
    fields = _pax_fields(e.path + "/" if e.kind == "dir" else e.path, e.link, contents)
    if fields:
        size += BLOCK + _padded(len(_pax_records(fields)), BLOCK)
    return size


def _padded(n: int, block: int) -> int:
    return -(-n // block) * block


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
            packed = _Sink(raw, compressed)
            # threads=-1: one worker per core; multi-threaded zstd output is the same for any count.
            compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, threads=-1)
            # A file to zstd, which only calls write() on it.
            with compressor.stream_writer(cast(BinaryIO, packed), closefd=False, write_size=1 << 20) as zstd_out:
                plain = _Sink(zstd_out, tarred)
                feed(plain)
        path = blob_path(packed.sha256.hexdigest(), BLOB_NAME, _root())
        path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    blob = Blob(key=key, digest=f"sha256:{packed.sha256.hexdigest()}", diff_id=f"sha256:{plain.sha256.hexdigest()}", size=packed.count,
                uncompressed=plain.count, path=path)
    atomic_write_json(_index(key), blob.to_json())
    return blob


def write_layer(entries: Iterable[Entry], epoch: int, key: str | None = None,
                tarred: Callable[[int], None] | None = None, compressed: Callable[[int], None] | None = None) -> Blob:
    """Write (or find) the compressed layer for `entries`; the callbacks count bytes for progress."""
    members = with_parents(entries)
    return _compress(key or layer_key(members, epoch), lambda out: write_tar(members, out, epoch), tarred, compressed)


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
