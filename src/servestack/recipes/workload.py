"""The benchmark a recipe runs against what its engine roles can hold.

  * ISL + OSL must fit every role's max-model-len (vLLM refuses each longer request): an error;
  * a concurrency above what decode holds at once (max-num-seqs x data parallel x workers) is queued;
  * a per-rank batch above the largest CUDA-graph capture size runs outside CUDA graphs (why NVIDIA's
    `-cc4096`/`-cc5120` variants raise it to 640/768);
  * a fixed prompt count below the concurrency never reaches it.
The last three are warnings with the numbers: the run works, but it measures something else.
"""

from __future__ import annotations

import math
import re

from servestack.recipes.hardware import FP4, GPUS
from servestack.recipes.roles import Role, roles
from servestack.recipes.structure import Checker, concurrency_list, is_int
from servestack.util.yamlfile import Node

# vLLM 0.31.0's defaults when a role leaves them unset, on GPUs of >= 70 GB
# (engine/arg_utils.py:_set_default_max_num_seqs_and_batched_tokens_args) and for the largest capture
# size (config/vllm.py: min(2 x max_num_seqs, 1024 on the SM100 family else 512)).
DEFAULT_MAX_NUM_SEQS_LARGE_GPU = 1024
DEFAULT_CAPTURE = {"blackwell": 1024, "other": 512}
_HUMAN = re.compile(r"^(\d+)([kKmM]?)$")


def _tokens(value: object) -> int | None:
    """A max-model-len as vLLM reads it: 16k = 16000, 16K = 16384."""
    if is_int(value):
        return int(value)
    m = _HUMAN.match(str(value).strip()) if value is not None else None
    if not m:
        return None
    scale = {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}[m.group(2)]
    return int(m.group(1)) * scale


def check_workload(c: Checker, root: Node) -> None:
    bench = root.get("benchmark")
    if bench is None or not bench.is_map:
        return
    by_name = roles(root)
    serving = by_name.get("decode") or by_name.get("agg")
    if serving is None or serving.engine != "vllm":
        return
    _lengths(c, bench, list(by_name.values()))
    conc_node = bench.get("concurrencies")
    if conc_node is None:
        return
    try:
        concurrencies = concurrency_list(conc_node.plain())
    except ValueError:
        return  # reported by the structure check
    if not concurrencies:
        return
    _capacity(c, root, serving, conc_node, max(concurrencies))
    _prompts(c, bench, conc_node, max(concurrencies))


def _lengths(c: Checker, bench: Node, all_roles: list[Role]) -> None:
    isl, osl = bench.get("isl"), bench.get("osl")
    if isl is None or osl is None or not (is_int(isl.value) and is_int(osl.value)):
        return
    for role in all_roles:
        found = role.flag("max-model-len")
        limit = _tokens(found.value)
        if limit is not None and isl.value + osl.value > limit:
            c.err(isl, ("benchmark", "isl"),
                  f"isl {isl.value} (line {c.line(isl)}) + osl {osl.value} (line {c.line(osl)}) = {isl.value + osl.value} "
                  f"tokens exceed the {role.name} role's max-model-len {limit} (line {c.line(found.node)}): vLLM refuses "
                  "every request whose prompt plus max_tokens exceed it")


def _capacity(c: Checker, root: Node, role: Role, conc_node: Node, top: int) -> None:
    res = root.get("resources")
    type_node = res.get("gpu_type") if res is not None and res.is_map else None
    gpu = GPUS.get(str(type_node.value).lower()) if type_node is not None else None
    large = gpu is not None and gpu.memory_gb is not None and gpu.memory_gb >= 70
    seqs_found = role.flag("max-num-seqs")
    seqs = role.int_flag("max-num-seqs", DEFAULT_MAX_NUM_SEQS_LARGE_GPU if large else None)
    dp = role.int_flag("data-parallel-size", 1) or 1
    workers = role.workers or 1
    ranks = dp * workers
    if seqs is not None and top > seqs * ranks:
        said = f"line {c.line(seqs_found.node)}" if seqs_found.value is not None else "vLLM's default on this GPU"
        c.warn(conc_node, ("benchmark", "concurrencies"),
               f"concurrency {top} (line {c.line(conc_node)}) exceeds what the {role.name} role holds at once: "
               f"max-num-seqs {seqs} ({said}) x data parallel {dp} x {workers} worker(s) = {seqs * ranks}; "
               f"{top - seqs * ranks} requests wait in the queue and their time counts as latency")
    if role.flag("enforce-eager").value is True:
        return  # no CUDA graphs at all, by choice
    capture_found = role.flag("max-cudagraph-capture-size")
    capture = role.int_flag("max-cudagraph-capture-size")
    sizes = role.flag("cudagraph-capture-sizes")
    if capture is None and isinstance(sizes.value, list) and sizes.value:
        capture, capture_found = max(int(s.value) for s in sizes.value), sizes
    if capture is None and gpu is not None and seqs is not None and gpu.name != "cpu":
        family = "blackwell" if gpu.precisions & FP4 else "other"
        capture = min(2 * seqs, DEFAULT_CAPTURE[family])
    if capture is None:
        return
    batch = math.ceil(top / ranks)
    if batch > capture:
        said = f"line {c.line(capture_found.node)}" if capture_found.value is not None else "vLLM's default"
        c.warn(conc_node, ("benchmark", "concurrencies"),
               f"at concurrency {top} (line {c.line(conc_node)}) each of the {ranks} {role.name} rank(s) batches up to "
               f"{batch} requests, above the largest CUDA-graph capture size {capture} ({said}): those steps run "
               f"outside CUDA graphs; raise max-cudagraph-capture-size to {batch} or more, as NVIDIA's -cc4096/-cc5120 "
               "variants do")


def _prompts(c: Checker, bench: Node, conc_node: Node, top: int) -> None:
    for key in ("num_requests", "num_examples"):
        node = bench.get(key)
        if node is not None and is_int(node.value) and node.value < top:
            c.warn(node, ("benchmark", key),
                   f"{node.value} prompts (line {c.line(node)}) never reach concurrency {top} (line {c.line(conc_node)}): "
                   "the point measures a smaller load than it names")
    mult = bench.get("num_prompts_mult")
    if mult is not None and is_int(mult.value) and mult.value < 1:
        c.err(mult, ("benchmark", "num_prompts_mult"),
              f"num_prompts_mult {mult.value} (line {c.line(mult)}) sends fewer prompts than the concurrency "
              f"(line {c.line(conc_node)}): none of its points is measured")
