"""A minute and a half of a shared playground's life on the real app (a tiny target, 2 slots, an API key): page users
chatting, API clients streaming, the Arena tab running, and clients that vanish mid-answer (a closed stream, an
abandoned whole answer, a cancelled page job, a closed tab), all at once. Afterwards every slot is free, and
threads, memory and temporary folders are where they stood after a first pass of the same work; no API stream
waited 2 s for its next piece; the page's Stop answered within a second (95 times in 100, never over 2 s)."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from loadclient import (connect, free_port, new_client, run_cancel, run_close_tab, run_regular, serving)
from tiny import save_tiny

SOAK_S = float(os.environ.get("SPECPLAY_SOAK_S", "90"))  # longer by the variable: the suite keeps it short
START_TIMEOUT_S = 180
KEY = "soak-key-0123456789"
AUTH = {"Authorization": f"Bearer {KEY}"}
COPY = "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11"
OPEN = "w30 w31 w32 w33 w34 w30 w31 w32"
MAX_GAP_S = 2.0  # the longest an API stream may wait for its next piece once it streams
STOP_ANSWER_S = 1.0  # the page's Stop answers within this (95 times in 100), whatever else runs
STOP_WORST_S = 2.0  # and never slower than this
THREAD_SLACK = 12  # threads that pools may still hold idle (the API's 8 among them)
RSS_SLACK = 60 << 20  # bytes the process may grow over the soak's second half (allocator noise)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    root = tmp_path_factory.mktemp("soak")
    target = save_tiny(root / "target", seed=0)
    args = ["--target", str(target), "--port", str(free_port()), "--parallel", "2", "--n-ctx", "1024",
            "--queue", "16", "--api-key", KEY, "--client-max", "2",
            "--exempt-loopback"]  # the page's loops play the operator; the API's key is counted
    yield from serving(args, root / "app.log", START_TIMEOUT_S)


def temp_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("specplay-*")}


def idle(url: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(url + "metrics", headers=AUTH, timeout=30).text
        m = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}
        if (m["slots_busy"] == 0 and m["requests_waiting"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def api_stream(url: str, prompt: str, gaps: list) -> None:
    """One streamed answer; the seconds between its pieces once the first has come go into `gaps`."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 40, "stream": True, "temperature": 0}
    with httpx.stream("POST", url + "v1/chat/completions", json=body, headers=AUTH, timeout=120) as r:
        if r.status_code == 429:  # this client's share is taken by its own vanishing requests: allowed
            return
        assert r.status_code == 200, r.read()
        last = None
        for line in r.iter_lines():
            now = time.monotonic()
            if line.startswith("data:") and '"content"' in line:
                if last is not None:
                    gaps.append(now - last)
                last = now


def vanish(url: str, api, i: int) -> None:
    """A client that leaves mid-answer, one of four ways in turn."""
    body = {"messages": [{"role": "user", "content": OPEN}], "max_tokens": 400, "ignore_eos": True,
            "temperature": 0, "stream": i % 4 == 0}
    if i % 4 == 0:
        with httpx.stream("POST", url + "v1/chat/completions", json=body, headers=AUTH, timeout=60) as r:
            for n, _ in enumerate(r.iter_lines()):
                if n > 6:
                    break
    elif i % 4 == 1:
        try:
            httpx.post(url + "v1/chat/completions", json=body, headers=AUTH, timeout=0.3)
        except httpx.TimeoutException:
            pass
    elif i % 4 == 2:
        run_cancel(api, OPEN, 0.0, 300, 60)
    else:
        run_close_tab(api, OPEN, 0.0, 300, 60)


def arena(url: str) -> None:
    client = new_client(url)
    try:
        client.predict(COPY, 4, 16, api_name="/arena")
    finally:
        client.close()


def stop_latency(url: str, api) -> float:
    """Seconds the page's Stop takes to answer for a session with nothing running."""
    client = new_client(url)
    try:
        t0 = time.monotonic()
        client.submit(api_name="/stop").result(timeout=30)
        return time.monotonic() - t0
    finally:
        client.close()


def soak(url: str, api, seconds: float, gaps: list, stops: list, errors: list) -> None:
    """Every kind of client in its own loop until `seconds` have passed."""
    end = time.monotonic() + seconds

    def loop(work):
        i = 0
        while time.monotonic() < end:
            try:
                work(i)
            except Exception as e:  # recorded: the test fails on it, the other loops go on
                errors.append(f"{type(e).__name__}: {e}"[:300])
            i += 1

    def chat(i):
        o = run_regular(api, COPY if i % 2 else OPEN, 0.0 if i % 3 else 0.8, 24, 120)
        if o.error or not o.finished:
            errors.append(f"page chat: {o.error or 'unfinished'}")

    def stop(i):
        stops.append(stop_latency(url, api))
        time.sleep(0.5)

    loops = [chat, chat, lambda i: api_stream(url, COPY if i % 2 else OPEN, gaps), lambda i: vanish(url, api, i),
             lambda i: arena(url), stop]
    with ThreadPoolExecutor(len(loops)) as pool:
        list(pool.map(loop, loops))


def test_a_shared_playground_leaks_nothing(app):
    url, proc = app[0], app[1]
    api = connect(url)
    process = psutil.Process(proc.pid)
    warm_gaps, warm_stops, warm_errors = [], [], []
    soak(url, api, 10, warm_gaps, warm_stops, warm_errors)  # every pool and cache made once
    idle(url)
    time.sleep(12)  # worker threads idle past their keep-alive leave
    threads0, rss0, temps0 = process.num_threads(), process.memory_info().rss, temp_folders()

    gaps, stops, errors = [], [], []
    half = threading.Timer(SOAK_S / 2, lambda: rss_half.append(process.memory_info().rss))
    rss_half: list[int] = []
    half.start()
    soak(url, api, SOAK_S, gaps, stops, errors)
    m = idle(url)
    time.sleep(12)
    threads1, rss1, temps1 = process.num_threads(), process.memory_info().rss, temp_folders()
    print(f"soak {SOAK_S:.0f} s: {len(gaps)} stream gaps, longest {max(gaps, default=0):.2f} s; Stop "
          f"{sorted(stops)[len(stops) // 2] if stops else 0:.2f} s median, {max(stops, default=0):.2f} s at most over "
          f"{len(stops)}; threads {threads0} -> {threads1}; RSS "
          f"{rss0 >> 20} -> {rss_half[0] >> 20 if rss_half else 0} -> {rss1 >> 20} MiB; temp folders "
          f"{len(temps0)} -> {len(temps1)}; {len(errors)} errors")
    assert not errors, errors[:5]
    assert m["slots_busy"] == 0 and m["requests_waiting"] == 0
    assert gaps and max(gaps) < MAX_GAP_S
    assert stops and sorted(stops)[int(0.95 * (len(stops) - 1))] < STOP_ANSWER_S and max(stops) < STOP_WORST_S
    assert threads1 <= threads0 + THREAD_SLACK
    assert rss_half and rss1 - rss_half[0] < RSS_SLACK
    assert len(temps1 - temps0) <= 2  # the arena keeps its latest results only
