"""A playground others can reach, in process: the front door (Host, Origin, key, body size), the API's refusals
of odd input with the field named, each client's share of the engine, and prefixes that never pass between
clients. The routes serve a tiny target through a real engine and scheduler; a property-based fuzz of the
request schema asserts 4xx with a reason and never 5xx."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import app as app_module
from engine.serve.engine import Engine
from engine.serve.scheduler import Scheduler
from test_engine import SMALL_NGRAMS
from ui.api.guard import GuardConfig, host_name

KEYS = ("key-a", "key-b", "key-c")
BASE = "http://127.0.0.1:7860"
PROMPT = "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11 w12 w13 w14 w15"


def auth(key: str = "key-a") -> dict:
    return {"Authorization": f"Bearer {key}"}


def chat(content: str = "w1 w2", **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0, **kw}


@pytest.fixture(scope="module")
def served(tiny_target):
    """(TestClient, AppState) over the guarded routes: keys, a body limit of 64 KiB, one request per client."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from starlette.middleware import Middleware

    from ui.api.guard import Guard
    from ui.api.routes import api_routes
    from ui.visitors import ClientLimits
    from ui.state import AppOptions, AppState, Runtime
    from ui.tokens import Vocab

    state = AppState(runtime=None, options=AppOptions(parallel=2))
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=2, calibrate=False, drafter_params=SMALL_NGRAMS,
                    n_ctx_seq=256)
    state.runtime = Runtime(target=tiny_target, draft=None, engine=engine, vocab=Vocab.of(tiny_target.tokenizer),
                            scheduler=Scheduler(engine, on_event=state.counters.observe))
    state.limits = ClientLimits(max_each=1)  # the page's sends and the API's requests count together
    config = GuardConfig(keys=KEYS, allowed_hosts=("lab.example.org",), allowed_origins=("http://lab.example.org",),
                         body_max=64 << 10)
    fastapi_app = FastAPI(routes=api_routes(state, keyed=True), middleware=[Middleware(Guard, config=config)])
    try:
        with TestClient(fastapi_app, base_url=BASE) as http:
            yield http, state
    finally:
        state.runtime.scheduler.close()


# ---- starting up -------------------------------------------------------------------------------------------

def test_the_app_refuses_to_be_reachable_without_a_key(monkeypatch, capsys):
    monkeypatch.delenv("SPECPLAY_API_KEY", raising=False)
    monkeypatch.delenv("GRADIO_SHARE", raising=False)
    for argv in (["--host", "0.0.0.0"], ["--share"], ["--host", "192.168.1.5"],
                 ["--host", "127.0.0.1", "--allowed-host", "lab.example.org"]):  # behind a reverse proxy
        with pytest.raises(SystemExit):
            app_module.parse_args(argv)
        assert "without an API key" in capsys.readouterr().err
    key = "k" * 16
    assert app_module.parse_args(["--host", "0.0.0.0", "--api-key", f" {key} "]).api_key == [key]  # stripped
    monkeypatch.setenv("SPECPLAY_API_KEY", f"{key}1, {key}2")
    assert app_module.parse_args(["--host", "0.0.0.0"]).api_key == [f"{key}1", f"{key}2"]
    assert app_module.parse_args([]).host == "127.0.0.1"  # loopback needs none


def test_keys_are_long_read_from_a_file_and_never_echoed(monkeypatch, capsys, tmp_path):
    monkeypatch.delenv("SPECPLAY_API_KEY", raising=False)
    with pytest.raises(SystemExit):
        app_module.parse_args(["--host", "0.0.0.0", "--api-key", "short-key"])
    err = capsys.readouterr().err
    assert "fewer than 16 characters" in err and "short-key" not in err
    assert app_module.parse_args(["--host", "0.0.0.0", "--api-key", "short-key", "--weak-key"]).api_key
    keys = tmp_path / "keys"
    keys.write_text("# one a line\n  first-key-0123456789  \n\nsecond-key-0123456789\n")
    args = app_module.parse_args(["--host", "0.0.0.0", "--api-key-file", str(keys)])
    assert args.api_key == ["first-key-0123456789", "second-key-0123456789"]
    with pytest.raises(SystemExit):
        app_module.parse_args(["--api-key-file", str(tmp_path / "missing")])
    with pytest.raises(SystemExit):  # behind a proxy every visitor arrives from loopback
        app_module.parse_args(["--allowed-host", "lab.example.org", "--api-key", "k" * 16, "--exempt-loopback"])
    assert app_module.parse_args(["--exempt-loopback"]).exempt_loopback


