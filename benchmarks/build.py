"""Measure the image build: cold, cold again (same digest?), no-op, and one overlay patch changed.

Prints one JSON document. Each cold run starts from clean state: an empty servestack cache (so
every wheel is fetched and verified, the Debian base rebuilt, every wheel installed), no BuildKit
cache, and the stack's image deleted from the registry.

    python benchmarks/build.py --stack dev-cpu
    python benchmarks/build.py --stack tinyimg --project /path/to/a/fixture/project   # has an overlay PR
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from servestack import build, image, services
from servestack.project import Project


def _delete(reference: str) -> None:
    repository_part, digest = reference.split("@")
    address, repository = repository_part.split("/", 1)
    requests.delete(f"http://{address}/v2/{repository}/manifests/{digest}", timeout=30)


# Its own registry, so deleting images between cold runs never touches what others pull.
REGISTRY = "127.0.0.1:5099"


def _run(project: Project, stack: str) -> dict:
    started = time.monotonic()
    build.build(project, stack)
    built = time.monotonic()
    result = image.build_image(project, stack, registry_address=REGISTRY)
    return {
        "seconds": round(time.monotonic() - started, 1),
        "build_seconds": round(built - started, 1),
        "image_seconds": round(time.monotonic() - built, 1),
        "digest": result["reference"].split("@")[1],
        "total_size": result["total_size"],
        "layers": len(result["layers"]),
        "largest_layer": max(layer["size"] for layer in result["layers"]),
        "layers_pushed": result["layers_pushed"],
        "bytes_pushed": result["bytes_pushed"],
        "skipped": result["skipped"],
        "reference": result["reference"],
    }


def _cold(project: Project, stack: str, scratch: Path, name: str) -> dict:
    previous = project.artifacts(stack) / "image.json"
    if previous.exists():
        _delete(json.loads(previous.read_text())["reference"])
    subprocess.run(["docker", "buildx", "prune", "-af"], capture_output=True)
    for old in scratch.iterdir():  # the production image's caches are large: keep one at a time
        shutil.rmtree(old)
    os.environ["SERVESTACK_CACHE"] = str(scratch / name)
    return _run(project, stack)


def _change_one_patch(project: Project, stack: str) -> bool:
    """Simulate an upstream PR update: edit one overlay patch's added line, re-record its hash."""
    path = project.lock_file(stack)
    document = json.loads(path.read_text())
    overlays = [p for p in document["pull_requests"] if p["status"] == "overlay"]
    if not overlays:
        return False
    patch = project.root / overlays[0]["patch"]["path"]
    lines = patch.read_text().splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.startswith("+") and not line.startswith("+++") and line.strip() != "+":
            lines[i] = line.rstrip("\n") + "  # changed\n"
            break
    patch.write_text("".join(lines))
    overlays[0]["patch"]["sha256"] = hashlib.sha256(patch.read_bytes()).hexdigest()
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return True


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stack", default="dev-cpu")
    parser.add_argument("--project", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    project = Project(args.project.resolve())
    services.ensure_registry(REGISTRY)
    report: dict = {"stack": args.stack, "registry": REGISTRY}
    with tempfile.TemporaryDirectory(prefix="servestack-bench-", dir=Path.home() / ".cache") as tmp:
        scratch = Path(tmp)
        report["cold"] = _cold(project, args.stack, scratch, "cold-1")
        report["cold_again"] = _cold(project, args.stack, scratch, "cold-2")
        report["reproducible"] = report["cold"]["digest"] == report["cold_again"]["digest"]
        report["noop"] = _run(project, args.stack)
        saved = {path: path.read_bytes() for path in [project.lock_file(args.stack), *project.patches.glob("*.diff")]}
        try:
            if _change_one_patch(project, args.stack):
                changed = _run(project, args.stack)
                changed["pushed_fraction"] = round(changed["bytes_pushed"] / changed["total_size"], 6)
                report["one_pr_changed"] = changed
            else:
                report["one_pr_changed"] = "not measured: the stack has no overlay PR"
        finally:
            for path, data in saved.items():
                path.write_bytes(data)
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0 if report["reproducible"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
