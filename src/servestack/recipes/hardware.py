"""What each `gpu_type` is, in one table with its sources, and a recipe checked against it.

A GB200 recipe written for 8 GPUs per node, an NVFP4 model on Hopper, or an arm64 image on an x86
node all get an allocation before they fail; these facts turn each into an error in the file.
"""

from __future__ import annotations

from dataclasses import dataclass

from servestack.platforms import PLATFORMS
from servestack.recipes.structure import Checker, is_int
from servestack.util.yamlfile import Node

FP4 = frozenset({"nvfp4", "fp4", "mxfp4"})


@dataclass(frozen=True, kw_only=True)
class Gpu:
    name: str
    gpus_per_node: int | None  # None: any (a CPU deployment counts its workers as devices)
    arch: str | None  # the node's CPU, as an image platform names it (linux/arm64, linux/amd64)
    memory_gb: int | None
    nvlink_domain: int | None  # GPUs one NVLink fabric joins
    imex_multinode: bool  # NVLink across nodes needs IMEX channels in the job
    precisions: frozenset[str]
    source: str
    capability: tuple[int, int] | None = None  # CUDA compute capability (NVIDIA's CUDA GPUs table); None: no GPU


_HOPPER = frozenset({"fp8", "bf16", "bfloat16", "fp16", "float16", "auto"})
_BLACKWELL = _HOPPER | FP4

GPUS = {g.name: g for g in (
    Gpu(name="gb200", gpus_per_node=4, arch="linux/arm64", memory_gb=186, nvlink_domain=72, imex_multinode=True,
        precisions=_BLACKWELL, source="NVIDIA GB200 NVL72 datasheet: 18 compute trays of 2 Grace CPUs + 4 Blackwell "
                                      "GPUs, 13.4 TB HBM3e over 72 GPUs, one 72-GPU NVLink domain; multi-node NVLink "
                                      "memory needs IMEX (NVIDIA IMEX guide); FP4 tensor cores are Blackwell's",
        capability=(10, 0)),
    Gpu(name="gb300", gpus_per_node=4, arch="linux/arm64", memory_gb=288, nvlink_domain=72, imex_multinode=True,
        precisions=_BLACKWELL, source="NVIDIA GB300 NVL72 datasheet: 4 Blackwell Ultra GPUs per tray, 288 GB HBM3e "
                                      "each, one 72-GPU NVLink domain; IMEX as for GB200", capability=(10, 3)),
    Gpu(name="b200", gpus_per_node=8, arch="linux/amd64", memory_gb=180, nvlink_domain=8, imex_multinode=False,
        precisions=_BLACKWELL, source="NVIDIA HGX B200 datasheet: 8 GPUs on x86 hosts, 1.44 TB HBM3e, NVLink within "
                                      "the board", capability=(10, 0)),
    Gpu(name="h200", gpus_per_node=8, arch="linux/amd64", memory_gb=141, nvlink_domain=8, imex_multinode=False,
        precisions=_HOPPER, source="NVIDIA HGX H200 datasheet: 8 GPUs of 141 GB on x86 hosts, NVLink within the "
                                   "board; Hopper tensor cores stop at FP8", capability=(9, 0)),
    Gpu(name="h100", gpus_per_node=8, arch="linux/amd64", memory_gb=80, nvlink_domain=8, imex_multinode=False,
        precisions=_HOPPER, source="NVIDIA HGX H100 datasheet: 8 SXM GPUs of 80 GB on x86 hosts; Hopper stops at FP8",
        capability=(9, 0)),
    Gpu(name="cpu", gpus_per_node=None, arch=None, memory_gb=None, nvlink_domain=None, imex_multinode=False,
        precisions=frozenset({"bf16", "bfloat16", "fp32", "float32", "auto"}),
        source="servestack's dev-cpu deployments: vLLM's CPU build (GDN on CPU is bfloat16 only)"),
)}

# How a cluster's own words name a node's CPU: Debian's, uname's, and uname's with a dash (x86-64).
_ARCH_WORDS = {p.name: (p.debian, p.machine, p.machine.replace("_", "-")) for p in PLATFORMS.values()}


def _value(node: Node | None) -> str:
    return "" if node is None or node.value is None else str(node.value)


def check_hardware(c: Checker, root: Node) -> None:
    res = root.get("resources")
    type_node = res.get("gpu_type") if res is not None and res.is_map else None
    gpu = GPUS.get(_value(type_node).lower())
    if gpu is None:
        if type_node is not None and not c.placeholder(type_node):
            c.notes.append(f"{c.file}: gpu_type {_value(type_node)!r} has no hardware facts (known: {', '.join(GPUS)})")
        return
    where = f"{gpu.name} (line {c.line(type_node)})"
    cited = f" (source: {gpu.source})"
    assert res is not None  # the GPU was found by the gpu_type under it
    gpn = res.get("gpus_per_node")
    if gpu.gpus_per_node is not None and gpn is not None and is_int(gpn.value) and gpn.value != gpu.gpus_per_node:
        c.err(gpn, ("resources", "gpus_per_node"),
              f"{gpn.value} GPUs per node (line {c.line(gpn)}), but a {gpu.name} node has {gpu.gpus_per_node}: set "
              f"gpus_per_node to {gpu.gpus_per_node} for gpu_type {where}{cited}")
    model = root.get("model")
    precision = model.get("precision") if model is not None and model.is_map else None
    wanted = _value(precision).lower()
    if wanted in FP4 and not (gpu.precisions & FP4):
        c.err(precision, ("model", "precision"),
              f"{_value(precision)} (line {c.line(precision)}) needs Blackwell's FP4 tensor cores; "
              f"gpu_type {where} runs {', '.join(sorted(gpu.precisions - {'auto'}))}{cited}")
    _check_arch(c, gpu, type_node, model, cited)


def _check_arch(c: Checker, gpu: Gpu, type_node: Node | None, model: Node | None, cited: str) -> None:
    if gpu.arch is None:
        return
    container = model.get("container") if model is not None and model.is_map else None
    image = _value(container).lower()
    named = [arch for arch, words in _ARCH_WORDS.items() if any(w in image for w in words)]
    platforms = tuple(named) or c.platforms
    if platforms and gpu.arch not in platforms:
        how = "as its name says" if named else "as its stack builds it"
        c.err(container or type_node, ("model", "container"),
              f"the image (line {c.line(container)}) is {', '.join(platforms)} {how}, but gpu_type {gpu.name} "
              f"(line {c.line(type_node)}) nodes are {gpu.arch}: build the image for {gpu.arch}{cited}")
