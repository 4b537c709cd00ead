"""What the base's maintainer scripts would have done on a fresh install, done on the host.

No script runs: each effect below reads the same inputs the script reads (files the packages
ship) and writes what the script writes, for a first configuration (`postinst configure` with no
old version). Each is tied to the package whose script it stands for and runs only when that
package is in the base. What the scripts do that a container has no use for (systemd units,
rc.d links, debconf's database, upgrade clean-ups) is not done; `EFFECTS` is the whole list.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servestack.debian import ldcache
from servestack.debian.debfile import DebPackage, parse_fields
from servestack.debian.rootfs import Root
from servestack.errors import ServestackError

MAIL_GID, SHADOW_GID, UTMP_GID = 8, 42, 43  # base-passwd's group.master


@dataclass(frozen=True, kw_only=True)
class Context:
    root: Root
    packages: dict[str, DebPackage]
    machine: int  # ELF e_machine of the architecture


def _base_files(c: Context) -> list[str]:
    r = c.root
    done = []
    if not r.exists("etc/dpkg/origins/default") and r.exists("etc/dpkg/origins/debian"):
        r.symlink("etc/dpkg/origins/default", "debian")
    for default, target in (("dot.profile", "root/.profile"), ("dot.bashrc", "root/.bashrc"),
                            ("profile", "etc/profile"), ("motd", "etc/motd")):
        if not r.exists(target):
            r.file(target, r.read(f"usr/share/base-files/{default}"))
            done.append("/" + target)
    for directory in ("mnt", "srv", "opt", "etc/opt", "var/opt", "media"):
        r.dir(directory)
    r.dir("var/mail", 0o2775, gid=MAIL_GID, gname="mail")
    r.symlink("var/spool/mail", "../mail", replace=False)
    r.dir("run/lock", 0o1777)
    for old, new in (("var/run", "/run"), ("var/lock", "/run/lock")):
        node = r.nodes.get(r.canonical(old))
        if node is None or node.kind == "dir":
            r.symlink(old, new)
    for local in ("", "/share", "/share/man", "/bin", "/games", "/lib", "/include", "/sbin", "/src", "/etc"):
        r.dir("usr/local" + local)
    r.symlink("usr/local/man", "share/man")
    for log, mode in (("wtmp", 0o664), ("btmp", 0o660), ("lastlog", 0o664)):
        r.file(f"var/log/{log}", b"", mode, gid=UTMP_GID, gname="utmp", replace=False)
    if r.exists("usr/share/info") and not r.exists("usr/share/info/dir"):
        r.file("usr/share/info/dir", r.read("usr/share/base-files/info.dir"))
    return done + ["/root, /opt, /srv, /media, /mnt, /var/mail, /run/lock, /usr/local/*", "/var/run -> /run",
                   "/var/log/{wtmp,btmp,lastlog}"]


def _base_passwd(c: Context) -> list[str]:
    for name in ("passwd", "group"):
        c.root.file(f"etc/{name}", c.root.read(f"usr/share/base-passwd/{name}.master"), replace=False)
    return ["/etc/passwd, /etc/group from base-passwd's masters"]


def _shadow(c: Context) -> list[str]:
    """passwd's `shadowconfig on` (pwconv, grpconv): passwords move to /etc/shadow and /etc/gshadow, dated
    the archive's day as shadow does under SOURCE_DATE_EPOCH, with login.defs' ageing defaults."""
    r = c.root
    day = r.epoch // 86400
    users = [line.split(":") for line in r.read("etc/passwd").decode().splitlines() if line]
    groups = [line.split(":") for line in r.read("etc/group").decode().splitlines() if line]
    r.file("etc/shadow", "".join(f"{u[0]}:{u[1]}:{day}:0:99999:7:::\n" for u in users).encode(), 0o640,
           gid=SHADOW_GID, gname="shadow")
    r.file("etc/gshadow", "".join(f"{g[0]}:{g[1]}::{g[3]}\n" for g in groups).encode(), 0o640,
           gid=SHADOW_GID, gname="shadow")
    r.file("etc/passwd", "".join(":".join([u[0], "x", *u[2:]]) + "\n" for u in users).encode())
    r.file("etc/group", "".join(":".join([g[0], "x", *g[2:]]) + "\n" for g in groups).encode())
    return [f"/etc/shadow, /etc/gshadow: {len(users)} users, {len(groups)} groups"]


def _system_group(name: str) -> Callable[[Context], list[str]]:
    """`addgroup --system NAME`: the first free group id from adduser's FIRST_SYSTEM_GID (100)."""
    def effect(c: Context) -> list[str]:
        r = c.root
        groups = [line.split(":") for line in r.read("etc/group").decode().splitlines() if line]
        if any(g[0] == name for g in groups):
            return []
        taken = {int(g[2]) for g in groups}
        gid = next(i for i in range(100, 1000) if i not in taken)
        shadowed = r.exists("etc/gshadow")
        r.file("etc/group", r.read("etc/group") + f"{name}:{'x' if shadowed else '*'}:{gid}:\n".encode())
        if shadowed:
            r.file("etc/gshadow", r.read("etc/gshadow") + f"{name}:!::\n".encode(), 0o640, gid=SHADOW_GID,
                   gname="shadow")
        return [f"group {name} ({gid})"]
    return effect


