"""The FlashInfer modules built into the image, checked as FlashInfer itself will look them up.

The lock's gpu_node.prebuilt names the modules built at image build time ("module:generator") and
the architectures each platform's copy must carry (FLASHINFER_CUDA_ARCH_LIST words, "10.0a"). For
each module: its generator, called here, must answer a spec that is AOT (`spec.is_aot`) and whose
artifact, as FlashInfer resolves it (get_aot_artifacts, spec.aot_path), is the prebuilt file at
FlashInfer's own AOT location, flashinfer/data/aot/<name>/<name>.so. A FlashInfer whose version
or flags name the module otherwise would miss it and compile at start without a word; this fails
instead. The file's `.nv_fatbin` must hold a cubin (an ELF entry) for every architecture of this
platform, and the module must load in a fresh interpreter as the serving process loads it: after
torch, with the stub standing in for the node's libcuda.so.1, through spec.build_and_load() with
FLASHINFER_DISABLE_JIT=1, so anything but the prebuilt file is an error, not a compile.
"""

from __future__ import annotations

import importlib
import os
import platform as platform_module
import tempfile
from collections.abc import Callable

from .fatbin import cubin_problem, fatbin_entries, sm_of
from .flashinfer_jit import run_child, stand_in_for_the_driver, stub_path
from .report import FAIL, PASS, check, site_packages

MACHINES = {"x86_64": "linux/amd64", "amd64": "linux/amd64", "aarch64": "linux/arm64", "arm64": "linux/arm64"}


def this_platform(config: dict) -> str:
    return config.get("platform") or MACHINES.get(platform_module.machine(), platform_module.machine())


def aot_file(site: str, name: str) -> str:
    """FlashInfer's own AOT location for module NAME (flashinfer/jit/env.py's fallback path)."""
    return os.path.join(site, "flashinfer", "data", "aot", name, f"{name}.so")


def architecture_problems(path: str, wanted: list[str]) -> tuple[list[str], list[str]]:
    """(the architectures of WANTED that PATH carries no cubin for, what it does carry), by its .nv_fatbin."""
    entries = fatbin_entries(path)
    cubins: dict[str, str | None] = {}
    for entry in entries:
        if entry.kind == "elf":
            cubins.setdefault(entry.arch, cubin_problem(entry))
    carried = sorted(cubins) + sorted({e.arch for e in entries if e.kind != "elf"})
    problems = []
    for word in wanted:
        arch = sm_of(word)
        if arch not in cubins:
            problems.append(f"no {arch} cubin")
        elif cubins[arch]:
            problems.append(f"the {arch} entry is no cubin: {cubins[arch]}")
    return problems, carried


def resolve(entry: str, site: str) -> tuple[str, list[str], str]:
    """Ask FlashInfer where module ENTRY comes from: (its name, what is wrong, where it resolves)."""
    module, _, function = entry.partition(":")
    spec = getattr(importlib.import_module(module), function)()
    name = spec.name
    wanted = aot_file(site, name)
    artifacts = [str(a.path) for a in spec.aot_artifacts]
    problems = []
    if not spec.is_aot:
        problems.append(f"FlashInfer finds no prebuilt {name}: spec.is_aot is false and the module would be compiled "
                        f"at start (FlashInfer looks for {spec.aot_path}; {wanted} "
                        f"{'exists' if os.path.exists(wanted) else 'does not exist'})")
    elif [os.path.realpath(p) for p in artifacts] != [os.path.realpath(wanted)]:
        problems.append(f"FlashInfer resolves {name} to {artifacts}, not the prebuilt {wanted}")
    if spec.is_aot and os.path.realpath(str(spec.get_library_path())) != os.path.realpath(wanted):
        problems.append(f"FlashInfer would load {spec.get_library_path()}, not the prebuilt {wanted}")
    return name, problems, wanted


