"""The Debian base from locked packages: resolving a suite's Packages index, unpacking real .deb files
(built here with dpkg-deb) the way dpkg does, the package database, and the maintainer scripts'
effects done on the host."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import tarfile
import textwrap
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from servestack.debian import closure as resolve
from servestack.debian import ldcache, scripts
from servestack.debian.debfile import read_deb
from servestack.debian.rootfs import Root, merged_usr, unpack
from servestack.debian.tarball import assemble
from servestack.errors import ServestackError

EPOCH = 1783764997


def make_deb(tmp: Path, name: str, files: dict[str, bytes | str], *, version: str = "1.0", control: str = "",
             scripts_: dict[str, str] | None = None, conffiles: list[str] = (), triggers: str = "") -> Path:
    """A real .deb: FILES (path -> bytes, or "->target" for a symlink) packed by dpkg-deb."""
    root = tmp / f"{name}-src"
    (root / "DEBIAN").mkdir(parents=True)
    for path, data in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str) and data.startswith("->"):
            target.symlink_to(data[2:])
        else:
            target.write_bytes(data if isinstance(data, bytes) else data.encode())
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: amd64\nMaintainer: t <t@example.org>\n{control}"
        f"Description: {name} for a test\n")
    for script, text in (scripts_ or {}).items():
        (root / "DEBIAN" / script).write_text(text)
        (root / "DEBIAN" / script).chmod(0o755)
    if triggers:
        (root / "DEBIAN" / "triggers").write_text(triggers)
    if conffiles:
        (root / "DEBIAN" / "conffiles").write_text("".join(c + "\n" for c in conffiles))
    out = tmp / f"{name}_{version}_amd64.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(out)], check=True,
                   capture_output=True)
    return out


def packages_index(*stanzas: str) -> dict[str, resolve.Stanza]:
    common = "Architecture: amd64\nSize: 1\nSHA256: {}\nFilename: pool/main/x/{}.deb\n"
    text = "\n".join(textwrap.dedent(s).strip() + "\n" + common.format("0" * 64, s.split()[1]) for s in stanzas)
    return resolve.parse_index(text, "Packages")


# --------------------------------------------------------------------------- resolving


def test_the_base_is_the_essential_set_the_stack_packages_and_their_dependencies():
    index = packages_index(
        "Package: bash\nVersion: 5.2\nEssential: yes\nPre-Depends: libc6 (>= 2.36)",
        "Package: libc6\nVersion: 2.36-9",
        "Package: python3\nVersion: 3.11.2\nDepends: python3.11 (>= 3.11.2-1~), media-types | mailcap",
        "Package: python3.11\nVersion: 3.11.2-6\nDepends: libc6:any",
        "Package: media-types\nVersion: 10",
        "Package: mailcap\nVersion: 3",
        "Package: unrelated\nVersion: 1",
    )
    debs = resolve.resolve(index, ["python3"], "Debian bookworm amd64")
    assert [d.name for d in debs] == ["bash", "libc6", "media-types", "python3", "python3.11"]
    assert debs[1].version == "2.36-9" and debs[1].filename == "pool/main/x/libc6.deb"


def test_an_alternative_already_chosen_wins_and_a_virtual_package_takes_the_highest_priority_provider():
    index = packages_index(
        "Package: base-files\nVersion: 1\nEssential: yes\nPre-Depends: awk",
        "Package: gawk\nVersion: 5\nPriority: optional\nProvides: awk",
        "Package: mawk\nVersion: 1.3\nPriority: required\nProvides: awk",
        "Package: init-system-helpers\nVersion: 1\nEssential: yes\nDepends: usrmerge | usr-is-merged",
        "Package: usrmerge\nVersion: 37\nDepends: perl",
        "Package: perl\nVersion: 5.36",
        "Package: usr-is-merged\nVersion: 37",
    )
    names = [d.name for d in resolve.resolve(index, [], "suite")]
    # usr-is-merged is a root (the tree is merged-/usr by construction), so usrmerge and perl stay out
    assert names == ["base-files", "init-system-helpers", "mawk", "usr-is-merged"]


def test_a_versioned_dependency_needs_a_version_that_satisfies_it_and_says_which_when_none_does():
    index = packages_index("Package: app\nVersion: 1\nDepends: libfoo (>= 2.0~rc1) | libbar (= 3)",
                           "Package: libfoo\nVersion: 1.9", "Package: libbar\nVersion: 2",
                           "Package: libbaz\nVersion: 1\nProvides: libfoo")  # unversioned: no (>= ...)
    with pytest.raises(ServestackError, match=r"suite: app depends on libfoo \(>= 2.0~rc1\) \| libbar \(= 3\), "
                                              r"which no package satisfies"):
        resolve.resolve(index, ["app"], "suite")
    with pytest.raises(ServestackError, match=r"suite has no package nope \(base.debian.packages\)"):
        resolve.resolve(index, ["nope"], "suite")


ARCHIVE_PACKAGES = """\
Package: base-files
Version: 12.4+deb12u1
Architecture: amd64
Essential: yes
Priority: required
Pre-Depends: awk
Size: 70000
Filename: pool/main/b/base-files/base-files_12.4+deb12u1_amd64.deb
SHA256: 1111111111111111111111111111111111111111111111111111111111111111
Description: Debian base system miscellaneous files
 This package contains the basic filesystem hierarchy of a Debian system,
 and several important miscellaneous files.

