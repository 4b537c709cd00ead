"""The Debian archive a self-built base comes from, read as apt reads it.

The chain is apt's: the suite's InRelease is verified with Debian's archive keys (gpgv, the
keyring apt's sources name), the Packages index is checked against the sha256 and size the
verified Release gives it, and each .deb later against the sha256 its Packages stanza gives it,
which is what the lock records. Where the archive is, is configuration, never the repo or the
lock: `SERVESTACK_INDEX_DEBIAN` (a mirror or snapshot URL, or a directory laid out as an archive),
else this machine's apt sources.
"""

from __future__ import annotations

import lzma
import re
import subprocess
import tempfile
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from urllib.parse import unquote, urlparse

from servestack import settings
from servestack.errors import IntegrityError, ServestackError
from servestack.sources import cache
from servestack.util.fsutil import sha256_bytes

SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))
INDEX = "debian"
KEYRING = Path(settings.default("SERVESTACK_DEBIAN_KEYRING"))


@dataclass(frozen=True, kw_only=True)
class Release:
    suite: str
    date: int
    sha256: str  # of the InRelease file as served, signature included
    files: dict[str, tuple[str, int]]  # index path below dists/<suite>/ -> (sha256, size)


def archive() -> str:
    """Where the Debian archive is: SERVESTACK_INDEX_DEBIAN, else the archive this machine's apt uses."""
    configured = settings.value("SERVESTACK_INDEX_DEBIAN").strip()
    if configured:
        return configured.rstrip("/") if urlparse(configured).scheme else Path(configured).resolve().as_uri()
    return _apt_mirror()


def _apt_mirror() -> str:
    candidates: list[str] = []
    for source in SOURCES:
        files = sorted(source.glob("*.sources")) + sorted(source.glob("*.list")) if source.is_dir() else [source]
        for file in files:
            if not file.is_file():
                continue
            text = file.read_text()
            candidates += re.findall(r"^URIs:\s*(\S+)", text, re.M)
            candidates += re.findall(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+\S+", text, re.M)
    for uri in candidates:
        if uri.rstrip("/").endswith("/debian"):
            return uri.rstrip("/")
    raise ServestackError("no Debian archive: set SERVESTACK_INDEX_DEBIAN, or configure one in "
                          "/etc/apt/sources.list.d or /etc/apt/sources.list")


def keyring() -> Path:
    """Debian's archive keys (debian-archive-keyring), or SERVESTACK_DEBIAN_KEYRING."""
    path = Path(settings.value("SERVESTACK_DEBIAN_KEYRING") or KEYRING)  # set but empty: Debian's own keys
    if not path.is_file():
        raise ServestackError(f"{path}: no Debian archive keyring; install debian-archive-keyring "
                              "or set SERVESTACK_DEBIAN_KEYRING")
    return path


def url(path: str) -> str:
    """The URL of an archive path (a Packages stanza's Filename, or dists/...)."""
    return f"{archive()}/{path}"


def _read(path: str, what: str) -> bytes:
    location = url(path)
    parsed = urlparse(location)
    if parsed.scheme == "file":
        try:
            return Path(unquote(parsed.path)).read_bytes()
        except OSError as exc:
            raise ServestackError(f"{what}: cannot read {location}: {exc.strerror}") from None
    from servestack.sources import http

    response = http.get(http.session(), location, what=what, timeout=120)
    if response.status_code != 200:
        raise ServestackError(f"{what}: HTTP {response.status_code} from {location}")
    return response.content


def verified_release_text(signed: bytes, what: str) -> str:
    """The Release text of an InRelease file whose signature Debian's archive keys make good (gpgv)."""
    with tempfile.TemporaryDirectory(prefix="servestack-gpgv-") as tmp:
        signed_file, out = Path(tmp) / "InRelease", Path(tmp) / "Release"
        signed_file.write_bytes(signed)
        result = subprocess.run(["gpgv", "--keyring", str(keyring()), "--output", str(out), str(signed_file)],
                                capture_output=True, text=True)
        if result.returncode != 0 or not out.is_file():
            detail = " ".join(line.removeprefix("gpgv: ") for line in result.stderr.splitlines()[-2:])
            raise IntegrityError(f"{what}: the signature does not verify with {keyring()} ({detail})")
        return out.read_text()


def parse_release(text: str, suite: str, sha256: str, what: str) -> Release:
    date = re.search(r"^Date:\s*(.+)$", text, re.M)
    if not date:
        raise ServestackError(f"{what} has no Date field")
    section = re.search(r"^SHA256:\n((?: .*\n?)+)", text, re.M)
    if not section:
        raise ServestackError(f"{what} has no SHA256 field; expected the index files' sha256 sums")
    files = {}
    for line in section.group(1).splitlines():
        digest, size, name = line.split()
        files[name] = (digest, int(size))
    return Release(suite=suite, date=int(parsedate_to_datetime(date.group(1)).timestamp()), sha256=sha256, files=files)


def release(suite: str) -> Release:
    """The suite's Release as it is now, its signature verified."""
    what = f"Debian {suite} InRelease ({url(f'dists/{suite}/InRelease')})"
    signed = _read(f"dists/{suite}/InRelease", what)
    return parse_release(verified_release_text(signed, what), suite, sha256_bytes(signed), what)


def packages(release: Release, arch: str, component: str = "main") -> str:
    """The text of the suite's Packages index for `arch`, checked against the verified Release."""
    name = f"{component}/binary-{arch}/Packages.xz"
    what = f"Debian {release.suite} {name}"
    if name not in release.files:
        raise ServestackError(f"{what}: the {release.suite} Release lists no such index (architecture {arch!r}?)")
    digest, size = release.files[name]
    # Content-addressed: the cache gives back only bytes with the signed Release's sha256.
    path = cache.fetch(url(f"dists/{release.suite}/{name}"), digest, f"{release.suite}-{arch}-Packages.xz",
                       origin=f"the Debian archive ({archive()})", authority="the signed Release")
    if path.stat().st_size != size:
        raise IntegrityError(f"{what}: {path.stat().st_size} bytes; the signed Release says {size}")
    return lzma.decompress(path.read_bytes()).decode()
