"""Which GPU code a shared object carries: its `.nv_fatbin` section read without NVIDIA's tools.

nvcc puts every translation unit's device code in a fat binary, and the linker concatenates them
into the `.nv_fatbin` section (8-byte aligned, zero-padded). A fat binary is a 16-byte header
(magic 0xBA55ED50, version 1, header size, size of what follows) and entries, each a header of
its own size followed by its payload. An entry header (little-endian) holds:

    +0  u16 kind           1 = PTX, 2 = ELF (a cubin)
    +4  u32 header size    64, 80 or 112 bytes
    +8  u64 payload size   padded to 8 bytes; the next entry follows it
    +16 u32 stored size    the payload's own size, before that padding
    +28 u32 arch           90 for sm_90a, 100 for sm_100a
    +40 u64 flags          0x8000 compressed (zstd), 0x100000 arch-specific (sm_XXa), 0x200000 family (sm_XXf)

The layout and flags were read from nvcc 13.0's own output (tests/fixtures/fatbin, made by
tests/fixtures/fatbin/make.py): kernels for sm_90, sm_90a, sm_100a, sm_100f, as PTX and as
cubins, compressed and not, from one translation unit and from two linked together.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

FATBIN_MAGICS = (0xBA55ED50, 0x466243B1)  # linked, and relocatable (-rdc) objects
KINDS = {1: "ptx", 2: "elf"}
FLAG_COMPRESSED = 0x8000
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
EM_CUDA = 190
SHT_NOBITS = 8


@dataclass(frozen=True)
class Entry:
    """One entry of a fat binary: a cubin ("elf") or PTX for one GPU architecture."""

    kind: str  # "elf", "ptx", or "kind-N" for one this parser does not know
    arch: str  # nvcc's spelling: sm_90a, sm_100f, sm_80 (compute_100a for PTX)
    flags: int
    payload: bytes
    offset: int  # of its header in the blob parsed

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)


def arch_name(number: int, flags: int, kind: str = "elf") -> str:
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY else ""
    return f"{'compute' if kind == 'ptx' else 'sm'}_{number}{suffix}"


def sm_of(word: str) -> str:
    """FLASHINFER_CUDA_ARCH_LIST's word for an architecture ("10.0a") in nvcc's spelling ("sm_100a")."""
    major, _, minor = word.partition(".")
    if not major.isdigit() or not minor[:1].isdigit():
        raise ValueError(f"{word!r} is not a CUDA architecture as FLASHINFER_CUDA_ARCH_LIST writes one (e.g. 10.0a)")
    return f"sm_{major}{minor}"


def elf_section_range(data: bytes, name: str) -> tuple[int, int] | None:
    """(offset, size) of section NAME's contents in a little-endian ELF64 file, or None when it has none."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx]
    wanted = name.encode()
    for sh_name, sh_type, _, _, offset, size, *_ in headers:
        start = names[4] + sh_name
        if data[start:data.index(b"\x00", start)] == wanted:
            return (offset, 0 if sh_type == SHT_NOBITS else size)
    return None


def elf_section(data: bytes, name: str) -> bytes | None:
    found = elf_section_range(data, name)
    return None if found is None else data[found[0]:found[0] + found[1]]


def parse_fatbin(blob: bytes) -> list[Entry]:
    """Every entry of every fat binary in BLOB (a `.nv_fatbin` section, or one fat binary)."""
    entries: list[Entry] = []
    pos = 0
    while pos < len(blob):
        if pos % 8 == 0 and blob[pos:pos + 8] == bytes(8):
            pos += 8  # the linker's padding between two translation units' fat binaries
            continue
        if len(blob) - pos < 16:
            raise ValueError(f"{len(blob) - pos} stray bytes at offset {pos:#x}, too few for a fat binary header")
        magic, version, header_size, size = struct.unpack_from("<IHHQ", blob, pos)
        if magic not in FATBIN_MAGICS:
            raise ValueError(f"no fat binary at offset {pos:#x}: magic {magic:#010x}, not {FATBIN_MAGICS[0]:#010x}")
        end = pos + header_size + size
        if version != 1 or header_size < 16 or end > len(blob):
            raise ValueError(f"a malformed fat binary header at offset {pos:#x} (version {version}, "
                             f"header {header_size} bytes, {size} bytes of entries, {len(blob) - pos} left)")
        at = pos + header_size
        while at < end:
            kind, _, entry_size, payload_size = struct.unpack_from("<HHIQ", blob, at)
            if entry_size < 64 or at + entry_size + payload_size > end:
                raise ValueError(f"a malformed fat binary entry at offset {at:#x} (header {entry_size} bytes, "
                                 f"payload {payload_size} bytes, {end - at} left in its fat binary)")
            arch, = struct.unpack_from("<I", blob, at + 28)
            flags, = struct.unpack_from("<Q", blob, at + 40)
            stored, = struct.unpack_from("<I", blob, at + 16)  # the payload's own size, before the padding
            start = at + entry_size
            payload = blob[start:start + (stored if 0 < stored <= payload_size else payload_size)]
            name = KINDS.get(kind, f"kind-{kind}")
            entries.append(Entry(kind=name, arch=arch_name(arch, flags, name), flags=flags, payload=payload, offset=at))
            at = start + payload_size
        pos = end
    return entries


def cubin_problem(entry: Entry) -> str | None:
    """None when the entry's payload is a CUDA ELF (decompressed with zstandard where the image has it)."""
    data = entry.payload
    if entry.compressed or data[:4] == ZSTD_MAGIC:
        if data[:4] != ZSTD_MAGIC:
            return f"its payload is compressed, but not with zstd (it begins {data[:4].hex()})"
        try:
            import zstandard
        except ImportError:
            return None  # the header is all this interpreter can read
        try:
            data = zstandard.ZstdDecompressor().decompressobj().decompress(data)
        except zstandard.ZstdError as e:
            return f"its zstd payload does not decompress: {e}"
    if data[:4] != b"\x7fELF" or len(data) < 20:
        return f"its payload is not an ELF file (it begins {data[:4].hex()})"
    machine, = struct.unpack_from("<H", data, 18)
    return None if machine == EM_CUDA else f"its payload is an ELF for machine {machine}, not CUDA ({EM_CUDA})"


def fatbin_entries(path: str) -> list[Entry]:
    """The entries of the shared object's `.nv_fatbin` section (none when it has no such section)."""
    with open(path, "rb") as f:
        data = f.read()
    section = elf_section(data, ".nv_fatbin")
    return parse_fatbin(section) if section else []
