"""The API's parts without a server: request bodies to the page's Settings (structured output among them), stop
strings cut across rounds, usage and timings from RoundEvents, the engine's counters and the scheduler's
listener; and one structured answer through the routes in process, on the embedded model (the tiny test
tokenizer has no decoder llguidance can read)."""

from __future__ import annotations

import json
import pytest

from engine.events import RoundEvent
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from engine.serve.metrics import SpecCounters
from engine.serve.scheduler import Scheduler
from ui.api.answer import StopCut, Tally
from test_engine import SMALL_NGRAMS
from ui.api.request import ApiError, parse_chat

CHAIN = ["ngram-simple", "ngram-map-k"]
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}}, "required": ["name"],
          "additionalProperties": False}


def ev(kind="spec", drafted=(), m=0, emitted=(), text="", done=False, reason=None, t=1.0, seq=0, rows=0, ms=0.0):
    return RoundEvent(seq=seq, round=0 if kind == "prefill" else 1, kind=kind, drafter=None, pos_sampled=0, p0=1,
                      drafted=list(drafted), n_accepted=m, emitted=list(emitted), text_delta=text, done=done,
                      stop_reason=reason, t_end=t, batch_rows=rows, t_verify_ms=ms)


@pytest.mark.parametrize("fmt, kind, text", [
    (None, None, None),
    ({"type": "text"}, None, None),
    ({"type": "json_object"}, "json", ""),
    ({"type": "json_object", "schema": SCHEMA}, "json_schema", json.dumps(SCHEMA)),
    ({"type": "json_schema", "json_schema": {"name": "n", "strict": True, "schema": SCHEMA}}, "json_schema",
     json.dumps(SCHEMA)),
])
def test_response_format_takes_the_pages_grammar_path(fmt, kind, text):
    chat = parse_chat({"messages": USER, "response_format": fmt, "temperature": 0}, CHAIN)
    params = chat.gen_params(room=100)
    if kind is None:
        assert params.grammar is None
    else:
        assert (params.grammar.kind, params.grammar.text) == (kind, text)
    # as on the page: with a format the grammar drafter leads the chain, and plain decoding is constrained too
    assert params.spec.types == (["grammar"] + CHAIN if kind else CHAIN)
    chat.speculative = False
    plain = chat.gen_params(room=100)
    assert plain.spec.types == [] and plain.grammar == params.grammar


@pytest.mark.parametrize("body, words", [
    ({"response_format": {"type": "yaml"}}, "response_format type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "json_schema.schema"),
    ({"messages": []}, "non-empty"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text content"),
    ({"stop": 3}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "at most 4 stop strings"),
    ({"stop": "x" * 257}, "at most 4 stop strings"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"stream": "yes"}, "stream"),
    ({"tools": [{"type": "function"}]}, "tools"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
])
def test_bad_bodies_are_refused_with_the_reason(body, words):
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": USER, **body}, CHAIN).gen_params(room=10)
    assert e.value.status == 400 and words in str(e.value)


def test_validation_errors_come_from_the_engine():
    chat = parse_chat({"messages": USER, "speculative.n_min": 5, "speculative.n_max": 2}, CHAIN)
    with pytest.raises(ApiError, match=r"n_min \(5\) must not exceed n_max \(2\)"):
        chat.gen_params(room=10)
    with pytest.raises(ApiError, match="ignore_eos"):
        parse_chat({"messages": USER, "ignore_eos": True, "response_format": {"type": "json_object"}},
                   CHAIN).gen_params(room=10)


def test_fields_map_onto_settings():
    chat = parse_chat({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                      {"type": "text", "text": "b"}]}] + USER,
                       "stop": "x", "max_tokens": 9, "max_completion_tokens": 7, "top_p": 0.5, "seed": 4}, CHAIN)
    assert chat.messages == [{"role": "system", "content": "ab"}] + USER
    assert chat.stop == ["x"] and chat.max_tokens == 7  # max_completion_tokens replaces max_tokens, as in OpenAI
    params = chat.gen_params(room=100)
    assert (params.sampling.temp, params.sampling.top_p, params.sampling.seed) == (1.0, 0.5, 4)
    assert params.max_new_tokens == 7 and params.spec.types == CHAIN
    assert parse_chat({"messages": USER}, CHAIN).gen_params(room=50).max_new_tokens == 50  # the context's room


def test_stop_strings_are_cut_across_rounds():
    cut = StopCut(["END", "xyz"])
    assert cut.feed("hello E") == "hello "  # "E" may begin END: held
    assert cut.feed("N") == ""
    assert cut.feed("D and more") == "" and cut.hit
    assert cut.flush() == ""
    cut = StopCut(["END"])
    assert cut.feed("an E") == "an " and cut.feed("gg") == "Egg" and not cut.hit
    assert cut.feed("x EN") == "x " and cut.flush() == "EN"  # the answer ended before END did
    first = StopCut(["b", "a"])
    assert first.feed("xxab") == "xx" and first.hit  # the earliest stop in the text wins, not the first listed


