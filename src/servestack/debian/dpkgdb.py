"""The package database as dpkg leaves it once every package is configured: `dpkg -l`, `dpkg -S`,
`dpkg -V` and a later `apt-get install` in the image see a base dpkg installed."""

from __future__ import annotations

import re

from servestack.debian.debfile import DebPackage
from servestack.debian.rootfs import Root, md5

DB = "var/lib/dpkg"
# dpkg's own order of the status fields (lib/dpkg/parse.c); others follow in the control file's order.
_ORDER = ("Package", "Essential", "Protected", "Status", "Priority", "Section", "Installed-Size", "Origin",
          "Maintainer", "Bugs", "Architecture", "Multi-Arch", "Source", "Version", "Config-Version", "Replaces",
          "Provides", "Depends", "Pre-Depends", "Recommends", "Suggests", "Breaks", "Conflicts", "Enhances",
          "Conffiles", "Description")
_SCRIPTS = {"preinst", "postinst", "prerm", "postrm", "config"}


def info_name(package: DebPackage, arch: str) -> str:
    """dpkg names a Multi-Arch: same package's info files with its architecture."""
    same = package.fields.get("Multi-Arch") == "same"
    return f"{package.name}:{package.fields.get('Architecture', arch)}" if same else package.name


def _stanza(package: DebPackage, conffiles: list[tuple[str, str]]) -> str:
    fields = dict(package.fields)
    fields["Status"] = "install ok installed"
    if conffiles:
        fields["Conffiles"] = "".join(f"\n {path} {digest}" for path, digest in conffiles)
    ordered = [k for k in _ORDER if k in fields] + [k for k in fields if k not in _ORDER]
    return "".join(f"{k}: {fields[k]}\n" if not fields[k].startswith("\n") else f"{k}:{fields[k]}\n" for k in ordered)


def write(root: Root, packages: list[DebPackage], listed: dict[str, list[str]], arch: str) -> list[str]:
    """Writes the database; returns the file triggers and named triggers registered."""
    stanzas: list[str] = []
    file_triggers: list[str] = []
    named: dict[str, list[str]] = {}
    for package in packages:
        name = info_name(package, arch)
        conffiles = [(path, md5(root.read(path))) for path in package.control.get("conffiles", b"").decode().split()
                     if path.startswith("/") and root.exists(path)]
        stanzas.append(_stanza(package, conffiles))
        root.file(f"{DB}/info/{name}.list", "".join(p + "\n" for p in listed[package.name]).encode())
        for member, data in sorted(package.control.items()):
            root.file(f"{DB}/info/{name}.{member}", data, 0o755 if member in _SCRIPTS else 0o644)
        for kind, trigger in re.findall(r"^\s*(interest(?:-await|-noawait)?)\s+(\S+)",
                                        package.control.get("triggers", b"").decode(), re.M):
            who = package.name + ("/noawait" if kind == "interest-noawait" else "")
            if trigger.startswith("/"):
                file_triggers.append(f"{trigger} {who}")
            else:
                named.setdefault(trigger, []).append(who)
    root.file(f"{DB}/info/format", b"1\n")  # the multiarch layout: a Multi-Arch: same package's files are pkg:arch.*
    root.file(f"{DB}/status", "\n".join(stanzas).encode() + b"\n")
    root.file(f"{DB}/available", b"")
    root.file(f"{DB}/arch", f"{arch}\n".encode())
    root.file(f"{DB}/triggers/File", "".join(line + "\n" for line in file_triggers).encode())
    root.file(f"{DB}/triggers/Unincorp", b"")
    for trigger, interested in sorted(named.items()):
        root.file(f"{DB}/triggers/{trigger}", "".join(w + "\n" for w in interested).encode())
    for directory in ("alternatives", "updates", "parts"):
        root.dir(f"{DB}/{directory}")
    return file_triggers + [f"{t} {' '.join(w)}" for t, w in sorted(named.items())]
