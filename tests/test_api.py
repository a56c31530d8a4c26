"""The OpenAI-compatible endpoint and /metrics of the real app (python app.py on a tiny target, 2 slots), driven
by the official openai client: lossless answers streamed and whole, stop strings, token limits, refusals with
OpenAI's error body, a client that leaves mid-answer, and counters that add up to the answers' own timings."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadclient import connect, free_port, run_regular, serving
from tiny import save_tiny

START_TIMEOUT_S = 180  # imports and calibration on a busy 2-core machine
COPY = "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11"  # the tiny model's answer repeats: the n-grams draft
OPEN = "w30 w31 w32 w33 w34 w30 w31 w32"
TOO_LONG = " ".join(["w7"] * 2100)  # more tokens than the tiny model's 1024 positions


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("api")
    target = save_tiny(root / "target", seed=0)
    args = ["--target", str(target), "--port", str(free_port()), "--parallel", "2", "--n-ctx", "2048"]
    yield from serving(args, root / "app.log", START_TIMEOUT_S)


@pytest.fixture(scope="module")
def url(app):
    return app[0]


@pytest.fixture(scope="module")
def client(url):
    with openai.OpenAI(base_url=url + "v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def ask(client, prompt: str, **kw):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": prompt}], **kw)


def ask_streamed(client, prompt: str, **kw) -> tuple[str, str, dict]:
    """(content, finish_reason, the last chunk's timings) of a streamed answer."""
    parts, finish, timings = [], None, None
    for chunk in ask(client, prompt, stream=True, **kw):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        timings = getattr(chunk, "timings", None) or timings
    return "".join(parts), finish, timings


def scrape(url: str) -> dict:
    """Every sample of /metrics: name (with its labels) -> value."""
    text = httpx.get(url + "metrics", timeout=30).text
    return {s.name + "".join(f"[{v}]" for v in s.labels.values()): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def idle(url: str, timeout: float = 30) -> dict:
    """/metrics once no slot generates and nobody waits (a cancelled answer ends at its next round)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        if (m["slots_busy"] == 0 and m["requests_waiting"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


@pytest.mark.parametrize("prompt", [COPY, OPEN])
def test_whole_and_streamed_answers_equal_plain_decoding(client, prompt):
    whole = ask(client, prompt, temperature=0, max_tokens=40)
    streamed, finish, timings = ask_streamed(client, prompt, temperature=0, max_tokens=40)
    plain = ask(client, prompt, temperature=0, max_tokens=40, extra_body={"speculative": False})
    text = whole.choices[0].message.content
    assert text and text == streamed == plain.choices[0].message.content
    assert whole.choices[0].finish_reason == finish == plain.choices[0].finish_reason
    assert whole.usage.completion_tokens == plain.usage.completion_tokens
    for t in (whole.timings, timings):
        assert 0 <= t["draft_n_accepted"] <= t["draft_n"]
        assert t["predicted_n"] == whole.usage.completion_tokens and t["predicted_ms"] >= 0
    assert plain.timings["draft_n"] == 0
    if prompt == COPY:
        assert whole.timings["draft_n"] > 0 and whole.timings["draft_n_accepted"] > 0


def test_a_stop_string_cuts_the_answer(client):
    full = ask(client, COPY, temperature=0, max_tokens=30).choices[0].message.content
    words = full.split(" ")
    stop = " " + words[5]
    expected = full[: full.find(stop)]
    whole = ask(client, COPY, temperature=0, max_tokens=30, stop=[stop, "never-said"])
    assert (whole.choices[0].message.content, whole.choices[0].finish_reason) == (expected, "stop")
    streamed, finish, _ = ask_streamed(client, COPY, temperature=0, max_tokens=30, stop=stop)
    assert (streamed, finish) == (expected, "stop")


def test_max_tokens_ends_with_length(client):
    for kw in ({"max_tokens": 3}, {"max_completion_tokens": 3}):
        r = ask(client, OPEN, temperature=0, **kw)
        assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 3
        assert r.usage.prompt_tokens > 0 and r.timings["prompt_n"] + r.timings["cache_n"] == r.usage.prompt_tokens


@pytest.mark.parametrize("kw, words", [
    (dict(messages=[]), "non-empty"),
    (dict(response_format={"type": "yaml"}), "response_format"),
    (dict(extra_body={"speculative.n_min": 5, "speculative.n_max": 2}), "n_min"),
    (dict(temperature=-1), "temperature"),
    (dict(n=2), "n must be 1"),
    (dict(messages=[{"role": "user", "content": TOO_LONG}]), "does not fit"),
    # the tiny tokenizer has no decoder llguidance can read: structured output is refused, with the reason
    (dict(response_format={"type": "json_object"}), "grammars need"),
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
     "grammars need"),
])
def test_bad_requests_get_400_with_a_message(client, kw, words):
    kw.setdefault("messages", [{"role": "user", "content": "w1 w2"}])
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", max_tokens=4, **kw)
    body = e.value.response.json()["error"]
    assert e.value.status_code == 400 and body["type"] == "invalid_request_error"
    assert words in body["message"]


def test_a_body_that_is_not_json_gets_400(url):
    r = httpx.post(url + "v1/chat/completions", content=b"{not json", timeout=30,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(url + "v1/chat/completions", content=b'{"messages": []}', timeout=30)  # no JSON type: a form's
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_models_names_the_loaded_target(client):
    ids = [m.id for m in client.models.list().data]
    assert len(ids) == 1 and ids[0].endswith("target")  # the directory save_tiny wrote
    assert ask(client, OPEN, max_tokens=2).model == ids[0]


def test_metrics_grow_by_the_answers_own_timings(client, url):
    before = idle(url)
    answers = [ask(client, p, temperature=t, max_tokens=24, seed=3) for p in (COPY, OPEN) for t in (0, 0.8)]
    timings = [a.timings for a in answers]
    streamed = ask_streamed(client, COPY, temperature=0, max_tokens=24)[2]
    timings.append(streamed)
    after = idle(url)

    def grew(name):
        return after[name] - before[name]

    assert grew("spec_decode_num_draft_tokens_total") == sum(t["draft_n"] for t in timings) > 0
    assert grew("spec_decode_num_accepted_tokens_total") == sum(t["draft_n_accepted"] for t in timings)
    per_pos = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("spec_decode_num_accepted_tokens_per"))
    assert per_pos == grew("spec_decode_num_accepted_tokens_total")
    assert 0 < grew("spec_decode_num_drafts_total") <= grew("spec_decode_num_draft_tokens_total")
    assert grew("generation_tokens_total") == sum(t["predicted_n"] for t in timings)
    assert after["tokens_per_second"] > 0 and after["slots_total"] == 2


def test_a_client_that_leaves_mid_stream_frees_its_slot(url):
    before = idle(url)
    body = {"messages": [{"role": "user", "content": OPEN}], "stream": True, "max_tokens": 1000,
            "ignore_eos": True, "speculative": False, "temperature": 0}
    with httpx.stream("POST", url + "v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if '"content": "w' in line or '"content": " w' in line:
                break  # the answer has begun: leave
    after = idle(url)
    assert after["slots_busy"] == 0
    assert after["generation_tokens_total"] - before["generation_tokens_total"] < 1000  # cancelled, not finished


def test_a_client_that_gives_up_on_a_whole_answer_frees_its_slot(url):
    before = idle(url)
    body = {"messages": [{"role": "user", "content": OPEN}], "max_tokens": 1000, "ignore_eos": True,
            "speculative": False, "temperature": 0}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url + "v1/chat/completions", json=body, timeout=0.3)
    after = idle(url)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] < 1000


def test_page_answers_are_counted_too(url):
    before = idle(url)
    o = run_regular(connect(url), COPY, 0.0, 24, 120)
    assert o.finished and not o.error
    after = idle(url)
    assert after["spec_decode_num_draft_tokens_total"] > before["spec_decode_num_draft_tokens_total"]
    assert after["generation_tokens_total"] - before["generation_tokens_total"] >= 24