def _install_defaults(*pairs: tuple[str, str]) -> Callable[[Context], list[str]]:
    def effect(c: Context) -> list[str]:
        done = []
        for default, target in pairs:
            if not c.root.exists(target):
                c.root.file(target, c.root.read(default))
                done.append(f"/{target} from /{default}")
        return done
    return effect


def _empty_files(*paths: tuple[str, int]) -> Callable[[Context], list[str]]:
    def effect(c: Context) -> list[str]:
        for path, mode in paths:
            c.root.file(path, b"", mode, replace=False)
        return ["/" + ", /".join(p for p, _ in paths) + " (empty)"]
    return effect


def _shells(c: Context) -> list[str]:
    """update-shells: the template, then every package's shells.d entry, each also by its real path."""
    r = c.root
    listed: list[str] = []
    sources = ["usr/share/debianutils/shells"] + sorted(
        p for p in r.nodes if p.startswith(r.canonical("usr/share/debianutils/shells.d/x").rsplit("/", 1)[0] + "/"))
    shells = []
    for source in sources:
        for line in r.read(source).decode().splitlines():
            line = line.split("#")[0].strip()
            if line:
                real = "/" + r.canonical(os.path.dirname(line) + "/x").rsplit("/", 1)[0] + "/" + os.path.basename(line)
                shells.append((line, real))
    for line, real in shells:
        listed += [s for s in (line, real) if s not in listed]
    etc = ["# /etc/shells: valid login shells"] + [s for s, _ in shells] + [real for s, real in shells if real != s]
    r.file("etc/shells", "".join(line + "\n" for line in dict.fromkeys(etc)).encode())
    r.file("var/lib/shells.state", "".join(s + "\n" for s in listed).encode())
    return [f"/etc/shells: {len(listed)} shells"]


def _alternatives(c: Context) -> list[str]:
    """update-alternatives --install, as every postinst calls it, each group in auto mode."""
    groups: dict[str, dict] = {}
    for package in sorted(c.packages.values(), key=lambda p: p.name):
        script = package.control.get("postinst", b"").decode()
        for call in re.finditer(r"update-alternatives((?:[^\n]*\\\n)*[^\n]*)", script):
            args = [a for a in shlex.split(call.group(1).replace("\\\n", " "), comments=True) if a != "--quiet"]
            args = args[:args.index("||")] if "||" in args else args
            if not args or args[0] != "--install":
                continue
            args = args[1:]
            if any("$" in a for a in args) or len(args) < 4 or (len(args) - 4) % 4:
                raise ServestackError(f"{package.name} postinst: cannot read `update-alternatives --install"
                                      f"{call.group(1)}`; expected literal link, name, path, priority and --slaves")
            link, name, path, priority = args[:4]
            slaves = {args[i + 2]: (args[i + 1], args[i + 3]) for i in range(4, len(args), 4)}
            group = groups.setdefault(name, {"link": link, "slaves": {}, "choices": []})
            for slave, (slave_link, _) in slaves.items():
                group["slaves"][slave] = slave_link
            group["choices"].append((path, int(priority), {s: p for s, (_, p) in slaves.items()}))
    done = []
    for name, group in sorted(groups.items()):
        best = max(group["choices"], key=lambda ch: ch[1])
        slave_names = sorted(group["slaves"])
        lines = ["auto", group["link"]] + [x for s in slave_names for x in (s, group["slaves"][s])] + [""]
        for path, priority, paths in group["choices"]:
            lines += [path, str(priority)] + [paths.get(s, "") for s in slave_names]
        c.root.file(f"var/lib/dpkg/alternatives/{name}", "\n".join(lines + [""]).encode() + b"\n")
        for alt, link, target in [(name, group["link"], best[0])] + [
                (s, group["slaves"][s], best[2].get(s, "")) for s in slave_names]:
            if target and c.root.exists(target):  # a slave whose file is missing gets no link, as u-a does
                c.root.symlink(f"etc/alternatives/{alt}", target)
                c.root.symlink(link, f"/etc/alternatives/{alt}", replace=False)
        done.append(f"{group['link']} -> {best[0]}")
    return done