def test_a_proxys_host_name_on_loopback_counts_as_shared(monkeypatch):
    from ui.sharing import local_only, model_load_allowed

    monkeypatch.delenv("GRADIO_SHARE", raising=False)
    args = app_module.parse_args(["--allowed-host", "lab.example.org", "--api-key", "k" * 16])
    assert not local_only(args) and not model_load_allowed(args)
    assert local_only(app_module.parse_args([]))


def test_each_slot_gets_its_share_of_the_context():
    args = app_module.parse_args(["--n-ctx", "8192", "--parallel", "4"])
    assert args.ctx_per_slot == 2048 and args.client_max == 2
    assert app_module.parse_args(["--ctx-per-slot", "0"]).ctx_per_slot == 0  # the whole cache: opted in


def test_a_slots_share_bounds_its_prompt_and_its_answer(tiny_target):
    from engine.params import GenParams

    engine = Engine(tiny_target, n_ctx=512, n_seq_max=2, calibrate=False, n_ctx_seq=128)
    assert engine.prompt_limit == 128
    with pytest.raises(ValueError, match="does not fit the context of 128"):
        engine.check([5 + i % 50 for i in range(140)], GenParams(max_new_tokens=4))
    events = list(engine.generate([5 + i % 50 for i in range(100)], GenParams(max_new_tokens=500, ignore_eos=True)))
    assert events[-1].stop_reason == "context" and len(engine.slots[events[-1].seq].tokens) <= 128
    with pytest.raises(ValueError, match="share of the cache"):
        Engine(tiny_target, n_ctx=512, n_seq_max=2, calibrate=False, n_ctx_seq=1024)


# ---- the front door ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("host, ok", [
    ("127.0.0.1:7860", True), ("localhost:7860", True), ("[::1]:7860", True), ("10.1.2.3", True),
    ("lab.example.org:7860", True), ("attacker.example.com:7860", False), ("127.0.0.1.nip.io", False)])
def test_a_rebinding_host_is_refused(served, host, ok):
    http, _ = served
    r = http.get("/v1/models", headers={"Host": host, **auth()})
    assert (r.status_code == 200) == ok, r.text
    if not ok:
        assert r.status_code == 403 and "not allowed" in r.json()["error"]["message"]


@pytest.mark.parametrize("origin, ok", [
    (BASE, True), ("http://lab.example.org", True), ("http://LAB.example.org:80", True),
    ("https://lab.example.org", False), ("http://lab.example.org:8080", False), ("https://evil.example.com", False),
    ("null", False), ("http://127.0.0.1:9999", False), ("https://x.gradio.live", False)])
def test_a_foreign_origin_is_refused(served, origin, ok):
    http, _ = served
    r = http.post("/v1/chat/completions", json=chat(), headers={"Origin": origin, **auth()})
    assert (r.status_code == 200) == ok, r.text
    if not ok:
        assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"


def test_the_api_and_metrics_need_a_key(served):
    http, _ = served
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "key-a"}, {"Authorization": "Basic x"}):
        for r in (http.get("/metrics", headers=headers), http.post("/v1/chat/completions", json=chat(),
                                                                   headers=headers)):
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["code"] == "invalid_api_key"
    assert http.get("/metrics", headers=auth("key-b")).status_code == 200
    assert http.post("/v1/chat/completions", json=chat(), headers=auth("key-b")).status_code == 200


