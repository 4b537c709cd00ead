"""What FlashInfer's JIT does on a GPU node, done here on the CPU: compile *and link* one module.

On a GPU, vLLM builds FlashInfer modules at engine start (the sampler, at least) through
FlashInfer's own JitSpec.build: a build.ninja FlashInfer writes (nvcc with its flags, then
`c++ ... -shared -L$CUDA_HOME/lib64 -L$CUDA_HOME/lib64/stubs -lcudart -lcuda`) run by ninja.
A compiler that builds a cubin proves nothing about that link: an image whose CUDA_HOME has no
lib64/, no unversioned libcudart.so or no libcuda.so stub dies there, minutes into its first start.

check_jit_link makes that same call, in a child interpreter with the image's environment and a
fresh FLASHINFER_WORKSPACE_BASE: gen_jit_spec over a tiny .cu of ours (one kernel, one call into
the runtime and one into the driver, so both libraries end up needed), spec.build(), then the
module loaded as the serving process would load it: after torch (which brings libcudart.so.13),
with the stub standing in for the node's libcuda.so.1. check_cuda_stub holds the stub to what
linking needs (SONAME libcuda.so.1) and keeps it, and any other libcuda, off the loader's path:
the node's driver brings the real one, and a stub found first fails every CUDA call.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from .elfclosure import default_loader, read_elf
from .report import FAIL, PASS, check

MODULE_NAME = "servestack_link_probe"
LINK_SOURCE = r'''// servestack's link probe: a kernel, and a call into each library FlashInfer's ldflags name.
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void servestack_scale(float *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}

extern "C" int servestack_versions(int *runtime, int *driver) {
  return (int)cudaRuntimeGetVersion(runtime) * 1000 + (int)cuDriverGetVersion(driver);
}

extern "C" int servestack_launch(float *x, int n) {
  servestack_scale<<<(n + 255) / 256, 256>>>(x, 2.0f, n);
  return (int)cudaGetLastError();
}
'''
STUB = os.path.join("lib64", "stubs", "libcuda.so")
DRIVER_SONAME = "libcuda.so.1"
STUB_LIBRARY_ERROR = 34  # CUDA_ERROR_STUB_LIBRARY: what NVIDIA's stub answers to every call
# Where the linker says what it could not do: ld's "cannot find -lcudart", an undefined reference.
LINKER_LINE = re.compile(r"(cannot find|undefined reference|ld returned|ld: |error:)")


def arch_word(cuda_arch: str) -> str:
    """The stack's cuda_arch (sm_100a) as FLASHINFER_CUDA_ARCH_LIST writes it (10.0a)."""
    match = re.fullmatch(r"sm_(\d+)(\d)([a-z]?)", cuda_arch)
    if match is None:
        raise ValueError(f"cuda_arch {cuda_arch!r}: expected sm_<major><minor>[suffix], as sm_100a")
    major, minor, suffix = match.groups()
    return f"{major}.{minor}{suffix}"


def run_child(function: Callable, args: list, env: dict[str, str], timeout: float) -> tuple[dict | None, str]:
    """Call FUNCTION (a module-level function of this package) in a fresh interpreter with ENV, on ARGS:
    (its JSON result or None, what it printed)."""
    package, _, _ = function.__module__.rpartition(".")
    root = os.path.dirname(os.path.abspath(__file__))
    for _ in package.split("."):
        root = os.path.dirname(root)  # the directory the package is imported from
    boot = ("import importlib, json, sys; sys.path.insert(0, sys.argv[1]); "
            "m = importlib.import_module(sys.argv[2]); r = getattr(m, sys.argv[3])(*json.loads(sys.argv[4])); "
            "open(sys.argv[5], 'w').write(json.dumps(r))")
    fd, out = tempfile.mkstemp(prefix="probe-child-", suffix=".json")
    os.close(fd)
    try:
        argv = [sys.executable, "-c", boot, root, function.__module__, function.__name__, json.dumps(args), out]
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=timeout)
        said = (proc.stdout + proc.stderr).strip()
        with open(out, encoding="utf-8") as f:
            text = f.read()
        if proc.returncode != 0 or not text:
            return None, f"exit {proc.returncode}: " + "\n".join(said.splitlines()[-12:])
        return json.loads(text), said
    except subprocess.TimeoutExpired:
        return None, f"did not finish within {timeout:.0f} s"
    finally:
        os.unlink(out)


def stub_path(home: str) -> str | None:
    stub = os.path.join(home, STUB)
    return os.path.realpath(stub) if home and os.path.isfile(stub) else None


