"""The correctness oracle (servestack/clients/agreement.py): two runs' greedy answers agree token for
token up to a near tie, log-probs within the bound; anything else names the prompt and why. And the
pipeline's accuracy gate built on it."""

from __future__ import annotations

import json
import threading
import time
import zlib
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from fixtures.servers import JsonHandler
from servestack.clients import agreement
from servestack.errors import InputError
from servestack.stages.gates import evaluate_agreement
from servestack.stages.results import compare_answers, load_answers


def answer(tokens, logprobs, tops, *, kind="tokens", prompt=(1, 2, 3), prompt_tokens=3, error=None):
    if error:
        return {"kind": kind, "length": len(prompt), "prompt": list(prompt), "error": error}
    return {"kind": kind, "length": len(prompt), "prompt": list(prompt), "text": "", "tokens": list(tokens),
            "logprobs": list(logprobs), "top": [list(map(list, t)) for t in tops], "prompt_tokens": prompt_tokens,
            "error": None}


def run(*answers):
    return {"schema": agreement.SCHEMA, "seconds": 1.0, "answers": list(answers)}


# Three greedy steps: token 7 (2 nats clear of 8), then 5 (a near tie with 6: 0.0625 apart), then 9.
REF = answer([7, 5, 9], [-0.1, -0.70, -0.3], [[(7, -0.1), (8, -2.1)], [(5, -0.70), (6, -0.7625)], [(9, -0.3), (4, -1.5)]])


def test_the_same_answers_agree_with_float_noise_below_the_bound():
    noisy = answer([7, 5, 9], [-0.13, -0.69, -0.35], REF["top"])
    row = agreement.compare_answer(REF, noisy)
    assert row["verdict"] == "agree" and row["agreed"] == row["compared"] == 3
    assert row["max_logprob_diff"] == pytest.approx(0.05)


def test_a_different_token_at_a_near_tie_ends_the_comparison_there():
    other = answer([7, 6, 1], [-0.1, -0.69, -5.0], [[(7, -0.1), (8, -2.1)], [(6, -0.69), (5, -0.72)], [(1, -5.0), (2, -6)]])
    row = agreement.compare_answer(REF, other)
    assert row["verdict"] == "agree" and row["agreed"] == 1
    assert "near tie at token 1: 5 vs 6" in row["detail"]


def test_a_near_tie_of_three_may_reorder_as_long_as_both_choices_stay_near_the_top():
    """Batch-shape noise reordered a three-way tie at one prompt's sixth token: the reference's choice
    fell to the candidate's third place. It is a near tie all the same: the candidate's choice is
    within the tolerance of the reference's best, and the reference's among the candidate's best."""
    ref = answer([7, 5], [-0.1, -2.08], [[(7, -0.1), (8, -2.1), (9, -3)], [(5, -2.08), (6, -2.1425), (4, -2.3)]])
    cand = answer([7, 6], [-0.1, -2.045], [[(7, -0.1), (8, -2.1), (9, -3)], [(6, -2.045), (4, -2.23), (5, -2.24)]])
    row = agreement.compare_answer(ref, cand)
    assert row["verdict"] == "agree" and row["parted_at"] == 1 and "near tie at token 1: 5 vs 6" in row["detail"]
    # Out of the candidate's list altogether, the reference's choice was no near tie there.
    gone = answer([7, 6], [-0.1, -2.045], [[(7, -0.1), (8, -2.1), (9, -3)], [(6, -2.045), (4, -2.23), (3, -2.3)]])
    assert agreement.compare_answer(ref, gone)["verdict"] == "disagree"


def test_a_lost_state_disagrees_from_its_first_token_naming_the_gap():
    lost = answer([3, 3, 3], [-0.2, -0.2, -0.2], [[(3, -0.2), (7, -3.0)]] * 3)
    row = agreement.compare_answer(REF, lost)
    assert row["verdict"] == "disagree" and row["agreed"] == 0
    assert "token 0: 7 vs 3" in row["detail"] and "2.0000 nats apart" in row["detail"]


