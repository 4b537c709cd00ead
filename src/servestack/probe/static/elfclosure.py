"""The native-library closure: every symbol a serving library leaves undefined is defined by a library
the image carries, found as the dynamic loader would find it.

The loader resolves lazily: a library whose provider lacks a symbol loads, and the process dies at
the first call (torch 2.13.0's libtorch_cuda.so against NCCL 2.28 misses ncclCommSuspend and seven
more, which only NCCL 2.29 defines). So this reads each ELF file's dynamic symbol table and its
version tables itself (the standard library has no ELF reader, and binutils is not in the image)
and looks each strong undefined symbol up in the library's DT_NEEDED closure, the interpreter
first, as the loader's global scope has it.
"""

from __future__ import annotations

import fnmatch
import glob
import mmap
import os
import re
import struct
from dataclasses import dataclass

from .report import FAIL, PASS, check, site_packages

SHT_DYNSYM, SHT_DYNAMIC, SHT_VERDEF, SHT_VERNEED, SHT_VERSYM = 11, 6, 0x6FFFFFFD, 0x6FFFFFFE, 0x6FFFFFFF
DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH = 1, 14, 15, 29
STB_WEAK = 2
# The node's driver mounts these into the container (enroot's nvidia hook): no image carries them,
# and what they define is the driver's API, named by its prefix.
HOST_PROVIDED = {"libcuda.so.1": ("cu",), "libnvidia-ml.so.1": ("nvml",)}
HOST_REASON = "brought by the node's NVIDIA driver at container start, not by the image"
STANDARD_DIRS = ("/lib/{t}", "/usr/lib/{t}", "/lib64", "/usr/lib64", "/lib", "/usr/lib")


@dataclass(frozen=True, kw_only=True)
class Elf:
    path: str
    soname: str | None
    needed: tuple[str, ...]
    search: tuple[str, ...]  # RPATH or RUNPATH directories, $ORIGIN expanded
    defined: dict[str, frozenset[str]]  # name -> versions it is defined at ("" for none)
    undefined: tuple[tuple[str, str, str], ...]  # (name, version, the library the version names)


@dataclass(frozen=True, kw_only=True)
class Missing:
    symbol: str
    library: str
    expected_from: str


def _string(data: mmap.mmap, offset: int) -> str:
    return bytes(data[offset:data.find(b"\x00", offset)]).decode(errors="replace")


def read_elf(path: str) -> Elf | None:
    """The dynamic-linking view of a little-endian ELF64 file; None for anything else."""
    with open(path, "rb") as f:
        if f.read(6) != b"\x7fELF\x02\x01":
            return None
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    by_type = {s[1]: s for s in sections}
    dynsym, dynamic = by_type.get(SHT_DYNSYM), by_type.get(SHT_DYNAMIC)
    if dynsym is None or dynamic is None:
        return None
    strtab = sections[dynsym[6]][4]
    versions = _version_names(data, sections, by_type)
    versym = by_type.get(SHT_VERSYM)
    defined: dict[str, set[str]] = {}
    undefined = []
    for index, (name_at, info, _other, shndx, _value, _size) in enumerate(
            struct.iter_unpack("<IBBHQQ", data[dynsym[4]:dynsym[4] + dynsym[5]])):
        if index == 0 or not name_at:
            continue
        name = _string(data, strtab + name_at)
        ver = struct.unpack_from("<H", data, versym[4] + 2 * index)[0] & 0x7FFF if versym else 0
        version, library = versions.get(ver, ("", ""))
        if shndx:
            defined.setdefault(name, set()).add(version)
        elif info >> 4 != STB_WEAK:  # a weak reference may stay unresolved by design
            undefined.append((name, version, library))
    soname, needed, rpath, runpath = None, [], "", ""
    dstr = sections[dynamic[6]][4]
    for tag, value in struct.iter_unpack("<qQ", data[dynamic[4]:dynamic[4] + dynamic[5]]):
        if tag == 0:
            break
        if tag == DT_NEEDED:
            needed.append(_string(data, dstr + value))
        elif tag == DT_SONAME:
            soname = _string(data, dstr + value)
        elif tag == DT_RPATH:
            rpath = _string(data, dstr + value)
        elif tag == DT_RUNPATH:
            runpath = _string(data, dstr + value)
    origin = os.path.dirname(os.path.abspath(path))
    search = tuple(d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                   for d in (runpath or rpath).split(":") if d)
    return Elf(path=path, soname=soname, needed=tuple(needed), search=search,
               defined={k: frozenset(v) for k, v in defined.items()}, undefined=tuple(undefined))