Package: mawk
Version: 1.3.4.20200120-3.1
Architecture: amd64
Priority: required
Provides: awk
Size: 120000
Filename: pool/main/m/mawk/mawk_1.3.4.20200120-3.1_amd64.deb
SHA256: 2222222222222222222222222222222222222222222222222222222222222222

Package: python3
Version: 3.11.2-1
Architecture: amd64
Depends: python3.11 (>= 3.11.2-1~)
Size: 26000
Filename: pool/main/p/python3-defaults/python3_3.11.2-1_amd64.deb
SHA256: 3333333333333333333333333333333333333333333333333333333333333333

Package: python3.11
Version: 3.11.2-6
Architecture: amd64
Size: 570000
Filename: pool/main/p/python3.11/python3.11_3.11.2-6_amd64.deb
SHA256: 4444444444444444444444444444444444444444444444444444444444444444

Package: python3.11
Version: 3.11.2-6+deb12u1
Architecture: amd64
Size: 571000
Filename: pool/main/p/python3.11/python3.11_3.11.2-6+deb12u1_amd64.deb
SHA256: 5555555555555555555555555555555555555555555555555555555555555555
"""


def test_a_packages_index_given_as_text_resolves_to_the_locked_debs_with_no_archive():
    # The text as an archive serves it: a Description's continuation lines, a name listed at two versions.
    index = resolve.parse_index(ARCHIVE_PACKAGES, "Debian bookworm amd64 Packages")
    debs = resolve.resolve(index, ["python3"], f"Debian bookworm {resolve.architecture('linux/amd64')}")
    assert [(d.name, d.version) for d in debs] == [("base-files", "12.4+deb12u1"), ("mawk", "1.3.4.20200120-3.1"),
                                                   ("python3", "3.11.2-1"), ("python3.11", "3.11.2-6+deb12u1")]
    assert debs[3].sha256 == "5" * 64 and debs[3].size == 571000
    assert debs[3].filename == "pool/main/p/python3.11/python3.11_3.11.2-6+deb12u1_amd64.deb"
    with pytest.raises(ServestackError, match=r"platform linux/riscv64: a Debian base is resolved for linux/amd64, "
                                              r"linux/arm64"):
        resolve.architecture("linux/riscv64")


# The modules whose names mean a download: reaching one from the resolver would put I/O back in it.
NETWORK = ("servestack.sources", "requests", "urllib", "urllib3", "http", "socket")
SRC = ROOT / "src"


def _module_files(name: str) -> list[Path]:
    """The file of `name` (or of the servestack module it names a member of: `a.b.func` -> a/b.py), after
    the package `__init__`s above it, which importing it runs first; [] for what is not ours."""
    parts = name.split(".")
    while parts and parts[0] == "servestack":
        base = SRC.joinpath(*parts)
        for found in (base.with_suffix(".py"), base / "__init__.py"):
            if found.is_file():
                above = [SRC / package / "__init__.py" for package in reversed(found.relative_to(SRC).parents[:-1])]
                return [p for p in above if p != found] + [found]
        parts.pop()
    return []


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the file, a function body's included; `from a import b` as `a.b`."""
    package = path.relative_to(SRC).parent.parts
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = ".".join([*package[:len(package) - node.level + 1], *filter(None, [node.module])]) \
                if node.level else node.module
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def test_the_resolver_imports_nothing_that_downloads_however_deep():
    start = SRC / "servestack" / "debian" / "closure.py"
    chains, queue, reached = {start: [start]}, [start], []
    while queue:
        path = queue.pop(0)
        where = " -> ".join(str(p.relative_to(SRC)) for p in chains[path])
        for line, name in _imports(path):
            if any(name == bad or name.startswith(bad + ".") for bad in NETWORK):
                reached.append(f"{where}:{line} imports {name}")
                continue  # the first import that downloads is the one to name, not what it imports in turn
            for found in _module_files(name):
                if found not in chains:
                    chains[found] = chains[path] + [found]
                    queue.append(found)
    assert SRC / "servestack" / "debian" / "debfile.py" in chains  # the walk does follow the resolver's imports
    assert not reached, "debian/closure must be handed texts, not fetch them:\n" + "\n".join(reached)


