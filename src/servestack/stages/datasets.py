"""Data sets the project ships (GSM8K in `data/gsm8k`), checked against their SHA256SUMS."""

from __future__ import annotations

from pathlib import Path

from servestack.errors import InputError
from servestack.util.fsutil import sha256_file

GSM8K_FILES = ("test.jsonl", "train.jsonl")


def gsm8k_dir(root: Path, configured: Path | None, source: Path) -> Path:
    """The GSM8K directory a pipeline uses: its `data_dir`, else the project's `data/gsm8k`.

    Both splits must be there; when the directory has a SHA256SUMS (the shipped copy does),
    every file it lists must match. Errors name `source`'s data_dir field.
    """
    data = configured or (root / "data" / "gsm8k")
    missing = [f for f in GSM8K_FILES if not (data / f).is_file()]
    if missing:
        raise InputError(source, "data_dir", f"{data} must hold {' and '.join(GSM8K_FILES)} (missing: {', '.join(missing)})")
    sums = data / "SHA256SUMS"
    if sums.is_file():
        for line in sums.read_text().splitlines():
            if not line.strip():
                continue
            want, _, name = line.strip().partition("  ")
            got = sha256_file(data / name) if (data / name).is_file() else "missing"
            if got != want:
                raise InputError(source, "data_dir", f"{data / name}: sha256 {got}, SHA256SUMS says {want}")
    return data
