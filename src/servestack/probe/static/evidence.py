"""Each pull request of the lock (its evidence re-checked in the installed files) and each local patch.

One owner for "does this evidence hold in these files": `servestack lock` calls `evidence_problem`
on the pinned wheel's archive (zipfile members), this probe on the files the image has installed
(the distribution's RECORD). Text only: nothing is imported.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable

from .report import FAIL, NOT_RUN, PASS, check, installed_distributions, normalize, site_packages


def _definition(name: str) -> str:
    return rf"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+{re.escape(name)}\b|^[ \t]*{re.escape(name)}[ \t]*(?::[^=\n]*)?="


def _find(read: Callable[[str], str | None], paths: Iterable[str], pattern: str) -> str | None:
    """The first `path:line` among `paths` whose text matches `pattern`."""
    rx = re.compile(pattern, re.M)
    for path in paths:
        text = read(path)
        if text is None:
            continue
        m = rx.search(text)
        if m:
            return f"{path}:{text.count(chr(10), 0, m.start()) + 1}"
    return None


def evidence_label(item: dict) -> str:
    if "file" in item:
        what = f"contains {item['contains']!r}" if "contains" in item else f"matches /{item['pattern']}/"
        return f"{item['file']} {what}"
    kind = next(k for k in ("attribute", "flag", "env") if k in item)
    return f"{kind} {item[kind]}"


def evidence_problem(item: dict, read: Callable[[str], str | None],
                     names: Callable[[], Iterable[str]]) -> tuple[str | None, str]:
    """(problem or None, where it was found). `read(path)` gives a package file's text or None;
    `names()` lists the package's file paths."""
    if "file" in item:
        text = read(item["file"])
        if text is None:
            return f"{item['file']} is not in the package", ""
        pattern = re.escape(item["contains"]) if "contains" in item else item["pattern"]
        where = _find(read, [item["file"]], pattern)
        return (None, where) if where else (f"{evidence_label(item)}: not found", "")
    sources = sorted(n for n in names() if n.endswith(".py"))
    if "attribute" in item:
        module, attribute = item["attribute"].split(":")
        base = module.replace(".", "/")
        paths = [p for p in (f"{base}.py", f"{base}/__init__.py") if p in set(sources)]
        if not paths:
            return f"module {module} is not in the package", ""
        text = "\n".join(read(p) or "" for p in paths)
        offset = 0
        for part in attribute.split("."):  # Class.method: the method is defined after its class
            m = re.compile(_definition(part), re.M).search(text, offset)
            if not m:
                return f"{module} defines no {attribute}", ""
            offset = m.end()
        return None, paths[0]
    if "flag" in item:
        dest = item["flag"][2:].replace("-", "_")
        pattern = rf"""["']{re.escape(item['flag'])}["']|dest=["']{dest}["']|^[ \t]+{dest}[ \t]*:"""
        where = _find(read, sources, pattern)
        return (None, where) if where else (f"no source declares the flag {item['flag']}", "")
    where = _find(read, sources, rf"""["']{re.escape(item['env'])}["']""")
    return (None, where) if where else (f"no source registers the variable {item['env']}", "")


def _installed_files(site: str, package: str) -> tuple[Callable[[str], str | None], Callable[[], list[str]]]:
    """read/names over the files one installed distribution's RECORD lists."""
    found = installed_distributions(site).get(normalize(package)) or []
    files = sorted({str(f).replace(os.sep, "/") for f in (found[0].files or [])}) if len(found) == 1 else []

    def read(path: str) -> str | None:
        if path not in files:
            return None
        try:
            with open(os.path.join(site, path), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            return None

    return read, (lambda: files)


def check_evidence(pr: dict, site: str) -> tuple[bool, str]:
    """Re-check a PR's evidence against the installed files: (all present, detail)."""
    read, names = _installed_files(site, pr.get("package") or "")
    found: list[str] = []
    missing: list[str] = []
    for item in pr.get("evidence") or []:
        problem, where = evidence_problem(item, read, names)
        (missing if problem else found).append(problem or f"{evidence_label(item)} ({where})")
    if missing:
        return False, "evidence missing in the image: " + "; ".join(missing)
    return True, "evidence in the image: " + "; ".join(found)


def _overlaid(label: str, package: str, patch_sha256: str, why: str, overlays: dict, overlay_ok: dict[str, bool]) -> dict:
    if package not in overlays:
        return check(label, FAIL, f"the lock overlays it onto {package}, but the image has no overlay for {package} ({why})")
    version = overlays[package].get("version")
    if not overlay_ok.get(package, False):
        return check(label, FAIL, f"overlaid onto {package} {version}, but overlaid files do not match ({why})")
    return check(label, PASS, f"overlaid onto {package} {version} (patch sha256 {patch_sha256[:12]}; {why})")


def check_prs(config: dict, stack_json: dict | None, overlay_ok: dict[str, bool], site: str | None = None) -> list[dict]:
    """Each PR (included, overlaid or unverified, its evidence re-checked) and each local patch (overlaid), as one check."""
    site = site or site_packages(config)
    overlays = {normalize(k): v for k, v in ((stack_json or {}).get("overlays") or {}).items()}
    results = []
    for pr in config.get("pull_requests") or []:
        label = f"pr:{pr['repo']}#{pr['number']}"
        title = pr.get("title") or ""
        package = normalize(pr.get("package") or "")
        status = pr.get("status")
        if pr.get("evidence") and status in ("included", "overlay"):
            ok, detail = check_evidence(pr, site)
            if not ok:
                results.append(check(label, FAIL, f"{status} per the lock, but {detail} ({title})"))
                continue
            title = f"{title}; {detail}"
        if status == "included":
            how = "+".join(pr.get("verified_by") or []) or "the lock"
            results.append(check(label, PASS, f"included upstream in the pinned {package}, verified by {how} ({title})"))
        elif status == "overlay":
            results.append(_overlaid(label, package, (pr.get("patch") or {}).get("sha256", ""), title, overlays, overlay_ok))
        else:
            reason = pr.get("unverified_reason") or "not classified against GitHub"
            results.append(check(label, NOT_RUN, f"unverified: {reason} ({title})"))
    for patch in config.get("local_patches") or []:
        package = normalize(patch["package"])
        label = f"patch:{package}:{os.path.basename(patch['file'])}"
        results.append(_overlaid(label, package, patch.get("sha256", ""), f"local patch: {patch.get('reason', '')}", overlays, overlay_ok))
    return results
