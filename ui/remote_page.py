"""The page's chat against another server (`app.py --remote URL`): its answer streamed into the chat, and under it
what the server reports about its speculation, with what a server seen from outside cannot show.

Only the operator names the server, on the command line: a visitor never points the app at a URL. The key is read
from SPECPLAY_REMOTE_KEY or a file, never from the command line (where `ps` and shell histories show it), and goes
in the Authorization header only. Each answer runs between two scrapes of the server's /metrics (engine/remote/);
where the server takes a per-request switch (llama-server's `speculative.n_max: 0`, this playground's
`speculative: false`), the prompt is then asked once more without speculation, for the speedup and a text check.
"""

from __future__ import annotations

import argparse
import html
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Iterator

from ui.render import answer_bubble, notice_html, transcript_html, user_bubble

if TYPE_CHECKING:  # app.py reads the flags from here at --help: nothing heavy at import
    from ui.settings import Settings
    from ui.state import SessionState

KEY_ENV = "SPECPLAY_REMOTE_KEY"
REFRESH_S = 0.3  # the chat is redrawn at most this often while the server's answer streams
EMPTY_HINT = "Ask something: the answer comes from the server named on the command line (--remote)."


def add_remote_args(p: argparse.ArgumentParser) -> None:
    """The flags that point the page's chat at another OpenAI-compatible server."""
    p.add_argument("--remote", default=None, metavar="URL",
                   help="send the page's chat to this OpenAI-compatible server (llama-server, vLLM, SGLang, another "
                        "playground: http://HOST:PORT) and show what it reports about its speculation; the local "
                        "model still serves the other tabs and the API")
    p.add_argument("--remote-key-file", default=None, metavar="FILE",
                   help=f"a file holding the server's API key (or set {KEY_ENV}); the key is never taken on the "
                        "command line, never shown and never logged")
    p.add_argument("--remote-plain", default=None, metavar="URL",
                   help="the same model served without speculation (vLLM, SGLang, llama-server builds that ignore "
                        "a request's speculative.n_max): each answer is asked there too, for the speedup")
    p.add_argument("--remote-shared", action="store_true",
                   help="the server also serves others: its /metrics change over an answer is then not read as "
                        "that answer's (only its own timings are)")


def remote_key(args: argparse.Namespace) -> str | None:
    if args.remote_key_file:
        return Path(args.remote_key_file).read_text().strip() or None
    return os.environ.get(KEY_ENV, "").strip() or None


@dataclass
class RemotePage:
    """The server the page's chat talks to, as the operator named it."""

    client: object  # engine.RemoteClient
    info: object  # engine.ServerInfo, read when the app started
    shared: bool = False  # --remote-shared: the counters' change is never one answer's
    twin: object = None  # engine.RemoteClient of --remote-plain, the same model without speculation


def open_remote(args: argparse.Namespace) -> RemotePage | None:
    """The --remote server, asked what it runs; None without --remote. Raises RuntimeError (the server cannot be
    reached or refuses) or OSError (the key file) with the reason."""
    if not args.remote:
        return None
    from engine import RemoteClient, RemoteConfig, read_server_info

    key = remote_key(args)
    client = RemoteClient(RemoteConfig(args.remote, key=key))
    twin = RemoteClient(RemoteConfig(args.remote_plain, key=key)) if args.remote_plain else None
    return RemotePage(client=client, info=read_server_info(client), shared=args.remote_shared, twin=twin)


def open_url(url: str) -> RemotePage:
    """The server at `url` named on the page of a local-only app, with the key of SPECPLAY_REMOTE_KEY if set;
    asked what it runs. Raises ValueError (the URL) or RuntimeError (it cannot be reached or refuses)."""
    from engine import RemoteClient, RemoteConfig, read_server_info

    client = RemoteClient(RemoteConfig(url, key=os.environ.get(KEY_ENV, "").strip() or None))
    return RemotePage(client=client, info=read_server_info(client))


def header_html(page: RemotePage) -> str:
    return (f'<div class="notice notice-info">The chat talks to {html.escape(page.client.config.base)}: '
            f'{html.escape(page.info.describe())}. The rounds stay on the server; its counters are shown under '
            'each answer.</div>')


def request_body(session: SessionState, text: str, settings: Settings) -> dict:
    """The conversation so far and the sidebar's sampling, as an OpenAI chat request."""
    return {"messages": session.history + [{"role": "user", "content": text}], "max_tokens": settings.max_new_tokens,
            "temperature": settings.temp, "top_p": settings.top_p, "seed": settings.seed}


class RemoteLine:
    """The part of a scheduler a session's Active asks for (stop, cancel), for an answer streaming from the server:
    Stop, or a tab that closes, ends it at its next piece."""

    def __init__(self):
        self.ended = threading.Event()

    def stop(self, _gen_id) -> None:
        self.ended.set()

    cancel = stop


