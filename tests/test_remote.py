"""The remote client against fake llama-server and vLLM servers (tests/fake_servers.py) and against a second
instance of this playground's own API: streamed answers, the counters' change per answer, acceptance per
position, a server that refuses, stalls or vanishes, and a key that never shows."""

from __future__ import annotations

import time

import pytest

from engine.remote.client import RemoteAnswer, RemoteClient, RemoteConfig, RemoteError
from engine.remote.counters import SpecCounts, delta, parse_samples, read_counts
from engine.remote.observe import judge, observe_whole, read_server_info
from engine.remote.reading import read_remote
from fake_servers import ROUNDS, WORDS, FakeServer, serve_asgi
from loadclient import free_port

ASK = {"messages": [{"role": "user", "content": "Say the fox sentence."}], "max_tokens": 32, "temperature": 0}
FAST = dict(connect_timeout_s=1.0, read_timeout_s=5.0, retries=3, backoff_s=0.01)
# ROUNDS keep 4, 2, 0 and 3 of 4 draft tokens: position i kept in 3, 3, 2 and 1 of the 4 drafted rounds
PER_POSITION = (0.75, 0.75, 0.5, 0.25)


@pytest.fixture()
def fake(request):
    server = FakeServer(kind=getattr(request, "param", "llama-server"))
    with serve_asgi(server.app()) as url:
        yield server, url


def client_for(url: str, **kw) -> RemoteClient:
    return RemoteClient(RemoteConfig(url, **{**FAST, **kw}))