def _version_names(data: mmap.mmap, sections: list[tuple[int, ...]], by_type: dict[int, tuple[int, ...]]
                   ) -> dict[int, tuple[str, str]]:
    """Version index -> (version name, the library a needed version comes from; "" when defined here)."""
    names: dict[int, tuple[str, str]] = {}
    verdef = by_type.get(SHT_VERDEF)
    if verdef:
        strtab, at = sections[verdef[6]][4], verdef[4]
        for _ in range(verdef[7]):  # sh_info: the number of entries
            _v, _flags, ndx, _cnt, _hash, aux, nxt = struct.unpack_from("<HHHHIII", data, at)
            names[ndx] = (_string(data, strtab + struct.unpack_from("<I", data, at + aux)[0]), "")
            at += nxt
    verneed = by_type.get(SHT_VERNEED)
    if verneed:
        strtab, at = sections[verneed[6]][4], verneed[4]
        for _ in range(verneed[7]):
            _v, cnt, file_at, aux, nxt = struct.unpack_from("<HHIII", data, at)
            library, entry = _string(data, strtab + file_at), at + aux
            for _ in range(cnt):
                _hash, _flags, other, name_at, next_aux = struct.unpack_from("<IHHII", data, entry)
                names[other] = (_string(data, strtab + name_at), library)
                entry += next_aux
            at += nxt
    return names


@dataclass(frozen=True, kw_only=True)
class Loader:
    """Where the loader looks: a library's own RPATH/RUNPATH, LD_LIBRARY_PATH, the standard directories."""

    library_path: tuple[str, ...]
    standard: tuple[str, ...]

    def find(self, name: str, elf: Elf) -> str | None:
        if "/" in name:
            return name if os.path.exists(name) else None
        for directory in (*elf.search, *self.library_path, *self.standard):
            candidate = os.path.join(directory, name)
            if os.path.isfile(candidate):
                return os.path.realpath(candidate)
        return None


def default_loader(env: dict[str, str], root: str = "/") -> Loader:
    triplets = [os.path.basename(p) for p in glob.glob(os.path.join(root, "usr/lib/*-linux-gnu"))]
    standard = tuple(os.path.join(root, d.format(t=t).lstrip("/")) for t in triplets or [""] for d in STANDARD_DIRS)
    return Loader(library_path=tuple(p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p),
                  standard=tuple(dict.fromkeys(standard)))


class Closure:
    """Reads each file once; answers which symbols a library's needed closure leaves undefined."""

    def __init__(self, loader: Loader, scope: tuple[str, ...] = ()):
        self.loader, self.scope = loader, scope
        self._elves: dict[str, Elf | None] = {}

    def elf(self, path: str) -> Elf | None:
        if path not in self._elves:
            self._elves[path] = read_elf(path)
        return self._elves[path]

    def _scope(self) -> list[Elf]:
        """The interpreter and what it links: in the global scope before any library python loads."""
        if not hasattr(self, "_global"):
            roots = [e for e in (self.elf(s) for s in self.scope) if e is not None]
            self._global = roots + [p for r in roots for p in self._providers(r)[0]]
        return self._global

    def _providers(self, elf: Elf) -> tuple[list[Elf], list[str]]:
        """Breadth-first over DT_NEEDED, as the loader orders its search; and the needed names not found."""
        found, lost, queue, seen = [], [], [elf], {elf.path}
        while queue:
            current = queue.pop(0)
            for name in current.needed:
                path = self.loader.find(name, current)
                if path is None:
                    lost.append(name)
                elif path not in seen:
                    seen.add(path)
                    provider = self.elf(path)
                    if provider is not None:
                        found.append(provider)
                        queue.append(provider)
        return found, lost

    def missing(self, path: str, loaded: tuple[str, ...] = ()) -> tuple[list[Missing], list[str]]:
        """What `path` leaves undefined in a process that has already loaded `loaded` (torch's and the
        CUDA wheels' libraries, which `import torch` loads first, and the package's own bundled ones):
        a needed name matches an already-loaded library by its soname, as the loader matches it."""
        elf = self.elf(path)
        if elf is None:
            return [], []
        providers, lost = self._providers(elf)
        present = [e for e in (self.elf(p) for p in loaded) if e is not None]
        names = {n for e in present for n in (e.soname, os.path.basename(e.path)) if n}
        lost = [name for name in lost if name not in names]
        providers += self._scope() + present
        host = tuple(p for name in lost if name in HOST_PROVIDED for p in HOST_PROVIDED[name])
        problems = [Missing(symbol=f"the library {name}", library=path, expected_from="nowhere on the loader's path")
                    for name in lost if name not in HOST_PROVIDED]
        for symbol, version, library in elf.undefined:
            if host and symbol.startswith(host):
                continue
            if any(_provides(p, symbol, version) for p in providers) or symbol in elf.defined:
                continue
            problems.append(Missing(symbol=f"{symbol}@{version}" if version else symbol, library=path,
                                    expected_from=library or _guess_provider(symbol, providers)))
        return problems, [name for name in lost if name in HOST_PROVIDED]


def _provides(provider: Elf, symbol: str, version: str) -> bool:
    versions = provider.defined.get(symbol)
    if versions is None:
        return False
    # A provider without version definitions answers any version, as glibc's lookup does.
    return not version or version in versions or versions == {""}


