"""The page's chat against a remote server (app.py --remote): the flags, the key kept out of sight, a turn streamed
from fake llama-server and vLLM servers into the chat, and the report under it."""

from __future__ import annotations

import pytest

import app as app_module
from fake_servers import WORDS, FakeServer, serve_asgi
from ui.remote_page import KEY_ENV, open_remote, remote_turn
from ui.session import UserError
from ui.settings import Settings
from ui.state import SessionState


@pytest.fixture(params=["llama-server", "vllm"])
def server(request):
    fake = FakeServer(kind=request.param)
    with serve_asgi(fake.app()) as url:
        yield fake, url


def page_for(url: str, *extra: str, monkeypatch=None):
    args = app_module.parse_args(["--remote", url, *extra])
    return open_remote(args)


def turn(page, session, text="Say the fox sentence.") -> list[dict]:
    return list(remote_turn(page, session, text, Settings(max_new_tokens=32)))


def test_a_turn_streams_the_servers_answer_and_reports_its_speculation(server):
    fake, url = server
    page = page_for(url)
    session = SessionState()
    views = turn(page, session)
    final = views[-1]
    answer = "".join(WORDS)
    assert answer in final["chat"] and session.history[-1] == {"role": "assistant", "content": answer}
    assert not session.busy and session.pending_user == ""
    summary = final["summary"]
    assert "drafted / accepted</span> 16 / 9 (56%)" in summary
    assert "3.25 tokens a drafted round" in summary and "d1 75% d2 75% d3 50% d4 25%" in summary
    assert "Not shown by a remote server: which tokens each round drafted" in summary
    if fake.kind == "llama-server":  # asked once more with speculative.n_max 0: its own speedup and the text
        assert fake.requests[-1][1]["speculative.n_max"] == 0
        assert "100.0 tokens/s; the text is the same" in summary
        assert "pays on this prompt: 1.80x" in summary and "n_max 3 is predicted best" in summary
    else:  # vLLM takes no per-request switch: one request, no speedup claimed
        assert len(fake.requests) == 1 and "pays" not in summary
    turn(page, session, "Again.")
    assert fake.requests[-1][1]["messages"][:2] == [{"role": "user", "content": "Say the fox sentence."},
                                                   {"role": "assistant", "content": answer}]


def test_a_shared_server_shows_only_its_own_timings(server):
    fake, url = server
    summary = turn(page_for(url, "--remote-shared"), SessionState())[-1]["summary"]
    assert "acceptance by position" not in summary and "--remote-shared" in summary
    assert ("16 / 9" in summary) == (fake.kind == "llama-server")  # only llama-server counts per answer


def test_a_vanishing_server_leaves_the_text_and_says_why(server):
    fake, url = server
    fake.vanish_after = 2
    session = SessionState()
    final = turn(page_for(url), session)[-1]
    assert "".join(WORDS[:2]) in final["chat"] and "went away mid-answer" in final["notice"]
    assert len(fake.requests) == 1  # no plain run of a broken answer


def test_the_key_comes_from_a_file_or_the_environment_and_never_shows(server, tmp_path, monkeypatch):
    fake, url = server
    key_file = tmp_path / "key"
    key_file.write_text("sk-file-key\n")
    page = page_for(url, "--remote-key-file", str(key_file))
    turn(page, SessionState())
    assert fake.requests[-1][0]["authorization"] == "Bearer sk-file-key"
    monkeypatch.setenv(KEY_ENV, "sk-env-key")
    page = page_for(url)
    turn(page, SessionState())
    assert fake.requests[-1][0]["authorization"] == "Bearer sk-env-key"
    shown = repr(page) + repr(page.client) + str(vars(page))
    assert "sk-env-key" not in shown and "sk-file-key" not in shown


def test_no_remote_no_page_and_an_unreachable_one_is_refused():
    from loadclient import free_port

    assert open_remote(app_module.parse_args([])) is None
    args = app_module.parse_args(["--remote", f"http://127.0.0.1:{free_port()}"])
    with pytest.raises(RuntimeError, match="cannot reach the server"):
        open_remote(args)


def test_an_empty_message_and_a_second_turn_are_refused(server):
    _, url = server
    page, session = page_for(url), SessionState()
    with pytest.raises(UserError, match="Type a message"):
        turn(page, session, "  ")
    session.turn_open = True
    with pytest.raises(UserError, match="still coming"):
        turn(page, session)


