"""Reading wheels, and writing them deterministically.

A wheel written here is a function of its files' bytes, their executable bits and the given
SOURCE_DATE_EPOCH only: entries sorted with `*.dist-info/` last (RECORD the very last), every
timestamp the epoch (clamped to the zip format's 1980..2107 range), modes 0644 or 0755, no
directory entries, no extra fields or comments, one fixed deflate level, and a RECORD
regenerated from the bytes written (urlsafe-b64 sha256 without padding, sizes; RECORD itself
unhashed). Signatures (RECORD.jws, RECORD.p7s) are dropped: they cannot survive a rewrite.

Typical use (overlays): `unpack_wheel` into a scratch dir, edit files, `relabel_tree` to a
version with a local label, `pack_wheel` into the output directory.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import stat
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from servestack.errors import InputError, WheelError

# 1980-01-01T00:00:00Z, the earliest time a zip entry can hold; and the latest (2107-12-31).
ZIP_EPOCH_MIN = 315532800
ZIP_EPOCH_MAX = 4354819199
COMPRESS_LEVEL = 6

_WHEEL_FILENAME = re.compile(
    r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<tag>[^-]+-[^-]+-[^-]+)\.whl$"
)
_LOCAL_LABEL = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$", re.IGNORECASE)
_SIGNATURES = ("RECORD.jws", "RECORD.p7s")


@dataclass(frozen=True, kw_only=True)
class RecordEntry:
    path: str
    hash: str  # "sha256=<urlsafe b64>" or "" (RECORD itself)
    size: int | None


@dataclass(frozen=True, kw_only=True)
class WheelInfo:
    path: Path
    name: str  # distribution name as spelled in the dist-info directory (escaped: `_` for `-`)
    version: str
    build: str | None  # optional build tag of the filename
    tag: str  # compressed tag triple of the filename, e.g. "py3-none-any"
    tags: tuple[str, ...]  # `Tag:` lines of WHEEL, e.g. ("cp311-cp311-linux_x86_64",)
    dist_info: str  # "vllm-0.31.0.dist-info"
    root_is_purelib: bool
    record: tuple[RecordEntry, ...]

    @property
    def filename(self) -> str:
        return self.path.name


# ---------------------------------------------------------------- names and versions


def normalize(name: str) -> str:
    """PEP 503 name normalization."""
    return re.sub(r"[-_.]+", "-", name).lower()


def escape_name(name: str) -> str:
    """The name as wheel filenames and dist-info directories spell it."""
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_wheel_filename(filename: str) -> tuple[str, str, str | None, str]:
    """`vllm-0.31.0-cp38-abi3-manylinux1_x86_64.whl` -> (name, version, build, tag)."""
    m = _WHEEL_FILENAME.match(filename)
    if not m:
        raise InputError(filename, "filename", "not a wheel filename (expected name-version[-build]-py-abi-platform.whl)")
    return m["name"], m["version"], m["build"], m["tag"]


def wheel_filename(name: str, version: str, tag: str, build: str | None = None) -> str:
    parts = [escape_name(name), version.replace("-", "_")]
    if build:
        parts.append(build)
    parts.append(tag)
    return "-".join(parts) + ".whl"


def add_local_label(version: str, label: str) -> str:
    """PEP 440 local label composition: `0.31.0` + `ss.1a2b3c4d` -> `0.31.0+ss.1a2b3c4d`;
    `2.13.0+cpu` + `ss.1a2b3c4d` -> `2.13.0+cpu.ss.1a2b3c4d`."""
    if not _LOCAL_LABEL.match(label):
        raise ValueError(f"not a PEP 440 local version label: {label!r}")
    if "+" in version:
        public, local = version.split("+", 1)
        if not _LOCAL_LABEL.match(local):
            raise ValueError(f"version {version!r} has a malformed local part {local!r}")
        return f"{public}+{local}.{label}"
    return f"{version}+{label}"


def overlay_label(digest_hex: str) -> str:
    """The local label servestack appends: `ss.` + the first 8 hex of the overlay set's digest."""
    return f"ss.{digest_hex[:8].lower()}"


