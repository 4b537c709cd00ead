"""Wheels read with zlib-ng's inflate and CRC-32, straight from the archive's file, instead of zipfile's
member reader and the interpreter's zlib.

Installing a stack inflates every member of every wheel (dev-cpu: 42,000 members, 3.8 GB); with the
interpreter's zlib, inflate and zipfile's CRC-32 check of what it inflated are half the install's CPU.
zlib-ng decodes the same deflate streams to the same bytes (inflate is lossless: the output is fixed by
the archive, whichever library decodes it) in about half the time. zipfile's member reader costs the
rest: ~35 us of Python per member opened (a shared file object's seek, tell and lock per read, a
ZipExtFile's set-up) and, for a large member, a copy of the unconsumed input per read, as its inflate
output is capped at what was asked. Only archives opened here are read this way: zipfile, which
everything else in the process reads with, is left alone.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import zipfile
from collections.abc import Iterator
from typing import IO, Literal

from installer.sources import WheelFile
from zlib_ng import zlib_ng

# Compressed bytes read at a time: a member's whole compressed bytes when smaller (most are: one read
# and one inflate call each); a quarter of the copy's read size (trees.COPY_CHUNK), so that one read's
# output seldom overflows a read and leaves input to copy.
READ = 1 << 18
LINE = 1 << 13  # inflated bytes a readline asks for at a time
# zipfile's own local-header layout and magic: private names that typeshed leaves out.
LOCAL_HEADER = struct.Struct(zipfile.structFileHeader)  # type: ignore[attr-defined]
UTF8_NAME = 0x800  # general purpose flag bit 11: the member's name is UTF-8 (else cp437)
UNSUPPORTED = 0x1 | 0x20 | 0x40  # encrypted, compressed patched data, strong encryption: zipfile's own reader


class _Member:
    """A stored or deflated member's bytes, read with os.pread from the archive's file (no shared position:
    zipfile's other readers are not disturbed) and inflated by zlib-ng, its CRC-32 checked at the end as
    zipfile checks it. The local header is checked as zipfile.ZipFile.open checks it, and the archive's
    file stays open until the member is closed, as with zipfile (ZipFile.close leaves it to the last reader)."""

    def __init__(self, archive: zipfile.ZipFile, info: zipfile.ZipInfo):
        file = archive.fp
        assert file is not None  # WheelZipFile.open hands out members only while the archive is open
        self.archive, self.file, self.info = archive, file, info
        archive._fileRefCnt += 1  # type: ignore[attr-defined]  # what ZipFile.open counts; _fpclose undoes it
        self.closed = True  # until the header is read: a bad one leaves nothing to close but the count
        try:
            self._start(self.file.fileno())
        except BaseException:
            archive._fpclose(self.file)  # type: ignore[attr-defined]
            raise
        self.closed = False

    def _start(self, fd: int) -> None:
        info = self.info
        self.fd = fd
        header = os.pread(fd, LOCAL_HEADER.size, info.header_offset)
        if len(header) != LOCAL_HEADER.size:
            raise zipfile.BadZipFile("Truncated file header")
        fields = LOCAL_HEADER.unpack(header)
        if fields[0] != zipfile.stringFileHeader:  # type: ignore[attr-defined]  # private, as LOCAL_HEADER's layout
            raise zipfile.BadZipFile("Bad magic number for file header")
        name_length, extra_length = fields[10], fields[11]
        name = os.pread(fd, name_length, info.header_offset + LOCAL_HEADER.size)
        # metadata_encoding (3.11) is set by ZipFile.__init__ but typeshed declares it only as a parameter.
        encoding = self.archive.metadata_encoding  # type: ignore[attr-defined]
        if name.decode("utf-8" if fields[3] & UTF8_NAME else encoding or "cp437") != info.orig_filename:
            raise zipfile.BadZipFile(f"File name in directory {info.orig_filename!r} and header {name!r} differ.")
        self.position = info.header_offset + LOCAL_HEADER.size + name_length + extra_length
        self.compressed_left, self.left, self.crc = info.compress_size, info.file_size, 0
        self.ended = False  # the last inflated bytes read and the CRC-32 checked (an empty member's too)
        self._decompressor = (zlib_ng.decompressobj(-zlib_ng.MAX_WBITS)  # raw deflate, as zipfile
                              if info.compress_type == zipfile.ZIP_DEFLATED else None)
        self.tail = b""  # compressed, not yet inflated (the last inflate's output was capped)
        self.pending = b""  # inflated, not yet read (a line read ended before it)

    def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes (all that is left without it), fewer only at the member's end, as zipfile's."""
        if self.closed:
            raise ValueError("read from closed file.")
        if n is None or n < 0:
            n = len(self.pending) + max(self.left, 1)  # at least one more: an empty member's CRC-32 is checked too
        parts = []
        if self.pending:
            parts.append(self.pending[:n])
            self.pending = self.pending[n:]
            n -= len(parts[0])
        while n > 0 and not self.ended:
            parts.append(data := self._more(n))
            n -= len(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readline(self) -> bytes:
        """Up to and with the next newline (installer reads a script's shebang line so)."""
        line = b""
        while chunk := self.pending or (b"" if self.ended else self._more(LINE)):
            end = chunk.find(b"\n") + 1
            line, self.pending = (line + chunk[:end], chunk[end:]) if end else (line + chunk, b"")
            if end:
                break
        return line

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Back to the start and on to `offset` (installer rewinds a script to read its shebang line); as
        zipfile's, the position reached, never past the end nor before the start."""
        if whence != os.SEEK_SET:
            raise io.UnsupportedOperation("a wheel member seeks only from its start")
        self._start(self.fd)
        return len(self.read(max(offset, 0)))

    def seekable(self) -> bool:
        return True

    def _more(self, most: int) -> bytes:
        """The next inflated bytes, at most `most` and what is left of the member (as zipfile, never more
        than its size), its CRC-32 checked once the last of them is read."""
        if self._decompressor is None:
            data = self._compressed(most)
            ended = not self.compressed_left
        else:
            # Input left over from the last call (its output was capped) first: copied only when there is some.
            compressed = self.tail + self._compressed(READ - len(self.tail)) if self.tail else self._compressed(READ)
            data = self._decompressor.decompress(compressed, most)
            self.tail = self._decompressor.unconsumed_tail
            # All input consumed is not the end while the output was capped: inflate may still hold output
            # (the rest of a long match), which the next call, given no input, returns. Output short of the
            # cap with no input left is all there is (inflate writes what it can), so no flush is needed.
            ended = self._decompressor.eof or (not (self.compressed_left or self.tail) and len(data) < most)
        data = data[:self.left]
        self.left -= len(data)
        if ended:  # as zipfile: a member that ends short of its size ends there; its CRC-32 then tells
            self.left = 0
        self.crc = zlib_ng.crc32(data, self.crc)
        if not self.left:
            self.ended = True
            if self.crc != self.info.CRC:
                raise zipfile.BadZipFile(f"Bad CRC-32 for file {self.info.filename!r}")
        return data

    def _compressed(self, most: int) -> bytes:
        if not self.compressed_left or most <= 0:
            return b""
        chunk = os.pread(self.fd, min(self.compressed_left, most), self.position)
        if not chunk:
            raise EOFError
        self.position += len(chunk)
        self.compressed_left -= len(chunk)
        return chunk

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed, self.tail, self.pending = True, b"", b""
            self.archive._fpclose(self.file)  # type: ignore[attr-defined]

    def __enter__(self) -> _Member:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WheelZipFile(zipfile.ZipFile):
    """A ZipFile whose stored and deflated members, opened for reading, are read by _Member."""

    def open(self, name: str | zipfile.ZipInfo, mode: Literal["r", "w"] = "r", pwd: bytes | None = None,
             *, force_zip64: bool = False) -> IO[bytes]:
        # _writing: ZipFile's private flag for a member being written, which typeshed leaves out.
        if mode == "r" and self.fp is not None and not self._writing:  # type: ignore[attr-defined]
            info = name if isinstance(name, zipfile.ZipInfo) else self.getinfo(name)
            if info.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED) and not info.flag_bits & UNSUPPORTED:
                return _Member(self, info)  # type: ignore[return-value]
        return super().open(name, mode, pwd, force_zip64=force_zip64)


@contextlib.contextmanager
def open_wheel(path: str | os.PathLike[str]) -> Iterator[WheelFile]:
    """installer's `WheelFile.open(path)`, its members read by _Member: pass it to installer.install."""
    with WheelZipFile(path) as archive:
        yield WheelFile(archive)
