"""The GPU-node section: what a GB200 node's first job needs from the image beyond the wheels.

Each check reads the image the way the node's runtime will: the libibverbs copies' compiled-in
provider directories, the name Dynamo's runtime dlopens NIXL's C API by, the cache locations the
serving libraries compute for themselves (with the root read-only and no home, as srt-slurm
starts containers), and the in-image CUDA compiler building a kernel for the target.
Only libcuda and the GPU itself stay out: the node's driver brings them.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import struct
import subprocess
import tempfile

from .report import FAIL, PASS, check, site_packages

# rdma-core's libibverbs: "<provider dir>/lib%s-rdmav<ABI>.so" and the .driver files' directory.
PROVIDER_FORMAT = re.compile(rb"(/[\x21-\x7e]+?)/lib%s-rdmav(\d+)\.so\x00")
CONFIG_DIR = re.compile(rb"\x00(/[\x21-\x7e]*libibverbs\.d)\x00")

DT_NEEDED, DT_SONAME = 1, 14


def elf_dynamic(path: str) -> tuple[str | None, list[str]]:
    """(DT_SONAME, DT_NEEDED) of a little-endian ELF64 shared object, read without binutils."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{path} is not a little-endian ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
    if dynamic is None:
        return None, []
    strtab = sections[dynamic[6]]  # sh_link: the dynamic string table
    def string(offset: int) -> str:
        start = strtab[4] + offset
        return data[start:data.index(b"\x00", start)].decode()
    soname, needed = None, []
    for at in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, value = struct.unpack_from("<qQ", data, at)
        if tag == 0:
            break
        if tag == DT_NEEDED:
            needed.append(string(value))
        elif tag == DT_SONAME:
            soname = string(value)
    return soname, needed


def libibverbs_copies(root: str, site: str) -> list[str]:
    """Every libibverbs in the image: the system's and those wheels bundle (auditwheel renames them)."""
    system = sorted({os.path.realpath(p) for p in glob.glob(os.path.join(root, "usr/lib*/**/libibverbs.so.1"), recursive=True)})
    bundled = sorted(p for p in glob.glob(os.path.join(site, "*", "libibverbs*.so*")) if not os.path.islink(p))
    return system + bundled


def _provider_problems(copy: str, root: str, providers: list[str]) -> tuple[list[str], str]:
    with open(copy, "rb") as f:
        data = f.read()
    found = PROVIDER_FORMAT.search(data)
    if not found:
        return [f"{copy}: no compiled-in provider path (lib%s-rdmav<N>.so) found"], ""
    directory, abi = found.group(1).decode(), found.group(2).decode()
    config = CONFIG_DIR.search(data)
    config_dir = config.group(1).decode() if config else "/etc/libibverbs.d"
    soname, _ = elf_dynamic(copy)
    problems = []
    for name in providers:
        provider = os.path.join(root, directory.lstrip("/"), f"lib{name}-rdmav{abi}.so")
        if not os.path.exists(provider):
            problems.append(f"{copy} looks for {directory}/lib{name}-rdmav{abi}.so, which is not in the image")
            continue
        _, needed = elf_dynamic(os.path.realpath(provider))
        if soname not in needed:
            problems.append(f"{provider} registers with {[n for n in needed if 'ibverbs' in n] or 'no libibverbs'}, "
                            f"not with {soname} that loads it: that copy would see no device")
        if not os.path.exists(os.path.join(root, config_dir.lstrip("/"), f"{name}.driver")):
            problems.append(f"{config_dir}/{name}.driver is missing: {copy} never loads the {name} provider")
    return problems, f"{os.path.basename(copy)} -> {directory}/lib{{{','.join(providers)}}}-rdmav{abi}.so"


