"""The installed files against the lock: stack.json's lock, each wheel's version, the overlaid files,
the excluded dependencies and the smoke model."""

from __future__ import annotations

import hashlib
import json
import os
import re

from .report import FAIL, PASS, canonical_json, check, installed_distributions, normalize, sha256_file


def load_stack_json(config: dict) -> tuple[dict | None, dict | None]:
    path = config.get("stack_json") or "/opt/servestack/stack.json"
    try:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    except OSError as e:
        return None, check("stack-json", FAIL, f"cannot read {path}: {e}")
    except ValueError as e:
        return None, check("stack-json", FAIL, f"{path} is not valid JSON: {e}")
    if not isinstance(document, dict):
        return None, check("stack-json", FAIL, f"{path} is not a JSON object")
    return document, None


def check_lock(config: dict, stack_json: dict) -> list[dict]:
    expected = config.get("expected_lock_sha256")
    lock = stack_json.get("lock")
    if not isinstance(lock, dict):
        return [check("lock", FAIL, "stack.json has no `lock` document")]
    actual = hashlib.sha256(canonical_json(lock).encode()).hexdigest()
    recorded = stack_json.get("lock_sha256")
    problems = []
    if recorded != actual:
        problems.append(f"stack.json records lock_sha256 {recorded} but its lock document hashes to {actual}")
    if expected and actual != expected:
        problems.append(
            f"the image's lock hashes to {actual}, the host's pins lock to {expected}: "
            "the image was built from a different lock (rebuild it, or re-lock)"
        )
    if problems:
        return [check("lock", FAIL, "; ".join(problems))]
    return [check("lock", PASS, f"stack.json's lock is the host's lock (sha256 {actual})")]



def check_versions(config: dict, stack_json: dict | None, site: str) -> list[dict]:
    overlays = (stack_json or {}).get("overlays") or {}
    overlays = {normalize(k): v for k, v in overlays.items()}
    dists = installed_distributions(site)
    results = []
    for wheel in sorted(config.get("wheels") or [], key=lambda w: normalize(w["name"])):
        name = normalize(wheel["name"])
        locked = wheel["version"]
        label = f"version:{name}"
        found = dists.get(name) or []
        if not found:
            results.append(check(label, FAIL, f"{name} {locked} is locked but not installed in {site}"))
            continue
        if len(found) > 1:
            versions = sorted(d.version for d in found)
            results.append(check(label, FAIL, f"{name} is installed {len(found)} times ({', '.join(versions)})"))
            continue
        dist = found[0]
        installed = dist.version
        overlay = overlays.get(name)
        if overlay:
            expected = overlay.get("version")
            base = expected.split("+", 1)[0] if expected else None
            if installed != expected:
                results.append(check(label, FAIL, f"{name} is installed as {installed}; the overlaid build is {expected} (lock: {locked})"))
                continue
            if base and base != locked.split("+", 1)[0]:
                results.append(check(label, FAIL, f"{name}'s overlay version {expected} is not built on the locked {locked}"))
                continue
            what = f"{installed} (locked {locked} + overlay)"
        else:
            if installed != locked:
                results.append(check(label, FAIL, f"{name} is installed as {installed}, the lock says {locked}"))
                continue
            what = installed
        if dist.read_text("RECORD") is None:
            results.append(check(label, FAIL, f"{name} {installed} has no RECORD in its dist-info"))
            continue
        results.append(check(label, PASS, what))
    return results



def check_overlays(stack_json: dict | None, site: str) -> tuple[list[dict], dict[str, bool]]:
    results = []
    ok_by_package: dict[str, bool] = {}
    for package, overlay in sorted(((stack_json or {}).get("overlays") or {}).items()):
        files = overlay.get("files") or {}
        ok = True
        if not files:
            results.append(check(f"overlay:{normalize(package)}", FAIL, "stack.json lists an overlay with no files"))
            ok = False
        for rel, expected in sorted(files.items()):
            label = f"overlay:{normalize(package)}:{rel}"
            path = os.path.join(site, rel)
            if not os.path.isfile(path):
                if expected is None:
                    results.append(check(label, PASS, "deleted by the overlay, and absent"))
                else:
                    results.append(check(label, FAIL, f"overlaid file {rel} is missing from {site}"))
                    ok = False
                continue
            if expected is None:
                results.append(check(label, FAIL, f"{rel} should have been deleted by the overlay but exists"))
                ok = False
                continue
            actual = sha256_file(path)
            if actual != expected:
                results.append(check(label, FAIL, f"overlaid file {rel} has sha256 {actual}, stack.json says {expected}"))
                ok = False
            else:
                results.append(check(label, PASS, f"sha256 {actual}"))
        ok_by_package[normalize(package)] = ok
    return results, ok_by_package



def module_name(site: str, path: str) -> str:
    rel = os.path.relpath(path, site)[: -len(".py")].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def check_excluded(config: dict, site: str) -> list[dict]:
    excluded = config.get("excluded") or []
    if not excluded:
        return []
    dists = installed_distributions(site)
    patterns = {}
    for e in excluded:
        mod = normalize(e["name"]).replace("-", "_")
        patterns[e["name"]] = (
            mod.encode(),
            re.compile(
                rf"^[ \t]*(?:from[ \t]+{mod}(?:\.[\w.]+)?[ \t]+import\b|import[ \t]+(?:[\w.]+[ \t]*(?:as[ \t]+\w+)?[ \t]*,[ \t]*)*{mod}\b)",
                re.M,
            ),
        )
    importers: dict[str, list[str]] = {name: [] for name in patterns}
    for root, dirs, files in os.walk(site):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.endswith(".dist-info"))
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(root, f)
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except OSError:
                continue
            for name, (needle, rx) in patterns.items():
                if needle in data and rx.search(data.decode("utf-8", "replace")):
                    importers[name].append(module_name(site, path))
    results = []
    for e in excluded:
        name = e["name"]
        mods = sorted(importers[name])
        installed = dists.get(normalize(name))
        if installed:
            results.append(check(f"excluded:{name}", FAIL, f"{name} is excluded by the stack but installed ({installed[0].version})"))
            continue
        if mods:
            shown = ", ".join(mods[:12]) + (f", ... ({len(mods)} modules)" if len(mods) > 12 else "")
            detail = f"not installed; imported by {len(mods)} installed module(s): {shown}"
        else:
            detail = "not installed; no installed module imports it"
        results.append(check(f"excluded:{name}", PASS, detail))
    return results


def check_model(model_dir: str) -> dict:
    if not os.path.isdir(model_dir):
        return check("smoke-model", FAIL, f"the smoke model directory {model_dir} is missing")
    files = sorted(os.listdir(model_dir))
    missing = [f for f in ("config.json",) if f not in files]
    if missing:
        return check("smoke-model", FAIL, f"{model_dir} has no {', '.join(missing)} (has {files})")
    size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files if os.path.isfile(os.path.join(model_dir, f)))
    return check("smoke-model", PASS, f"{model_dir}: {len(files)} files, {size} bytes")
