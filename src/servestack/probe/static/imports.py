"""What must start: each module imports (an isolated section), each entry point (the Dynamo workers'
`python -m MODULE --help`) prints a usage."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import traceback

from .report import FAIL, PASS, check, classify_import_error, normalize


def section_imports(config: dict) -> list[dict]:
    import importlib

    excluded = {normalize(e["name"]) for e in config.get("excluded") or []}
    results = []
    for module in config.get("modules") or []:
        start = time.monotonic()
        try:
            importlib.import_module(module)
        except BaseException as e:
            text = f"{type(e).__name__}: {e}".strip()
            status, detail = classify_import_error(text, excluded)
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
        status, detail = classify_import_error("\n".join(err[-1:]) or f"no usage printed (exit {proc.returncode})", excluded)
        where = "\n".join(err[-8:-1])
        results.append(check(label, status, f"exit {proc.returncode}: {detail}" + (f"\n{where}" if where else "")))
    return results
