"""Each visitor apart, in process: one identity per request (a header sent twice is refused), the page's tabs
and the API sharing one per-visitor share, a prefix-cache salt drawn per browser session, origins trusted
exactly, the page's Gradio routes behind its login, open requests and sign-ins bounded, and the models a
visitor may load."""

from __future__ import annotations

import copy
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.serve.engine import Engine
from engine.serve.scheduler import Scheduler
from test_engine import SMALL_NGRAMS
from ui.api.guard import GuardConfig, check
from ui.api.openings import Openings
from ui.catalog import Catalog
from ui.visitors import ClientLimits, ShareExceeded, digest, visitor_id

KEY_A, KEY_B = "key-a-0123456789", "key-b-0123456789"
BASE = "http://127.0.0.1:7860"
PROMPT = "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11 w12 w13 w14 w15"


def auth(key: str = KEY_A) -> dict:
    return {"Authorization": f"Bearer {key}"}


def chat(content: str = "w1 w2", **kw) -> dict:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0, **kw}


@pytest.fixture(scope="module")
def served(tiny_target):
    """(TestClient, AppState) over the guarded routes: two keys, one request in flight per visitor."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from starlette.middleware import Middleware

    from ui.api.guard import Guard
    from ui.api.routes import api_routes
    from ui.state import AppOptions, AppState, Runtime
    from ui.tokens import Vocab

    state = AppState(runtime=None, options=AppOptions(parallel=2), limits=ClientLimits(max_each=1))
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=2, calibrate=False, drafter_params=SMALL_NGRAMS,
                    n_ctx_seq=256)
    state.runtime = Runtime(target=tiny_target, draft=None, engine=engine, vocab=Vocab.of(tiny_target.tokenizer),
                            scheduler=Scheduler(engine, on_event=state.counters.observe))
    config = GuardConfig(keys=(KEY_A, KEY_B))
    fastapi_app = FastAPI(routes=api_routes(state, keyed=True), middleware=[Middleware(Guard, config=config)])
    try:
        with TestClient(fastapi_app, base_url=BASE) as http:
            yield http, state
    finally:
        state.runtime.scheduler.close()


def scope(headers: list[tuple[str, str]], path: str = "/v1/models", method: str = "GET") -> dict:
    return {"type": "http", "path": path, "method": method, "client": ("10.0.0.5", 5000),
            "headers": [(k.lower().encode(), v.encode()) for k, v in headers]}


# ---- one identity per request ------------------------------------------------------------------------------

def test_forty_streams_with_a_decoy_key_first_are_all_refused(served):
    """A decoy Authorization before the real key named a new client each time: now each is a 400, none served."""
    http, state = served
    statuses = []
    for i in range(40):
        headers = [("Authorization", f"Bearer decoy-{i}"), ("Authorization", f"Bearer {KEY_A}"),
                   ("Content-Type", "application/json")]
        with http.stream("POST", "/v1/chat/completions", headers=headers,
                         content=b'{"messages": [{"role": "user", "content": "w1"}], "stream": true}') as r:
            statuses.append(r.status_code)
            r.read()
            assert "more than once" in r.text
    assert statuses == [400] * 40 and state.limits.in_flight() == 0


@pytest.mark.parametrize("name", ["Host", "Origin", "Cookie"])
def test_a_header_the_identity_rests_on_comes_once(name):
    value = {"Host": "127.0.0.1", "Origin": BASE, "Cookie": "a=b"}[name]
    refused = check(GuardConfig(keys=(KEY_A,)), scope([(name, value), (name, value), *auth().items()]))
    assert refused is not None and refused[0] == 400 and name.lower() in refused[1]


# ---- the page and the API share one visitor's share ---------------------------------------------------------

def test_a_page_turn_and_the_api_count_against_one_share(served):
    """Visitor A (key A, this address) holds a step-mode turn on the page: its API request gets 429 while
    visitor B's is served; once the turn ends, A is served again."""
    from ui.session import converse, stop_turn
    from ui.settings import Settings
    from ui.turns import UserError

    http, state = served
    page = copy.deepcopy(state_session())
    page.visitor = visitor_id(digest(KEY_A), "testclient")  # the TestClient's address
    list(converse(state, page, "w1 w2 w3", Settings(types=[], max_new_tokens=8), manual=True))
    r = http.post("/v1/chat/completions", json=chat(), headers=auth(KEY_A))
    assert r.status_code == 429 and "page tabs and API together" in r.json()["error"]["message"]
    assert http.post("/v1/chat/completions", json=chat(), headers=auth(KEY_B)).status_code == 200
    second = copy.deepcopy(state_session())  # another tab of the same visitor
    second.visitor = page.visitor
    with pytest.raises(UserError, match="Please wait"):
        list(converse(state, second, "w1", Settings(types=[], max_new_tokens=4), manual=False))
    stop_turn(state, page)
    assert http.post("/v1/chat/completions", json=chat(), headers=auth(KEY_A)).status_code == 200


