"""The probe's flow: the file checks in this process, each isolated section in a child interpreter, one report."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile

from .base import check_base
from .cpu_isa import section_cpu_isa
from .elfclosure import check_native_closure
from .engine import section_engine
from .evidence import check_prs
from .fast_path import check_fast_path_files, section_fast_path, section_loads
from .flashinfer_jit import arch_word
from .gpu_node import section_gpu_node
from .import_closure import check_import_closure
from .imports import check_entry_points, section_imports
from .installed import check_excluded, check_lock, check_model, check_overlays, check_versions, load_stack_json
from .kernel_shapes import section_kernel_shapes
from .report import FAIL, check, site_packages
from .runtime_build import runtime_builds, section_runtime_build
from .tokenizer import section_tokenizer

# The package directory: `python PACKAGE_DIR ...` runs it (see __main__), here and in the children.
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

# What runs in a child interpreter (vLLM imported): a crash or a hang there is a failed check, not a lost report.
SECTIONS = {"imports": section_imports, "engine": section_engine, "fast_path": section_fast_path, "loads": section_loads,
            "runtime_build": section_runtime_build, "tokenizer": section_tokenizer,
            "cpu_isa": section_cpu_isa, "gpu_node": section_gpu_node, "kernel_shapes": section_kernel_shapes}


def section_environment(section: str, config: dict) -> dict[str, str]:
    """What a section's interpreter is told beyond the image's environment (which wins)."""
    if section in ("engine", "fast_path", "kernel_shapes"):
        # The CUDA build cannot infer a device without a GPU; the parser itself is device-free.
        return {"VLLM_TARGET_DEVICE": "cpu"}
    arch = (config.get("gpu_node") or {}).get("cuda_arch")
    if section == "gpu_node" and arch:
        # FlashInfer takes its target from the GPUs at import, and refuses to make a JIT spec with
        # none; told the node's architecture (sm_100a -> "10.0a"), it answers as on the node.
        return {"FLASHINFER_CUDA_ARCH_LIST": arch_word(arch)}
    return {}


def run_section(config_path: str, config: dict, section: str) -> list[dict]:
    """Run one section in a child interpreter; a crash, hang or garbage is a failed check."""
    fd, out = tempfile.mkstemp(prefix=f"probe-{section}-", suffix=".json")
    os.close(fd)
    env = {**section_environment(section, config), **os.environ}
    timeout = float(config.get("section_timeout") or 1800)
    try:
        proc = subprocess.run(
            [sys.executable, PACKAGE_DIR, "--section", section, config_path, out],
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


def probe(config_path: str, config: dict) -> dict:
    site = site_packages(config)
    checks: list[dict] = []
    stack_json, problem = load_stack_json(config)
    if problem:
        checks.append(problem)
    else:
        assert stack_json is not None  # load_stack_json gives the document or the problem
        checks.extend(check_lock(config, stack_json))
        checks.extend(check_base(stack_json))
    checks.extend(check_versions(config, stack_json, site))
    overlay_checks, overlay_ok = check_overlays(stack_json, site)
    checks.extend(overlay_checks)
    checks.extend(check_prs(config, stack_json, overlay_ok, site))
    checks.extend(check_excluded(config, site))
    checks.extend(check_fast_path_files(config, site))
    if config.get("model_dir"):
        checks.append(check_model(config["model_dir"]))
        checks.extend(run_section(config_path, config, "tokenizer"))
    if config.get("modules"):
        checks.extend(run_section(config_path, config, "imports"))
    if config.get("engine"):
        checks.extend(run_section(config_path, config, "engine"))
    checks.extend(check_entry_points(config))
    if (config.get("fast_path") or {}).get("loads"):
        checks.extend(run_section(config_path, config, "loads"))  # a fresh interpreter: only these imports loaded
    if (config.get("fast_path") or {}).get("gdn_prefill"):
        checks.extend(run_section(config_path, config, "fast_path"))
    if config.get("cpu_attention_without_amx"):
        checks.extend(run_section(config_path, config, "cpu_isa"))
    if runtime_builds(config):
        checks.extend(run_section(config_path, config, "runtime_build"))
    if config.get("gpu_node"):
        checks.extend(run_section(config_path, config, "gpu_node"))
    checks.extend(check_native_closure(config))
    checks.extend(check_import_closure(config))
    if config.get("kernel_shapes"):
        checks.extend(run_section(config_path, config, "kernel_shapes"))
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
        sys.stderr.write("usage: python static CONFIG.json\n")
        return 2
    with open(argv[0], encoding="utf-8") as f:
        config = json.load(f)
    report = probe(argv[0], config)
    with os.fdopen(real_stdout, "w", encoding="utf-8") as stdout:
        stdout.write(json.dumps(report, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
