"""The tiny model's weights: exact values from SHAKE-256, with Gated DeltaNet heads that remember.

Every random weight is one SHAKE-256 byte (keyed by seed and tensor name) read as a signed 8-bit
integer and scaled by a power of two: exact in bfloat16 and float32, so the dtype changes only the
encoding. model.safetensors is written by hand (8-byte little-endian header length, a JSON header
with sorted keys padded with spaces to 8 bytes, then the tensors in the header's order).

The GDN heads' decays are not random, because the disaggregated oracle exists to see the recurrent
state that NIXL moves, and heads that forget hide it. A Gated DeltaNet head keeps exp(g) of its
state per token, g = -exp(A_log) * softplus(a + dt_bias). transformers' init (A_log near 0,
dt_bias 1) keeps 0.2-0.37 per token: such a head forgets within a few tokens, and a state lost in
the transfer changed only 5 of the oracle's 15 answers. Trained heads spread from a few tokens to
thousands (Mamba-2's init draws dt log-uniform in [0.001, 0.1] for that reason). Each layer's value
heads get the decays of GDN_DECAYS, from a head that forgets in 2 tokens to one that keeps 82% of
what it held 1,000 tokens ago (less what newer keys overwrite).

What a head outputs is then mostly what it remembers: with the queries and keys independent, a
token's query meets its own key at cosine 1/sqrt(128), and the first GDN layer's heads after a
lost state point elsewhere (normalised outputs 1.1-1.2 apart of at most 2, over prompts of 100 to
2,000 tokens; 0.13-0.2 apart after a halved one), where a query that repeats its key keeps them
within 0.2-0.36.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from typing import Any, Protocol


class TinyModelSpec(Protocol):
    """The fields of tinymodel.TinyModelSpec the weights read (tinymodel imports this module),
    read-only as in its frozen record."""

    @property
    def seed(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def num_attention_heads(self) -> int: ...
    @property
    def num_key_value_heads(self) -> int: ...
    @property
    def linear_num_key_heads(self) -> int: ...
    @property
    def linear_num_value_heads(self) -> int: ...
    @property
    def linear_key_head_dim(self) -> int: ...
    @property
    def linear_value_head_dim(self) -> int: ...
    @property
    def linear_conv_kernel_dim(self) -> int: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def moe_intermediate_size(self) -> int: ...
    @property
    def shared_expert_intermediate_size(self) -> int: ...
    @property
    def vocab_size(self) -> int: ...

    @property
    def layer_types(self) -> list[str]: ...

DTYPES = {"bfloat16": ("BF16", 2), "float32": ("F32", 4)}
# Per-token decay of each value head's recurrent state (at a zero input), cycled over a layer's heads:
# horizons 1/(1 - decay) of 2, 10, 50 and 5,000 tokens. The longest is longer than the oracle's
# 2,000-token prompt because the delta rule also erases along every new key (about 0.75/128 of the
# state's square per token at beta 0.5): at 0.999 a 2,000-token state kept 6% of its first half,
# at 0.9998 it keeps 15% (tests/inputs/test_tinymodel.py measures it against bfloat16 rounding).
GDN_DECAYS = (0.5, 0.9, 0.98, 0.9998)
# The time step of the same heads, log-spread over Mamba-2's init range [0.001, 0.1], the longest
# memory on the smallest step (A = -ln(decay) / dt: 6.9, 4.9, 4.4 and 0.2).
GDN_TIME_STEPS = (0.1, 0.0215, 0.00464, 0.001)

# value = (byte - 128) * 2**-12: uniform on [-1/32, 1/32), std about 0.018 (like init 0.02).
_SCALE_EXP = 12
# lm_head 16 times larger (std about 0.29): logits spread by several nats, so greedy decoding rarely
# meets a near tie, and the disaggregated-vs-aggregated oracle can hold the two to the same tokens
# (at init scale every logit is within a few hundredths of the next).
_LM_HEAD_SCALE_EXP = 8
# Qwen3.5's RMSNorms scale by (1 + weight): their weights start at zero (transformers' init); the gated
# norm of the GDN layers scales by weight: it starts at one.
_ZERO_CENTERED_NORMS = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                        "k_norm.weight", "language_model.norm.weight")


def tensor_shapes(spec: TinyModelSpec) -> dict[str, tuple[int, ...]]:
    """Qwen3_5MoeForCausalLM's parameters under the names Qwen3.5 checkpoints use (what transformers'
    save_pretrained writes: experts one by one, the layers under model.language_model. as in the
    production checkpoint, which vLLM maps to model.)."""
    h, hd = spec.hidden_size, spec.head_dim
    nk, nv, dk, dv = (spec.linear_num_key_heads, spec.linear_num_value_heads,
                      spec.linear_key_head_dim, spec.linear_value_head_dim)
    conv_dim = 2 * nk * dk + nv * dv
    lm = "model.language_model."
    shapes: dict[str, tuple[int, ...]] = {
        lm + "embed_tokens.weight": (spec.vocab_size, h),
        lm + "norm.weight": (h,),
        "lm_head.weight": (spec.vocab_size, h),
    }
    for n, kind in enumerate(spec.layer_types):
        p = f"{lm}layers.{n}."
        if kind == "full_attention":
            q, kv = spec.num_attention_heads * hd, spec.num_key_value_heads * hd
            shapes.update({
                p + "self_attn.q_proj.weight": (2 * q, h),  # query and its output gate
                p + "self_attn.k_proj.weight": (kv, h),
                p + "self_attn.v_proj.weight": (kv, h),
                p + "self_attn.o_proj.weight": (h, q),
                p + "self_attn.q_norm.weight": (hd,),
                p + "self_attn.k_norm.weight": (hd,),
            })
        else:
            shapes.update({
                p + "linear_attn.A_log": (nv,),
                p + "linear_attn.dt_bias": (nv,),
                p + "linear_attn.conv1d.weight": (conv_dim, 1, spec.linear_conv_kernel_dim),
                p + "linear_attn.in_proj_qkv.weight": (conv_dim, h),
                p + "linear_attn.in_proj_z.weight": (nv * dv, h),
                p + "linear_attn.in_proj_b.weight": (nv, h),
                p + "linear_attn.in_proj_a.weight": (nv, h),
                p + "linear_attn.norm.weight": (dv,),
                p + "linear_attn.out_proj.weight": (h, nv * dv),
            })
        mi, si = spec.moe_intermediate_size, spec.shared_expert_intermediate_size
        shapes.update({
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "mlp.gate.weight": (spec.num_experts, h),
            p + "mlp.shared_expert.gate_proj.weight": (si, h),
            p + "mlp.shared_expert.up_proj.weight": (si, h),
            p + "mlp.shared_expert.down_proj.weight": (h, si),
            p + "mlp.shared_expert_gate.weight": (1, h),
        })
        for e in range(spec.num_experts):
            shapes.update({
                p + f"mlp.experts.{e}.gate_proj.weight": (mi, h),
                p + f"mlp.experts.{e}.up_proj.weight": (mi, h),
                p + f"mlp.experts.{e}.down_proj.weight": (h, mi),
            })
    return shapes


def bfloat16_value(x: float) -> float:
    """x rounded to the nearest bfloat16 (ties to even), as a float: the value both dtypes then hold."""
    (bits,) = struct.unpack("<I", struct.pack("<f", x))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def inverse_softplus(y: float) -> float:
    return y + math.log(-math.expm1(-y))


def gdn_head_parameters(heads: int) -> list[tuple[float, float]]:
    """(A_log, dt_bias) of each value head, as stored: exact in bfloat16."""
    out = []
    for j in range(heads):
        decay, dt = GDN_DECAYS[j % len(GDN_DECAYS)], GDN_TIME_STEPS[j % len(GDN_TIME_STEPS)]
        out.append((bfloat16_value(math.log(-math.log(decay) / dt)), bfloat16_value(inverse_softplus(dt))))
    return out


def head_decays(heads: int) -> list[float]:
    """Each value head's decay per token at a zero input, from the stored (rounded) parameters."""
    return [math.exp(-math.exp(a_log) * math.log1p(math.exp(dt_bias))) for a_log, dt_bias in gdn_head_parameters(heads)]