def state_session():
    from ui.state import SessionState

    return SessionState()


def test_forty_tabs_of_one_visitor_hold_one_share_while_another_starts_at_once():
    limits = ClientLimits(max_each=2)
    held, refused = 0, 0
    for _ in range(40):
        try:
            limits.take("addr:10.0.0.1")
            held += 1
        except ShareExceeded:
            refused += 1
    t0 = time.perf_counter()
    limits.take("addr:10.0.0.2")
    assert (held, refused) == (2, 38) and time.perf_counter() - t0 < 0.01
    exempt = ClientLimits(max_each=1, exempt_loopback=True)
    for _ in range(5):
        exempt.take("addr:127.0.0.1")  # the operator's own tabs, by its flag
    with pytest.raises(ShareExceeded):
        exempt.take("addr:10.0.0.3")
        exempt.take("addr:10.0.0.3")


# ---- the prefix cache: one salt per browser session ---------------------------------------------------------

def prefill_rows(run) -> int:
    return next(ev.batch_rows for ev in run.events if ev.kind == "prefill")


def test_two_tabs_sending_one_prompt_share_no_cells(served):
    """gr.State deep-copies one initial value into each tab: the salt is drawn per tab, at its first turn, so the
    second tab's prefill forwards the whole prompt; with --share-prefix-cache it reuses the first's."""
    from ui.session import converse
    from ui.settings import Settings

    _, state = served
    settings = Settings(types=[], max_new_tokens=2)
    initial = state_session()
    first, second, third, fourth = (copy.deepcopy(initial) for _ in range(4))
    list(converse(state, first, PROMPT + " w41", settings, manual=False))
    list(converse(state, second, PROMPT + " w41", settings, manual=False))
    assert first.cache_salt and second.cache_salt and first.cache_salt != second.cache_salt
    n_prompt = len(first.run.prompt_ids)
    assert prefill_rows(first.run) == prefill_rows(second.run) == n_prompt
    state.options.share_prefix_cache = True
    try:
        list(converse(state, third, PROMPT + " w42", settings, manual=False))
        list(converse(state, fourth, PROMPT + " w42", settings, manual=False))
    finally:
        state.options.share_prefix_cache = False
    assert prefill_rows(fourth.run) < n_prompt // 2


# ---- origins, the page's login, open requests, sign-ins -----------------------------------------------------

def test_a_share_link_trusts_its_own_origin_only():
    from ui.sharing import trust_share_link

    config = GuardConfig(keys=(KEY_A,), page_login=True)
    trust_share_link(config, "https://abc123.gradio.live")
    own = [("Host", "abc123.gradio.live"), ("Origin", "https://abc123.gradio.live"), *auth().items()]
    other = [("Host", "abc123.gradio.live"), ("Origin", "https://evil999.gradio.live"), *auth().items()]
    assert check(config, scope(own)) is None
    assert check(config, scope(other))[0] == 403
    assert check(config, scope([("Host", "evil999.gradio.live"), *auth().items()]))[0] == 403


def test_every_gradio_route_asks_for_the_login_when_shared():
    config = GuardConfig(keys=(KEY_A,), page_login=True)
    for path in ("/gradio_api/heartbeat/abc", "/gradio_api/queue/data", "/gradio_api/upload"):
        assert check(config, scope([("Host", "127.0.0.1")], path))[0] == 401
    assert check(config, scope([("Host", "127.0.0.1")], "/gradio_api/login_check")) is None

    class App:  # Gradio's app: its table of session tokens
        tokens = {"tok": "student"}

    signed_in = {**scope([("Host", "127.0.0.1"), ("Cookie", "access-token-unsecure-x=tok")],
                         "/gradio_api/heartbeat/abc"), "app": App()}
    assert check(config, signed_in) is None