# ---------------------------------------------------------------- reading


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _find_dist_info(names: Iterable[str], where: object) -> str:
    found = sorted({n.split("/", 1)[0] for n in names if re.match(r"^[^/]+\.dist-info/WHEEL$", n)})
    if len(found) != 1:
        raise InputError(str(where), "dist-info", f"expected exactly one *.dist-info/WHEEL, found {found or 'none'}")
    return found[0]


def _parse_kv(text: str) -> list[tuple[str, str]]:
    out = []
    for line in text.splitlines():
        if not line:
            break  # end of headers (METADATA may have a body); a whitespace-only line continues a field
        if ":" in line and not line[0].isspace():
            k, v = line.split(":", 1)
            out.append((k.strip(), v.strip()))
    return out


def _parse_record(text: str) -> tuple[RecordEntry, ...]:
    entries = []
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        path, h, size = (row + ["", ""])[:3]
        entries.append(RecordEntry(path=path, hash=h, size=int(size) if size else None))
    return tuple(entries)


def read_wheel(path: Path) -> WheelInfo:
    path = Path(path)
    _, version, build, tag = parse_wheel_filename(path.name)
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            dist_info = _find_dist_info(names, path)
            wheel_kv = _parse_kv(zf.read(f"{dist_info}/WHEEL").decode())
            meta_kv = _parse_kv(zf.read(f"{dist_info}/METADATA").decode("utf-8", "replace"))
            record_name = f"{dist_info}/RECORD"
            record = _parse_record(zf.read(record_name).decode()) if record_name in names else ()
    except zipfile.BadZipFile as e:
        raise InputError(path, "wheel", f"not a zip archive: {e}") from None
    except KeyError as e:
        raise InputError(path, "wheel", f"missing {e.args[0]}") from None
    meta_version = next((v for k, v in meta_kv if k == "Version"), version)
    return WheelInfo(
        path=path,
        name=dist_info.rsplit(".dist-info", 1)[0].split("-", 1)[0],
        version=meta_version,
        build=build,
        tag=tag,
        tags=tuple(v for k, v in wheel_kv if k == "Tag"),
        dist_info=dist_info,
        root_is_purelib=next((v for k, v in wheel_kv if k == "Root-Is-Purelib"), "true").lower() == "true",
        record=record,
    )


def verify_record(path: Path) -> list[str]:
    """Problems with a wheel's RECORD (empty when every file is listed with its right hash and size)."""
    problems: list[str] = []
    with zipfile.ZipFile(path) as zf:
        names = [n for n in zf.namelist() if not n.endswith("/")]
        dist_info = _find_dist_info(names, path)
        record_name = f"{dist_info}/RECORD"
        if record_name not in names:
            return [f"{record_name} missing"]
        listed = {e.path: e for e in _parse_record(zf.read(record_name).decode())}
        for n in names:
            e = listed.pop(n, None)
            if e is None:
                if n not in (f"{dist_info}/{s}" for s in _SIGNATURES):
                    problems.append(f"{n}: not in RECORD")
                continue
            if n == record_name:
                if e.hash:
                    problems.append(f"{n}: RECORD must not hash itself")
                continue
            data = zf.read(n)
            if e.hash != _record_hash(data):
                problems.append(f"{n}: hash {e.hash} != {_record_hash(data)}")
            if e.size != len(data):
                problems.append(f"{n}: size {e.size} != {len(data)}")
        problems.extend(f"{p}: in RECORD but not in the wheel" for p in sorted(listed))
    return problems


def _safe_member(name: str, where: object) -> str:
    p = PurePosixPath(name)
    if name.startswith("/") or ".." in p.parts or "\\" in name or (p.parts and ":" in p.parts[0]):
        raise InputError(str(where), "entry", f"unsafe path {name!r} in wheel")
    return name