def _encode_stream(dtype: str, scale_exp: int, stream: bytes) -> bytes:
    """Each byte b as the value (b - 128) * 2**-scale_exp, little-endian: one bytes.translate per
    byte of the encoding, interleaved (a 10 MB model in a fraction of a second)."""
    # exact: 8 significant bits at most; bf16 is the high half of f32 (exact here)
    encodings = [struct.pack("<f", (b - 128) * 2.0**-scale_exp) for b in range(256)]
    offsets = (2, 3) if dtype == "bfloat16" else (0, 1, 2, 3)
    out = bytearray(len(stream) * len(offsets))
    for position, offset in enumerate(offsets):
        out[position::len(offsets)] = stream.translate(bytes(e[offset] for e in encodings))
    return bytes(out)


def _encode(spec: TinyModelSpec, values: list[float]) -> bytes:
    raws = [struct.pack("<f", v) for v in values]
    return b"".join(r[2:] if spec.dtype == "bfloat16" else r for r in raws)


def tensor_bytes(spec: TinyModelSpec, name: str, shape: tuple[int, ...]) -> bytes:
    n = math.prod(shape)
    if name.endswith(_ZERO_CENTERED_NORMS) or name.endswith(".bias"):
        return _encode(spec, [0.0] * n)
    if name.endswith("norm.weight"):
        return _encode(spec, [1.0] * n)  # transformers' init: the gated norm's scale at one
    if name.endswith(("linear_attn.A_log", "linear_attn.dt_bias")):
        column = 0 if name.endswith("A_log") else 1
        return _encode(spec, [p[column] for p in gdn_head_parameters(n)])
    key = f"servestack-tinymodel/v2/{spec.seed}/{name}".encode()
    stream = hashlib.shake_256(key).digest(n)
    return _encode_stream(spec.dtype, _LM_HEAD_SCALE_EXP if name == "lm_head.weight" else _SCALE_EXP, stream)


def safetensors_bytes(spec: TinyModelSpec) -> bytes:
    st_dtype, _ = DTYPES[spec.dtype]
    shapes = tensor_shapes(spec)
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for name in sorted(shapes):
        data = tensor_bytes(spec, name, shapes[name])
        header[name] = {"dtype": st_dtype, "shape": list(shapes[name]), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + b"".join(chunks)