def _guess_provider(symbol: str, providers: list[Elf]) -> str:
    """Where an unversioned symbol was meant to come from: the needed library sharing its prefix."""
    stem = symbol.lstrip("_")[:4].lower()
    named = [os.path.basename(p.path) for p in providers if stem and stem in os.path.basename(p.path).lower()]
    return named[0] if named else "none of its needed libraries"


PRELOADED = ["torch/lib/*.so*", "nvidia/*/lib/*.so*"]
# What a package's own import loads into the global scope before any of its libraries: FlashInfer's
# modules (prebuilt or JIT) come in through tvm_ffi.load_module, after `import tvm_ffi` loaded
# libtvm_ffi.so with RTLD_GLOBAL, so their TVMFFI* symbols resolve there and no DT_NEEDED names it.
IMPORTED_FIRST = {"flashinfer": ["tvm_ffi/lib/libtvm_ffi.so"]}


def libraries(site: str, patterns: list[str]) -> list[str]:
    found = set()
    for pattern in patterns:
        for path in glob.glob(os.path.join(site, pattern), recursive=True):
            if os.path.isfile(path) and not os.path.islink(path) and ".so" in os.path.basename(path):
                found.add(path)
    return sorted(found)


def _torch_tag(site: str) -> str | None:
    """The installed torch's major and minor as builds name them (2.13.0 -> "213")."""
    found = glob.glob(os.path.join(site, "torch-*.dist-info"))
    version = re.match(r"torch-(\d+)\.(\d+)", os.path.basename(found[0])) if found else None
    return version.group(1) + version.group(2) if version else None


def _loadable_here(path: str, torch_tag: str | None) -> bool:
    """An extension module built for another Python (`_C.cpython-313-x86_64-linux-gnu.so`) or another
    torch (`nixl_ep_cpp_torch211...`, beside the one for the torch installed) is never loaded."""
    import sys

    name = os.path.basename(path)
    python = re.search(r"\.(cpython-\d+)", name)
    if python and python.group(1) != sys.implementation.cache_tag:
        return False
    torch = re.search(r"_torch(\d{3})\b", name)
    return not (torch and torch_tag and torch.group(1) != torch_tag)


def _plugin(path: str, plugins: dict) -> bool:
    return any(fnmatch.fnmatch(os.path.basename(path), pattern) for pattern in plugins.get("optional", []))


def check_native_closure(config: dict, env: dict[str, str] | None = None, root: str = "/") -> list[dict]:
    """Per package: every strong undefined symbol of its shared libraries resolves. Optional plugins
    (NIXL's backends: GPUNETIO needs DOCA, which a node without it does not load) are named, not failed."""
    spec = config.get("native_closure") or {}
    if not spec.get("libraries"):
        return []
    site = site_packages(config)
    import sys

    closure = Closure(default_loader(dict(os.environ) if env is None else env, root),
                      scope=(os.path.realpath(sys.executable),))
    results = []
    # `import torch` loads its own libraries and the CUDA wheels' (torch/__init__.py's global deps)
    # before vLLM, FlashInfer or NIXL load theirs.
    first = tuple(libraries(site, PRELOADED))
    plugins = spec.get("plugins") or {}
    torch_tag = _torch_tag(site)
    for package, patterns in sorted(spec["libraries"].items()):
        files = [f for f in libraries(site, patterns) if _loadable_here(f, torch_tag)]
        label = f"native-closure:{package}"
        if not files:
            if package in (spec.get("optional") or []):
                results.append(check(label, PASS, f"{package} carries no shared library here ({', '.join(patterns)}): "
                                                  "its kernels are compiled at first use"))
            else:
                results.append(check(label, FAIL, f"no shared library of {package} under {site} ({', '.join(patterns)})"))
            continue
        by_library: dict[str, list[Missing]] = {}
        host: set[str] = set()
        imported = tuple(libraries(site, IMPORTED_FIRST.get(package, [])))
        for path in files:
            found, left = closure.missing(path, loaded=first + imported + tuple(files))
            if found:
                by_library[path] = found
            host.update(left)
        unloadable = sorted(os.path.basename(p) for p in by_library if _plugin(p, plugins))
        problems = {p: m for p, m in by_library.items() if not _plugin(p, plugins)}
        shown = [f"{os.path.relpath(path, site)}: {', '.join(m.symbol for m in missing[:3])}"
                 f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''} (expected from {missing[0].expected_from})"
                 for path, missing in list(problems.items())[:8]]
        notes = (f"; {', '.join(sorted(host))} {HOST_REASON}" if host else "") + (
            f"; optional plugins that cannot load here, lacking their own libraries: {', '.join(unloadable)}"
            if unloadable else "")
        if problems:
            count = sum(len(m) for m in problems.values())
            results.append(check(label, FAIL, f"{count} undefined symbols in {len(problems)} of {len(files)} libraries "
                                              f"resolve nowhere in the image: {'; '.join(shown)}{notes}"))
        else:
            results.append(check(label, PASS, f"every strong undefined symbol of {len(files)} libraries resolves in "
                                              f"its needed closure{notes}"))
    return results
