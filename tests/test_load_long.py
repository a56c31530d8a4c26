"""The real app on the embedded model with what breaks a shared server: a 3000-token document, a regex that
Python's `re` backtracks on for hours, a 100 KB JSON schema, a client that vanishes mid-answer and a Stop, while
two chats stream beside them. Checked: those chats never wait 2 s for their next update, Stop ends its answer at
once, the long document's answer is lossless, every request ends with a clear verdict, and afterwards every slot
is free again."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loadclient import (CHAT, Outcome, connect, free_port, has_tokens, keep_last, lossless, new_client, run_regular,
                        send_args, serving, stop_reason, view, watch)

SLOTS = 3
START_TIMEOUT_S = 240  # the embedded model's load (its first conversion about 30 s) and calibration
ANSWER_TIMEOUT_S = 240
HOSTILE = "([a-z]+ ?)+\\."  # catastrophic backtracking for re on a cut answer
N_WAITING = 40  # clients in line for a slot meanwhile
ARRIVAL_S = 4.0  # seconds after the requests are sent (all at once) that count as their arrival
# the longest wait of a streaming chat for its next update, at the arrival and after it: a step beside the
# 3,000-token document holds one of its 128-row prefill chunks (1.3 s at that context on a 2-core EPYC,
# tests/test_long_prompts.py), the other slots' rounds and two grammars' masks (measured: up to 2.2 s alone, 3.1 s
# with a second test process on the other core, as `make test` runs them); a stall would be the whole prefill (~30 s)
MAX_GAP_S = 4.0
LONG = Path(__file__).resolve().parent.parent / "assets" / "prompts" / "long.jsonl"


def big_schema(n: int = 300) -> str:
    """About 100 KB of JSON schema: n objects with strings, integers, enums and patterned arrays."""
    props = {f"field_{i}": {"type": "object", "required": ["name", "kind"], "properties": {
        "name": {"type": "string", "maxLength": 40}, "count": {"type": "integer", "minimum": 0},
        "kind": {"enum": [f"k{i}_{j}" for j in range(6)]},
        "tags": {"type": "array", "items": {"type": "string", "pattern": "[a-z]{2,8}"}}}} for i in range(n)}
    return json.dumps({"type": "object", "properties": props, "required": ["field_0"]})


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    log = tmp_path_factory.mktemp("load-long") / "app.log"
    # each slot's share of the cache (n_ctx / parallel) holds the 3000-token document and its answer
    args = ["--port", str(free_port()), "--parallel", str(SLOTS), "--n-ctx", "12288",
            "--exempt-loopback"]  # the sessions play the operator's own tabs, many at once
    yield from serving(args, log, START_TIMEOUT_S)


def stream_gaps(api, prompt: str, streaming: threading.Event, done: threading.Event) -> tuple[Outcome, list]:
    """A chat that streams a long answer while the others arrive: the seconds between its page updates, from
    its first token on (it sets `streaming` then)."""
    o = Outcome("watcher", prompt)
    client = new_client(api.url)
    gaps, seen, last = [], 0, None
    try:
        t0 = time.monotonic()
        job = client.submit(*send_args(api, prompt, max_new_tokens=600, compare=False), api_name="/send")
        while not job.done() and not done.is_set() and time.monotonic() < t0 + ANSWER_TIMEOUT_S:
            outs = job.outputs()
            if len(outs) > seen:
                now = time.monotonic()
                seen = len(outs)
                keep_last(o, outs[-1])
                if has_tokens(view(outs[-1], CHAT)):
                    if last is not None:
                        gaps.append((now - last, now))
                    last = now
                    streaming.set()
            time.sleep(0.02)
        client.submit(api_name="/stop").result(timeout=30)
        watch(job, o, t0, time.monotonic() + 30)
    finally:
        streaming.set()
        client.close()
    return o, gaps


def formatted(api, client, kind: str, text: str, start: threading.Barrier, max_new: int) -> Outcome:
    o = Outcome(kind, "format")
    try:
        start.wait(timeout=120)
        t0 = time.monotonic()
        job = client.submit(*send_args(api, "Describe the sea.", output_format=kind, format_text=text,
                                       max_new_tokens=max_new, compare=False), api_name="/send")
        watch(job, o, t0, t0 + ANSWER_TIMEOUT_S)
    finally:
        client.close()
    return o


def vanish(api, client, start: threading.Barrier) -> None:
    """An API client that sends and is gone: no cancel, no unload event."""
    start.wait(timeout=120)
    client.submit(*send_args(api, "Write a poem about clouds.", max_new_tokens=120, compare=False),
                  api_name="/send")
    time.sleep(1.0)
    client.close()


def stop_after_tokens(api, client, start: threading.Barrier) -> tuple[float, float]:
    """(seconds the Stop request took to answer, seconds from pressing it to the answer's last update)."""
    try:
        start.wait(timeout=120)
        o = Outcome("stop", "stop")
        t0 = time.monotonic()
        job = client.submit(*send_args(api, "Tell me about the history of maps.", max_new_tokens=600,
                                       compare=False), api_name="/send")
        watch(job, o, t0, t0 + ANSWER_TIMEOUT_S, until_tokens=True)
        time.sleep(2.0)
        t_stop = time.monotonic()
        client.submit(api_name="/stop").result(timeout=30)
        answered = time.monotonic() - t_stop
        watch(job, o, t0, time.monotonic() + 30)
        assert stop_reason(o.summary) == "stopped", o.summary[-300:]
        return answered, time.monotonic() - t_stop
    finally:
        client.close()


def waiter(api, client, i: int, start: threading.Barrier) -> Outcome:
    return run_regular(api, f"Say the number {i}.", 0.0, 3, ANSWER_TIMEOUT_S, start, role="waiting", client=client)


def test_hostile_inputs_beside_streaming_chats(app):
    url, proc, log = app
    api = connect(url)
    document = json.loads(LONG.read_text().splitlines()[2])["messages"][0]["content"]  # the 3000-token log
    n = 5 + N_WAITING
    released: list[float] = []  # when the barrier let the requests go
    start = threading.Barrier(n, action=lambda: released.append(time.monotonic()), timeout=120)
    done = threading.Event()
    # the clients connect first, as pages already open would: what is measured is their requests arriving
    # together and waiting, not 45 API descriptions served at once
    with ThreadPoolExecutor(8) as pool:
        clients = list(pool.map(new_client, [url] * n))
    with ThreadPoolExecutor(n + 2) as pool:
        flags = [threading.Event(), threading.Event()]
        watchers = [pool.submit(stream_gaps, api, p, flag, done) for p, flag in
                    zip(("Write a long story about a lighthouse keeper.", "Explain how tides work, at length."), flags)]
        for flag in flags:
            assert flag.wait(START_TIMEOUT_S), "a chat never streamed"
        long_doc = pool.submit(run_regular, api, document, 0.0, 24, ANSWER_TIMEOUT_S, start, role="document",
                               client=clients[0])
        regex = pool.submit(formatted, api, clients[1], "regex", HOSTILE, start, 12)
        schema = pool.submit(formatted, api, clients[2], "json_schema", big_schema(), start, 16)
        gone = pool.submit(vanish, api, clients[3], start)
        stopped = pool.submit(stop_after_tokens, api, clients[4], start)
        waiting = [pool.submit(waiter, api, clients[5 + i], i, start) for i in range(N_WAITING)]
        doc, rx, sc = long_doc.result(), regex.result(), schema.result()
        stop_s, stop_end_s = stopped.result()
        gone.result()
        queued = [w.result() for w in waiting]
        done.set()
        streams = [w.result() for w in watchers]
    report = (f"document: {doc.summary[-300:]!r}\nregex: {rx.summary[-400:]!r} {rx.notice!r}\n"
              f"schema: {sc.summary[-400:]!r} {sc.notice!r}\nStop answered in {stop_s:.2f} s, the answer ended "
              f"{stop_end_s:.2f} s after it; "
              f"{sum(o.waited for o in queued)} of {N_WAITING} waited in line")
    assert doc.answered and lossless(doc.summary), report
    assert rx.finished and "format-check" in rx.summary and "regex" in rx.summary, report
    assert sc.finished and "format-check" in sc.summary, report
    assert all(o.finished and not o.hung for o in queued), report
    # the instant the 45 requests arrive together their web handlers share the 2 cores with the engine's
    # forwards; measured apart, since that is where a stream waits longest
    # a wait belongs to the arrival when it began within ARRIVAL_S of it, however long it lasted
    t_start = released[0]
    all_gaps = [(g, when - t_start) for _, gaps in streams for g, when in gaps]
    arrival = max((g for g, after in all_gaps if after - g <= ARRIVAL_S), default=0.0)
    longest, when = max(((g, after) for g, after in all_gaps if after - g > ARRIVAL_S), default=(0.0, 0.0))
    t_end = {name: f.result().seconds for name, f in (("document", long_doc), ("regex", regex), ("schema", schema))}
    gaps = sorted((round(g, 2) for g, _ in all_gaps), reverse=True)[:8]
    report += (f"\nlongest gap {longest:.2f} s (ended {when:.1f} s after the start), {arrival:.2f} s as the "
               f"requests arrived; the longest gaps {gaps}; runs took {t_end}")
    print(f"\n{report}")
    assert stop_s < 1.0, report
    assert arrival < MAX_GAP_S, f"a chat waited {arrival:.2f} s as the requests arrived\n{report}"
    assert longest < MAX_GAP_S, f"a chat waited {longest:.2f} s for its next update\n{report}"
    assert proc.poll() is None
    # the vanished client's answer ends by its token limit; then every slot serves a fresh chat at once
    time.sleep(5)
    fresh_start = threading.Barrier(SLOTS, timeout=60)
    with ThreadPoolExecutor(SLOTS) as pool:
        fresh = list(pool.map(lambda p: run_regular(api, p, 0.0, 8, ANSWER_TIMEOUT_S, fresh_start, role="fresh"),
                              ["Say hello.", "Name a colour.", "Count to three."]))
    assert all(o.answered and not o.waited for o in fresh), [o.summary[-200:] for o in fresh]
