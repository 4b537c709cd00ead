"""Wheels read with zlib-ng's inflate and CRC-32 instead of the interpreter's zlib.

Installing a stack inflates every member of every wheel (dev-cpu: 42,000 members, 3.8 GB); with the
interpreter's zlib, inflate and zipfile's CRC-32 check of what it inflated are half the install's CPU.
zlib-ng decodes the same deflate streams to the same bytes (inflate is lossless: the output is fixed by
the archive, whichever library decodes it) in about half the time. Only archives opened here use it:
zipfile's module-level decompressor and crc32, which everything else in the process reads with, are left
alone.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Iterator
from typing import IO, Literal

from installer.sources import WheelFile
from zlib_ng import zlib_ng


class _Member(zipfile.ZipExtFile):
    """A member read as zipfile reads it, its CRC-32 computed by zlib-ng and checked at the end."""

    def _update_crc(self, newdata: bytes) -> None:
        # ZipExtFile._update_crc with zlib-ng's crc32 (the same function, so the same value): zipfile
        # calls the module-level `crc32` here, the interpreter's zlib.
        if self._expected_crc is None:
            return
        self._running_crc = zlib_ng.crc32(newdata, self._running_crc)
        if self._eof and self._running_crc != self._expected_crc:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {self.name!r}")


class WheelZipFile(zipfile.ZipFile):
    """A ZipFile whose members, opened for reading, are inflated and CRC-checked by zlib-ng."""

    def open(self, name: str | zipfile.ZipInfo, mode: Literal["r", "w"] = "r", pwd: bytes | None = None,
             *, force_zip64: bool = False) -> IO[bytes]:
        member = super().open(name, mode, pwd, force_zip64=force_zip64)
        if mode == "r":
            # ZipFile.open builds a ZipExtFile by its module-level name: there is no hook for a subclass
            # or another decompressor. The member has inflated nothing yet, so its class and decompressor
            # can still be swapped. A backward seek (installer never seeks) restarts it with zipfile's
            # own decompressor: slower, same bytes.
            assert isinstance(member, zipfile.ZipExtFile)
            member.__class__ = _Member
            if member._compress_type == zipfile.ZIP_DEFLATED:
                member._decompressor = zlib_ng.decompressobj(-zlib_ng.MAX_WBITS)  # raw deflate, as zipfile
        return member


@contextlib.contextmanager
def open_wheel(path: str | os.PathLike[str]) -> Iterator[WheelFile]:
    """installer's `WheelFile.open(path)`, its members read through zlib-ng: pass it to installer.install."""
    with WheelZipFile(path) as archive:
        yield WheelFile(archive)