def test_the_first_token_s_log_prob_is_held_to_float_noise():
    off = answer([7, 5, 9], [-0.3, -0.70, -0.3], REF["top"])
    row = agreement.compare_answer(REF, off)
    assert row["verdict"] == "disagree" and row["agreed"] == 0
    assert "token 0 (7): log-prob -0.1000 vs -0.3000 (bound 0.15)" in row["detail"]


def test_a_later_token_may_carry_more_float_noise_but_not_half_a_nat():
    """After the first token a random-weight network carries the paths' float noise on (at most
    0.095 nats measured), so later tokens get more room than the first, but not half a nat."""
    noisy = answer([7, 5, 9], [-0.1, -0.70, -0.6], REF["top"])
    row = agreement.compare_answer(REF, noisy)
    assert row["verdict"] == "agree" and row["agreed"] == 3 and row["max_logprob_diff"] == pytest.approx(0.3)
    off = answer([7, 5, 9], [-0.1, -0.70, -0.9], REF["top"])
    row = agreement.compare_answer(REF, off)
    assert row["verdict"] == "disagree" and row["agreed"] == 2
    assert "token 2 (9): log-prob -0.3000 vs -0.9000 (bound 0.5)" in row["detail"]


def test_text_tokenized_differently_by_the_two_servers_disagrees():
    row = agreement.compare_answer(answer([7], [-1], [[(7, -1), (8, -2)]], kind="text", prompt_tokens=25),
                                   answer([7], [-1], [[(7, -1), (8, -2)]], kind="text", prompt_tokens=22))
    assert row["verdict"] == "disagree" and "25 tokens to the reference and 22 to the candidate" in row["detail"]


def test_a_failed_request_is_an_error_and_the_run_fails_naming_it():
    result = agreement.compare(run(REF, REF), run(REF, answer((), (), (), error="HTTPError: HTTP Error 500")))
    assert not result["passed"] and result["failed"] == [1] and result["identical"] == 1
    assert "prompt 1 (tokens, 3 tokens): error: candidate: HTTPError: HTTP Error 500" in agreement.describe_failures(result)


def test_a_broken_candidate_cannot_look_closer_by_choosing_other_tokens():
    """The old summary took log-prob differences only where both sides chose the same token, so a
    candidate that parted at its first token showed 0.0. The first token's difference counts the
    reference's token in the candidate's list whatever the candidate chose."""
    parted = answer([8, 5, 9], [-0.05, -0.70, -0.3], [[(8, -0.05), (7, -3.0)], [(5, -0.7), (6, -1.0)], [(9, -0.3), (4, -1)]])
    row = agreement.compare_answer(REF, parted)
    assert row["verdict"] == "disagree" and row["parted_at"] == 0
    assert row["first_token_diff"] == pytest.approx(2.9) and not row["first_token_diff_at_least"]
    # Not even among the candidate's best: a lower bound, and marked as one.
    unseen = answer([3, 5, 9], [-0.05, -0.70, -0.3], [[(3, -0.05), (4, -2.0)], [(5, -0.7), (6, -1.0)], [(9, -0.3), (4, -1)]])
    row = agreement.compare_answer(REF, unseen)
    assert row["first_token_diff"] == pytest.approx(1.9) and row["first_token_diff_at_least"]
    result = agreement.compare(run(REF, REF), run(REF, parted))
    assert result["max_first_token_diff"] == pytest.approx(2.9) and result["failed_transferred"] == [1]
    assert "parted (length:position) 3:0" in agreement.summary(result)


