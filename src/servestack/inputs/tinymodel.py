"""A tiny random-weight Qwen3.5 hybrid model directory that vLLM serves, made offline, bit-for-bit.

The production checkpoint's language model (Qwen3_5MoeForCausalLM: Gated DeltaNet and gated full
attention layers, a sparse MoE with a shared expert in every layer; ARCHITECTURE says why not the
vision-language wrapper) at toy size: 4 layers (3 GDN + 1 attention), hidden 256, 4 experts.

No model hub is reachable, so smoke tests serve a model this module writes:
config.json, generation_config.json, model.safetensors, tokenizer.json and
tokenizer_config.json. The same TinyModelSpec gives the same bytes on every machine
and every Python >= 3.11, with nothing but the standard library:

- Production's head dimensions (Qwen3.5's config: attention heads of 256, Gated DeltaNet key and
  value heads of 128), so the model reaches the kernels production reaches on a GPU: FlashInfer's
  SM90 GDN prefill accepts only 128, and a smaller toy would fail there before production would.
- Weights (tinyweights.py) come from SHAKE-256 keyed by (seed, tensor name), exact in bfloat16 and
  float32; the GDN heads' decays span 2 to 1,000 tokens, so the recurrent state that disaggregated
  serving moves over NIXL carries the prompt's beginning, as production's does.
- The tokenizer (tinytokenizer.py) is constructed, not trained with a library: Qwen's byte-level
  BPE with merges learned from a fixed corpus. The JSON files are canonical JSON.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from servestack.errors import InputError, Location
from servestack.inputs.tinytokenizer import EOS_TOKEN, PAD_TOKEN, SPECIAL_TOKENS, tokenizer_config, tokenizer_json
from servestack.inputs.tinyweights import DTYPES, safetensors_bytes
from servestack.util import yamlfile
from servestack.util.fsutil import atomic_write_bytes, canonical_json, sha256_bytes

# The language model of the production checkpoint (Qwen3.5-397B-A17B is Qwen3_5MoeForConditionalGeneration:
# this model under model.language_model., plus a vision tower production never runs, serving with
# --language-model-only): Gated DeltaNet and gated full attention layers, a sparse MoE with a shared
# expert in every layer. Not the vision-language class itself, though vLLM's CPU server serves it
# (measured: --language-model-only builds the tower and never runs it), because Dynamo 1.6.1's vLLM
# worker builds the model's multimodal processor even with --language-model-only (vLLM's
# get_mm_max_tokens_per_item -> qwen3_vl get_hf_processor), and Qwen3-VL's video processor requires
# torchvision, which cannot load beside torch+cpu: the disaggregated shape would never start.
# vLLM loads this class with the same Qwen3_5Model as the language model of the production class.
ARCHITECTURE = "Qwen3_5MoeForCausalLM"
# Head sizes vLLM's CPU attention backend accepts (16 is refused).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 192, 256)
# Where a spec's fields are written: a stack file's `smoke_model.make` (records/stack.py's SmokeModel),
# whose `name` gives the spec's. A spec made in code, not from a file, is named by the file's pattern.
STACK_FIELD = "smoke_model.make"
STACK_FILE = "pins/<stack>.yaml"


@dataclass(frozen=True, kw_only=True)
class TinyModelSpec:
    """Everything that determines the model's bytes; a stack file carries these fields.

    The defaults are Qwen3.5-397B-A17B's shape at toy size: every `full_attention_interval`-th
    layer full (gated) attention, the others Gated DeltaNet, every layer a sparse MoE with a shared
    expert."""

    name: str = "tiny"
    architecture: str = ARCHITECTURE
    hidden_size: int = 256
    layers: int = 4
    full_attention_interval: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 256
    linear_num_key_heads: int = 2
    linear_num_value_heads: int = 4
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    num_experts: int = 4
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 128
    shared_expert_intermediate_size: int = 128
    vocab_size: int = 1024
    max_position_embeddings: int = 4096
    dtype: str = "bfloat16"
    seed: int = 0

    def __post_init__(self) -> None:
        problem = self._problem()
        if problem:
            field, expected = problem
            raise InputError(STACK_FILE, f"{STACK_FIELD}.{field}", expected)

    def _problem(self) -> tuple[str, str] | None:
        """(field, what was expected instead) for the first field this spec cannot make a servable model with."""
        for f in fields(self):
            value, least = getattr(self, f.name), 0 if f.name == "seed" else 1
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < least):
                return f.name, f"expected a {'non-negative' if least == 0 else 'positive'} integer, not {value!r}"
        if self.architecture != ARCHITECTURE:
            return "architecture", (f"expected {ARCHITECTURE} (the production checkpoint's), not "
                                    f"{self.architecture!r}")
        if self.dtype not in DTYPES:
            return "dtype", f"expected one of {', '.join(sorted(DTYPES))}, not {self.dtype!r}"
        if self.head_dim not in CPU_HEAD_SIZES:
            return "head_dim", (f"expected one of the head sizes vLLM's CPU backend takes "
                                f"({', '.join(map(str, CPU_HEAD_SIZES))}), not {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            return "num_attention_heads", (f"expected a multiple of num_key_value_heads ({self.num_key_value_heads}), "
                                           f"not {self.num_attention_heads}")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            return "linear_num_value_heads", (f"expected a multiple of linear_num_key_heads "
                                              f"({self.linear_num_key_heads}), not {self.linear_num_value_heads}")
        if self.num_experts_per_tok > self.num_experts:
            return "num_experts_per_tok", (f"expected at most num_experts ({self.num_experts}), "
                                           f"not {self.num_experts_per_tok}")
        if "full_attention" not in self.layer_types or set(self.layer_types) == {"full_attention"}:
            return "full_attention_interval", (
                f"{self.layers} layers with full_attention_interval {self.full_attention_interval} is not a hybrid: "
                "expected both Gated DeltaNet and full attention layers (an interval from 2 to the number of layers)")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            return "vocab_size", (f"expected at least {256 + len(SPECIAL_TOKENS)} (the bytes and the special tokens), "
                                  f"not {self.vocab_size}")
        return None

    @property
    def layer_types(self) -> list[str]:
        """As Qwen3.5's config derives them: every interval-th layer full attention."""
        return ["full_attention" if (n + 1) % self.full_attention_interval == 0 else "linear_attention"
                for n in range(self.layers)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, stack_file: Path | None = None) -> TinyModelSpec:
        """The spec of `name` and the fields of a stack file's `smoke_model.make`. A problem is an
        InputError at the field's line in STACK_FILE when it is given, else named by the pattern."""
        where = _locator(stack_file)
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            close = difflib.get_close_matches(unknown[0], known, n=1)
            hint = f"did you mean `{close[0]}`? " if close else ""
            field = f"{STACK_FIELD}.{unknown[0]}"
            raise InputError(where(field), field, f"unknown field; {hint}expected one of: {', '.join(sorted(known))}")
        try:
            return cls(**data)
        except InputError as e:
            raise InputError(where(e.field), e.field, e.problem) from None

    @property
    def ordinary_tokens(self) -> int:
        """How many ids come before the special tokens (the oracle draws its token-id prompts below it)."""
        return self.vocab_size - len(SPECIAL_TOKENS)

    @property
    def special_token_ids(self) -> dict[str, int]:
        """The special tokens take the last ids, like Qwen's."""
        return {tok: self.ordinary_tokens + i for i, tok in enumerate(SPECIAL_TOKENS)}