def check_verbs_providers(config: dict, root: str = "/") -> dict:
    providers = (config.get("gpu_node") or {}).get("verbs_providers") or []
    copies = libibverbs_copies(root, site_packages(config))
    if not copies:
        return check("gpu-node:verbs-providers", FAIL, "no libibverbs in the image: UCX and NCCL cannot use InfiniBand")
    problems, seen = [], []
    for copy in copies:
        found, summary = _provider_problems(copy, root, providers)
        problems += found
        seen.append(summary)
    if problems:
        return check("gpu-node:verbs-providers", FAIL, "; ".join(problems) + ": RDMA falls back to TCP without a word")
    return check("gpu-node:verbs-providers", PASS, f"{len(copies)} libibverbs cop{'y' if len(copies) == 1 else 'ies'}, "
                 f"each finds its own provider: {'; '.join(seen)}")


def _loaded_path(handle: ctypes.CDLL) -> str:
    """Where the loader found a library: dlinfo(RTLD_DI_LINKMAP)'s l_name."""
    libdl = ctypes.CDLL(None)
    linkmap = ctypes.c_void_p()
    if libdl.dlinfo(ctypes.c_void_p(handle._handle), 2, ctypes.byref(linkmap)) != 0 or linkmap.value is None:
        return "?"
    name = ctypes.c_char_p.from_address(linkmap.value + ctypes.sizeof(ctypes.c_void_p)).value  # link_map.l_name
    return (name or b"?").decode()


def check_nixl_capi(config: dict) -> dict:
    """Dynamo's runtime dlopens NIXL's C API by bare name; unresolved, it runs its stubs without a word."""
    site = site_packages(config)
    cores = glob.glob(os.path.join(site, "dynamo", "_core*.so"))
    if not cores:
        return check("gpu-node:nixl-capi", FAIL, f"no dynamo/_core*.so under {site}: Dynamo's runtime is not installed")
    with open(cores[0], "rb") as f:
        names = sorted(set(re.findall(rb"\x00?(libnixl\w*_capi\.so)", f.read())))
    if not names:
        return check("gpu-node:nixl-capi", FAIL, f"{cores[0]} names no libnixl*_capi.so: cannot tell what it loads")
    name = names[0].decode()
    try:
        handle = ctypes.CDLL(name)
    except OSError as e:
        return check("gpu-node:nixl-capi", FAIL, f"Dynamo's runtime loads {name} by bare name and the loader does not find "
                     f"it ({e}); Dynamo then runs NIXL stubs. LD_LIBRARY_PATH={os.environ.get('LD_LIBRARY_PATH', '')!r}")
    path = os.path.realpath(_loaded_path(handle))
    if not hasattr(handle, "nixl_capi_create_configured_agent"):
        return check("gpu-node:nixl-capi", FAIL, f"{name} resolves to {path}, which lacks nixl_capi_create_configured_agent")
    if not path.startswith(os.path.realpath(site) + os.sep):
        return check("gpu-node:nixl-capi", FAIL, f"{name} resolves to {path}, outside the installed wheels")
    return check("gpu-node:nixl-capi", PASS, f"Dynamo's runtime loads {name} by bare name: {path}")


KERNEL = r'''#include <cuda_runtime.h>
#include <cuda_bf16.h>
extern "C" __global__ void scale(__nv_bfloat16 *x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __float2bfloat16(a * __bfloat162float(x[i]));
}
'''
EM_CUDA = 190