def test_tally_counts_rounds_as_llama_server_times_them():
    tally = Tally(prompt_n=10)
    for e in [ev("prefill", emitted=[5], rows=4, ms=20.0, t=1.0), ev(drafted=[1, 2, 3], m=2, emitted=[1, 2, 7], t=1.5),
              ev("plain", emitted=[8], t=2.0), ev(drafted=[4], m=0, emitted=[9], done=True, reason="length", t=2.5)]:
        tally.add(e)
    t = tally.timings()
    assert (t["draft_n"], t["draft_n_accepted"], t["predicted_n"]) == (4, 2, 6)
    assert (t["prompt_n"], t["cache_n"], t["prompt_ms"]) == (4, 6, 20.0)
    assert t["predicted_ms"] == pytest.approx(1500.0) and t["predicted_per_second"] == pytest.approx(4.0)
    assert tally.usage() == {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}
    assert tally.finish_reason(False) == "length" and tally.finish_reason(True) == "stop"


def test_counters_count_drafts_positions_and_speed():
    c = SpecCounters()
    for e in [ev("prefill", emitted=[5], rows=3, t=1.0), ev(drafted=[1, 2, 3], m=2, emitted=[1, 2, 7], t=2.0),
              ev(drafted=[4, 5], m=1, emitted=[4, 6], done=True, reason="eos", t=3.0)]:
        c.observe(e)
    c.observe(ev(drafted=[1], m=1, emitted=[1, 2], seq=1, t=9.0), manual=True)  # step mode: no speed
    t = c.snapshot()
    assert (t.drafts, t.draft_tokens, t.accepted_tokens, t.accepted_per_pos) == (3, 6, 4, [3, 1])
    assert (t.prompt_tokens, t.generation_tokens) == (3, 8)
    assert t.tokens_per_second == pytest.approx(5 / 2.0)  # the tokens after the prefill over its rounds' time


def drain(gen) -> list:
    out = []
    while not (out and out[-1].done):
        out.append(gen.events.get(timeout=60))
    return out


def test_the_scheduler_tells_its_listener_every_round(tiny_target):
    heard = []
    counters = SpecCounters()

    def listener(e, manual, purpose):
        heard.append(e)
        counters.observe(e, manual, purpose)

    s = Scheduler(Engine(tiny_target, n_ctx=512, n_seq_max=2, calibrate=False, drafter_params=SMALL_NGRAMS),
                  on_event=listener)
    try:
        params = GenParams(max_new_tokens=20, ignore_eos=True, sampling=SamplerParams(temp=0.0),
                           spec=SpecParams(types=["ngram-simple"], n_max=4))
        gens = [s.submit(p, params) for p in ([1, 5, 6, 7, 5, 6, 7, 5], [1, 9, 10, 11, 9, 10])]
        got = [e for g in gens for e in drain(g)]
        assert s.load() == (0, 0)
    finally:
        s.close()
    rounds = [e for e in got if isinstance(e, RoundEvent)]
    assert sorted(map(id, heard)) == sorted(map(id, rounds))
    t = counters.snapshot()
    assert t.draft_tokens == sum(len(e.drafted) for e in rounds) > 0
    assert t.accepted_tokens == sum(e.n_accepted for e in rounds) == sum(t.accepted_per_pos)
    assert t.generation_tokens == 40


def test_a_json_schema_answer_through_the_routes(embedded):
    """The embedded model answers a json_schema response_format; the answer parses and follows it."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from ui.api.routes import api_routes
    from ui.state import AppOptions, AppState, Runtime
    from ui.tokens import Vocab

    state = AppState(runtime=None, options=AppOptions(parallel=1))
    engine = Engine(embedded, n_ctx=1024, n_seq_max=1, calibrate=False)
    state.runtime = Runtime(target=embedded, draft=None, engine=engine, vocab=Vocab.of(embedded.tokenizer),
                            scheduler=Scheduler(engine, on_event=state.counters.observe))
    try:
        with TestClient(FastAPI(routes=api_routes(state))) as http:
            r = http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Give a name as JSON."}], "temperature": 0,
                "max_tokens": 40, "response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}})
            metrics = http.get("/metrics").text
    finally:
        state.runtime.scheduler.close()
    assert r.status_code == 200, r.text
    body = r.json()
    answer = json.loads(body["choices"][0]["message"]["content"])
    assert set(answer) == {"name"} and isinstance(answer["name"], str) and len(answer["name"]) <= 12
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["timings"]["draft_n"] >= body["timings"]["draft_n_accepted"] > 0  # the grammar's forced tokens
    assert f"spec_decode_num_draft_tokens_total {float(body['timings']['draft_n'])}" in metrics


def test_the_api_is_on_unless_turned_off():
    import app

    assert app.parse_args([]).no_api is False and app.parse_args(["--no-api"]).no_api is True
