"""Kernels against shapes: for each model, on each simulated GPU, which GDN prefill and attention
kernel vLLM would pick, and whether that kernel's own argument checks accept the model's shapes.

vLLM's resolver picks a kernel from the device alone where the kernel itself also checks the head
size: vLLM 0.31.0 picks FlashInfer's GDN prefill on every SM90 device, and FlashInfer 0.7.0.post1's
SM90 kernel raises `DSL kernel only supports D=128` for anything else, at the engine's profile run,
on the node. So the answer needs both sides: the resolver's choice (asked in the image, else the
rule recorded from its source) and the kernel's guard (read from the installed source with `ast`,
else the value recorded from the release named below).

The judgement (`check_model`) is a pure function of the shapes and those facts, so it is tested on
any CPU; `section_kernel_shapes` gathers the facts inside the image.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass

from .report import FAIL, PASS, check, site_packages

DEVICES = (9, 10)  # SM90 (Hopper: H100/H200) and SM100 (Blackwell: B200/GB200)
# vllm/engine/arg_utils.py (0.31.0): --gdn-prefill-backend sets additional_config["gdn_prefill_backend"],
# the value _resolve_gdn_prefill_backend reads first; "triton" is never refused by the device.
AVOID_GDN = "--gdn-prefill-backend triton"
AVOID_ATTENTION = "--attention-backend"


@dataclass(frozen=True, kw_only=True)
class Shapes:
    """What a model's config.json hands the kernels."""

    model: str
    source: str
    head_dim: int
    linear_key_head_dim: int
    linear_value_head_dim: int

    @classmethod
    def from_config(cls, *, model: str, source: str, config: dict) -> Shapes:
        text = config.get("text_config") or config  # multimodal checkpoints nest the text model
        heads = text.get("num_attention_heads") or 1
        return cls(model=model, source=source,
                   head_dim=int(text.get("head_dim") or text.get("hidden_size", 0) // heads),
                   linear_key_head_dim=int(text.get("linear_key_head_dim") or 0),
                   linear_value_head_dim=int(text.get("linear_value_head_dim") or 0))


@dataclass(frozen=True, kw_only=True)
class GuardSource:
    """Where a kernel refuses a head size: the function, and a phrase of its error that finds the guard."""

    kernel: str
    path: str  # relative to site-packages
    function: str
    marker: str
    recorded: int  # the size it requires in the release below, for an image without the file
    recorded_from: str


@dataclass(frozen=True, kw_only=True)
class DimGuard:
    kernel: str
    required: int | None  # None: the installed kernel has no such guard
    where: str


@dataclass(frozen=True, kw_only=True)
class AttentionBackend:
    """A backend's head-size rule: an explicit list, or a multiple-of with a bound (and a floor)."""

    name: str
    where: str
    sizes: tuple[int, ...] = ()
    multiple_of: int = 1
    minimum: int = 1
    maximum: int | None = None

    def accepts(self, size: int) -> bool:
        if self.sizes:
            return size in self.sizes
        return size % self.multiple_of == 0 and size >= self.minimum and (self.maximum is None or size <= self.maximum)


@dataclass(frozen=True, kw_only=True)
class KernelFacts:
    gdn_choice: dict[tuple[int, int], str]  # (SM major, linear_key_head_dim) -> vLLM's pick
    resolver: str  # how the choices were had
    gdn_guards: dict[int, DimGuard]  # SM major -> FlashInfer's GDN prefill guard there
    attention: dict[int, tuple[AttentionBackend, ...]]  # SM major -> vLLM's priority order


FLASHINFER_RELEASE = "flashinfer-python 0.7.0.post1"
GDN_GUARDS = {
    9: GuardSource(kernel="FlashInfer's SM90 GDN prefill (CuTe DSL delta_rule_prefill_dsl_sm90)",
                   path="flashinfer/gdn_kernels/delta_rule_dsl/delta_rule_sm90.py",
                   function="delta_rule_prefill_dsl_sm90", marker="only supports D=", recorded=128,
                   recorded_from=f"{FLASHINFER_RELEASE}, delta_rule_sm90.py line 2415: `if D != 128: raise`"),
    10: GuardSource(kernel="FlashInfer's Blackwell GDN prefill (chunk_gated_delta_rule, SM100 path)",
                    path="flashinfer/gdn_prefill.py", function="chunk_gated_delta_rule",
                    marker="Blackwell GDN prefill requires head_size=", recorded=128,
                    recorded_from=f"{FLASHINFER_RELEASE}, gdn_prefill.py: `assert head_size == 128`"),
}

VLLM_RELEASE = "vLLM 0.31.0"
_FLASHINFER_ATTENTION = "vllm/v1/attention/backends/flashinfer.py"
# Recorded from vLLM 0.31.0: FLASH_ATTN's supports_head_size (multiples of 8 up to 256; FA4, which
# is Blackwell's, to 512) and TRITON_ATTN's (>= 32). FlashInfer's list is read from the image.
_FLASH_ATTN = {9: AttentionBackend(name="FLASH_ATTN", multiple_of=8, maximum=256,
                                   where=f"{VLLM_RELEASE} flash_attn.py FlashAttentionBackend.supports_head_size"),
               10: AttentionBackend(name="FLASH_ATTN", multiple_of=8, maximum=512,
                                    where=f"{VLLM_RELEASE} flash_attn.py FlashAttentionBackend.supports_head_size (FA4)")}
_TRITON_ATTN = AttentionBackend(name="TRITON_ATTN", minimum=32,
                                where=f"{VLLM_RELEASE} triton_attn.py TritonAttentionBackend.supports_head_size")
_FLASHINFER_SIZES = (64, 128, 256, 512)  # vLLM 0.31.0's FlashInferBackend.get_supported_head_sizes


def recorded_gdn_choice(sm: int, head_k_dim: int, cuda_major: int = 13) -> str:
    """vLLM 0.31.0's _resolve_gdn_prefill_backend with no backend requested, as its source reads:
    SM90 takes FlashInfer with no further check; SM10x/SM12x only at head_k_dim 128 on CUDA >= 13."""
    if sm == 9:
        return "flashinfer"
    if sm in (10, 12) and head_k_dim == 128 and cuda_major >= 13:
        return "flashinfer"
    return "triton"


def _constant_int(node: ast.AST) -> int | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, int) else None


