"""A .deb read in memory: its control fields and files, and the members of its data archive."""

from __future__ import annotations

import io
import lzma
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path

import zstandard

from servestack.errors import ServestackError


@dataclass(frozen=True, kw_only=True)
class Member:
    info: tarfile.TarInfo
    data: bytes | None  # a regular file's bytes


@dataclass(frozen=True, kw_only=True)
class DebPackage:
    fields: dict[str, str]  # the control file's fields, in its order (continuation lines kept)
    control: dict[str, bytes]  # control.tar's files other than `control`: md5sums, conffiles, postinst, ...
    members: list[Member]  # data.tar's members, in archive order

    @property
    def name(self) -> str:
        return self.fields["Package"]


def _ar_members(data: bytes, what: str) -> dict[str, bytes]:
    if not data.startswith(b"!<arch>\n"):
        raise ServestackError(f"{what}: not a Debian package (no ar archive signature)")
    members, offset = {}, 8
    while offset + 60 <= len(data):
        header = data[offset:offset + 60]
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58].decode().strip())
        members[name] = data[offset + 60:offset + 60 + size]
        offset += 60 + size + (size & 1)
    return members


def _untar(member: str, data: bytes, what: str) -> tarfile.TarFile:
    if member.endswith(".xz"):
        data = lzma.decompress(data)
    elif member.endswith(".zst"):
        data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
    elif member.endswith(".gz"):
        import gzip

        data = gzip.decompress(data)
    elif not member.endswith(".tar"):
        raise ServestackError(f"{what}: {member}: unknown compression")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:")


def _file_bytes(tar: tarfile.TarFile, info: tarfile.TarInfo) -> bytes:
    reader = tar.extractfile(info)
    assert reader is not None  # extractfile gives None only for a member that is no file; callers pass files
    return reader.read()


def parse_fields(text: str) -> dict[str, str]:
    """deb822 fields of one stanza; a continuation line stays part of its field's value."""
    fields: dict[str, str] = {}
    for match in re.finditer(r"^([A-Za-z0-9-]+):[ \t]*(.*(?:\n[ \t].*)*)", text, re.M):
        fields[match.group(1)] = match.group(2)
    return fields


def read_deb(path: Path) -> DebPackage:
    what = str(path)
    ar = _ar_members(path.read_bytes(), what)
    control_name = next((n for n in ar if n.startswith("control.tar")), None)
    data_name = next((n for n in ar if n.startswith("data.tar")), None)
    if control_name is None or data_name is None:
        raise ServestackError(f"{what}: no control.tar or data.tar member")
    control: dict[str, bytes] = {}
    with _untar(control_name, ar[control_name], what) as tar:
        for info in tar:
            if info.isfile():
                control[info.name.removeprefix("./")] = _file_bytes(tar, info)
    if "control" not in control:
        raise ServestackError(f"{what}: control.tar has no control file")
    fields = parse_fields(control.pop("control").decode())
    members = []
    with _untar(data_name, ar[data_name], what) as tar:
        for info in tar:
            members.append(Member(info=info, data=_file_bytes(tar, info) if info.isfile() else None))
    return DebPackage(fields=fields, control=control, members=members)
