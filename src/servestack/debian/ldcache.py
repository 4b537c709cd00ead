"""/etc/ld.so.cache written on the host, as `ldconfig` (libc-bin's trigger) would write it in the image.

ld.so looks a library up in the cache before its default directories; without one every lookup
walks them. The host's ldconfig cannot write another architecture's cache (it tags libraries by
its own ELF flags), so the file is written here in glibc's format "glibc-ld.so.cache1.1": a header,
entries (flags, key, value, hwcap) sorted as ld.so's binary search expects, then the strings.
"""

from __future__ import annotations

import re
import struct

from servestack.debian.rootfs import Root

# e_machine -> (the cache's flags for a 64-bit library of that machine, the multiarch triplet)
MACHINES = {62: (0x0303, "x86_64-linux-gnu"), 183: (0x0A03, "aarch64-linux-gnu")}
_DT_NULL, _DT_STRTAB, _DT_SONAME = 0, 5, 14


def soname(data: bytes, machine: int) -> str | None:
    """The DT_SONAME of a 64-bit little-endian shared object for `machine`, None for anything else."""
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_type != 3 or e_machine != machine:
        return None
    phoff, = struct.unpack_from("<Q", data, 32)
    phentsize, phnum = struct.unpack_from("<HH", data, 54)
    loads, dynamic = [], None
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == 2:
            dynamic = (p_offset, p_filesz)
    if dynamic is None:
        return None
    tags: dict[int, int] = {}
    for offset in range(dynamic[0], dynamic[0] + dynamic[1], 16):
        tag, value = struct.unpack_from("<qQ", data, offset)
        if tag == _DT_NULL:
            break
        tags.setdefault(tag, value)
    if _DT_SONAME not in tags or _DT_STRTAB not in tags:
        return None
    strtab = next((off + tags[_DT_STRTAB] - vaddr for vaddr, off, size in loads
                   if vaddr <= tags[_DT_STRTAB] < vaddr + size), None)
    if strtab is None:
        return None
    start = strtab + tags[_DT_SONAME]
    return data[start:data.index(b"\0", start)].decode()


def _libcmp_key(name: str) -> list[tuple[int, int | str]]:
    """A sort key that orders as glibc's _dl_cache_libcmp: digit runs compare as numbers, above letters."""
    return [(1, int(part)) if part.isdigit() else (0, part) for part in re.findall(r"\d+|\D", name)]


def search_dirs(root: Root, triplet: str) -> list[str]:
    """ldconfig's directories: those /etc/ld.so.conf includes, then the trusted /lib and /usr/lib."""
    dirs: list[str] = []

    def read_conf(path: str) -> None:
        for line in root.read(path).decode().splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("include "):
                pattern = line.split(None, 1)[1]
                directory, glob = pattern.rsplit("/", 1)
                regex = re.compile(re.escape(glob).replace(r"\*", ".*") + "$")
                canonical = root.canonical(directory + "/x").rsplit("/", 1)[0]
                for child in sorted(p for p in root.nodes if p.rsplit("/", 1)[0] == canonical):
                    if regex.match(child.rsplit("/", 1)[1]):
                        read_conf(child)
            elif line:
                dirs.append(line)

    if root.exists("etc/ld.so.conf"):
        read_conf("etc/ld.so.conf")
    return dirs + [f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib", "/usr/lib"]


def entries(root: Root, machine: int) -> dict[str, str]:
    """soname -> the path ld.so loads it from, the first directory holding it winning."""
    _, triplet = MACHINES[machine]
    found: dict[str, str] = {}
    seen: set[str] = set()
    for directory in search_dirs(root, triplet):
        real = root.resolve(directory)
        if real is None or real in seen or root.nodes[real].kind != "dir":
            continue
        seen.add(real)
        prefix = real + "/" if real else ""
        names = sorted(p[len(prefix):] for p in root.nodes if p.startswith(prefix) and "/" not in p[len(prefix):])
        for name in names:
            if not (name.startswith("lib") or name.startswith("ld-")) or ".so" not in name:
                continue
            target = root.resolve(prefix + name)
            node = root.nodes.get(target) if target else None
            if node is not None and node.kind == "hardlink":
                node = root.nodes[node.link]
            if node is None or node.kind != "file":
                continue
            so = soname(node.data, machine)
            if so is None or so in found:
                continue
            # ldconfig enters a library by its soname, where a file or link of that name is (it makes the link).
            if root.exists(prefix + so):
                found[so] = directory.rstrip("/") + "/" + so
    return found


def cache_bytes(libraries: dict[str, str], machine: int) -> bytes:
    flags, _ = MACHINES[machine]
    ordered = sorted(libraries.items(), key=lambda kv: _libcmp_key(kv[0]), reverse=True)
    header = 48
    strings_start = header + 24 * len(ordered)
    strings, offsets = bytearray(), {}
    for text in [t for pair in ordered for t in pair]:
        if text not in offsets:
            offsets[text] = strings_start + len(strings)
            strings += text.encode() + b"\0"
    out = bytearray(b"glibc-ld.so.cache1.1")
    out += struct.pack("<IIB3xI12x", len(ordered), len(strings), 2, 0)
    for key, value in ordered:
        out += struct.pack("<iIIIQ", flags, offsets[key], offsets[value], 0, 0)
    return bytes(out + strings)


def write(root: Root, machine: int) -> int:
    libraries = entries(root, machine)
    root.file("etc/ld.so.cache", cache_bytes(libraries, machine))
    return len(libraries)