def test_the_body_must_be_declared_json(served):
    http, _ = served
    r = http.post("/v1/chat/completions", content=b'{"messages": []}', headers={"Content-Type": "text/plain",
                                                                                 **auth()})
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_a_big_body_gets_413_before_it_is_read(served):
    http, _ = served

    def body():  # chunked: no length declared, so the guard counts what arrives (tests/test_shared_app.py
        for _ in range(4):  # sends 200 MB to the real server)
            yield b" " * (1 << 20)

    t0 = time.perf_counter()
    r = http.post("/v1/chat/completions", content=b"x" * (65 << 10),
                  headers={"Content-Type": "application/json", **auth()})
    assert r.status_code == 413 and "at most 65536" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", content=body(), headers={"Content-Type": "application/json", **auth()})
    assert r.status_code == 413 and "over 65536" in r.json()["error"]["message"]
    assert time.perf_counter() - t0 < 5


# ---- odd input: 400 with the field named -------------------------------------------------------------------

@pytest.mark.parametrize("raw, param, words", [
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": Infinity}', None, "not JSON"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "n": NaN}', None, "not JSON"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e999}', "max_tokens", "integer"),
    (b'{"messages": [{"role": ["user"], "content": "hi"}]}', "messages", "role must be"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "top_k": 1e30}', "top_k", "magnitude"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": -1}', "seed", "seed"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "cache_salt": 5}', "cache_salt", "cache_salt"),
    (b"[" * 5000 + b"]" * 5000, None, "nests deeper"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, None, "nests deeper"),
    (b"\xff\xfe", None, "not JSON"),
])
def test_odd_bodies_get_400_naming_the_field(served, raw, param, words):
    http, _ = served
    r = http.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json", **auth()})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert words in error["message"] and (param is None or error["param"] == param)


def test_a_message_longer_than_the_context_could_hold_is_refused_before_templating(served, monkeypatch):
    http, state = served
    calls = []
    monkeypatch.setattr(state.runtime.target, "encode_chat", lambda m: calls.append(m) or [1, 2])
    r = http.post("/v1/chat/completions", json=chat("w1 " * 200_00), headers=auth())
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages" and not calls


# ---- each client's share, and what one client can learn of another -----------------------------------------

def test_one_client_cannot_hold_every_slot(served):
    """A client with a request in flight gets 429 for a second one; another client is served meanwhile."""
    http, _ = served
    body = chat(PROMPT, max_tokens=200, ignore_eos=True, stream=True)
    with http.stream("POST", "/v1/chat/completions", json=body, headers=auth("key-a")) as first:
        assert first.status_code == 200
        second = http.post("/v1/chat/completions", json=chat(), headers=auth("key-a"))
        assert second.status_code == 429 and second.json()["error"]["type"] == "rate_limit_error"
        assert http.post("/v1/chat/completions", json=chat(), headers=auth("key-b")).status_code == 200
    deadline = time.monotonic() + 10  # the closed stream's generator ends on the server's own loop
    while (status := http.post("/v1/chat/completions", json=chat(), headers=auth("key-a")).status_code) == 429 \
            and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200  # freed once its stream was closed


def test_another_clients_prompt_cannot_be_probed_through_the_cache(served):
    """Client A asks with a secret; client C sends guesses that share ever longer prefixes with it. C reuses at
    most what its own earlier prompts share with a guess (the tiny tokenizer: one token a word), never A's, while
    A's own second turn reuses its prefix."""
    http, _ = served
    secret = PROMPT + " w40 w41 w42"
    first = http.post("/v1/chat/completions", json=chat(secret), headers=auth("key-a")).json()
    n_prompt = first["usage"]["prompt_tokens"]
    own = ["w50 w51"]
    http.post("/v1/chat/completions", json=chat(own[0]), headers=auth("key-c"))
    for guess in (secret, PROMPT, PROMPT + " w40", secret):
        t = http.post("/v1/chat/completions", json=chat(guess), headers=auth("key-c")).json()["timings"]
        shared_with_own = max(common_words(guess, mine) for mine in own)
        assert t["cache_n"] <= shared_with_own, (guess, t)
        own.append(guess)
    again = http.post("/v1/chat/completions", json=chat(secret), headers=auth("key-a")).json()
    assert again["timings"]["cache_n"] > n_prompt // 2
    salted = http.post("/v1/chat/completions", json=chat(secret, cache_salt="other"), headers=auth("key-a")).json()
    assert salted["timings"]["cache_n"] == 0  # a client's own salt partitions its prefixes further


