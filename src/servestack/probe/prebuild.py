"""Runs inside the image while it is built (image/kernels.py): what the serving path would compile at
start, compiled now, by the image's own nvcc, g++ and FlashInfer, for the stack's target GPUs.

    python prebuild.py OUT ARCHS MODULE...     (in a container allowed to make pid namespaces)

ARCHS is FLASHINFER_CUDA_ARCH_LIST's words ("9.0a 10.0a"); each MODULE a "module:generator" of
FlashInfer's JIT. OUT receives the tree the image's prebuilt layer holds, relative to `/`, and `prebuilt.json`, what
was built and how long it took.

Three things, in this order, because each needs the one before:
1. CUDA_HOME gets the layout FlashInfer's and torch's link lines assume (`-L$CUDA_HOME/lib64
   -L$CUDA_HOME/lib64/stubs -lcudart -lcuda`): the CUDA 13 wheels ship `lib/libcudart.so.13` only.
2. The driver-API stub under lib64/stubs: a library exporting every entry point the image's own
   cuda.h declares, each answering CUDA_ERROR_STUB_LIBRARY, with the driver's SONAME, so a module
   links as it would against NVIDIA's stub and loads the real driver on the node. It holds no
   driver code, and it is never on a loader path.
3. Each module built by FlashInfer's own JitSpec (its flags, its ninja file, its link line), then
   laid where FlashInfer looks before it compiles: flashinfer/data/aot/<name>/<name>.so.

Standard library plus the image's FlashInfer only; nothing of servestack's is importable here.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DRIVER_SONAME = "libcuda.so.1"
# The stub's source file name is part of its symbol table: fixed, so the bytes are.
STUB_SOURCE = "cuda_driver_stub.c"
WORKSPACE = "/tmp/servestack-prebuild"
_DECLARED = re.compile(r"\b(cu[A-Z]\w*)\s*\(")


def cuda_layout(cuda_home: Path, out: Path) -> dict[str, str]:
    """lib64 -> lib and the unversioned libcudart.so, made in the image and recorded under OUT."""
    made = {}
    lib = cuda_home / "lib"
    runtimes = sorted(p.name for p in lib.glob("libcudart.so.*") if re.fullmatch(r"libcudart\.so\.\d+", p.name))
    if len(runtimes) != 1:
        raise SystemExit(f"prebuild: {lib} holds {runtimes or 'no libcudart.so.N'}; expected exactly one CUDA runtime")
    links = {cuda_home / "lib64": "lib", lib / "libcudart.so": runtimes[0]}
    for path, target in links.items():
        if not path.is_symlink() and not path.exists():
            path.symlink_to(target)
        mirror = out / path.relative_to("/")
        mirror.parent.mkdir(parents=True, exist_ok=True)
        mirror.symlink_to(target)
        made[str(path)] = target
    return made


def driver_entry_points(cuda_h: Path) -> tuple[list[str], int]:
    """Every cu* function cuda.h declares, by the name code calls after its macros (cuMemAlloc_v2) and by
    the plain name, as NVIDIA's own stub exports both; and the header's CUDA_ERROR_STUB_LIBRARY."""
    preprocessed = subprocess.run(["gcc", "-E", "-P", "-x", "c", str(cuda_h)], check=True, capture_output=True,
                                  text=True).stdout
    names = set(_DECLARED.findall(preprocessed)) | set(_DECLARED.findall(cuda_h.read_text()))
    code = re.search(r"\bCUDA_ERROR_STUB_LIBRARY\s*=\s*(\d+)", preprocessed)
    if code is None:
        raise SystemExit(f"prebuild: {cuda_h} defines no CUDA_ERROR_STUB_LIBRARY; expected CUDA's driver API header")
    return sorted(names), int(code[1])


def driver_stub(cuda_home: Path, out: Path) -> dict[str, object]:
    """lib/stubs/libcuda.so, built with the image's gcc from the image's cuda.h."""
    names, stub_error = driver_entry_points(cuda_home / "include" / "cuda.h")
    if len(names) < 100:
        raise SystemExit(f"prebuild: {cuda_home}/include/cuda.h declares {len(names)} driver entry points; "
                         "expected hundreds (is it CUDA's driver API header?)")
    stubs = cuda_home / "lib" / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / STUB_SOURCE
        # Every call answers CUDA_ERROR_STUB_LIBRARY, as NVIDIA's stub does: a stub that says "success"
        # once found at run time makes the CUTLASS DSL read driver version 0.0 and refuse to import.
        source.write_text("".join(f"int {name}(void) {{ return {stub_error}; }}\n" for name in names))
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-nostdlib", f"-Wl,-soname,{DRIVER_SONAME}",
                        "-o", str(stubs / "libcuda.so"), STUB_SOURCE], cwd=tmp, check=True)
    target = out / (stubs / "libcuda.so").relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(stubs / "libcuda.so", target)
    return {"path": str(stubs / "libcuda.so"), "soname": DRIVER_SONAME, "entry_points": len(names),
            "answers": stub_error}


def build_module(reference: str, out: Path) -> dict[str, object]:
    """One FlashInfer module by its own JitSpec (its flags, ninja file and link line), copied to its AOT path under OUT."""
    module_name, generator = reference.split(":")
    from flashinfer.jit import env as jit_env

    spec = getattr(importlib.import_module(module_name), generator)()
    aot = jit_env.FLASHINFER_AOT_DIR / spec.name / f"{spec.name}.so"
    started = time.monotonic()
    spec.build(verbose=True)
    target = out / aot.relative_to("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(spec.jit_library_path, target)
    return {"module": reference, "name": spec.name, "path": str(aot), "seconds": round(time.monotonic() - started, 1),
            "bytes": target.stat().st_size}


def main(argv: list[str]) -> int:
    out, archs, modules = Path(argv[0]), argv[1], argv[2:]
    cuda_home = Path(os.environ["CUDA_HOME"])
    # FlashInfer reads these when its jit package is imported: set before the first import.
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = archs
    # A fixed place: the objects' paths are in the link line.
    os.environ["FLASHINFER_WORKSPACE_BASE"] = WORKSPACE
    # nvcc names its temporary files in /tmp after its process id, and the names land in the module's
    # symbol table: each nvcc starts as process 1 of its own pid namespace (through FlashInfer's own
    # launcher setting), so the bytes do not depend on what else ran or on how many cores ran it; one
    # at a time (FlashInfer's MAX_JOBS), since two processes 1 would share their temporary files' names.
    os.environ["FLASHINFER_NVCC_LAUNCHER"] = "unshare --pid --fork"
    os.environ["MAX_JOBS"] = "1"
    record = {"archs": archs.split(), "layout": cuda_layout(cuda_home, out), "stub": driver_stub(cuda_home, out)}
    record["modules"] = [build_module(reference, out) for reference in modules]
    (out / "prebuilt.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