def unpack_wheel(path: Path, dest: Path) -> WheelInfo:
    """Extract a wheel's files into `dest` keeping only the executable bit (0755, else 0644)."""
    info = read_wheel(path)
    dest = Path(dest)
    with zipfile.ZipFile(path) as zf:
        for zi in zf.infolist():
            if zi.is_dir():
                continue
            target = dest / _safe_member(zi.filename, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(zi) as src, open(target, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.chmod(target, 0o755 if (zi.external_attr >> 16) & 0o111 else 0o644)
    return info


def read_member(wheel: Path, member: str) -> bytes | None:
    with zipfile.ZipFile(wheel) as zf:
        try:
            return zf.read(member)
        except KeyError:
            return None


@dataclass(frozen=True, kw_only=True)
class WheelFacts:
    """What a wheel says about itself beyond its name and version, for an SBOM."""
    license: str | None  # an SPDX expression, when the metadata gives one
    license_text: str | None  # the metadata's own words about its licence
    vendored: tuple[str, ...]  # "name==version" of each distribution it ships inside itself (setuptools/_vendor)


def wheel_facts(wheel: Path) -> WheelFacts:
    """The licence: `License-Expression` (core metadata 2.4), else a `License` field that is itself a
    valid SPDX expression. Anything else (free text, a trove classifier such as "BSD License", which
    names no one licence) is no expression: its words are kept for a reader, and an SBOM says
    NOASSERTION rather than guess. The vendored distributions: every other `*.dist-info/METADATA`."""
    from license_expression import ExpressionError, get_spdx_licensing

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        own = _find_dist_info(names, wheel)
        fields = _parse_kv(zf.read(f"{own}/METADATA").decode("utf-8", "replace"))
        vendored = []
        for name in names:
            parent, _, leaf = name.rpartition("/")
            if leaf == "METADATA" and parent.endswith(".dist-info") and parent != own:
                meta = dict(_parse_kv(zf.read(name).decode("utf-8", "replace")))
                named, _, versioned = parent.rsplit("/", 1)[-1].removesuffix(".dist-info").partition("-")
                vendored.append(f"{normalize(meta.get('Name') or named)}=={meta.get('Version') or versioned}")
    words = [v for k, v in fields if k in ("License-Expression", "License")]
    words += [v.removeprefix("License :: ") for k, v in fields if k == "Classifier" and v.startswith("License :: ")]
    said = "; ".join(dict.fromkeys(w for w in words if w)) or None
    if said and len(said) > 200:
        said = said[:197] + "..."
    licensing = get_spdx_licensing()
    for key in ("License-Expression", "License"):
        value = next((v for k, v in fields if k == key and v), None)
        try:  # not licensing.validate: it fails with AttributeError on text it cannot tokenize (30.4)
            parsed = licensing.parse(value) if value and len(value) <= 200 else None
        except ExpressionError:  # free text ("Copyright (c) 2005-2025, NumPy Developers.")
            parsed = None
        if parsed is not None and not licensing.unknown_license_keys(parsed):
            return WheelFacts(license=parsed.render(), license_text=said, vendored=tuple(sorted(set(vendored))))
    return WheelFacts(license=None, license_text=said, vendored=tuple(sorted(set(vendored))))


# ---------------------------------------------------------------- relabelling and writing


def tree_dist_info(root: Path) -> str:
    return _find_dist_info((p.relative_to(root).as_posix() for p in Path(root).glob("*.dist-info/WHEEL")), root)


def relabel_tree(root: Path, new_version: str) -> str:
    """Give an unpacked wheel a new version: rename `<name>-<old>.dist-info` (and `.data`),
    rewrite METADATA's Version. Returns the new dist-info directory name."""
    root = Path(root)
    old = tree_dist_info(root)
    name, old_version = old[: -len(".dist-info")].split("-", 1)
    new = f"{name}-{new_version}.dist-info"
    meta_path = root / old / "METADATA"
    meta = meta_path.read_bytes()
    head, sep, body = meta.partition(b"\n\n")
    lines = head.split(b"\n")
    hits = [i for i, line in enumerate(lines) if line.startswith(b"Version:")]
    if len(hits) != 1:
        raise WheelError(f"{old}/METADATA: expected one Version: header, found {len(hits)}")
    lines[hits[0]] = b"Version: " + new_version.encode()
    meta_path.write_bytes(b"\n".join(lines) + sep + body)
    if new != old:
        (root / old).rename(root / new)
        data = root / f"{name}-{old_version}.data"
        if data.is_dir():
            data.rename(root / f"{name}-{new_version}.data")
    return new


def _compress_tags(tags: Iterable[str]) -> str:
    pys, abis, plats = set(), set(), set()
    for t in tags:
        py, abi, plat = t.split("-")
        pys.update(py.split("."))
        abis.update(abi.split("."))
        plats.update(plat.split("."))
    if not pys:
        raise WheelError("WHEEL has no Tag: lines")
    return "-".join(".".join(sorted(s)) for s in (pys, abis, plats))


def _sort_key(dist_info: str) -> Callable[[str], tuple[int, str]]:
    def key(path: str) -> tuple[int, str]:
        if path == f"{dist_info}/RECORD":
            return (2, path)
        if path.startswith(dist_info + "/"):
            return (1, path)
        return (0, path)

    return key


def _zinfo(path: str, epoch: int, executable: bool) -> zipfile.ZipInfo:
    t = time.gmtime(min(max(int(epoch), ZIP_EPOCH_MIN), ZIP_EPOCH_MAX))
    zi = zipfile.ZipInfo(path, date_time=(t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec))
    zi.create_system = 3  # unix, so that the mode bits below mean what they say
    zi.external_attr = ((0o100755 if executable else 0o100644) & 0xFFFF) << 16
    zi.compress_type = zipfile.ZIP_DEFLATED
    zi.extra = b""
    zi.comment = b""
    return zi


def pack_wheel(root: Path, out_dir: Path, *, epoch: int, tag: str | None = None, build: str | None = None) -> Path:
    """Write the unpacked wheel at `root` as a deterministic wheel into `out_dir`; returns its path.

    The filename comes from the dist-info directory's name and version and `tag` (default:
    compressed from WHEEL's Tag lines). RECORD is regenerated. The file appears atomically.
    """
    root, out_dir = Path(root), Path(out_dir)
    dist_info = tree_dist_info(root)
    name, version = dist_info[: -len(".dist-info")].split("-", 1)
    if tag is None:
        wheel_kv = _parse_kv((root / dist_info / "WHEEL").read_text())
        tag = _compress_tags(v for k, v in wheel_kv if k == "Tag")
    record_name = f"{dist_info}/RECORD"
    skip = {record_name, *(f"{dist_info}/{s}" for s in _SIGNATURES)}
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for fn in filenames:
            full = Path(dirpath, fn)
            rel = full.relative_to(root).as_posix()
            if not stat.S_ISREG(full.lstat().st_mode):
                raise WheelError(f"{rel}: not a regular file (symlinks and specials cannot go in a wheel)")
            if rel not in skip:
                files.append(rel)
    files.append(record_name)
    files.sort(key=_sort_key(dist_info))

    out_dir.mkdir(parents=True, exist_ok=True)
    filename = wheel_filename(name, version, tag, build)
    fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".tmp", dir=out_dir)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as zf:
            record = io.StringIO()
            writer = csv.writer(record, lineterminator="\n")
            for rel in files:
                if rel == record_name:
                    writer.writerow([rel, "", ""])
                    data = record.getvalue().encode()
                    executable = False
                else:
                    full = root / rel
                    data = full.read_bytes()
                    executable = bool(full.stat().st_mode & 0o100)
                    writer.writerow([rel, _record_hash(data), str(len(data))])
                zf.writestr(_zinfo(rel, epoch, executable), data, compresslevel=COMPRESS_LEVEL)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_dir / filename)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out_dir / filename