def common_words(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split(), b.split()):
        if x != y:
            break
        n += 1
    return n


def test_host_names_are_read_from_the_header():
    assert [host_name(h) for h in ("[::1]:80", "a.b:7860", "a.b", "::1")] == ["::1", "a.b", "a.b", "::1"]


# ---- the fuzz ----------------------------------------------------------------------------------------------

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=False),
                    st.text(max_size=20))
JSONISH = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                       max_leaves=12)
FIELDS = {"temperature": st.one_of(st.floats(0, 2), JSONISH), "top_p": st.one_of(st.floats(0, 1), JSONISH),
          "top_k": st.one_of(st.integers(0, 50), JSONISH), "min_p": st.one_of(st.floats(0, 1), JSONISH),
          "seed": st.one_of(st.integers(0, 2 ** 64), JSONISH), "max_tokens": st.one_of(st.integers(-3, 8), JSONISH),
          "stop": st.one_of(st.text(max_size=6), st.lists(st.text(max_size=6), max_size=6), JSONISH),
          "stream": JSONISH, "n": JSONISH, "ignore_eos": JSONISH, "speculative": JSONISH,
          "speculative.n_max": st.one_of(st.integers(-2, 40), JSONISH), "speculative.n_min": JSONISH,
          "speculative.p_min": JSONISH, "response_format": JSONISH, "logit_bias": JSONISH, "cache_salt": JSONISH}
MESSAGE = st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["user", "system", "assistant"]), JSONISH),
                                 "content": st.one_of(st.text(max_size=40), JSONISH)})
BODY = st.fixed_dictionaries({"messages": st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), JSONISH)},
                             optional=FIELDS)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(body=BODY)
def fuzz_one(served, body, seen: list) -> None:
    """One fuzzed request: an answer, or a 4xx with a message and a type; its (status, seconds) go to `seen`."""
    http, _ = served
    if body.get("ignore_eos") is True or body.get("stream") is True:
        body["max_tokens"] = 4  # a valid request answers within the slot's share; keep the fuzz quick
    t0 = time.perf_counter()
    raw = json.dumps(body).encode()  # Infinity among the numbers, as a careless client sends it
    r = http.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json", **auth("key-a")})
    seen.append((r.status_code, time.perf_counter() - t0))
    assert r.status_code < 500, (body, r.text)
    if r.status_code >= 400:
        error = r.json()["error"]
        assert error["message"] and error["type"]


def test_fuzzed_requests_get_an_answer_or_a_4xx_with_a_reason(served):
    """The fuzz, then what it ran (printed with -s): one test, so the count never depends on the order."""
    seen = []
    fuzz_one(served, seen=seen)
    statuses = sorted({s for s, _ in seen})
    print(f"fuzz: {len(seen)} requests, statuses {statuses}, "
          f"{sum(s >= 500 for s, _ in seen)} 5xx, slowest {max(t for _, t in seen):.2f} s")
    assert seen and all(s < 500 for s, _ in seen) and max(t for _, t in seen) < 30


def test_sessions_that_never_leave_are_forgotten_past_the_capacity():
    from ui.state import AppOptions, AppState, SessionState, session_capacity

    app = AppState(runtime=None, options=AppOptions(parallel=2, queue_max=8))
    cap = session_capacity(app.options)
    busy = SessionState(turn_open=True)
    app.opened("busy", busy, 0.0)
    for i in range(cap + 50):
        app.opened(f"s{i}", SessionState(), float(i))
    assert len(app.sessions) == cap and "busy" in app.sessions  # the idle oldest went; a generating one stays
    assert "s0" not in app.sessions and f"s{cap + 49}" in app.sessions