def test_open_requests_and_sign_ins_are_bounded():
    doors = Openings(total_max=5, each_max=2, login_max=3)
    assert doors.enter("addr:10.0.0.1") is None and doors.enter("addr:10.0.0.1") is None
    assert doors.enter("addr:10.0.0.1")[0] == 429
    assert doors.enter("addr:10.0.0.2") is None
    doors.leave("addr:10.0.0.1")
    assert doors.enter("addr:10.0.0.1") is None
    for i in range(3, 5):
        assert doors.enter(f"addr:10.0.0.{i}") is None
    assert doors.enter("addr:10.0.0.9")[0] == 503
    assert [doors.sign_in_refused("10.0.0.1", now=t) for t in (0, 1, 2)] == [None] * 3
    assert doors.sign_in_refused("10.0.0.1", now=3)[0] == 429
    assert doors.sign_in_refused("10.0.0.2", now=3) is None  # another address
    assert doors.sign_in_refused("10.0.0.1", now=61.5) is None  # the window moved on


def test_sign_in_names_stay_with_their_first_key():
    from ui.visitors import Logins

    logins = Logins()
    assert logins.bind("ana", KEY_A) and logins.bind("ana", KEY_A) and not logins.bind("ana", KEY_B)
    assert logins.key_digest("ana") == digest(KEY_A) and logins.key_digest("bob") is None


# ---- the models a visitor may load ---------------------------------------------------------------------------

def test_a_visitors_model_path_outside_the_model_folder_is_refused_alike(tmp_path):
    folder = tmp_path / "models"
    (folder / "tiny").mkdir(parents=True)
    (folder / "tiny" / "config.json").write_text("{}")
    (folder / "small.gguf").write_bytes(b"GGUF")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "config.json").write_text("{}")
    (folder / "escape").symlink_to(tmp_path / "secret")
    catalog = Catalog(packaged=("embedded",), model_dirs=(str(folder),))
    assert catalog.resolve("embedded") == "embedded"
    assert catalog.resolve("tiny") == str((folder / "tiny").resolve())
    assert catalog.resolve(str(folder / "small.gguf")) == str((folder / "small.gguf").resolve())
    messages = set()
    for name in (str(tmp_path / "secret"), "/nowhere/at/all", "../secret", "escape", "owner/model", "/etc/passwd"):
        with pytest.raises(ValueError) as refused:
            catalog.resolve(name)
        messages.add(str(refused.value).replace(repr(name[:80]), "NAME"))
    assert len(messages) == 1, messages  # the same words whether the path exists or not
    assert Catalog(packaged=("embedded",), hub=True).resolve("owner/model") == "owner/model"
    assert catalog.listed() == ["embedded", "small.gguf", "tiny"]


def test_validation_errors_name_their_field(served):
    http, _ = served
    for body, param in ((chat(top_p=0), "top_p"), (chat(**{"speculative.n_max": -1}), "speculative.n_max"),
                        (chat(temperature=-1), "temperature")):
        r = http.post("/v1/chat/completions", json=body, headers=auth(KEY_B))
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_models_names_no_local_path(served, tiny_target):
    http, _ = served
    names = [m["id"] for m in http.get("/v1/models", headers=auth()).json()["data"]]
    assert names and all("/" not in n for n in names), names


def test_limits_are_safe_under_threads():
    limits = ClientLimits(max_each=3)
    taken = []

    def grab():
        try:
            limits.take("addr:10.0.0.7")
            taken.append(1)
        except ShareExceeded:
            pass

    threads = [threading.Thread(target=grab) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(taken) == 3 and limits.in_flight() == 3


HEADER_NAMES = ("Authorization", "authorization", "Host", "Origin", "Cookie", "X-Forwarded-For", "Content-Type")


@settings(max_examples=300, deadline=None, derandomize=True)
@given(headers=st.lists(st.tuples(st.sampled_from(HEADER_NAMES), st.text(max_size=30)), max_size=8),
       path=st.sampled_from(["/v1/chat/completions", "/metrics", "/gradio_api/heartbeat/x", "/", "/login"]))
def test_fuzzed_headers_get_a_verdict_and_one_identity(headers, path):
    """Any header list: the guard answers (never raises), refuses a duplicated identity header with 400, and
    names the visitor from the one key it checked."""
    config = GuardConfig(keys=(KEY_A,), page_login=True)
    ascii_headers = [(k, v.encode("latin-1", "replace").decode("latin-1")) for k, v in headers]
    refused = check(config, scope(ascii_headers, path, "POST"))
    counts = {}
    for k, _ in ascii_headers:
        counts[k.lower()] = counts.get(k.lower(), 0) + 1
    twice = any(counts.get(n, 0) > 1 for n in ("authorization", "host", "origin", "cookie"))
    assert (refused is not None and refused[0] == 400) == twice
    if refused is None:
        from ui.api.guard import identity

        given = {k.lower(): v for k, v in ascii_headers}
        who = identity(config, "10.0.0.5", given, None)
        assert who.endswith("@10.0.0.5") or who == "addr:10.0.0.5"