def test_the_one_token_prompt_is_a_control_not_evidence_of_a_transfer():
    one = answer([7, 5, 9], REF["logprobs"], REF["top"], prompt=(4,), prompt_tokens=1)
    result = agreement.compare(run(one, REF), run(one, REF))
    assert result["passed"] and result["controls"] == [0]
    assert result["transferred_prompts"] == 1 and result["identical"] == 1
    assert agreement.summary(result).startswith("1 of 1 transferred prompts identical")
    assert "control (never transferred): tokens of 1 token agree" in agreement.summary(result)
    # A control that disagrees still fails the run (the decode worker computes wrongly), named as a control.
    lost = answer([3, 3, 3], [-0.2, -0.2, -0.2], [[(3, -0.2), (7, -3.0)]] * 3, prompt=(4,), prompt_tokens=1)
    result = agreement.compare(run(one, REF), run(lost, REF))
    assert not result["passed"] and result["failed"] == [0] and result["failed_transferred"] == []
    assert "prompt 0 (tokens, 1 tokens, control): disagree" in agreement.describe_failures(result)


class _PairStillHandshaking(JsonHandler):
    """A server that lists its model but fails its first completions with HTTP 500, as a
    disaggregated pair does while the decode worker's NIXL handshake with prefill times out."""

    failures_left = 0
    failure_status = 500
    completions = 0

    def do_GET(self):
        self.send_json(200, {"data": [{"id": "tiny"}]})

    def do_POST(self):
        body = self.read_json()
        cls = type(self)
        cls.completions += 1
        if cls.failures_left:
            cls.failures_left -= 1
            status = cls.failure_status
            return self.send_json(status, {"message": "Model `tiny` is not ready to serve requests yet" if status == 503
                                           else "Internal server error", "code": status})
        n = body["max_tokens"]
        self.send_json(200, {"choices": [{"text": "", "logprobs": {"tokens": ["token_id:7"] * n, "token_logprobs": [-0.5] * n,
                                                                     "top_logprobs": [{"token_id:7": -0.5, "token_id:8": -1.5}] * n}}],
                             "usage": {"prompt_tokens": len(body["prompt"]) if isinstance(body["prompt"], list) else 3}})


def _serving(handler) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


@pytest.fixture
def handshaking_server():
    server, url = _serving(_PairStillHandshaking)
    yield url
    server.shutdown()
    _PairStillHandshaking.failure_status = 500


