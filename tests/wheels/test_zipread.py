"""Wheels read through zlib-ng: the same bytes as zipfile, the same CRC-32 failure, zipfile left alone."""

from __future__ import annotations

import random
import struct
import zipfile
from pathlib import Path

import pytest
from installer import install
from installer.destinations import SchemeDictionaryDestination
from installer.sources import WheelFile
from zlib_ng import zlib_ng

from servestack.wheels import pack_wheel
from servestack.wheels.zipread import WheelZipFile, open_wheel


def _contents() -> dict[str, bytes]:
    rng = random.Random(7)
    text = "".join(f"def f{i}(x):\n    return x * {rng.randrange(1000)}\n" for i in range(60_000)).encode()
    return {
        "demo/__init__.py": b"",
        "demo/big.py": text,  # ~2 MB that deflates well: many max_length-limited inflate calls
        "demo/blob.bin": rng.randbytes(1_500_000),  # incompressible: stored blocks inside deflate
        "demo/small.txt": b"x" * 100,
    }


def _wheel(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    for path, data in _contents().items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    dist_info = root / "demo-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    return pack_wheel(root, tmp_path / "dist", epoch=0)


def _corrupt_crc(archive: Path, member: str) -> None:
    """Flip a bit of `member`'s CRC-32 in the central directory (what zipfile checks against)."""
    data = bytearray(archive.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at != -1:
        name_length = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + name_length] == member.encode():
            data[at + 16] ^= 1
            archive.write_bytes(bytes(data))
            return
        at = data.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{archive}: no central directory entry for {member}")


def _installed(source: WheelFile, root: Path) -> dict[str, bytes]:
    scheme = {key: str(root / key) for key in ("purelib", "platlib", "headers", "scripts", "data")}
    install(source, SchemeDictionaryDestination(scheme, interpreter="/usr/bin/python3", script_kind="posix"),
            additional_metadata={})
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_reads_the_same_bytes_as_zipfile(tmp_path):
    wheel = _wheel(tmp_path)
    with zipfile.ZipFile(wheel) as plain, WheelZipFile(wheel) as fast:
        names = [info.filename for info in plain.infolist()]
        assert all(info.compress_type == zipfile.ZIP_DEFLATED for info in plain.infolist())
        for name in names:
            assert fast.read(name) == plain.read(name), name
            with fast.open(name) as stream:  # in installer's way: fixed-size reads until empty
                chunks = iter(lambda: stream.read(65536), b"")
                assert b"".join(chunks) == plain.read(name), name
        for path, data in _contents().items():
            assert fast.read(path) == data


def test_installer_installs_the_same_files(tmp_path):
    wheel = _wheel(tmp_path)
    with WheelFile.open(wheel) as source:
        expected = _installed(source, tmp_path / "plain")
    with open_wheel(wheel) as source:
        assert _installed(source, tmp_path / "fast") == expected
    assert expected["purelib/demo/blob.bin"] == _contents()["demo/blob.bin"]


def test_members_are_inflated_by_zlib_ng_and_zipfile_is_left_alone(tmp_path):
    wheel = _wheel(tmp_path)
    with WheelZipFile(wheel) as fast, fast.open("demo/big.py") as stream:
        assert type(stream._decompressor) is type(zlib_ng.decompressobj(-15))
    with zipfile.ZipFile(wheel) as plain, plain.open("demo/big.py") as stream:
        assert type(stream) is zipfile.ZipExtFile
        assert not isinstance(stream._decompressor, type(zlib_ng.decompressobj(-15)))


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_a_corrupted_crc_fails_as_in_zipfile(tmp_path, compression):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", compression=compression) as zf:
        zf.writestr("good.py", _contents()["demo/big.py"])
        zf.writestr("bad.py", _contents()["demo/big.py"])
    _corrupt_crc(archive, "bad.py")
    with zipfile.ZipFile(archive) as plain, WheelZipFile(archive) as fast:
        assert fast.read("good.py") == plain.read("good.py")
    _both_fail(archive, "bad.py", "Bad CRC-32 for file 'bad.py'")


def test_installing_a_wheel_with_a_corrupted_crc_fails(tmp_path):
    wheel = _wheel(tmp_path)
    _corrupt_crc(wheel, "demo/blob.bin")
    with open_wheel(wheel) as source, pytest.raises(zipfile.BadZipFile, match="demo/blob.bin"):
        _installed(source, tmp_path / "root")


def test_a_read_is_as_long_as_asked_but_at_the_end_and_the_archive_stays_open_for_an_open_member(tmp_path):
    """As zipfile's: installer and trees copy in fixed-size reads; a member opened before ZipFile.close
    is still read whole after it."""
    wheel = _wheel(tmp_path)
    fast = WheelZipFile(wheel)
    with fast.open("demo/big.py") as stream:
        fast.close()
        chunks = list(iter(lambda: stream.read(65536), b""))
    assert b"".join(chunks) == _contents()["demo/big.py"]
    assert {len(chunk) for chunk in chunks[:-1]} == {65536} and len(chunks) > 2


def test_a_member_whose_local_header_names_another_file_fails_as_in_zipfile(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("good.py", b"A = 1\n")
    data = bytearray(archive.read_bytes())
    data[data.find(b"good.py")] = ord("G")  # the local header's copy of the name, before the central directory's
    archive.write_bytes(bytes(data))
    _both_fail(archive, "good.py", "File name in directory 'good.py' and header b'Good.py' differ")


def _both_fail(archive: Path, name: str, error: str) -> None:
    """Reading `name` fails with `error`, through zipfile and through WheelZipFile alike."""
    for reader in (zipfile.ZipFile, WheelZipFile):
        with reader(archive) as opened, pytest.raises(zipfile.BadZipFile, match=error):
            opened.read(name)


def test_a_member_rewinds_and_reads_a_line_as_zipfiles_does(tmp_path):
    """installer fixes a script's #!python line so: seek(0), read(8), seek(0), readline(), then reads."""
    wheel = _wheel(tmp_path)
    with zipfile.ZipFile(wheel) as plain, WheelZipFile(wheel) as fast:
        for archive in (plain, fast):
            with archive.open("demo/big.py") as stream:
                first = stream.read(8)
                stream.seek(0)
                line = stream.readline()
                rest = list(iter(lambda: stream.read(65536), b""))
            assert (first, line, b"".join(rest)) == (b"def f0(x", _contents()["demo/big.py"].split(b"\n")[0] + b"\n",
                                                     _contents()["demo/big.py"].split(b"\n", 1)[1])


def _archive(tmp_path: Path, compression: int, members: dict[str, bytes]) -> Path:
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w", compression=compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return archive


@pytest.mark.parametrize("size", [1, 100, 2000])
def test_output_inflate_still_holds_after_the_last_input_is_read(tmp_path, size):
    """A member ending in a long run deflates to a few bytes, all consumed by the first inflate call, while
    the run's rest is still to come: reads of `size` must go on past the input's end, not stop short."""
    data = b"ab" * 10 + b"x" * 4000
    archive = _archive(tmp_path, zipfile.ZIP_DEFLATED, {"run.txt": data})
    with WheelZipFile(archive) as fast, fast.open("run.txt") as stream:
        assert type(stream) is not zipfile.ZipExtFile
        chunks = list(iter(lambda: stream.read(size), b""))
    assert b"".join(chunks) == data
    assert {len(chunk) for chunk in chunks[:-1]} <= {size}


def test_stored_members_read_as_in_zipfile(tmp_path):
    """Wheels hold stored members too (already-compressed files): read by our reader, whole, in fixed-size
    reads, and a line at a time, the same bytes as zipfile's."""
    rng = random.Random(3)
    members = {"big.bin": rng.randbytes(700_000), "lines.py": b"#!python\nA = 1\n" * 5000, "one": b"1"}
    archive = _archive(tmp_path, zipfile.ZIP_STORED, members)
    with zipfile.ZipFile(archive) as plain, WheelZipFile(archive) as fast:
        for name, data in members.items():
            assert plain.read(name) == data
            assert fast.read(name) == data, name
            with fast.open(name) as stream:
                assert type(stream) is not zipfile.ZipExtFile and stream._decompressor is None
                assert b"".join(iter(lambda: stream.read(65536), b"")) == data, name
            with fast.open(name) as stream:
                line, (head, newline, _) = stream.readline(), data.partition(b"\n")
                assert line == head + newline and line + stream.read() == data, name


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_an_empty_members_crc_is_checked_as_in_zipfile(tmp_path, compression):
    archive = _archive(tmp_path, compression, {"good.py": b"", "bad.py": b""})
    _corrupt_crc(archive, "bad.py")
    with zipfile.ZipFile(archive) as plain, WheelZipFile(archive) as fast:
        assert fast.read("good.py") == plain.read("good.py") == b""
        with fast.open("good.py") as stream:
            assert stream.read(65536) == b"" and stream.read(65536) == b""
        for archive_reader in (plain, fast):
            with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32 for file 'bad.py'"):
                archive_reader.read("bad.py")
            with archive_reader.open("bad.py") as stream, pytest.raises(zipfile.BadZipFile, match="bad.py"):
                stream.read(65536)  # installer's and trees' way: fixed-size reads


@pytest.mark.parametrize("compression", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED])
def test_seek_returns_the_position_reached_as_zipfiles_does(tmp_path, compression):
    data = b"0123456789" * 1000
    archive = _archive(tmp_path, compression, {"m": data})
    with zipfile.ZipFile(archive) as plain, WheelZipFile(archive) as fast:
        for archive_reader in (plain, fast):
            with archive_reader.open("m") as stream:
                assert stream.seek(25) == 25 and stream.read(3) == b"567"
                assert stream.seek(len(data) + 100) == len(data) and stream.read(10) == b""
                assert stream.seek(-5) == 0 and stream.read(3) == b"012"
                assert stream.seek(0) == 0 and stream.read() == data