def _dash(c: Context) -> list[str]:
    c.root.file("var/lib/dpkg/diversions", b"/usr/share/man/man1/sh.1.gz\n/usr/share/man/man1/sh.distrib.1.gz\ndash\n"
                b"/bin/sh\n/bin/sh.distrib\ndash\n")
    c.root.symlink("bin/sh", "dash", replace=False)
    return ["/bin/sh -> dash, diverted from bash as dash's postinst does"]


def _loader_cache(c: Context) -> list[str]:
    return [f"/etc/ld.so.cache: {ldcache.write(c.root, c.machine)} libraries"]


def _pam_profiles(r: Root) -> dict[str, dict[str, str]]:
    base = r.canonical("usr/share/pam-configs/x").rsplit("/", 1)[0]
    profiles = {}
    for path in sorted(p for p in r.nodes if p.startswith(base + "/") and r.nodes[p].kind == "file"):
        fields = {}
        for key, value in parse_fields(r.read(path).decode()).items():
            lines = [line.strip() for line in value.split("\n")]
            fields[key.removesuffix("-Final")] = "\n".join(line for line in lines if line)
        if "Session-Interactive-Only" not in fields:
            for suffix in ("-Type", "", "-Initial"):
                if "Session" + suffix in fields:
                    fields["Session-noninteractive" + suffix] = fields["Session" + suffix]
        profiles[path.rsplit("/", 1)[1]] = fields
    return profiles


def _pam(c: Context) -> list[str]:
    """pam-auth-update --package on a fresh install: the Default: yes profiles in the stock templates."""
    r = c.root
    profiles = _pam_profiles(r)
    # pam-auth-update's order: by Priority, highest first, then by name, last first
    order = sorted(sorted(profiles, reverse=True), key=lambda n: -int(profiles[n].get("Priority", "0")))
    enabled = [n for n in order if profiles[n].get("Default") == "yes"]

    def lines_for(name: str, uctype: str, position: int) -> str:
        initial = profiles[name].get(uctype + "-Initial")
        return initial if position == 0 and initial else profiles[name].get(uctype, "")

    def block(uctype: str, kind: str) -> list[str]:
        return [n for n in enabled if profiles[n].get(uctype + "-Type") == kind]

    for pam_type in ("auth", "account", "password", "session", "session-noninteractive"):
        uctype, stack_type = pam_type[0].upper() + pam_type[1:], pam_type.removesuffix("-noninteractive")
        out, state = [], 0
        for line in r.read(f"usr/share/pam/common-{pam_type}").decode().splitlines(keepends=True):
            if state in (1, 3):
                if line.startswith("# here's the fallback" if state == 1 else "# end of pam-auth-update config"):
                    out.append(line)
                    state += 1
                continue
            out.append(line)
            marker = {0: '# here are the per-package modules (the "Primary" block)',
                      2: '# and here are more per-package modules (the "Additional" block)'}.get(state)
            if marker is None or not line.startswith(marker):
                continue
            kind = "Primary" if state == 0 else "Additional"
            modules = [lines_for(n, uctype, i).split("\n") for i, n in enumerate(block(uctype, kind))]
            count = sum(len(m) for m in modules) - (kind == "Additional")
            if kind == "Primary" and count == 0:
                out.append(f"{stack_type}\t[default=1]\t\t\tpam_permit.so\n")
            for module in modules:
                for text in module:
                    head = re.match(r"^((\[[^]]+\]|\w+)\s+\S+)\s*(.*)", text)
                    if head is None:
                        raise ServestackError(f"/usr/share/pam-configs: a {uctype} line pam-auth-update cannot "
                                              f"read: {text!r}")
                    out.append(f"{stack_type}\t{head.group(1).replace('end', str(count))} "
                               f"{' '.join(head.group(3).split())}\n")
                    count -= 1
            state += 1
        if state < 4:
            raise ServestackError(f"/usr/share/pam/common-{pam_type}: not a pam-auth-update template")
        r.file(f"etc/pam.d/common-{pam_type}", "".join(out).encode())
        saved = []
        for kind in ("Primary", "Additional"):
            chosen = block(uctype, kind)
            saved += [f"Module: {n}\n{lines_for(n, uctype, i)}\n" for i, n in enumerate(chosen)]
            if kind == "Primary" and not chosen:
                saved.append("Module: null\n[default=1]\t\t\tpam_permit.so\n")
        r.file(f"var/lib/pam/{pam_type}", "".join(saved).encode())
    r.file("var/lib/pam/seen", "".join(n + "\n" for n in order).encode())
    return [f"/etc/pam.d/common-*: profiles {', '.join(enabled)}"]