def test_the_oracle_asks_its_prompts_only_after_the_server_served_one_completion_and_keeps_what_failed_before(
        handshaking_server, tmp_path: Path):
    _PairStillHandshaking.failures_left, _PairStillHandshaking.completions = 2, 0
    warmup = agreement.warm_up(handshaking_server, "tiny", 1017, time.monotonic() + 30, pause=0.05)
    assert warmup["served"] and warmup["failed_attempts"] == 2
    assert all("HTTP Error 500" in e for e in warmup["errors"])

    _PairStillHandshaking.failures_left = 1
    out = tmp_path / "answers.json"
    assert agreement.main(["collect", "--base-url", handshaking_server, "--model", "tiny", "--vocab-size", "1017",
                           "--wait", "30", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert not any(a["error"] for a in result["answers"]) and result["warmup"]["failed_attempts"] == 1


def test_a_server_that_never_serves_is_named_by_the_warm_up_and_its_prompts_still_fail(handshaking_server):
    _PairStillHandshaking.failures_left, _PairStillHandshaking.completions = 10**6, 0
    warmup = agreement.warm_up(handshaking_server, "tiny", 1017, time.monotonic() + 0.5, pause=0.1)
    assert not warmup["served"] and warmup["failed_attempts"] >= 2 and len(warmup["errors"]) <= 5
    answers = agreement.collect(handshaking_server, "tiny", 1017, lengths=(1, 2), texts=())
    assert all(a["error"] for a in answers["answers"])


def test_a_prompt_refused_as_unavailable_is_asked_again_and_the_refusals_are_kept(handshaking_server):
    # Dynamo's frontend holds its decode worker out of routing for 5 s after a transport error and
    # answers 503 "not ready ... retry shortly" meanwhile: the prompt is asked again after a pause.
    _PairStillHandshaking.failures_left, _PairStillHandshaking.failure_status = 3, 503
    result = agreement.collect(handshaking_server, "tiny", 1017, lengths=(1, 2), texts=(), unavailable_pause=0.01)
    first, second = result["answers"]
    assert not first["error"] and len(first["refused"]) == 3 and "HTTP Error 503" in first["refused"][0]
    assert not second["error"] and second["refused"] == [] and result["refused_attempts"] == 3


def test_a_server_unavailable_for_good_costs_the_retry_time_once_and_other_errors_fail_at_once(handshaking_server):
    _PairStillHandshaking.failures_left, _PairStillHandshaking.failure_status = 10**6, 503
    started = time.monotonic()
    first, *rest = agreement.collect(handshaking_server, "tiny", 1017, lengths=(1, 2, 5, 16), texts=(),
                                     unavailable_pause=0.1, unavailable_retry=0.5)["answers"]
    assert time.monotonic() - started < 2.0  # 0.5 s of waiting in all, not 0.5 s a prompt
    assert "HTTP Error 503" in first["error"] and len(first["refused"]) == 5
    assert all("HTTP Error 503" in a["error"] and a["refused"] == [] for a in rest)
    _PairStillHandshaking.failure_status = 500
    [answer_] = agreement.collect(handshaking_server, "tiny", 1017, lengths=(1,), texts=(), unavailable_pause=0.05)["answers"]
    assert "HTTP Error 500" in answer_["error"] and answer_["refused"] == []


class _Model(JsonHandler):
    """A server whose greedy answer is a function of its prompt, a few milliseconds a token. With
    `misroute`, a request that arrives while another is in flight is answered from that one's state,
    as a decode worker that hands a request another in-flight request's state would."""

    misroute = False
    in_flight: list = []
    lock = threading.Lock()

    @staticmethod
    def answer(prompt, n):
        first = 10 + zlib.crc32(json.dumps(prompt).encode()) % 100_000  # distinct answers for distinct prompts
        return {"tokens": [f"token_id:{first + i}" for i in range(n)], "token_logprobs": [-0.5] * n,
                "top_logprobs": [{f"token_id:{first + i}": -0.5, "token_id:1": -3.0} for i in range(n)]}

    def do_POST(self):
        body = self.read_json()
        cls = type(self)
        with cls.lock:
            source = cls.in_flight[0] if cls.misroute and cls.in_flight else body["prompt"]
            cls.in_flight.append(body["prompt"])
        time.sleep(0.004 * body["max_tokens"])
        with cls.lock:
            cls.in_flight.remove(body["prompt"])
        self.send_json(200, {"choices": [{"text": "", "logprobs": cls.answer(source, body["max_tokens"])}],
                             "usage": {"prompt_tokens": len(body["prompt"])}})


@pytest.fixture
def model_server():
    server, url = _serving(_Model)
    yield url
    server.shutdown()
    _Model.misroute = False


def test_under_load_pairs_arrive_while_the_carrier_decodes_and_agree_with_their_answers_one_at_a_time(model_server):
    reference = agreement.collect(model_server, "tiny", 1017, texts=())
    loaded = reference["loaded"]
    assert [a["kind"] for a in loaded["answers"]] == ["carrier"] + ["pair"] * 2 * len(agreement.PAIR_LENGTHS)
    assert loaded["arrived_while_decoding"] == 2 * len(agreement.PAIR_LENGTHS)
    assert len(loaded["answers"][0]["tokens"]) == agreement.CARRIER_TOKENS
    result = agreement.compare(reference, agreement.collect(model_server, "tiny", 1017, texts=()))
    assert result["passed"] and result["loaded"]["identical"] == 7, agreement.describe_failures(result)
    assert ("under load 7 of 7 identical, 0 parted at a near tie, 0 where the reference parts under load too, "
            "0 disagree (6 arrived while") in agreement.summary(result)


def test_a_state_handed_to_another_in_flight_request_passes_one_at_a_time_and_fails_under_load(model_server):
    reference = agreement.collect(model_server, "tiny", 1017, texts=())
    _Model.misroute = True
    result = agreement.compare(reference, agreement.collect(model_server, "tiny", 1017, texts=()))
    assert result["failed"] == [], "one at a time, nothing else is in flight: the sequential round agrees"
    assert not result["passed"] and len(result["loaded"]["failed"]) >= 6
    assert "under load, pair of 16 tokens: disagree: token 0" in agreement.describe_failures(result, most=20)


def test_an_answer_that_matches_its_partner_is_named_as_another_request_s_state():
    a = answer([7, 5, 9], REF["logprobs"], REF["top"], prompt=(1, 2))
    b = answer([3, 3, 3], [-0.2] * 3, [[(3, -0.2), (7, -3.0)]] * 3, prompt=(4, 5))
    reference = run(a, b)
    swapped = {**run(a, b), "loaded": {"answers": [{**a, "kind": "carrier"}, {**b, "kind": "pair", "prompt": [1, 2]},
                                                   {**a, "kind": "pair", "prompt": [4, 5]}], "arrived_while_decoding": 2}}
    loaded = agreement.compare(reference, swapped)["loaded"]
    assert loaded["failed"] == [1, 2]
    assert all(loaded["rows"][i]["detail"].startswith("answered as its partner of the same length (another request's "
                                                      "state): token 0") for i in (1, 2))


def test_where_the_reference_parts_under_the_same_load_the_candidate_may_part_too():
    """Batch composition, not a transfer: on an H100 the aggregated server's own 1,024-token pair swapped a
    0.31-nat tie at token 4 under the loaded round, in every run; the disaggregated pair did the same."""
    a = answer([7, 5, 9], REF["logprobs"], REF["top"], prompt=(1, 2))
    b = answer([3, 3, 3], [-0.2] * 3, [[(3, -0.2), (7, -3.0)]] * 3, prompt=(4, 5))
    swapped_tie = answer([7, 5, 4], [-0.1, -0.7, -1.4], [[(7, -0.1), (8, -2.1)], [(5, -0.7), (6, -0.76)], [(4, -1.4), (9, -1.7)]],
                         prompt=(1, 2))
    loaded = {"answers": [{**b, "kind": "carrier"}, {**swapped_tie, "kind": "pair"}, {**b, "kind": "pair"}],
              "arrived_while_decoding": 2}
    reference = {**run(a, b), "loaded": loaded}
    result = agreement.compare(reference, {**run(a, b), "loaded": loaded})
    assert result["passed"] and result["loaded"]["as_reference"] == 1, agreement.describe_failures(result)
    assert result["loaded"]["rows"][1]["detail"].startswith("parts as the reference does under this load: token 2")
    # Where the reference kept its answer under load, the same parting is a disagreement.
    steady = {**run(a, b), "loaded": {**loaded, "answers": [{**b, "kind": "carrier"}, {**a, "kind": "pair"}, {**b, "kind": "pair"}]}}
    assert not agreement.compare(steady, {**run(a, b), "loaded": loaded})["passed"]


def test_a_near_tie_does_not_excuse_the_reference_token_moving_more_than_noise():
    """A changed choice at a near tie is allowed only where the reference's own token kept its log-prob
    (within the bound): broken runs got through with their reference token moved 0.36 nats."""
    moved = answer([6, 5, 9], [-0.05, -0.7, -0.3], [[(6, -0.05), (7, -0.2), (8, -2.1)], [(5, -0.7)], [(9, -0.3)]])
    ref = answer([7, 5, 9], [-0.1, -0.70, -0.3], [[(7, -0.1), (6, -0.2), (8, -2.1)], [(5, -0.7)], [(9, -0.3)]])
    assert agreement.compare_answer(ref, moved)["verdict"] == "agree"
    far = answer([6, 5, 9], [-0.05, -0.7, -0.3], [[(6, -0.05), (7, -0.46), (8, -2.1)], [(5, -0.7)], [(9, -0.3)]])
    row = agreement.compare_answer(ref, far)
    assert row["verdict"] == "disagree" and "its 7 moved 0.3600" in row["detail"]


def test_runs_of_different_prompts_are_not_compared():
    with pytest.raises(ValueError, match="same prompts"):
        agreement.compare(run(REF), run(answer([7], [-1], [[(7, -1)]], prompt=(9,))))


def test_prompts_are_token_ids_of_the_stated_lengths_the_same_every_time():
    prompts = agreement.token_prompts(1017)
    assert [len(p) for p in prompts] == list(agreement.LENGTHS)
    assert prompts == agreement.token_prompts(1017) and prompts != agreement.token_prompts(1017, seed=1)
    assert all(0 <= t < 1017 for p in prompts for t in p) and len({t for p in prompts for t in p}) > 900


def test_the_gate_holds_every_recipe_to_the_reference(tmp_path: Path):
    lost = answer([3, 3, 3], [-0.2, -0.2, -0.2], [[(3, -0.2), (7, -3.0)]] * 3)
    answers = {"agg-acc": run(REF, REF), "disagg-acc": run(REF, lost)}
    comparisons, runs = compare_answers(answers, "agg-acc")
    [(c, r)] = zip(comparisons, runs, strict=True)
    assert c["recipe"] == "disagg-acc" and c["reference"] == "agg-acc" and r.accuracy == 0.5 and r.n == 2
    verdict = evaluate_agreement(comparisons, "agg-acc", ["agg-acc", "disagg-acc"], set(answers))
    [failure] = verdict.failures
    assert failure.gate == "agreement" and failure.recipe == "disagg-acc" and failure.point == "vs agg-acc"
    assert "1 of 2 requests disagree with agg-acc: prompt 1 (tokens, 3 tokens): disagree: token 0: 7 vs 3" in failure.message
    # No answers from the reference: nothing is compared, and that is a failure, not a pass.
    comparisons, _ = compare_answers({"disagg-acc": answers["disagg-acc"]}, "agg-acc")
    verdict = evaluate_agreement(comparisons, "agg-acc", ["agg-acc", "disagg-acc"], {"disagg-acc"})
    assert [f.gate for f in verdict.failures] == ["missing"] and "the reference" in verdict.failures[0].message
    # Answers that are not the oracle's are refused, naming the file.
    f = tmp_path / "answers.json"
    f.write_text(json.dumps({"accuracy": 0.5}))
    with pytest.raises(InputError, match="answers.json"):
        load_answers(f)


def test_the_report_names_what_was_asked_again(tmp_path: Path):
    from servestack.stages.results import StageResult
    from servestack.stages.stage_report import markdown_stage

    candidate = {**run(REF), "warmup": {"served": True, "failed_attempts": 1}, "refused_attempts": 2}
    comparisons, runs = compare_answers({"agg-acc": run(REF), "disagg-acc": candidate}, "agg-acc")
    result = StageResult(stack="dev-cpu", pipeline="dev-cpu", stage="accuracy", image="img@sha256:" + "0" * 64, runner="local",
                         out_dir=tmp_path,
                         accuracy=runs, agreement=comparisons)
    md = markdown_stage(result)
    assert ("Asked again: `disagg-acc`: 1 failed warm-up attempts, 2 attempts refused as unavailable (HTTP 503) "
            "and asked again.") in md and "`agg-acc`:" not in md.split("Asked again:")[1]


def test_selecting_a_recipe_the_oracle_judges_runs_its_reference_too():
    from servestack.stages.execute import _selected
    from servestack.stages.pipeline import load_pipeline

    root = ROOT
    pipeline = load_pipeline(root / "pipelines" / "dev-cpu.yaml", root)
    assert _selected(pipeline, ("disagg-acc",))["accuracy"].recipes == ("agg-acc", "disagg-acc")
    assert "accuracy" not in _selected(pipeline, ("agg",))
    with pytest.raises(InputError, match="agg-acc is the reference the other recipes are held to; alone it is judged by nothing"):
        _selected(pipeline, ("agg-acc",))
