"""The stack's fast path (GB200): torch's CUDA, the packages it needs, the CUDA builds its packages
load, vLLM's GDN prefill backend.

The lock's `fast_path` says what the image needs for its fast path. torch's CUDA and the
installed distributions are read from files; the GDN prefill backend is what vLLM's own resolver
answers for a simulated device (its platform object swapped for one reporting that capability),
in a child process like every import.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from .report import FAIL, PASS, check, classify_import_error, installed_distributions, normalize, site_packages

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


# --------------------------------------------------------------------------- what an import loads
#
# Packages that pick a CUDA build at import time (nixl -> nixl_cu<N>, the CUTLASS DSL ->
# _cutlass_ir.cu<N>) are imported, and every file the process then has loaded (modules' files and
# mapped shared objects) is traced back to the distribution whose RECORD lists it. The stack's
# `fast_path.loads` names the build each must pick; an excluded distribution's file loaded fails.


def _owners(site: str) -> dict[str, str]:
    """Real path of every file an installed distribution's RECORD lists -> that distribution."""
    owners: dict[str, str] = {}
    for name, dists in installed_distributions(site).items():
        for dist in dists:
            for f in dist.files or ():
                owners[os.path.realpath(os.path.join(site, str(f)))] = name
    return owners


def _loaded_files() -> set[str]:
    paths = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths.update(line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6)
    except OSError:  # not Linux: the modules' files alone
        pass
    return {os.path.realpath(p) for p in paths if p and p.startswith("/") and os.path.isfile(p)}


def section_loads(config: dict) -> list[dict]:
    import importlib

    loads = (config.get("fast_path") or {}).get("loads") or {}
    if not loads:
        return []
    site = site_packages(config)
    excluded = {normalize(e["name"]) for e in config.get("excluded") or []}
    owners = _owners(site)
    results = []
    for module, wanted in sorted(loads.items()):
        label = f"fast-path:loads:{module}"
        try:
            importlib.import_module(module)
        except BaseException as e:
            status, detail = classify_import_error(f"{type(e).__name__}: {e}", excluded)
            if detail.startswith("needs the excluded"):  # needing an excluded twin is what this check catches
                status = FAIL
            results.append(check(label, status, f"import {module} failed, so which build it loads is unknown: {detail}"))
            continue
        by_dist: dict[str, list[str]] = {}
        for path in sorted(_loaded_files()):
            if path in owners:
                by_dist.setdefault(owners[path], []).append(os.path.relpath(path, site))
        twins = sorted(d for d in by_dist if d in excluded)
        native = [p for p in by_dist.get(normalize(wanted), []) if ".so" in os.path.basename(p)]
        stem = re.sub(r"-?cu\d+$", "", normalize(wanted))  # nixl-cu13 -> nixl: the package and its builds
        family = sorted(d for d in by_dist if d in excluded or d.startswith(stem))
        shown = ", ".join(f"{d} ({len(by_dist[d])} files)" for d in family)
        if twins:
            results.append(check(label, FAIL, f"import {module} loaded files of the excluded {', '.join(twins)}: {shown}"))
        elif normalize(wanted) not in by_dist:
            results.append(check(label, FAIL, f"import {module} loaded nothing of {wanted}; of its family it loaded "
                                              f"{shown or 'nothing'} ({len(by_dist)} distributions in all)"))
        else:
            first = (native or by_dist[normalize(wanted)])[0]
            results.append(
                check(
                    label,
                    PASS,
                    f"import {module} loads {wanted} ({first}); of {len(by_dist)} distributions "
                    f"with files loaded, {shown}; nothing of the excluded {', '.join(sorted(excluded)) or '(none)'}",
                )
            )
    return results


@dataclass(frozen=True, kw_only=True)
class ResolverAnswer:
    requested: str
    chosen: str
    runtime: int  # the CUDA runtime major the simulated device reports
    where: str  # the resolver asked, and the platform it was asked through


def ask_gdn_resolver(*, major: int, minor: int, head_k_dim: int, excluded: list[dict]) -> ResolverAnswer | str:
    """vLLM's own GDN prefill resolver on a simulated device; a sentence when it cannot be asked."""
    import importlib
    import types

    try:
        from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum
        try:
            from vllm.platforms.cuda import CudaPlatformBase as Base
            platform_from = "vLLM's CUDA platform"
        except BaseException as e:
            import torch

            class Base(Platform):  # type: ignore[no-redef]
                @classmethod
                def get_cuda_runtime_major(cls) -> int:
                    # CudaPlatformBase's rule: the major of torch.version.cuda, 0 if undetermined.
                    major = (torch.version.cuda or "0").split(".", 1)[0]
                    return int(major) if major.isdigit() else 0

            platform_from = f"vLLM's platform interface + torch.version.cuda ({type(e).__name__} loading vllm.platforms.cuda here)"
        module: Any = None  # one of vLLM's modules, which are untyped to mypy here
        for name in GDN_RESOLVER_MODULES:
            try:
                module = importlib.import_module(name)
                break
            except ModuleNotFoundError:
                continue
    except BaseException as e:
        _, detail = classify_import_error(f"{type(e).__name__}: {e}", {normalize(x["name"]) for x in excluded})
        return f"cannot load vLLM's platform or GDN layer: {detail}"
    resolver = getattr(module, "_resolve_gdn_prefill_backend", None) if module else None
    if resolver is None:
        return f"the installed vLLM has no GDN prefill resolver (looked in {', '.join(GDN_RESOLVER_MODULES)})"

    class SimulatedDevice(Base):
        """vLLM's CUDA platform, reporting the target's compute capability instead of asking NVML."""

        _enum = PlatformEnum.CUDA

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major=major, minor=minor)

    text_config = types.SimpleNamespace(linear_key_head_dim=head_k_dim)
    vllm_config = types.SimpleNamespace(additional_config={}, model_config=types.SimpleNamespace(hf_text_config=text_config))
    saved = module.current_platform
    module.current_platform = SimulatedDevice()
    try:
        requested, chosen = resolver(vllm_config)
        runtime = SimulatedDevice.get_cuda_runtime_major()
    except BaseException as e:
        return f"vLLM's GDN prefill resolver failed on the simulated device: {type(e).__name__}: {e}"
    finally:
        module.current_platform = saved
    return ResolverAnswer(requested=requested, chosen=chosen, runtime=runtime,
                          where=f"{module.__name__}._resolve_gdn_prefill_backend ({platform_from})")


def section_fast_path(config: dict) -> list[dict]:
    """Ask vLLM's GDN prefill backend resolver what it picks on the stack's target device."""
    spec = (config.get("fast_path") or {}).get("gdn_prefill")
    if not spec:
        return []
    label = "fast-path:gdn-prefill"
    major, minor = (int(x) for x in spec["device_capability"].split("."))
    answer = ask_gdn_resolver(major=major, minor=minor, head_k_dim=spec["head_k_dim"], excluded=config.get("excluded") or [])
    if isinstance(answer, str):
        status = FAIL if not answer.startswith("cannot load") else \
            classify_import_error(answer, {normalize(x["name"]) for x in config.get("excluded") or []})[0]
        return [check(label, status, answer)]
    status = PASS if answer.chosen == spec["backend"] else FAIL
    return [check(label, status,
                  f"{answer.where} on a simulated SM{major}{minor} device (head_k_dim {spec['head_k_dim']}, CUDA runtime "
                  f"major {answer.runtime}, requested {answer.requested!r}) chooses {answer.chosen}; the stack requires "
                  f"{spec['backend']}")]