# --------------------------------------------------------------------------- unpacking


def test_files_under_bin_land_in_usr_through_the_merged_usr_links_and_the_list_keeps_their_names(tmp_path):
    deb = read_deb(make_deb(tmp_path, "tool", {"bin/tool": b"#!/bin/sh\n", "usr/share/doc/tool/README": b"x"}))
    root = Root(epoch=EPOCH)
    merged_usr(root, [deb])
    listed = unpack(root, deb)
    assert root.nodes["bin"].kind == "symlink" and root.nodes["bin"].link == "usr/bin"
    assert root.nodes["usr/bin/tool"].data == b"#!/bin/sh\n" and "bin/tool" not in root.nodes
    assert "/bin/tool" in listed and "/." in listed
    assert "sbin" not in root.nodes  # a link only for a top directory some package uses


def test_a_file_two_packages_ship_differently_is_refused_unless_one_replaces_the_other(tmp_path):
    first = read_deb(make_deb(tmp_path, "one", {"usr/bin/x": b"1"}))
    clash = read_deb(make_deb(tmp_path, "two", {"usr/bin/x": b"2"}))
    taker = read_deb(make_deb(tmp_path, "three", {"usr/bin/x": b"3"}, control="Replaces: one\n"))
    same = read_deb(make_deb(tmp_path, "four", {"usr/bin/x": b"1"}))
    root = Root(epoch=EPOCH)
    unpack(root, first)
    unpack(root, same)  # the same bytes: shared, as dpkg allows
    with pytest.raises(ServestackError, match=r"two: /usr/bin/x is also shipped, differently, by one, which two "
                                              r"does not Replace"):
        unpack(root, clash)
    unpack(root, taker)
    assert root.read("usr/bin/x") == b"3"


def test_the_tar_is_ordered_parents_first_with_hard_links_after_the_file_that_carries_the_bytes(tmp_path):
    src = tmp_path / "hl"
    (src / "DEBIAN").mkdir(parents=True)
    (src / "usr/bin").mkdir(parents=True)
    (src / "usr/bin/zcat").write_bytes(b"gzip")
    (src / "usr/bin/azcat").hardlink_to(src / "usr/bin/zcat")  # sorts before the member dpkg-deb stores first
    (src / "DEBIAN/control").write_text("Package: hl\nVersion: 1\nArchitecture: amd64\nMaintainer: t <t@e>\n"
                                        "Description: d\n")
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", str(src), str(tmp_path / "hl.deb")], check=True,
                   capture_output=True)
    out = tmp_path / "base.tar"
    assemble([tmp_path / "hl.deb"], "amd64", EPOCH, out)
    with tarfile.open(out) as tar:
        members = tar.getmembers()
        names = [m.name for m in members]
        assert names[0] == "." and names.index("./usr") < names.index("./usr/bin") < names.index("./usr/bin/azcat")
        azcat, zcat = tar.getmember("./usr/bin/azcat"), tar.getmember("./usr/bin/zcat")
        assert azcat.isfile() and zcat.islnk() and zcat.linkname == "./usr/bin/azcat"
        assert max(m.mtime for m in members) <= EPOCH
    first = out.read_bytes()
    assemble([tmp_path / "hl.deb"], "amd64", EPOCH, out)
    assert out.read_bytes() == first