def _ca_certificates(c: Context) -> list[str]:
    """ca-certificates' first configure (every certificate it ships enabled), then update-ca-certificates:
    a .pem link per certificate, the bundle, and OpenSSL's subject-hash links (`openssl rehash`, on the host:
    the hash is the same on every OpenSSL since 1.0)."""
    r = c.root
    base = r.canonical("usr/share/ca-certificates/x").rsplit("/", 1)[0] + "/"
    certs = sorted(p[len(base):] for p, n in r.nodes.items() if p.startswith(base) and p.endswith(".crt")
                   and n.kind == "file")
    r.file("etc/ca-certificates.conf", _CONF_HEADER.encode() + "".join(cert + "\n" for cert in certs).encode(), replace=False)
    r.dir("usr/local/share/ca-certificates")
    bundle = bytearray()
    pems: dict[str, bytes] = {}
    for cert in certs:
        pem = os.path.basename(cert).removesuffix(".crt").replace(" ", "_") + ".pem"
        data = r.read(base + cert)
        pems[pem] = data
        r.symlink(f"etc/ssl/certs/{pem}", f"/usr/share/ca-certificates/{cert}")
        bundle += data if data.endswith(b"\n") else data + b"\n"
    r.file("etc/ssl/certs/ca-certificates.crt", bytes(bundle))
    with tempfile.TemporaryDirectory(prefix="servestack-rehash-") as tmp:
        for pem, data in pems.items():
            (Path(tmp) / pem).write_bytes(data)
        subprocess.run(["openssl", "rehash", tmp], check=True, capture_output=True)
        links = sorted(p for p in Path(tmp).iterdir() if p.is_symlink())
        for link in links:
            r.symlink(f"etc/ssl/certs/{link.name}", os.readlink(link))
    return [f"/etc/ssl/certs: {len(certs)} certificates, ca-certificates.crt, {len(links)} hash links"]


_CONF_HEADER = """\
# This file lists certificates that you wish to use or to ignore to be
# installed in /etc/ssl/certs.
# update-ca-certificates(8) will update /etc/ssl/certs by reading this file.
#
# This is autogenerated by dpkg-reconfigure ca-certificates.
# Certificates should be installed under /usr/share/ca-certificates
# and files with extension '.crt' is recognized as available certs.
#
# line begins with # is comment.
# line begins with ! is certificate filename to be deselected.
#
"""


def _python_config(c: Context) -> list[str]:
    if c.root.exists("etc/python3/debian_config"):
        return []
    c.root.file("etc/python3/debian_config",
                b"[DEFAULT]\n# how to byte-compile (comma separated: standard, optimize)\nbyte-compile = standard\n")
    return ["/etc/python3/debian_config"]


def _python_local(version: str) -> Callable[[Context], list[str]]:
    def effect(c: Context) -> list[str]:
        c.root.dir(f"usr/local/lib/python{version}/dist-packages")
        return [f"/usr/local/lib/python{version}/dist-packages"]
    return effect


# (package, effect): in this order, for the packages the base holds. Alternatives come after every
# package's files (their targets must exist), the loader cache last (it reads every library).
EFFECTS: list[tuple[str, Callable[[Context], list[str]]]] = [
    ("base-files", _base_files),
    ("base-passwd", _base_passwd),
    ("passwd", _shadow),
    ("libibverbs1", _system_group("rdma")),
    ("dash", _dash),
    ("debianutils", _shells),
    ("libc-bin", _install_defaults(("usr/share/libc-bin/nsswitch.conf", "etc/nsswitch.conf"))),
    ("readline-common", _install_defaults(("usr/share/readline/inputrc", "etc/inputrc"))),
    ("login", _empty_files(("var/log/faillog", 0o644), ("etc/subuid", 0o644), ("etc/subgid", 0o644))),
    ("libpam-modules", _empty_files(("etc/security/opasswd", 0o600), ("etc/environment", 0o644))),
    ("libpam-runtime", _pam),
    ("python3", _python_config),
    ("python3.11-minimal", _python_local("3.11")),
    ("ca-certificates", _ca_certificates),
    ("", _alternatives),
    ("libc-bin", _loader_cache),
]


def apply(root: Root, packages: list[DebPackage], machine: int) -> list[str]:
    """Every effect for the packages present; returns what was done, one line each."""
    context = Context(root=root, packages={p.name: p for p in packages}, machine=machine)
    done = []
    for package, effect in EFFECTS:
        if not package or package in context.packages:
            done += [f"{package or 'update-alternatives'}: {line}" for line in effect(context)]
    return done
