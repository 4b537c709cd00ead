"""The tiny offline model: deterministic bytes, a tokenizer that round-trips, a config that
matches its spec (a vLLM server that serves it: test_tinymodel_e2e.py)."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from servestack.errors import InputError
from servestack.inputs.tinymodel import TinyModelSpec, make_model
from servestack.inputs.tinytokenizer import CORPUS, SPECIAL_TOKENS, tokenizer_vocab
from servestack.inputs.tinyweights import GDN_DECAYS, head_decays, tensor_shapes
from servestack.util.fsutil import sha256_file

FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}


def test_same_bytes_every_time(tmp_path: Path) -> None:
    spec = TinyModelSpec()
    start = time.monotonic()
    first = make_model(tmp_path / "a", spec)
    elapsed = time.monotonic() - start
    second = make_model(tmp_path / "b", spec)
    assert set(first) == FILES
    assert first == second
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert sha256_file(tmp_path / "a" / name) == first[name]
    assert elapsed < 2.0
    # Another seed changes the weights only.
    other = make_model(tmp_path / "c", TinyModelSpec(seed=1))
    assert other["model.safetensors"] != first["model.safetensors"]
    assert other["tokenizer.json"] == first["tokenizer.json"]


# The default spec's bytes, pinned: the same on every machine and Python (checked on CPython
# 3.11.2 and 3.11.7). A change here changes the model every stack serves: bump deliberately.
GOLDEN = {
    "config.json": "b82cf020b304e682b7177065773cca3ea36fb0d2c973f78634cd1c86839d2b5d",
    "generation_config.json": "8d5db6937987592a6231a18174cdaeca978dfa706ad9878b47b49a8e75da76c0",
    "model.safetensors": "ed5a5851dae14941c32e09999c0940d622519d12085013eedd94b5e6132f87fa",
    "tokenizer.json": "9659570bcc8d5a35d056d893476ab0bb252af038b457650a469028028e516505",
    "tokenizer_config.json": "7f476e43c7643117b4461c093bbba202db5abb4f238d2c051f53f3fdff0e086c",
}


def test_default_model_bytes_are_pinned(tmp_path: Path) -> None:
    assert CORPUS.isascii()  # no dependence on the Unicode database of the running Python
    assert make_model(tmp_path, TinyModelSpec()) == GOLDEN


# The oracle's longest prompt, and the half of it a disaggregated transfer must carry.
LONG_PROMPT = 2000


def test_the_recurrent_state_of_a_long_prompt_remembers_its_first_half() -> None:
    """What NIXL moves for a GDN layer is its recurrent state: with the model's own weights, the
    state after 2,000 tokens depends on the first 1,000 far beyond bfloat16 rounding (vLLM's SSM
    cache dtype, applied here after every token: the most rounding any kernel path could add).
    transformers' init decays (A_log 0, dt_bias 1) keep nothing of it: the test can fail."""
    np = pytest.importorskip("numpy")
    from fixtures.gdn import recurrent_state, relative_change, to_bfloat16
    from servestack.clients.agreement import token_prompts

    spec = TinyModelSpec()
    prompt = token_prompts(spec.ordinary_tokens, (LONG_PROMPT,))[0]
    other_first_half = token_prompts(spec.ordinary_tokens, (LONG_PROMPT // 2,), seed=7)[0]
    changed = other_first_half + prompt[LONG_PROMPT // 2:]

    state = recurrent_state(spec, prompt)
    noise = relative_change(state, recurrent_state(spec, prompt, state_rounding=to_bfloat16))
    dependence = relative_change(state, recurrent_state(spec, changed))
    longest = GDN_DECAYS.index(max(GDN_DECAYS))
    assert dependence[longest] > 4 * noise[longest] and dependence[longest] > 0.1, (dependence, noise)
    # The short heads forget it, as they should: the model spans horizons.
    assert min(dependence) < 1e-6, dependence

    forgetful = (np.zeros(spec.linear_num_value_heads), np.ones(spec.linear_num_value_heads))
    state = recurrent_state(spec, prompt, head_parameters=forgetful)
    assert max(relative_change(state, recurrent_state(spec, changed, head_parameters=forgetful))) < 1e-9


def test_gdn_heads_span_short_and_long_horizons() -> None:
    decays = head_decays(TinyModelSpec().linear_num_value_heads)
    # As stored in bfloat16 (8 significant bits), each head keeps its intended decay per token closely.
    assert decays == pytest.approx(list(GDN_DECAYS), rel=5e-3)
    assert min(decays) < 0.6 and max(decays) > 0.999


def test_safetensors_package_reads_it(tmp_path: Path) -> None:
    st_numpy = pytest.importorskip("safetensors.numpy")
    spec = TinyModelSpec(dtype="float32")
    make_model(tmp_path, spec)
    tensors = st_numpy.load_file(str(tmp_path / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == tensor_shapes(spec)
    # Qwen3.5's (1 + weight) RMSNorms start at zero, the GDN layers' gated norm at one.
    assert float(abs(tensors["model.language_model.norm.weight"]).max()) == 0.0
    assert float(tensors["model.language_model.layers.0.linear_attn.norm.weight"].min()) == 1.0


def test_safetensors_layout(tmp_path: Path) -> None:
    spec = TinyModelSpec(dtype="float32", layers=2, full_attention_interval=2)
    make_model(tmp_path, spec)
    raw = (tmp_path / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    shapes = tensor_shapes(spec)
    assert set(header) == set(shapes)
    end = 0
    for name in sorted(header):
        info = header[name]
        assert info["dtype"] == "F32"
        assert tuple(info["shape"]) == shapes[name]
        begin, stop = info["data_offsets"]
        assert begin == end
        count = 1
        for d in info["shape"]:
            count *= d
        assert stop - begin == 4 * count
        end = stop
    assert 8 + n + end == len(raw)
    norm = header["model.language_model.layers.0.linear_attn.norm.weight"]["data_offsets"]
    assert set(struct.unpack(f"<{spec.linear_value_head_dim}f", raw[8 + n + norm[0] : 8 + n + norm[1]])) == {1.0}


def _split_safetensors(raw: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def test_bf16_holds_the_same_values_as_f32(tmp_path: Path) -> None:
    make_model(tmp_path / "f", TinyModelSpec(dtype="float32"))
    make_model(tmp_path / "b", TinyModelSpec(dtype="bfloat16"))
    hf, df = _split_safetensors((tmp_path / "f" / "model.safetensors").read_bytes())
    hb, db = _split_safetensors((tmp_path / "b" / "model.safetensors").read_bytes())
    assert hb["model.language_model.embed_tokens.weight"]["dtype"] == "BF16"
    name = "model.language_model.layers.3.self_attn.q_proj.weight"
    fo, bo = hf[name]["data_offsets"], hb[name]["data_offsets"]
    fvals = struct.unpack(f"<{(fo[1] - fo[0]) // 4}f", df[fo[0] : fo[1]])
    bvals = struct.unpack(f"<{(bo[1] - bo[0]) // 2}H", db[bo[0] : bo[1]])
    widened = [struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in bvals]
    assert list(fvals) == widened
    rms = (sum(v * v for v in fvals) / len(fvals)) ** 0.5
    assert 0.01 < rms < 0.03


def test_config_matches_spec(tmp_path: Path) -> None:
    spec = TinyModelSpec(name="t2", hidden_size=128, layers=6, full_attention_interval=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, num_experts=8, num_experts_per_tok=2, vocab_size=2048,
                         max_position_embeddings=8192, dtype="float32", seed=7)
    make_model(tmp_path, spec)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5MoeForCausalLM"]
    assert config["model_type"] == "qwen3_5_moe_text"
    assert config["layer_types"] == ["linear_attention", "linear_attention", "full_attention"] * 2
    assert (config["hidden_size"], config["num_hidden_layers"], config["head_dim"]) == (128, 6, 32)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert (config["num_experts"], config["num_experts_per_tok"]) == (8, 2)
    assert config["vocab_size"] == 2048 and config["max_position_embeddings"] == 8192
    assert config["dtype"] == "float32"
    assert config["tie_word_embeddings"] is False
    shapes = tensor_shapes(spec)
    assert shapes["model.language_model.layers.2.self_attn.q_proj.weight"] == (2 * 4 * 32, 128)  # query + its gate
    assert "model.language_model.layers.0.linear_attn.conv1d.weight" in shapes
    assert "model.language_model.layers.2.linear_attn.conv1d.weight" not in shapes
    assert shapes["model.language_model.layers.5.mlp.experts.7.down_proj.weight"] == (128, spec.moe_intermediate_size)
    ids = spec.special_token_ids
    assert config["eos_token_id"] == ids["<|im_end|>"] == 2048 - len(SPECIAL_TOKENS) + 2
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert ids["<|im_end|>"] in gen["eos_token_id"]
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"
    assert "<|im_start|>" in tok_config["chat_template"]
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    ids_in_tokenizer = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
    assert ids_in_tokenizer == set(range(spec.vocab_size))
    assert {t["content"]: t["id"] for t in tok["added_tokens"] if t["content"] in SPECIAL_TOKENS} == ids
    assert TinyModelSpec.from_dict(spec.to_dict()) == spec


def test_transformers_loads_every_tensor_under_its_name(tmp_path: Path) -> None:
    pytest.importorskip("torch")  # not in the test extras: the image's static probe and smoke load it there
    transformers = pytest.importorskip("transformers")
    make_model(tmp_path, TinyModelSpec())
    _, info = transformers.Qwen3_5MoeForCausalLM.from_pretrained(str(tmp_path), output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}


def test_spec_rejects_what_cannot_serve() -> None:
    with pytest.raises(InputError):
        TinyModelSpec(head_dim=16)
    with pytest.raises(InputError):
        TinyModelSpec(architecture="LlamaForCausalLM")
    with pytest.raises(InputError, match="not a hybrid"):
        TinyModelSpec(layers=3, full_attention_interval=4)  # no full attention layer
    with pytest.raises(InputError, match="not a hybrid"):
        TinyModelSpec(full_attention_interval=1)  # no Gated DeltaNet layer
    with pytest.raises(InputError, match="num_experts_per_tok"):
        TinyModelSpec(num_experts=2, num_experts_per_tok=3)
    with pytest.raises(InputError):
        TinyModelSpec(dtype="float16")
    with pytest.raises(InputError):
        TinyModelSpec.from_dict({"name": "x", "layer": 2})


def test_a_spec_the_stack_file_gets_wrong_is_named_at_its_line_with_what_was_expected(tmp_path: Path) -> None:
    """The build makes the model from the stack file's `smoke_model.make`: a value no servable model
    has is an input error at that file, line and field, saying what it should be."""
    stack = tmp_path / "tiny.yaml"
    stack.write_text("name: tiny\nsmoke_model:\n  name: servestack/tiny\n  make:\n    seed: 0\n    head_dim: 16\n")
    with pytest.raises(InputError) as bad:
        TinyModelSpec.from_dict({"name": "tiny", "seed": 0, "head_dim": 16}, stack_file=stack)
    assert str(bad.value) == (f"{stack}:6:5: smoke_model.make.head_dim: expected one of the head sizes vLLM's CPU "
                              "backend takes (32, 64, 80, 96, 112, 128, 192, 256), not 16")
    assert bad.value.exit_code == InputError.exit_code

    # A field the file does not write is named at the mapping that would hold it.
    with pytest.raises(InputError, match=rf"^{stack}:4:3: smoke_model.make.num_experts_per_tok: expected at most "
                                         r"num_experts \(2\), not 3$"):
        TinyModelSpec.from_dict({"name": "tiny", "num_experts": 2, "num_experts_per_tok": 3}, stack_file=stack)
    with pytest.raises(InputError, match=rf"^{stack}:4:3: smoke_model.make.layer: unknown field; did you mean `layers`\?"):
        TinyModelSpec.from_dict({"name": "tiny", "layer": 2}, stack_file=stack)

    # Made in code, a spec names the file such fields are written in.
    with pytest.raises(InputError, match=r"^pins/<stack>.yaml: smoke_model.make.dtype: expected one of .*, not 'float16'$"):
        TinyModelSpec(dtype="float16")


def test_merges_fill_the_vocab() -> None:
    vocab, merges, added = tokenizer_vocab(TinyModelSpec())
    assert len(vocab) + len(added) == 1024
    assert set(added) == set(SPECIAL_TOKENS)
    for a, b in merges:
        assert a in vocab and b in vocab and a + b in vocab


TEXTS = [
    "Hello, world!",
    "Natalia sold 48 clips in April and 24 in May: 72 altogether.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Unicode: café, naïve, 東京, emoji 🙂",
    "def f(x_1):\n    return x_1 ** 2  # comment",
]


def test_tokenizer_round_trips(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    make_model(tmp_path, TinyModelSpec())
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert tok.get_vocab_size(with_added_tokens=True) == 1024
    for text in TEXTS:
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text
        assert max(ids) < 1024
    # Merges are used: common English takes fewer tokens than bytes.
    assert len(tok.encode(TEXTS[1]).ids) < len(TEXTS[1].encode()) / 2
    chat = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(chat).ids
    assert ids[0] == tok.token_to_id("<|im_start|>") == 1024 - len(SPECIAL_TOKENS) + 1
    assert tok.token_to_id("<|im_end|>") in ids
    assert tok.token_to_id("<|endoftext|>") == 1024 - len(SPECIAL_TOKENS)
    assert tok.decode(ids, skip_special_tokens=False) == chat


def test_the_file_as_written_and_transformers_tokenize_alike(tmp_path: Path) -> None:
    """Dynamo's frontend reads tokenizer.json as written; vLLM reads it through transformers'
    Qwen2Tokenizer, which installs Qwen's own pre-tokenizer: the file says the same, so both give the
    same ids for digits and newlines (with GPT-2's pattern they split "48 + 24" differently)."""
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    make_model(tmp_path, TinyModelSpec())
    as_written = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    engine = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    for text in [*TEXTS, "He has 17 + 25 = 42 sheep.\n\nQuestion: 1,234?\r\n"]:
        assert as_written.encode(text, add_special_tokens=False).ids == engine.encode(text, add_special_tokens=False), text
    assert len(as_written.encode("2026").ids) == 4  # Qwen splits numbers digit by digit


def test_chat_template_renders(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    make_model(tmp_path, TinyModelSpec())
    tok = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    text = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.eos_token == "<|im_end|>"