# --------------------------------------------------------------------------- the database and the scripts' effects


def test_the_database_is_what_dpkg_leaves_after_configuring(tmp_path):
    conf = b"include /etc/ld.so.conf.d/*.conf\n"
    libc = make_deb(tmp_path, "libc6", {"etc/ld.so.conf": conf}, control="Multi-Arch: same\n",
                    conffiles=["/etc/ld.so.conf"], triggers="interest-noawait ldconfig\n")
    out = tmp_path / "base.tar"
    done = assemble([libc], "amd64", EPOCH, out)
    assert done[0] == "dpkg: 1 packages configured, triggers registered: ldconfig libc6/noawait"
    with tarfile.open(out) as tar:
        status = tar.extractfile("./var/lib/dpkg/status").read().decode()
        assert status.startswith("Package: libc6\nStatus: install ok installed\n")
        assert f"Conffiles:\n /etc/ld.so.conf {hashlib.md5(conf).hexdigest()}\n" in status
        assert tar.extractfile("./var/lib/dpkg/info/format").read() == b"1\n"
        assert tar.extractfile("./var/lib/dpkg/info/libc6:amd64.list").read().decode().splitlines() == \
            ["/.", "/etc", "/etc/ld.so.conf"]
        assert tar.extractfile("./var/lib/dpkg/triggers/ldconfig").read() == b"libc6/noawait\n"


def test_update_alternatives_calls_are_read_from_the_postinst_and_a_slave_without_its_file_gets_no_link(tmp_path):
    postinst = textwrap.dedent("""\
        #!/bin/sh
        set -e
        update-alternatives --quiet \\
            --install /usr/bin/awk awk /usr/bin/mawk 5 \\
            --slave /usr/share/man/man1/awk.1.gz awk.1.gz /usr/share/man/man1/mawk.1.gz \\
            --slave /usr/bin/nawk nawk /usr/bin/mawk
        """)
    deb = make_deb(tmp_path, "mawk", {"usr/bin/mawk": b"ELF"}, scripts_={"postinst": postinst})
    out = tmp_path / "base.tar"
    done = assemble([deb], "amd64", EPOCH, out)
    assert "update-alternatives: /usr/bin/awk -> /usr/bin/mawk" in done
    with tarfile.open(out) as tar:
        assert tar.getmember("./usr/bin/awk").linkname == "/etc/alternatives/awk"
        assert tar.getmember("./etc/alternatives/awk").linkname == "/usr/bin/mawk"
        assert tar.getmember("./usr/bin/nawk").linkname == "/etc/alternatives/nawk"
        names = tar.getnames()
        assert "./usr/share/man/man1/awk.1.gz" not in names  # mawk.1.gz is not in the package
        assert tar.extractfile("./var/lib/dpkg/alternatives/awk").read().decode() == (
            "auto\n/usr/bin/awk\nawk.1.gz\n/usr/share/man/man1/awk.1.gz\nnawk\n/usr/bin/nawk\n\n"
            "/usr/bin/mawk\n5\n/usr/share/man/man1/mawk.1.gz\n/usr/bin/mawk\n\n")


def test_an_update_alternatives_call_that_is_not_literal_is_refused_naming_the_package(tmp_path):
    deb = make_deb(tmp_path, "odd", {"usr/bin/odd": b"x"},
                   scripts_={"postinst": "#!/bin/sh\nupdate-alternatives --install /usr/bin/o o $TARGET 5\n"})
    with pytest.raises(ServestackError, match=r"odd postinst: cannot read `update-alternatives --install"):
        assemble([deb], "amd64", EPOCH, tmp_path / "base.tar")
    assert not (tmp_path / "base.tar").exists()


