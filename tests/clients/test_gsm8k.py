"""The GSM8K client: answer extraction, scoring, prompt format, and a whole run against a fake server."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from fixtures.paths import ROOT
from fixtures.servers import JsonHandler
from servestack.clients import gsm8k

DATA = ROOT / "data" / "gsm8k"  # shipped with the project


@pytest.mark.parametrize("text,expected", [
    ("She has 3 + 4 = 7 apples.\n#### 7", "7"),
    ("#### 1,234", "1234"),
    ("#### -5", "-5"),
    ("#### 3.50", "3.5"),
    ("#### 12.", "12"),
    ("the answer is 7", None),          # no '#### N': strict finds nothing
    ("####7", None),                    # lm-eval's pattern needs the space
    ("#### 8\nQuestion: #### 9", "8"),  # the first match
])
def test_strict_extraction(text, expected):
    assert gsm8k.extract_strict(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("so she pays $1,200 in total.", "1200"),
    ("first 3 then 4 then 18", "18"),
    ("#### 42", "42"),
    ("no digits here", None),
    ("-7 degrees", "-7"),
])
def test_flexible_extraction(text, expected):
    assert gsm8k.extract_flexible(text) == expected


def test_reference_answers_of_the_real_test_set_all_parse():
    rows = gsm8k.read_jsonl(str(DATA / "test.jsonl"))
    assert len(rows) == 1319
    golds = [gsm8k.reference_answer(r["answer"]) for r in rows]
    assert golds[0] == "18" and all(g is not None for g in golds)


def test_prompt_is_lm_eval_style():
    train = gsm8k.read_jsonl(str(DATA / "train.jsonl"))
    prefix = gsm8k.fewshot_prefix(train, 5)
    prompt = gsm8k.build_prompt(prefix, "What is 2+2?")
    assert prompt.count("Question: ") == 6 and prompt.endswith("Question: What is 2+2?\nAnswer:")
    assert prefix.startswith(f"Question: {train[0]['question']}\nAnswer: {train[0]['answer']}\n\n")
    assert prefix.count("####") == 5


def test_score_counts_strict_flexible_invalid_and_errors():
    s = gsm8k.score(["x #### 5", "5", None, "#### 4"], ["5", "5", "5", "5"])
    assert s == {"n": 4, "correct_strict": 1, "correct_flexible": 2, "accuracy_strict": 0.25,
                 "accuracy_flexible": 0.5, "invalid_strict": 2, "invalid_flexible": 1, "errors": 1}


class _Fake(JsonHandler):
    answers: dict[str, str] = {}
    requests: list[dict] = []

    def do_POST(self):
        body = self.read_json()
        type(self).requests.append(body)
        question = body["prompt"].rsplit("Question: ", 1)[1].split("\nAnswer:")[0]
        gold = self.answers[question]
        # Every other question right, the rest with a wrong strict answer and a right trailing number.
        idx = list(self.answers).index(question)
        text = f" work... #### {gold}" if idx % 2 == 0 else f" #### 0 but really {gold}"
        self.send_json(200, {"choices": [{"text": text}], "usage": {"completion_tokens": 7}})


def test_whole_run_against_a_fake_server(tmp_path):
    rows = gsm8k.read_jsonl(str(DATA / "test.jsonl"))[:10]
    _Fake.answers = {r["question"]: gsm8k.reference_answer(r["answer"]) for r in rows}
    _Fake.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        out = tmp_path / "r.json"
        rc = gsm8k.main(["--base-url", f"http://127.0.0.1:{server.server_port}", "--model", "m",
                         "--dataset", str(DATA / "test.jsonl"), "--fewshot-from", str(DATA / "train.jsonl"),
                         "--num-questions", "10", "--shots", "5", "--repeats", "2", "--concurrency", "4",
                         "--out", str(out)])
    finally:
        server.shutdown()
    assert rc == 0
    result = json.loads(out.read_text())
    assert [r["repeat"] for r in result["repeats"]] == [0, 1]
    rep = result["repeats"][0]
    assert (rep["n"], rep["accuracy_strict"], rep["accuracy_flexible"], rep["errors"]) == (10, 0.5, 1.0, 0)
    assert rep["output_tokens"] == 70 and result["gated_on"] == "strict"
    req = _Fake.requests[0]
    assert req["temperature"] == 0 and req["stop"] == ["Question:", "</s>", "<|im_end|>"] and req["model"] == "m"
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, nothing left behind


def test_unreachable_server_is_an_error_not_a_zero(tmp_path, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(gsm8k, "sleep", waits.append)
    out = tmp_path / "r.json"
    rc = gsm8k.main(["--base-url", "http://127.0.0.1:9", "--model", "m", "--dataset", str(DATA / "test.jsonl"),
                     "--fewshot-from", str(DATA / "train.jsonl"), "--num-questions", "2", "--timeout", "2",
                     "--out", str(out)])
    assert rc == 2
    assert json.loads(out.read_text())["repeats"][0]["errors"] == 2
    assert sorted(waits) == [1, 1, 2, 2, 4, 4]  # each question's three attempts, backing off
