"""The tokenizer section: the model's tokenizer.json read as Dynamo's frontend reads it (the tokenizers
library on the file as written) and as vLLM reads it (transformers' AutoTokenizer, whose Qwen2Tokenizer
installs its own pre-tokenizer), on text with digits, newlines and other scripts: the same token ids."""

from __future__ import annotations

import os

from .report import FAIL, PASS, check

TEXTS = (
    "Natalia sold 48 clips in April, and then she sold half as many clips in May.\nHow many clips did she sell?",
    "Question: 17 + 25 = ?\nAnswer: 42\n\nQuestion: 42 - 9 = ?\nAnswer:",
    "def add(a, b):\n    return a + b\n\nprint(add(12, 30))",
    "  leading spaces, tabs\tand\r\nwindows newlines\n\n\n",
    "Unicode: café, naïve, 東京 2026, emoji 🙂, 1,234.56",
    "<|im_start|>user\nWhat is 6 * 7?<|im_end|>\n<|im_start|>assistant\n",
)


def section_tokenizer(config: dict) -> list[dict]:
    import tokenizers
    import transformers

    model_dir = config["model_dir"]
    as_written = tokenizers.Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    engine = transformers.AutoTokenizer.from_pretrained(model_dir)
    differ = []
    for text in TEXTS:
        frontend_ids = as_written.encode(text, add_special_tokens=False).ids
        engine_ids = engine.encode(text, add_special_tokens=False)
        if frontend_ids != engine_ids:
            at = next((i for i, (a, b) in enumerate(zip(frontend_ids, engine_ids, strict=False)) if a != b),
                      min(len(frontend_ids), len(engine_ids)))
            differ.append(f"{text[:40]!r}: {len(frontend_ids)} ids as written vs {len(engine_ids)} through "
                          f"{type(engine).__name__}, first difference at id {at}")
    if differ:
        return [check("tokenizer:frontend-engine", FAIL, "tokenizer.json as written (Dynamo's frontend) and "
                      f"transformers (vLLM) tokenize differently: {'; '.join(differ)}")]
    return [check("tokenizer:frontend-engine", PASS, f"{len(TEXTS)} texts (digits, newlines, other scripts, chat markup) "
                  f"give the same token ids as written and through {type(engine).__name__}")]