def test_pam_auth_update_is_followed_for_a_first_install(tmp_path):
    template = textwrap.dedent("""\
        # here are the per-package modules (the "Primary" block)
        $account_primary
        # here's the fallback if no module succeeds
        account\trequisite\t\t\tpam_deny.so
        account\trequired\t\t\tpam_permit.so
        # and here are more per-package modules (the "Additional" block)
        $account_additional
        # end of pam-auth-update config
        """)
    unix = "Name: Unix\nDefault: yes\nPriority: 256\nAccount-Type: Primary\nAccount:\n\t[success=end default=ignore]\tpam_unix.so\n"
    extra = "Name: Extra\nDefault: yes\nPriority: 0\nAccount-Type: Additional\nAccount:\n\trequired\tpam_extra.so  debug\n"
    off = "Name: Off\nDefault: no\nPriority: 512\nAccount-Type: Primary\nAccount:\n\trequired\tpam_off.so\n"
    files = {f"usr/share/pam/common-{t}": template.replace("account", t.removesuffix("-noninteractive"))
             for t in ("auth", "account", "password", "session", "session-noninteractive")}
    files.update({"usr/share/pam-configs/unix": unix, "usr/share/pam-configs/extra": extra,
                  "usr/share/pam-configs/off": off})
    out = tmp_path / "base.tar"
    assemble([make_deb(tmp_path, "libpam-runtime", files)], "amd64", EPOCH, out)
    with tarfile.open(out) as tar:
        account = tar.extractfile("./etc/pam.d/common-account").read().decode()
        auth = tar.extractfile("./etc/pam.d/common-auth").read().decode()
        assert "account\t[success=1 default=ignore]\tpam_unix.so \n" in account  # jumps past pam_deny
        assert "account\trequired\tpam_extra.so debug\n" in account and "pam_off" not in account
        assert "auth\t[default=1]\t\t\tpam_permit.so\n" in auth  # no primary module for auth
        assert tar.extractfile("./var/lib/pam/seen").read() == b"off\nunix\nextra\n"


def test_the_effects_list_names_a_package_for_each_script_it_stands_for():
    assert {package for package, _ in scripts.EFFECTS} >= {"base-files", "base-passwd", "dash", "debianutils",
                                                           "libc-bin", "libpam-runtime", "ca-certificates", "passwd"}


# --------------------------------------------------------------------------- the loader cache


def test_the_loader_cache_lists_each_library_by_soname_as_the_hosts_ldconfig_reads_it(tmp_path):
    import glob

    libs = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libz.so.1.*") + glob.glob("/usr/lib/x86_64-linux-gnu/libc.so.6")
                  + glob.glob("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.*"))
    if len(libs) < 2:
        pytest.skip("this host has no x86-64 libc and libz to take as real libraries")
    root = Root(epoch=EPOCH)
    root.file("etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n")
    root.file("etc/ld.so.conf.d/x86_64-linux-gnu.conf", b"/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n")
    root.dir("usr/lib")
    root.symlink("lib", "usr/lib")
    expected = {}
    for lib in libs:
        data = Path(lib).read_bytes()
        so = ldcache.soname(data, 62)
        root.file(f"usr/lib/x86_64-linux-gnu/{Path(lib).name}", data)
        if so != Path(lib).name:
            root.symlink(f"usr/lib/x86_64-linux-gnu/{so}", Path(lib).name)
        expected[so] = f"/lib/x86_64-linux-gnu/{so}"
    root.file("usr/lib/x86_64-linux-gnu/libnot.so.1", b"not an ELF file")
    ldcache.write(root, 62)
    cache = tmp_path / "ld.so.cache"
    cache.write_bytes(root.read("etc/ld.so.cache"))
    shown = subprocess.run(["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True, check=True).stdout
    listed = dict(line.strip().split(" (libc6,x86-64) => ") for line in shown.splitlines()[1:] if "=>" in line)
    assert listed == expected
    assert shown.splitlines()[0].startswith(f"{len(expected)} libs found in cache")