def stand_in_for_the_driver(stub: str | None) -> None:
    """In a child, once its imports are done: the stub loaded by path, so that what needs libcuda.so.1 finds it by
    SONAME, as it finds the node's driver. Never on LD_LIBRARY_PATH: the imports probe the driver (the CUTLASS DSL
    asks cuDriverGetVersion), and on a CPU they must find none, as every other section finds none."""
    if stub:
        import ctypes

        ctypes.CDLL(stub)


def build_link_probe(source: str) -> dict:
    """In the child: FlashInfer's own JIT build of SOURCE (gen_jit_spec, spec.build), as at engine start."""
    from flashinfer.jit import core, env

    spec = core.gen_jit_spec(MODULE_NAME, [source])
    start = time.monotonic()
    try:
        spec.build(verbose=False)
        problem = None
    except Exception as e:
        problem = f"{type(e).__name__}: {e}"
    ninja = spec.ninja_path.read_text() if spec.ninja_path.exists() else ""
    return {"problem": problem, "seconds": time.monotonic() - start, "ninja": ninja,
            "library": str(spec.jit_library_path), "workspace": str(env.FLASHINFER_WORKSPACE_DIR)}


def load_after_torch(paths: list[str], stub: str | None) -> dict:
    """In the child: import torch (it loads the CUDA runtime, as in the serving process), then dlopen each path now."""
    import ctypes

    import torch  # noqa: F401 - its libraries are what the modules resolve against

    stand_in_for_the_driver(stub)
    problems = {}
    for path in paths:
        try:
            ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as e:
            problems[path] = str(e)
    return {"problems": problems}


def _ninja_variable(text: str, name: str) -> str:
    found = re.search(rf"^{name} = ((?:.*\$\n)*.*)$", text, re.M)
    return " ".join(found.group(1).replace("$\n", " ").split()) if found else ""


def linker_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if LINKER_LINE.search(line) and "nvcc" not in line][:8]


def _runtime_and_driver(library: str) -> tuple[list[str], str | None]:
    """What of the CUDA runtime and driver the linked module needs, and what is wrong with it: one linked against
    the real pair needs a libcudart.so.N and libcuda.so.1."""
    elf = read_elf(library)
    if elf is None:
        return [], f"{library} is not a shared object with dynamic symbols"
    needed = elf.needed
    runtime = [n for n in needed if re.fullmatch(r"libcudart\.so\.\d+", n)]
    missing = [n for n, found in (("libcudart.so.N", runtime), (DRIVER_SONAME, DRIVER_SONAME in needed)) if not found]
    return runtime + [DRIVER_SONAME], (f"{library} needs {list(needed)}, not {', '.join(missing)}" if missing else None)


def check_jit_link(config: dict) -> dict:
    name = "gpu-node:jit-link"
    home = os.environ.get("CUDA_HOME", "")
    arch = os.environ.get("FLASHINFER_CUDA_ARCH_LIST") or arch_word((config.get("gpu_node") or {}).get("cuda_arch")
                                                                    or "sm_90a")
    timeout = float(config.get("section_timeout") or 1800) / 2
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="probe-jit-link-") as tmp:
        source = os.path.join(tmp, f"{MODULE_NAME}.cu")
        with open(source, "w", encoding="utf-8") as f:
            f.write(LINK_SOURCE)
        env = {**os.environ, "FLASHINFER_WORKSPACE_BASE": os.path.join(tmp, "workspace"),
               "FLASHINFER_CUDA_ARCH_LIST": arch}
        built, said = run_child(build_link_probe, [source], env, timeout)
        if built is None:
            return check(name, FAIL, f"FlashInfer's JIT could not be driven in a child interpreter ({said})")
        how = (f"FlashInfer's gen_jit_spec + JitSpec.build on a {LINK_SOURCE.count(chr(10))}-line .cu for {arch} "
               f"(CUDA_HOME={home}, a fresh FLASHINFER_WORKSPACE_BASE; its link: c++ <objects> "
               f"{_ninja_variable(built['ninja'], 'ldflags')})")
        if built["problem"]:
            lines = linker_lines(built["problem"]) or built["problem"].splitlines()[-6:]
            return check(name, FAIL, f"{how} failed as vLLM's engine start would, after {built['seconds']:.0f} s "
                         f"(the check {time.monotonic() - start:.0f} s):\n" + "\n".join(lines)
                         + "\nCUDA_HOME needs lib64/, an unversioned libcudart.so and lib64/stubs/libcuda.so")
        library = built["library"]
        needs, problem = _runtime_and_driver(library)
        if problem:
            return check(name, FAIL, f"{how} linked, but not against the CUDA runtime and the driver: {problem}")
        stub = stub_path(home)
        loaded, said = run_child(load_after_torch, [[library], stub], dict(os.environ), timeout)
        driver = "with the stub as libcuda.so.1" if stub else "with no stub to stand in for the driver"
        if loaded is None or loaded["problems"]:
            why = said if loaded is None else "; ".join(loaded["problems"].values())
            return check(name, FAIL, f"{how} built {library}, which does not load after torch {driver}: {why}")
    return check(name, PASS, f"{how}: compiled and linked in {built['seconds']:.1f} s (the whole check "
                 f"{time.monotonic() - start:.1f} s); the module needs {' and '.join(needs)} and loads after "
                 f"torch {driver}")