def _locator(stack_file: Path | None) -> Callable[[str], Location]:
    """Where a dotted field of the stack file is: read only once there is a problem to name."""
    def where(field: str) -> Location:
        if stack_file is None:
            return Location(file=STACK_FILE)
        try:
            return yamlfile.load(stack_file).location(tuple(field.split(".")))
        except InputError:  # the file is gone or broken since the lock was checked: name it all the same
            return Location(file=stack_file)
    return where


# ---------------------------------------------------------------- config


def model_config(spec: TinyModelSpec) -> dict[str, Any]:
    """config.json as transformers 5.17's save_pretrained writes Qwen3_5MoeTextConfig for this spec."""
    ids = spec.special_token_ids
    return {
        "architectures": [spec.architecture],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "dtype": spec.dtype,
        "eos_token_id": ids[EOS_TOKEN],
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "hidden_size": spec.hidden_size,
        "initializer_range": 0.02,
        "layer_types": spec.layer_types,
        "linear_conv_kernel_dim": spec.linear_conv_kernel_dim,
        "linear_key_head_dim": spec.linear_key_head_dim,
        "linear_num_key_heads": spec.linear_num_key_heads,
        "linear_num_value_heads": spec.linear_num_value_heads,
        "linear_value_head_dim": spec.linear_value_head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "model_type": "qwen3_5_moe_text",
        "moe_intermediate_size": spec.moe_intermediate_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_experts": spec.num_experts,
        "num_experts_per_tok": spec.num_experts_per_tok,
        "num_hidden_layers": spec.layers,
        "num_key_value_heads": spec.num_key_value_heads,
        "output_router_logits": False,
        "pad_token_id": ids[PAD_TOKEN],
        "partial_rotary_factor": 0.25,
        "rms_norm_eps": 1e-06,
        "rope_parameters": {"partial_rotary_factor": 0.25, "rope_theta": 10000.0, "rope_type": "default"},
        "router_aux_loss_coef": 0.001,
        "shared_expert_intermediate_size": spec.shared_expert_intermediate_size,
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": spec.vocab_size,
    }


def generation_config(spec: TinyModelSpec) -> dict[str, Any]:
    ids = spec.special_token_ids
    return {
        "bos_token_id": ids[PAD_TOKEN],
        "eos_token_id": [ids[EOS_TOKEN], ids[PAD_TOKEN]],
        "pad_token_id": ids[PAD_TOKEN],
    }


# ---------------------------------------------------------------- the directory


def model_files(spec: TinyModelSpec) -> dict[str, bytes]:
    """File name -> exact bytes of the model directory."""
    return {
        "config.json": canonical_json(model_config(spec)).encode(),
        "generation_config.json": canonical_json(generation_config(spec)).encode(),
        "model.safetensors": safetensors_bytes(spec),
        "tokenizer.json": canonical_json(tokenizer_json(spec)).encode(),
        "tokenizer_config.json": canonical_json(tokenizer_config(spec)).encode(),
    }


def make_model(out_dir: Path, spec: TinyModelSpec) -> dict[str, str]:
    """Write the model directory (each file atomically); returns file name -> sha256."""
    out_dir = Path(out_dir)
    digests: dict[str, str] = {}
    for name, data in model_files(spec).items():
        atomic_write_bytes(out_dir / name, data)
        digests[name] = sha256_bytes(data)
    return digests
