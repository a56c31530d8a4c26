"""The real app (python app.py, a tiny target, 2 slots) as a shared playground meets it: a start refused without
a key, the key asked of the API and /metrics, a DNS-rebinding Host and a foreign page's Origin refused on the
page's routes and the API's alike, a 200 MB body refused in under 100 ms without the server's memory growing,
one client that cannot take every slot while a page chats, and a shared page behind its login."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import psutil
import pytest

from loadclient import ROOT, connect, free_port, run_regular, serving
from tiny import save_tiny

START_TIMEOUT_S = 180
KEY = "class-key-1"
COPY = "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11"
BIG = 200_000_000  # bytes of the body that must not be read


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return save_tiny(tmp_path_factory.mktemp("shared") / "target", seed=0)


@pytest.fixture(scope="module")
def app(target, tmp_path_factory):
    args = ["--target", str(target), "--port", str(free_port()), "--parallel", "2", "--n-ctx", "1024",
            "--api-key", KEY]
    yield from serving(args, tmp_path_factory.mktemp("shared-log") / "app.log", START_TIMEOUT_S)


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "v1", api_key=key, max_retries=0, timeout=60)


def test_reachable_from_elsewhere_without_a_key_it_does_not_start():
    env = {k: v for k, v in os.environ.items() if k not in ("SPECPLAY_API_KEY", "GRADIO_SHARE")}
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "app.py", "--host", "0.0.0.0", "--port", str(free_port())], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "without an API key" in done.stderr and "--api-key" in done.stderr
    assert time.monotonic() - t0 < 60  # refused before any model loads


def test_the_api_asks_for_its_key(app):
    url = app[0]
    with client(url, "wrong") as c, pytest.raises(openai.AuthenticationError):
        c.chat.completions.create(model="t", messages=[{"role": "user", "content": "w1"}], max_tokens=2)
    assert httpx.get(url + "metrics", timeout=30).status_code == 401
    with client(url, KEY) as c:
        r = c.chat.completions.create(model="t", messages=[{"role": "user", "content": COPY}], max_tokens=4,
                                      temperature=0)
    assert r.choices[0].message.content and r.usage.completion_tokens == 4
    assert httpx.get(url + "metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).status_code == 200


@pytest.mark.parametrize("path, method", [("config", "GET"), ("gradio_api/queue/join", "POST"),
                                          ("v1/chat/completions", "POST"), ("", "GET")])
def test_a_rebinding_host_and_a_foreign_origin_are_refused(app, path, method):
    url = app[0]
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "text/plain"}
    rebound = httpx.request(method, url + path, headers={**headers, "Host": f"evil.example:{url.split(':')[2]}"},
                            content=b"{}", timeout=30)
    foreign = httpx.request(method, url + path, headers={**headers, "Origin": "https://evil.example"},
                            content=b"{}", timeout=30)
    assert rebound.status_code == 403 and foreign.status_code == 403


def rss(proc) -> int:
    return psutil.Process(proc.pid).memory_info().rss


def raw_post(url: str, head: str, body_chunks) -> tuple[float, str, int]:
    """POST over a bare socket: (seconds from the headers to the status line, the status line, bytes sent). The
    body is sent from another thread until the server answers or closes."""
    host, port = url.split("//")[1].rstrip("/").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sent, answered = [0], threading.Event()

    def feed():
        try:
            for chunk in body_chunks:
                if answered.is_set():
                    return
                sock.sendall(chunk)
                sent[0] += len(chunk)
        except OSError:
            return  # the server closed the connection: nothing more is read

    sock.sendall(head.encode())
    t0 = time.perf_counter()
    threading.Thread(target=feed, daemon=True).start()
    line = sock.makefile("rb").readline().decode()
    seconds = time.perf_counter() - t0
    answered.set()
    sock.close()
    return seconds, line, sent[0]


def test_a_200_mb_body_gets_413_at_once_without_memory_growth(app):
    url, proc = app[0], app[1]
    before = rss(proc)
    chunk = b" " * (1 << 20)
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {BIG}\r\n\r\n")
    declared_s, line, _ = raw_post(url, head, (chunk for _ in range(BIG >> 20)))
    assert " 413 " in line and declared_s < 0.1, (line, declared_s)
    chunked = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {KEY}\r\nTransfer-Encoding: chunked\r\n\r\n")
    frames = (b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(BIG >> 20))
    _, line, sent = raw_post(url, chunked, frames)
    assert " 413 " in line and sent < BIG // 4, (line, sent)
    grown = rss(proc) - before
    print(f"200 MB body: 413 after {declared_s * 1e3:.1f} ms (declared), after {sent >> 20} MiB sent (chunked); "
          f"server RSS {grown / (1 << 20):+.1f} MiB")
    assert grown < 50 << 20  # neither body was kept: at most a few buffers' worth


def test_one_client_cannot_take_every_slot_while_a_page_chats(app):
    """With 2 slots a client may have 1 request in flight: its second gets 429 while a page's chat is served."""
    url = app[0]
    body = {"messages": [{"role": "user", "content": COPY}], "max_tokens": 600, "ignore_eos": True,
            "speculative": False, "stream": True}
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", url + "v1/chat/completions", json=body, headers=auth, timeout=60) as first:
        assert first.status_code == 200
        second = httpx.post(url + "v1/chat/completions", json={**body, "stream": False}, headers=auth, timeout=60)
        assert second.status_code == 429 and "in flight" in second.json()["error"]["message"]
        page = run_regular(connect(url), COPY, 0.0, 12, 120)
        assert page.finished and not page.error


@pytest.fixture(scope="module")
def shared(target, tmp_path_factory):
    """The app listening on every address with a key: the page behind Gradio's login (probed on loopback)."""
    port = free_port()
    args = ["--target", str(target), "--host", "0.0.0.0", "--port", str(port), "--parallel", "1", "--n-ctx", "512",
            "--api-key", KEY]
    for url, proc, log in serving(args, tmp_path_factory.mktemp("shared-page") / "app.log", START_TIMEOUT_S):
        yield f"http://127.0.0.1:{port}/", proc, log


def test_a_shared_page_asks_for_the_key_as_its_login(shared):
    url = shared[0]
    assert httpx.get(url + "config", timeout=30).status_code == 401
    with httpx.Client(base_url=url, timeout=30) as browser:
        assert browser.post("login", data={"username": "student", "password": "wrong"}).status_code >= 400
        assert browser.post("login", data={"username": "student", "password": KEY}).status_code == 200
        assert browser.get("config").status_code == 200
    with client(url, KEY) as c:
        assert c.models.list().data