def loader_directories(home: str) -> list[str]:
    """Every directory the runtime loader searches in this image (LD_LIBRARY_PATH, ld.so.cache, ld.so.conf, the
    standard ones), and the CUDA runtime's own, which torch's and the CUDA wheels' RUNPATHs reach."""
    loader = default_loader(dict(os.environ))
    dirs = [*loader.library_path, *loader.standard]
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        cache = ""
    dirs += [os.path.dirname(line.split("=>")[-1].strip()) for line in cache.splitlines() if "=>" in line]
    for conf in ["/etc/ld.so.conf", *sorted(glob.glob("/etc/ld.so.conf.d/*.conf"))]:
        try:
            with open(conf, encoding="utf-8") as f:
                dirs += [line.strip() for line in f if line.strip().startswith("/")]
        except OSError:
            pass
    dirs += [os.path.join(home, "lib"), os.path.join(home, "lib64")] if home else []
    return list(dict.fromkeys(os.path.normpath(d) for d in dirs))


def stub_answers(stub: str) -> dict:
    """In a child: what the stub answers to the driver calls a process makes first (0 is CUDA_SUCCESS)."""
    import ctypes

    lib, version, count = ctypes.CDLL(stub), ctypes.c_int(0), ctypes.c_int(0)
    return {"cuInit": lib.cuInit(0), "cuDriverGetVersion": lib.cuDriverGetVersion(ctypes.byref(version)),
            "cuDeviceGetCount": lib.cuDeviceGetCount(ctypes.byref(count))}


def check_cuda_stub(config: dict, directories: Callable[[str], list[str]] = loader_directories) -> dict:
    name = "gpu-node:cuda-stub"
    home = os.environ.get("CUDA_HOME", "")
    stub = os.path.join(home, STUB)
    if not home or not os.path.isfile(stub):
        return check(name, FAIL, f"no {STUB} under CUDA_HOME={home!r}: FlashInfer links every module it compiles with "
                     "-L$CUDA_HOME/lib64/stubs -lcuda, and the link fails (`cannot find -lcuda`)")
    elf = read_elf(os.path.realpath(stub))
    if elf is None:
        return check(name, FAIL, f"{stub} is not a shared object with dynamic symbols")
    soname = elf.soname
    if soname != DRIVER_SONAME:
        return check(name, FAIL, f"{stub} has SONAME {soname!r}, not {DRIVER_SONAME}: what links against it would "
                     f"ask the loader for {soname!r}, which no node's driver provides")
    answers, said = run_child(stub_answers, [os.path.realpath(stub)], dict(os.environ), 120)
    if answers is None:
        return check(name, FAIL, f"{stub} cannot be loaded and called in a child interpreter: {said}")
    succeeded = sorted(call for call, code in answers.items() if code == 0)
    if succeeded:
        return check(name, FAIL, f"{stub} answers {', '.join(succeeded)} with 0 (CUDA_SUCCESS): a process that loaded "
                     "it would take it for a driver (the CUTLASS DSL then reads a driver of CUDA 0.0 and refuses to "
                     f"import). A stub answers every call with an error, as NVIDIA's does ({STUB_LIBRARY_ERROR}, "
                     "CUDA_ERROR_STUB_LIBRARY)")
    stub_dir = os.path.realpath(os.path.dirname(stub))
    found = []
    for directory in directories(home):
        if os.path.realpath(directory) == stub_dir:
            found.append(f"{directory} (the stubs directory itself)")
        found += sorted(glob.glob(os.path.join(directory, "libcuda.so*")))
    if found:
        return check(name, FAIL, f"on the runtime loader's path: {', '.join(found[:6])}. The image must carry no "
                     "libcuda there: the node's driver brings libcuda.so.1, and a stub found first fails every CUDA "
                     "call (CUDA_ERROR_STUB_LIBRARY)")
    codes = ", ".join(f"{call} {code}" for call, code in sorted(answers.items()))
    return check(name, PASS, f"{stub} (SONAME {DRIVER_SONAME}; it answers {codes}) is there for linking, and no "
                 "libcuda is on the loader's path (LD_LIBRARY_PATH, ld.so.cache, ld.so.conf, the default directories, "
                 f"{home}/lib)")