def _guard_value(node: ast.AST, marker: str, text: str) -> int | None:
    """The size an `if X != N: raise ...(marker)` or `assert X == N, "...marker"` requires."""
    if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.ops[0], ast.NotEq):
        raises = [s for s in node.body if isinstance(s, ast.Raise)]
        if raises and marker in (ast.get_source_segment(text, raises[0]) or ""):
            return _constant_int(node.test.comparators[0])
    if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and isinstance(node.test.ops[0], ast.Eq):
        if node.msg is not None and marker in (ast.get_source_segment(text, node.msg) or ""):
            return _constant_int(node.test.comparators[0])
    return None


def read_guard(source: GuardSource, site: str) -> DimGuard:
    path = os.path.join(site, source.path)
    if not os.path.exists(path):
        return DimGuard(kernel=source.kernel, required=source.recorded,
                        where=f"recorded from {source.recorded_from} ({source.path} is not in this image)")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    functions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.FunctionDef) and n.name == source.function]
    for function in functions:
        for node in ast.walk(function):
            required = _guard_value(node, source.marker, text)
            if required is not None:
                assert isinstance(node, ast.stmt)  # _guard_value answers only for an `if` or an `assert`
                segment = ast.get_source_segment(text, node)
                assert segment is not None  # a node parsed from `text` has its position in it
                return DimGuard(kernel=source.kernel, required=required,
                                where=f"{source.path}:{node.lineno} `{segment.splitlines()[0]}`")
    return DimGuard(kernel=source.kernel, required=None, where=f"{source.path}: {source.function} has no head-size guard")


def read_flashinfer_attention(site: str) -> AttentionBackend:
    """FlashInfer attention's head sizes: the list its vLLM backend's get_supported_head_sizes returns."""
    path = os.path.join(site, _FLASHINFER_ATTENTION)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
                returned = next((n.value for n in ast.walk(node) if isinstance(n, ast.Return)), None)
                constants = [_constant_int(e) for e in returned.elts] if isinstance(returned, ast.List) else [None]
                sizes = tuple(size for size in constants if size is not None)
                if len(sizes) == len(constants):  # a list literal of int constants only
                    return AttentionBackend(name="FLASHINFER", sizes=sizes,
                                            where=f"{_FLASHINFER_ATTENTION}:{node.lineno} get_supported_head_sizes")
    return AttentionBackend(
        name="FLASHINFER",
        sizes=_FLASHINFER_SIZES,
        where=f"recorded from {VLLM_RELEASE} {_FLASHINFER_ATTENTION} "
              f"({'not in this image' if not os.path.exists(path) else 'no list literal'})",
    )


def attention_priorities(site: str) -> dict[int, tuple[AttentionBackend, ...]]:
    """vllm/platforms/cuda.py _get_backend_priorities (0.31.0), a causal non-MLA model: SM100 prefers
    FlashInfer, every other device FlashAttention; vLLM takes the first that accepts the head size."""
    flashinfer = read_flashinfer_attention(site)
    return {9: (_FLASH_ATTN[9], flashinfer, _TRITON_ATTN), 10: (flashinfer, _FLASH_ATTN[10], _TRITON_ATTN)}


def recorded_facts(site: str, dims: tuple[int, ...] = (64, 128)) -> KernelFacts:
    """The facts without asking vLLM's resolver: its rule as recorded from its source."""
    return KernelFacts(gdn_choice={(sm, d): recorded_gdn_choice(sm, d) for sm in DEVICES for d in dims},
                       resolver=f"{VLLM_RELEASE}'s _resolve_gdn_prefill_backend as recorded from its source",
                       gdn_guards={sm: read_guard(GDN_GUARDS[sm], site) for sm in DEVICES},
                       attention=attention_priorities(site))