def check_cuda_compiler(config: dict) -> dict:
    arch = (config.get("gpu_node") or {}).get("cuda_arch")
    home = os.environ.get("CUDA_HOME", "")
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return check("gpu-node:cuda-compiler", FAIL, f"no nvcc (CUDA_HOME={home!r}): every kernel not shipped prebuilt "
                     "needs the network or a compiler at the first start")
    with tempfile.TemporaryDirectory(prefix="probe-nvcc-") as tmp:
        source, cubin = os.path.join(tmp, "scale.cu"), os.path.join(tmp, "scale.cubin")
        with open(source, "w", encoding="utf-8") as f:
            f.write(KERNEL)
        try:
            proc = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-o", cubin, source], capture_output=True,
                                  text=True, timeout=900, cwd=tmp)
        except subprocess.TimeoutExpired:
            return check("gpu-node:cuda-compiler", FAIL, f"{nvcc} did not build a {arch} cubin within 900 s")
        if proc.returncode != 0 or not os.path.exists(cubin):
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
            return check("gpu-node:cuda-compiler", FAIL, f"{nvcc} -arch={arch} -cubin failed (exit {proc.returncode}):\n{tail}")
        with open(cubin, "rb") as f:
            head = f.read(64)
    machine = struct.unpack_from("<H", head, 18)[0] if len(head) >= 20 else None
    if head[:4] != b"\x7fELF" or machine != EM_CUDA:
        return check("gpu-node:cuda-compiler", FAIL, f"{nvcc} wrote something that is not a CUDA ELF (e_machine {machine})")
    return check("gpu-node:cuda-compiler", PASS, f"{nvcc} built a bfloat16 kernel for {arch} to a cubin (CUDA_HOME={home})")


def _release(text: str, pattern: str) -> tuple[int, int] | None:
    found = re.search(pattern, text)
    return (int(found.group(1)), int(found.group(2))) if found else None


def check_cuda_release(config: dict) -> dict:
    """nvcc and the CUDA runtime headers beside it are one CUDA release. CCCL, which FlashInfer's JIT
    modules include (its bundled copy), refuses any other pair with `#error "CUDA compiler and CUDA
    toolkit headers are incompatible"`: on a GPU the engine then dies at start-up compiling its
    sampler (seen on an H200 with nvcc 13.5 over torch's 13.0 runtime headers)."""
    name = "gpu-node:cuda-release"
    home = os.environ.get("CUDA_HOME", "")
    nvcc, header = os.path.join(home, "bin", "nvcc"), os.path.join(home, "include", "cuda_runtime_api.h")
    if not home or not os.path.exists(nvcc) or not os.path.exists(header):
        return check(name, FAIL, f"CUDA_HOME={home!r} lacks bin/nvcc or include/cuda_runtime_api.h")
    try:
        shown = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return check(name, FAIL, f"{nvcc} --version failed: {e}")
    compiler = _release(shown, r"release (\d+)\.(\d+)")
    with open(header, encoding="utf-8", errors="replace") as f:
        runtime_version = re.search(r"#define\s+CUDART_VERSION\s+(\d+)", f.read())
    if compiler is None or runtime_version is None:
        return check(name, FAIL, f"cannot read the release of {nvcc} ({shown.strip()[-80:]!r}) or CUDART_VERSION of {header}")
    value = int(runtime_version.group(1))
    runtime = (value // 1000, value % 1000 // 10)
    if compiler != runtime:
        return check(name, FAIL, f"nvcc is CUDA {compiler[0]}.{compiler[1]} but its runtime headers are CUDA "
                     f"{runtime[0]}.{runtime[1]} (CUDART_VERSION {value}, {header}): CCCL refuses the pair, so every "
                     "FlashInfer module compiled at start-up (the sampler, the GDN prefill) fails; pin the compiler "
                     f"to the runtime's release (cuda-toolkit[nvcc] {runtime[0]}.{runtime[1]}.*)")
    return check(name, PASS, f"nvcc and the CUDA runtime headers are both CUDA {compiler[0]}.{compiler[1]} (CUDA_HOME={home})")


def section_gpu_node(config: dict) -> list[dict]:
    from .flashinfer_jit import check_cuda_stub, check_jit_link
    from .gpu_caches import check_caches
    from .gpu_kernels import check_flashinfer_path, check_kernels
    from .prebuilt import check_prebuilt

    checks = [check_verbs_providers(config), check_nixl_capi(config), check_caches(config)]
    if (config.get("gpu_node") or {}).get("cuda_arch"):
        checks += [check_cuda_release(config), check_cuda_compiler(config), check_cuda_stub(config), check_jit_link(config)]
    checks += [check_flashinfer_path(config), check_kernels(config), *check_prebuilt(config)]
    return checks