def load_prebuilt(entries: list[str], stub: str | None) -> dict:
    """In the child: each module through spec.build_and_load() with JIT compilation disabled."""
    import torch  # noqa: F401 - first, as in the serving process: its libraries are what the modules resolve against

    found, specs = {}, {}
    for entry in entries:
        module, _, function = entry.partition(":")
        try:
            specs[entry] = getattr(importlib.import_module(module), function)()
        except Exception as e:
            found[entry] = {"ok": False, "why": f"{type(e).__name__}: {e}"}
    stand_in_for_the_driver(stub)
    for entry, spec in specs.items():
        try:
            spec.load(spec.aot_path)  # its own error, where FlashInfer's try_load would only log a warning
            loaded = spec.build_and_load()
            found[entry] = {"ok": True, "type": type(loaded).__name__}
        except Exception as e:
            found[entry] = {"ok": False, "why": f"{type(e).__name__}: {e}"}
    compiled = os.path.join(os.environ["FLASHINFER_WORKSPACE_BASE"], ".cache", "flashinfer")
    built = sorted(os.path.join(d, f) for d, _, files in os.walk(compiled) for f in files if f.endswith(".so"))
    return {"modules": found, "compiled": built}


def load_in_child(entries: list[str], timeout: float) -> tuple[dict[str, dict], str]:
    """Each module loaded in a fresh interpreter as the serving process loads it: ({entry: {"ok", "why"}}, how)."""
    home = os.environ.get("CUDA_HOME", "")
    stub = stub_path(home)
    with tempfile.TemporaryDirectory(prefix="probe-prebuilt-") as tmp:
        env = {**os.environ, "FLASHINFER_DISABLE_JIT": "1", "FLASHINFER_WORKSPACE_BASE": os.path.join(tmp, "workspace")}
        answer, said = run_child(load_prebuilt, [entries, stub], env, timeout)
    how = ("after torch " + ("with the stub as libcuda.so.1" if stub else f"with no stub (no {home}/lib64/stubs/libcuda.so)")
           + " through spec.build_and_load() with FLASHINFER_DISABLE_JIT=1")
    if answer is None:
        return {entry: {"ok": False, "why": f"the loading interpreter failed ({said})"} for entry in entries}, how
    loads = answer["modules"]
    if answer["compiled"]:
        loads = {entry: {"ok": False, "why": f"loading compiled {answer['compiled']} with JIT disabled"} for entry in entries}
    return loads, how


def check_prebuilt(config: dict, load: Callable[[list[str], float], tuple[dict[str, dict], str]] = load_in_child) -> list[dict]:
    prebuilt = (config.get("gpu_node") or {}).get("prebuilt")
    if not prebuilt:
        return []
    site, target = site_packages(config), this_platform(config)
    wanted_archs = (prebuilt.get("archs") or {}).get(target)
    if not wanted_archs:
        return [check("gpu-node:prebuilt", FAIL, f"gpu_node.prebuilt names no architectures for {target} "
                      f"(it has {sorted(prebuilt.get('archs') or {})})")]
    results: dict[str, tuple[str, list[str], str, list[str]]] = {}
    loadable = []
    for entry in prebuilt.get("modules") or []:
        try:
            name, problems, path = resolve(entry, site)
        except Exception as e:
            results[entry] = (entry, [f"its generator does not answer: {type(e).__name__}: {e}"], "", [])
            continue
        carried: list[str] = []
        if os.path.isfile(path):
            try:
                arch_problems, carried = architecture_problems(path, wanted_archs)
            except (OSError, ValueError) as e:
                arch_problems = [f"its .nv_fatbin cannot be read: {e}"]
            if arch_problems:
                problems.append(f"{', '.join(arch_problems)} for {target} (it carries {', '.join(carried) or 'none'})")
            loadable.append(entry)
        results[entry] = (name, problems, path, carried)
    loads, how = load(loadable, float(config.get("section_timeout") or 1800) / 2) if loadable else ({}, "")
    checks = []
    for entry, (name, problems, path, carried) in results.items():
        loaded = loads.get(entry)
        if loaded is not None and not loaded["ok"]:
            problems.append(f"it does not load {how}: {loaded['why'][-600:]}")
        label = f"gpu-node:prebuilt:{name}"
        if problems:
            checks.append(check(label, FAIL, f"{name} ({entry}), {path or 'no file'}: " + "; ".join(problems)))
        else:
            checks.append(check(label, PASS, f"{name} ({entry}) is FlashInfer's AOT artifact {path}, with cubins for "
                                f"{', '.join(sm_of(w) for w in wanted_archs)} ({target}; it carries {', '.join(carried)}), "
                                f"and loads {how}"))
    return checks