def check_gdn(shapes: Shapes, sm: int, facts: KernelFacts) -> dict:
    label = f"kernels:gdn-prefill:SM{sm}0:{shapes.model}"
    if not shapes.linear_key_head_dim:
        return check(label, PASS, f"{shapes.model} has no GDN layers ({shapes.source})")
    dims = f"linear_key_head_dim {shapes.linear_key_head_dim}, linear_value_head_dim {shapes.linear_value_head_dim}"
    chosen = facts.gdn_choice.get((sm, shapes.linear_key_head_dim)) or recorded_gdn_choice(sm, shapes.linear_key_head_dim)
    if chosen != "flashinfer":
        return check(label, PASS, f"vLLM picks {chosen} GDN prefill on SM{sm}0 at {dims} ({facts.resolver}); "
                                  f"it has no head-size guard ({shapes.source})")
    guard = facts.gdn_guards[sm]
    # The kernel keeps a D x D state: both head dims are its D.
    refused = [d for d in (shapes.linear_key_head_dim, shapes.linear_value_head_dim)
               if guard.required is not None and d != guard.required]
    if refused:
        return check(label, FAIL, f"vLLM picks FlashInfer GDN prefill on SM{sm}0 ({facts.resolver}), and {guard.kernel} "
                                  f"refuses {shapes.model}'s {dims}: it requires {guard.required} ({guard.where}); the "
                                  f"engine dies at its profile run. Avoid with `{AVOID_GDN}` or give the model "
                                  f"{guard.required}-dim GDN heads ({shapes.source})")
    return check(label, PASS, f"vLLM picks FlashInfer GDN prefill on SM{sm}0 ({facts.resolver}); {guard.kernel} accepts "
                              f"{dims} ({guard.where}; {shapes.source})")


def check_attention(shapes: Shapes, sm: int, facts: KernelFacts) -> dict:
    label = f"kernels:attention:SM{sm}0:{shapes.model}"
    order = facts.attention[sm]
    taken = next((b for b in order if b.accepts(shapes.head_dim)), None)
    if taken is None:
        return check(label, FAIL, f"no attention backend vLLM has on SM{sm}0 accepts head_dim {shapes.head_dim} "
                                  f"({'; '.join(b.name + ': ' + b.where for b in order)}; {shapes.source})")
    if taken is not order[0]:
        return check(label, FAIL, f"{order[0].name}, vLLM's first attention backend on SM{sm}0, refuses head_dim "
                                  f"{shapes.head_dim} ({order[0].where}): vLLM would take {taken.name} instead, not "
                                  f"the kernel production runs; pass `{AVOID_ATTENTION} {taken.name}` to say so, or "
                                  f"change the model's head_dim ({shapes.source})")
    return check(label, PASS, f"{taken.name} accepts head_dim {shapes.head_dim} on SM{sm}0 ({taken.where}; {shapes.source})")


def check_model(shapes: Shapes, facts: KernelFacts) -> list[dict]:
    return [c for sm in DEVICES for c in (check_gdn(shapes, sm, facts), check_attention(shapes, sm, facts))]


def models_of(config: dict) -> list[Shapes]:
    """The stack's recorded shapes (a checkpoint the image does not carry) and the made model's config.json."""
    found = [Shapes.from_config(model=m["name"], source=m["source"], config=m["config"])
             for m in (config.get("kernel_shapes") or {}).get("models") or []]
    model_dir = config.get("model_dir")
    if model_dir and os.path.exists(os.path.join(model_dir, "config.json")):
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            made = json.load(f)
        found.append(Shapes.from_config(model=os.path.basename(model_dir), source=f"{model_dir}/config.json", config=made))
    return found


def image_facts(config: dict, dims: tuple[int, ...]) -> KernelFacts:
    """The facts as the image answers them: vLLM's own resolver on each simulated device where it loads."""
    from .fast_path import ask_gdn_resolver

    facts = recorded_facts(site_packages(config), dims)
    choices, notes = {}, set()
    for sm, dim in facts.gdn_choice:
        answer = ask_gdn_resolver(major=sm, minor=0, head_k_dim=dim, excluded=config.get("excluded") or [])
        if isinstance(answer, str):  # could not ask: keep the recorded rule, say why
            return KernelFacts(gdn_choice=facts.gdn_choice, resolver=f"{facts.resolver} ({answer})",
                               gdn_guards=facts.gdn_guards, attention=facts.attention)
        choices[(sm, dim)] = answer.chosen
        notes.add(answer.where)
    return KernelFacts(gdn_choice=choices, resolver=f"asked {', '.join(sorted(notes))} on a simulated device",
                       gdn_guards=facts.gdn_guards, attention=facts.attention)


def section_kernel_shapes(config: dict) -> list[dict]:
    models = models_of(config)
    facts = image_facts(config, tuple(sorted({m.linear_key_head_dim for m in models if m.linear_key_head_dim})))
    return [c for shapes in models for c in check_model(shapes, facts)]