def remote_turn(page: RemotePage, session: SessionState, text: str, settings: Settings) -> Iterator[dict]:
    """A chat turn on the server: yields the views to show (chat, summary, notice) as the answer streams, then
    once more with its report. Raises ui.session.UserError when the server cannot answer at all."""
    from engine import RemoteError, plain_answer
    from ui.session import UserError
    from ui.state import Active

    text = (text or "").strip()
    if not text:
        raise UserError("Type a message first.")
    if session.busy:
        raise UserError("An answer is still coming: wait for it, then send.")
    line = RemoteLine()
    session.active = Active(scheduler=line, gen=SimpleNamespace(id=0, stats={}), run=None)
    session.turn_open, session.pending_user, session.notice = True, text, ("", "info")
    body = request_body(session, text, settings)
    try:
        seen = yield from stream_answer(page, session, body, line)
        plain, why = None, ""
        can_ask = page.twin is not None or page.info.plain_request is not None
        if seen.answer.error is None and settings.compare and not line.ended.is_set() and can_ask:
            session.notice = ("Asking the server once more without speculation, for the speedup...", "info")
            yield {"chat": live_chat(session, seen.answer.text), "notice": notice_html(*session.notice)}
            plain, why = plain_answer(page.client, body, page.info, page.twin)
        elif not can_ask:
            why = f"no plain run: {page.info.kind} takes no per-request switch; give --remote-plain URL"
    except RemoteError as e:
        session.pending_user = ""
        raise UserError(f"The server did not answer: {e}", "error") from e
    finally:
        session.turn_open, session.active.finished = False, True
    session.notice = (seen.answer.error, "warn") if seen.answer.error else ("", "info")
    finish_turn(session, seen)
    session.compare_html = report_html(page, seen, plain, settings, why)
    yield {"chat": transcript_html(session.turns_html, EMPTY_HINT, session.show_rejected),
           "summary": f'<div class="summary">{session.compare_html}</div>', "notice": notice_html(*session.notice)}


def stream_answer(page: RemotePage, session: SessionState, body: dict, line: RemoteLine) -> Iterator[dict]:
    """The answer's pieces into the chat, at most every REFRESH_S; returns its engine.Observation (a stopped
    answer's without counters: the server ends it on its own and counts on)."""
    from engine import Observation, RemoteAnswer, observe

    stream, shown, due = observe(page.client, body), "", 0.0
    while True:
        try:
            shown += next(stream)
        except StopIteration as done:
            return done.value
        if line.ended.is_set():
            stream.close()  # closes the response: the server sees the client leave
            return Observation(RemoteAnswer(text=shown, finish_reason="stopped"), None, None,
                               "stopped before its end: the counters are not read")
        if time.perf_counter() >= due:
            due = time.perf_counter() + REFRESH_S
            yield {"chat": live_chat(session, shown)}


def live_chat(session: SessionState, shown: str) -> str:
    turns = session.turns_html + [user_bubble(session.pending_user), answer_bubble(html.escape(shown), live=True)]
    return transcript_html(turns, EMPTY_HINT, session.show_rejected)


def finish_turn(session: SessionState, seen) -> None:
    answer = seen.answer
    meta = " | ".join(x for x in (f"{answer.tokens_per_second:.1f} tok/s ({answer.tps_source})"
                                  if answer.tokens_per_second else "", answer.finish_reason or "", answer.error or "")
                      if x)
    session.turns_html.append(user_bubble(session.pending_user) + answer_bubble(html.escape(answer.text),
                                                                                html.escape(meta)))
    session.history += [{"role": "user", "content": session.pending_user},
                        {"role": "assistant", "content": answer.text}]
    session.pending_user = ""


def report_html(page: RemotePage, seen, plain, settings: Settings, why_no_plain: str = "") -> str:
    """What the server reports about one answer, what that makes of its speculation, and what it cannot show."""
    from engine import NOT_SHOWN, read_remote

    answer, spec = seen.answer, seen.spec
    alone = seen.alone and not page.shared
    rows = [("server", page.info.describe())]
    # the answer's own counts (timings), else the counters' change where it is this answer's alone
    drafted, accepted = ((answer.draft_n, answer.draft_n_accepted) if page.shared else (seen.drafted, seen.accepted))
    if drafted is not None:
        rate = f" ({accepted / drafted:.0%})" if drafted else ""
        rows.append(("drafted / accepted", f"{drafted:.0f} / {accepted:.0f}{rate}"))
    if spec is not None and alone and spec.drafts:
        rows.append(("mean acceptance length", f"{spec.mean_acceptance_length:.2f} tokens a drafted round "
                                               "(1 + accepted / drafts)"))
        rows.append(("acceptance by position", " ".join(f"d{i + 1} {r:.0%}" for i, r in enumerate(spec.per_position))
                     + " (rounds keeping position i / drafted rounds)"))
    if answer.tokens_per_second:
        rows.append(("speed", f"{answer.tokens_per_second:.1f} tokens/s ({answer.tps_source}'s figure)"))
    if plain is not None and plain.tokens_per_second:
        same = plain.text == answer.text
        rows.append(("without speculation", f"{plain.tokens_per_second:.1f} tokens/s; the text is "
                     + ("the same" if same else "DIFFERENT" + ("" if settings.temp <= 0 else " (sampled)"))))
    reading = read_remote(answer.tokens_per_second, plain.tokens_per_second if plain is not None else None,
                          spec if alone else None)
    notes = reading.lines() + [n for n in (seen.note, why_no_plain) if n]
    if page.shared and spec is not None:
        notes.append("--remote-shared: the /metrics change counts everyone's answers, so only the server's own "
                     "timings are shown")
    body = "".join(f'<div class="summary-line"><span class="summary-label">{html.escape(k)}</span> '
                   f'{html.escape(v)}</div>' for k, v in rows)
    body += "".join(f'<div class="summary-line muted small">{html.escape(n)}</div>' for n in notes)
    return body + f'<div class="summary-line muted small">Not shown by a remote server: {html.escape(NOT_SHOWN)}.</div>'