@pytest.mark.parametrize("fake", ["llama-server", "vllm"], indirect=True)
def test_an_answer_and_its_speculation_are_read_from_either_server(fake):
    server, url = fake
    client = client_for(url + "/v1")  # a base URL given with /v1 works alike
    observe_whole(client, ASK)  # the counters start from an earlier answer: the change is this one's alone
    seen = observe_whole(client, ASK)
    assert seen.answer.text == "".join(WORDS) and seen.answer.error is None
    assert seen.answer.finish_reason == "stop" and seen.answer.completion_tokens == len(WORDS)
    assert seen.alone is True and seen.note == ""
    spec = seen.spec
    assert spec.family == ("vllm:" if server.kind == "vllm" else "llamacpp:")
    assert (spec.drafts, spec.draft_tokens, spec.accepted) == (4, 16, 9)
    assert spec.per_position == pytest.approx(PER_POSITION)
    assert spec.mean_acceptance_length == pytest.approx(1 + 9 / 4)
    assert spec.acceptance_rate == pytest.approx(9 / 16)
    assert (seen.drafted, seen.accepted) == (16, 9)
    if server.kind == "llama-server":  # its own per-answer counts and speed
        assert (seen.answer.draft_n, seen.answer.draft_n_accepted) == (16, 9)
        assert seen.answer.tokens_per_second == 180.0 and seen.answer.tps_source == "server"
    else:  # vLLM reports no timings: the speed is the client's, and usage came in a chunk without choices
        assert seen.answer.draft_n is None and seen.answer.tps_source == "client"
        assert server.requests[-1][1]["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("fake", ["llama-server", "vllm"], indirect=True)
def test_the_server_says_what_it_runs(fake):
    server, url = fake
    info = read_server_info(client_for(url))
    assert info.model == "fake/model"
    if server.kind == "llama-server":
        assert info.kind == "llama-server" and info.build == "b0000-fake"
        assert info.speculative == {"speculative.n_max": 16, "speculative.n_min": 0, "speculative.p_min": 0.75}
        assert info.plain_request == {"speculative.n_max": 0}
    else:
        assert info.kind == "vllm" and info.speculative == {} and info.plain_request is None


def test_a_503_before_the_first_byte_is_tried_again_with_back_off(fake):
    server, url = fake
    server.refuse_first = 2
    t0 = time.perf_counter()
    answer = client_for(url, backoff_s=0.05).chat(ASK)
    assert answer.text == "".join(WORDS) and answer.attempts == 3
    assert time.perf_counter() - t0 >= 0.05 + 0.1  # waited 0.05 s, then 0.1 s
    server.refuse_first = 5
    with pytest.raises(RemoteError, match="HTTP 503: Loading model after 2 tries"):
        client_for(url, retries=1).chat(ASK)


def test_a_server_that_vanishes_mid_answer_ends_it_with_a_reason(fake):
    server, url = fake
    server.vanish_after = 3
    client = client_for(url)
    answer = client.chat(ASK)
    assert answer.text == "".join(WORDS[:3])
    assert answer.error.startswith("the server went away mid-answer after 3 pieces")
    assert len(server.requests) == 1  # begun answers are never asked twice


def test_timeouts_before_and_during_an_answer(fake):
    server, url = fake
    server.stall_s = 1.0
    t0 = time.perf_counter()
    with pytest.raises(RemoteError, match="no answer within the timeout"):
        client_for(url, read_timeout_s=0.2, retries=1).chat(ASK)
    assert time.perf_counter() - t0 < 1.5
    server.stall_s, server.stall_mid_s = 0.0, 1.0
    answer = client_for(url, read_timeout_s=0.2).chat(ASK)
    assert answer.text == WORDS[0] and answer.error.startswith("the server fell silent mid-answer after 1 pieces")


def test_an_unreachable_server_is_named_with_the_reason():
    url = f"http://127.0.0.1:{free_port()}"  # nobody listens there
    with pytest.raises(RemoteError, match=f"{url}: cannot reach the server .* after 2 tries"):
        client_for(url, retries=1).chat(ASK)


def test_the_key_is_sent_and_never_shown(fake):
    server, url = fake
    client = RemoteClient(RemoteConfig(url, key="sk-secret-123", **FAST))
    client.chat(ASK)
    assert server.requests[-1][0]["authorization"] == "Bearer sk-secret-123"
    assert "sk-secret-123" not in repr(client) + repr(client.config) + str(client.config)
    assert "key=set" in repr(client)


def test_a_wrong_key_is_said_at_once_and_not_tried_again(fake):
    server, url = fake
    server.key = "sk-right"
    with pytest.raises(RemoteError, match="refused the key: HTTP 401"):
        read_server_info(RemoteClient(RemoteConfig(url, key="sk-wrong", **FAST)))
    with pytest.raises(RemoteError, match="refused the key: HTTP 401"):
        RemoteClient(RemoteConfig(url, **FAST)).chat(ASK)
    assert len(server.requests) == 0  # the key is checked before the chat route, and no retry followed
    assert read_server_info(RemoteClient(RemoteConfig(url, key="sk-right", **FAST))).kind == "llama-server"


def test_without_metrics_the_answer_still_comes_and_the_page_says_why(fake):
    server, url = fake
    server.metrics = False
    seen = observe_whole(client_for(url), ASK)
    assert seen.answer.text == "".join(WORDS) and seen.spec is None and "--metrics" in seen.note
    assert seen.drafted == 16  # llama-server's timings still give this answer's own counts


def test_others_served_between_the_scrapes_are_not_taken_for_this_answer():
    before = SpecCounts("vllm:", 10, 40, 20, (8, 6, 4, 2), generated=100)
    after = SpecCounts("vllm:", 16, 64, 30, (12, 9, 6, 3), generated=150)
    answer = RemoteAnswer(text="x", usage={"completion_tokens": 20})
    seen = judge(answer, before, after)
    assert seen.alone is False and "50 tokens meanwhile, this answer 20" in seen.note
    assert seen.drafted is None  # the counters' change is not this answer's
    assert delta(after, before) is None  # counters that went down: a restart, no change to show
    assert judge(answer, after, before).spec is None


def test_the_exposition_is_read_for_each_family_and_summed_over_labels():
    text = ('# TYPE vllm:spec_decode_num_drafts counter\n'
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3.0\n'
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 2.0\n'
            'vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4\n'
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 1\n')
    counts = read_counts(text)
    assert counts.family == "vllm:" and counts.drafts == 5 and counts.accepted_per_pos == (0.0, 5.0)
    assert counts.generated is None and counts.draft_tokens == 0
    assert read_counts("spec_decode_num_drafts_total 7\ngeneration_tokens_total 9\n").family == ""
    assert read_counts("# nothing here\nprocess_cpu_seconds_total 1\n") is None
    assert parse_samples('a{x="q\\"y"} 1\nbad line\n# c 2\n') == [("a", {"x": 'q\\"y'}, 1.0)]


def test_a_second_playground_is_read_through_its_own_names(tiny_target):
    """This playground's API over a tiny target, served on a port: its unprefixed counters move by exactly the
    answer's timings, and "speculative": false asks it for the plain text."""
    from fastapi import FastAPI

    from engine.serve.engine import Engine
    from engine.serve.scheduler import Scheduler
    from test_engine import SMALL_NGRAMS
    from ui.api.routes import api_routes
    from ui.state import AppOptions, AppState, Runtime
    from ui.tokens import Vocab

    state = AppState(runtime=None, options=AppOptions(parallel=1))
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=1, calibrate=False, drafter_params=SMALL_NGRAMS)
    state.runtime = Runtime(target=tiny_target, draft=None, engine=engine, vocab=Vocab.of(tiny_target.tokenizer),
                            scheduler=Scheduler(engine, on_event=state.counters.observe))
    body = {"messages": [{"role": "user", "content": "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11"}],
            "max_tokens": 40, "temperature": 0}
    try:
        with serve_asgi(FastAPI(routes=api_routes(state))) as url:
            client = client_for(url)
            info = read_server_info(client)
            seen = observe_whole(client, body)
            plain = client.chat({**body, **info.plain_request})
    finally:
        state.runtime.scheduler.close()
    assert info.kind == "playground" and info.plain_request == {"speculative": False}
    assert seen.answer.error is None and seen.answer.text == plain.text and plain.draft_n == 0
    assert seen.spec.family == "" and seen.alone is True
    assert seen.spec.draft_tokens == seen.answer.draft_n > 0
    assert seen.spec.accepted == seen.answer.draft_n_accepted
    assert sum(seen.spec.accepted_per_pos) == seen.spec.accepted
    assert seen.spec.per_position[0] <= 1.0 and seen.spec.mean_acceptance_length >= 1.0


def test_the_reading_says_whether_it_pays_and_which_n_max():
    spec = delta(SpecCounts("llamacpp:", 0, 0, 0, (0, 0, 0, 0), 0),
                 SpecCounts("llamacpp:", 4, 16, 9, (3, 3, 2, 1), 10))
    reading = read_remote(180.0, 100.0, spec)
    assert reading.speedup == pytest.approx(1.8) and reading.pays
    # L = 3.25 tokens a round at 1.8x: a round costs 3.25 / 1.8 steps; its 4 draft positions share the rest
    c = 3.25 / 1.8 - 1
    assert reading.round_cost == pytest.approx(c) and reading.mean_draft_length == 4
    assert reading.falls_off_at == 4  # 0.75, 0.75, 0.5, then 0.25
    expected = [(1 + sum(PER_POSITION[:m])) / (1 + m * c / 4) for m in range(1, 5)]
    assert reading.predicted == pytest.approx(expected)
    assert reading.suggested_n_max == 1 + max(range(4), key=expected.__getitem__)
    assert any("pays on this prompt: 1.80x" in line for line in reading.lines())
    slow = read_remote(90.0, 100.0, spec)
    assert slow.pays is False and "does not pay" in slow.lines()[0]
    blind = read_remote(180.0, None, None)
    assert blind.speedup is None and blind.suggested_n_max is None and blind.lines() == []
