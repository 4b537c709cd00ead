"""What every check of the static probe shares: the check record, name normalization, hashing, the site."""

from __future__ import annotations

import hashlib
import json
import re
import sysconfig

PASS, FAIL, NOT_RUN = "pass", "fail", "not_run"

# Messages that mean "this needs a GPU (or its driver)", not "this is broken".
GPU_MARKERS = (
    "cuda",
    "libcuda",
    "nvidia driver",
    "nvidia-smi",
    "nvml",
    "no gpu",
    "gpu is required",
    "failed to infer device type",
    "libnvidia",
    "cudart",
    "nccl",
)


def check(name: str, status: str, detail: str = "") -> dict:
    return {"name": name, "status": status, "detail": detail}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def canonical_json(value: object) -> str:
    # The spelling servestack writes locks in (fsutil.canonical_json).
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def site_packages(config: dict) -> str:
    return config.get("site_packages") or sysconfig.get_paths()["purelib"]



def installed_distributions(site: str) -> dict[str, list]:
    from importlib import metadata

    found: dict[str, list] = {}
    for dist in metadata.distributions(path=[site]):
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.setdefault(normalize(name), []).append(dist)
    return found



def classify_import_error(text: str, excluded: set[str]) -> tuple[str, str]:
    m = re.search(r"No module named '([\w.]+)'", text)
    if m and normalize(m.group(1).split(".")[0]) in excluded:
        return NOT_RUN, f"needs the excluded dependency {m.group(1).split('.')[0]!r}: {text}"
    lowered = text.lower()
    if any(marker in lowered for marker in GPU_MARKERS):
        return NOT_RUN, f"needs a GPU here: {text}"
    return FAIL, text