def test_the_page_names_the_server_and_its_send_streams_from_it(server):
    """The page built with a remote server says so in its header, and Send's handler packs the remote turn into
    the page's views (the message box emptied with the first update)."""
    pytest.importorskip("gradio")
    from ui import handlers
    from ui.app import build
    from ui.state import AppOptions, AppState

    fake, url = server
    page = page_for(url)
    app = AppState(runtime=None, options=AppOptions(parallel=1))
    demo = build(app, page)
    headers = [b.value for b in demo.blocks.values() if type(b).__name__ == "HTML" and "The chat talks to" in
               str(b.value)]
    assert len(headers) == 1 and f"{fake.kind} serving fake/model" in headers[0]
    session = SessionState()
    updates = list(handlers.remote_send(app, page, session, "Say it.", {"max_new_tokens": 32}))
    chat = handlers.VIEWS.index("chat")
    assert updates[0][-1] == "" and "".join(WORDS) in updates[-1][chat]
    refused = list(handlers.remote_send(app, page, session, "", {}))
    assert "Type a message" in refused[-1][handlers.VIEWS.index("notice")]


def test_stop_ends_a_streaming_answer_at_its_next_piece(server):
    from ui.session import stop_turn

    fake, url = server
    fake.stall_mid_s = 0.5  # the first piece, then a pause in which the reader presses Stop
    session = SessionState()
    turn_views = remote_turn(page_for(url), session, "Say it.", Settings(max_new_tokens=32))
    next(turn_views)
    assert session.busy
    stop_turn(None, session)
    final = list(turn_views)[-1]
    assert WORDS[0] in final["chat"] and "".join(WORDS) not in final["chat"] and not session.busy
    assert "stopped" in final["chat"] and len(fake.requests) == 1  # no plain run of a stopped answer


def test_a_server_that_drafts_when_asked_not_to_gives_no_speedup_and_a_twin_does():
    """A llama-server build that ignores a request's speculative.n_max drafts in the 'plain' run too: no speedup
    is claimed from it. A twin served without speculation (--remote-plain) gives the plain run instead."""
    fake, twin = FakeServer(honours_plain=False), FakeServer(kind="vllm")
    with serve_asgi(fake.app()) as url, serve_asgi(twin.app()) as twin_url:
        ignored = turn(page_for(url), SessionState())[-1]["summary"]
        paired = turn(page_for(url, "--remote-plain", twin_url), SessionState())[-1]["summary"]
    assert "drafted 16 tokens when asked not to" in ignored and "pays" not in ignored
    assert "without speculation</span>" in paired and len(twin.requests) == 1


def test_the_pages_field_names_a_server_only_where_the_app_is_local(server):
    """A local-only app's page points its chat at a server typed into its field (and back to its own engine with
    an empty one); a page reachable from other hosts refuses, so no visitor can aim the app at a host; a server
    that cannot be reached leaves the chat where it was."""
    pytest.importorskip("gradio")
    from ui import handlers
    from ui.state import AppOptions, AppState

    fake, url = server
    local = AppState(runtime=None, options=AppOptions(parallel=1, remote_from_page=True))
    said = handlers.connect_remote(local, url)
    assert local.remote is not None and "The chat talks to" in said and f"{fake.kind} serving fake/model" in said
    updates = list(handlers.remote_send(local, local.remote, SessionState(), "Say it.", {"max_new_tokens": 32}))
    assert "".join(WORDS) in updates[-1][handlers.VIEWS.index("chat")]
    before = local.remote
    assert "Cannot use http://127.0.0.1:9" in handlers.connect_remote(local, "http://127.0.0.1:9")
    assert local.remote is before
    assert "own engine" in handlers.connect_remote(local, "  ") and local.remote is None
    shared = AppState(runtime=None, options=AppOptions(parallel=1, remote_from_page=False))
    assert "operator names the remote server" in handlers.connect_remote(shared, url) and shared.remote is None
    from argparse import Namespace

    from ui.sharing import local_only  # what app.py sets remote_from_page from

    assert local_only(app_module.parse_args([]))
    assert not local_only(Namespace(host="0.0.0.0", share=False, allowed_host=[]))
    assert not local_only(Namespace(host="127.0.0.1", share=True, allowed_host=[]))
