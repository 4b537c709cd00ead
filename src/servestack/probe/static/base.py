"""The Debian base as the image holds it: assembled on the host from the lock's packages, with no
maintainer script run, it must still be what dpkg would have left."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

from .report import FAIL, PASS, check


def _run(argv: list[str], timeout: float = 600) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 127, str(e)
    return done.returncode, (done.stdout + done.stderr).strip()


def _installed() -> dict[str, str]:
    with open("/var/lib/dpkg/status", encoding="utf-8") as f:
        stanzas = f.read().split("\n\n")
    found = {}
    for stanza in stanzas:
        fields = dict(re.findall(r"^(Package|Status|Version): *(.*)$", stanza, re.M))
        if fields.get("Status") == "install ok installed":
            found[fields["Package"]] = fields.get("Version", "")
    return found


def check_dpkg(locked: list[dict]) -> dict:
    """dpkg's database lists exactly the locked packages, and every file it knows is as shipped."""
    installed = _installed()
    wanted = {d["name"]: d["version"] for d in locked}
    problems = [f"{n} {v} is locked but {'missing' if n not in installed else 'installed at ' + installed[n]}"
                for n, v in sorted(wanted.items()) if installed.get(n) != v]
    problems += [f"{n} {installed[n]} is installed but not locked" for n in sorted(set(installed) - set(wanted))]
    for argv in (["dpkg", "--audit"], ["dpkg", "--verify"]):
        code, out = _run(argv)
        if code != 0 or out:
            problems.append(f"`{' '.join(argv)}` (exit {code}): {out[:400]}")
    detail = "; ".join(problems[:8]) or f"{len(installed)} packages as locked; dpkg --audit and --verify are clean"
    return check("base:dpkg", FAIL if problems else PASS, detail)


def check_libraries() -> dict:
    """Every shared library and program of the base finds what it links, through the loader cache."""
    triplet = _run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"])[1] if shutil.which("dpkg-architecture") else ""
    if not triplet:
        triplet = next((os.path.basename(p) for p in glob.glob("/usr/lib/*-linux-gnu")), "")
    loader = next(iter(sorted(glob.glob(f"/usr/lib/{triplet}/ld-linux*.so.*"))), None)
    if loader is None:
        return check("base:libraries", FAIL, f"no dynamic loader in /usr/lib/{triplet}")
    code, cache = _run(["ldconfig", "-p"])
    if code != 0 or "libc.so.6" not in cache:
        return check("base:libraries", FAIL, f"the loader cache does not list libc.so.6: {cache[:300]}")
    files = sorted(set(glob.glob(f"/usr/lib/{triplet}/*.so*") + glob.glob("/usr/bin/*") + glob.glob("/usr/sbin/*")
                       + glob.glob("/usr/lib/python3*/lib-dynload/*.so")))
    unresolved, checked = [], 0
    for path in files:
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            if f.read(4) != b"\x7fELF":
                continue
        checked += 1
        code, out = _run([loader, "--list", path], timeout=60)
        if "not found" in out:
            unresolved.append(f"{path}: {', '.join(line.split()[0] for line in out.splitlines() if 'not found' in line)}")
    if unresolved:
        return check("base:libraries", FAIL, f"{len(unresolved)} of {checked} ELF files: " + "; ".join(unresolved[:6]))
    entries = len([line for line in cache.splitlines() if "=>" in line])
    return check("base:libraries", PASS, f"{checked} ELF files resolve; the loader cache lists {entries} libraries")


def check_interpreter() -> dict:
    """The base's interpreter starts and has its standard library, with TLS that trusts the CA bundle."""
    script = ("import ssl, sqlite3, ctypes, venv, zlib, lzma, bz2; "
              "print(len(ssl.create_default_context().get_ca_certs()))")
    code, out = _run(["/usr/bin/python3", "-c", script])
    last = out.splitlines()[-1] if out else ""
    if code != 0 or not last.isdigit():
        return check("base:interpreter", FAIL, f"/usr/bin/python3 (exit {code}): {out[-400:]}")
    if int(last) == 0:
        return check("base:interpreter", FAIL, "/usr/bin/python3 starts, but its TLS trusts no CA certificate: "
                                               "is ca-certificates in the stack's base packages?")
    return check("base:interpreter", PASS, f"/usr/bin/python3 starts; TLS trusts {last} CA certificates")


def check_no_apt() -> dict:
    """Nothing is left for apt to finish: no package manager frontend is needed, and none is shipped."""
    present = [tool for tool in ("apt-get", "apt") if shutil.which(tool)]
    if present:
        return check("base:no-apt", FAIL, f"{', '.join(present)} in the base: it is assembled from the lock, not by apt")
    return check("base:no-apt", PASS, "no apt in the base; every package configured without it")


def check_base(stack_json: dict) -> list[dict]:
    debian = ((stack_json.get("lock") or {}).get("base") or {}).get("debian")
    if not debian:
        return []
    code, arch = _run(["dpkg", "--print-architecture"])
    platform = {"amd64": "linux/amd64", "arm64": "linux/arm64"}.get(arch, arch)
    locked = (debian.get("resolved") or {}).get(platform)
    if code != 0 or locked is None:
        return [check("base:dpkg", FAIL, f"the lock's base has no packages for this image's architecture {arch!r}")]
    return [check_dpkg(locked), check_libraries(), check_interpreter(), check_no_apt()]
