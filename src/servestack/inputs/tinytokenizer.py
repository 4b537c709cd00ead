"""The tiny model's tokenizer, constructed rather than trained with a library, bit-for-bit.

A GPT-2/Qwen style byte-level BPE whose vocabulary is the 256 byte symbols plus merges learned from
the fixed corpus below by plain greedy BPE (most frequent pair, ties to the smallest pair), then
Qwen's special tokens; tokenizer.json and tokenizer_config.json are canonical JSON. It carries
Qwen's own pre-tokenizer, so Dynamo's frontend (the file as written) and vLLM (transformers'
Qwen2Tokenizer) give the same ids.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from typing import Any, Protocol

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>",
                  "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
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


class TokenizerSpec(Protocol):
    """What the tokenizer reads of tinymodel.TinyModelSpec (tinymodel imports this module),
    read-only as in its frozen record."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def max_position_embeddings(self) -> int: ...


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


def tokenizer_vocab(spec: TokenizerSpec) -> tuple[dict[str, int], list[tuple[str, str]], dict[str, int]]:
    """(BPE vocab, merges, added special tokens). Ids: bytes 0-255, merged tokens, reserved
    filler if the corpus runs out of merges, then the Qwen special tokens at the end."""
    vocab, merges, added = _vocab_cached(spec.vocab_size)
    return dict(vocab), list(merges), dict(added)


def tokenizer_json(spec: TokenizerSpec) -> dict[str, Any]:
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


def tokenizer_config(spec: TokenizerSpec) -> dict[str, Any]:
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
