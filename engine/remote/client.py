"""An OpenAI-compatible server over HTTP: its chat answer streamed and read chunk by chunk (text, how it ended,
`usage`, llama-server's `timings`), its other pages read, its key kept out of sight.

Retries wait and try again only before the first byte of an answer (a refused connection, a timeout, 429 or a
5xx): a request the server has begun to answer is not sent twice, since a second answer would be another text.
A stream that breaks off ends the answer with the reason; the text that came stays.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Iterator

import httpx

RETRY_STATUS = (429, 502, 503, 504)  # a server starting, loading a model, or full: worth another try


@dataclass(frozen=True)
class RemoteConfig:
    """Where the server is and how long to wait for it."""

    url: str  # base URL, e.g. http://127.0.0.1:8080 (a trailing /v1 is dropped)
    key: str | None = field(default=None, repr=False)  # sent as "Authorization: Bearer KEY", never shown
    connect_timeout_s: float = 5.0  # to open a connection
    read_timeout_s: float = 120.0  # the longest silence between two pieces of an answer (a long prefill)
    retries: int = 3  # tries after the first, before the first byte only
    backoff_s: float = 0.5  # the wait before the first retry, doubled for each next one

    @property
    def base(self) -> str:
        base = self.url.rstrip("/")
        return base[:-3] if base.endswith("/v1") else base


@dataclass
class RemoteAnswer:
    """What one chat completion gave; filled as its chunks arrive."""

    text: str = ""  # the answer so far
    finish_reason: str | None = None  # the server's ("stop", "length"); None: it never said
    error: str | None = None  # why the answer ended early (server gone, error chunk, timeout), for the reader
    usage: dict = field(default_factory=dict)  # OpenAI's usage, where the server sent it
    timings: dict = field(default_factory=dict)  # llama-server's timings (this playground sends them too)
    t_first_s: float | None = None  # seconds from the request to the first text
    t_total_s: float = 0.0  # seconds from the request to the end
    n_chunks: int = 0  # chunks that carried text
    attempts: int = 1  # requests made: retries happen before the first byte only

    @property
    def draft_n(self) -> int | None:
        """Draft tokens the server proposed for this answer (llama-server's timings); None: not reported."""
        return self.timings.get("draft_n")

    @property
    def draft_n_accepted(self) -> int | None:
        return self.timings.get("draft_n_accepted")

    @property
    def completion_tokens(self) -> int | None:
        n = self.usage.get("completion_tokens", self.timings.get("predicted_n"))
        return int(n) if n is not None else None

    @property
    def tokens_per_second(self) -> float | None:
        """The server's own decode speed where it reports one (timings.predicted_per_second), else the tokens
        over the time after the first text arrived, as a client sees it (network included)."""
        tps = self.timings.get("predicted_per_second")
        if tps:
            return float(tps)
        n, t0 = self.completion_tokens, self.t_first_s
        if n and t0 is not None and self.t_total_s > t0 and n > 1:
            return (n - 1) / (self.t_total_s - t0)
        return None

    @property
    def tps_source(self) -> str:
        return "server" if self.timings.get("predicted_per_second") else "client"


def read_event(answer: RemoteAnswer, data: str) -> bool:
    """Take one server-sent event's data into `answer`; True when it was the last ("[DONE]" or an error)."""
    if data.strip() == "[DONE]":
        return True
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        answer.error = f"the server sent a chunk that is not JSON: {data[:80]!r}"
        return True
    if not isinstance(chunk, dict):
        return False
    if chunk.get("error"):
        err = chunk["error"]
        answer.error = "the server ended the answer with an error: " + str(
            err.get("message", err) if isinstance(err, dict) else err)
        return True
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta") or choice.get("message") or {}
        piece = delta.get("content") or ""
        if piece:
            answer.text += piece
            answer.n_chunks += 1
        answer.finish_reason = choice.get("finish_reason") or answer.finish_reason
    if isinstance(chunk.get("usage"), dict):
        answer.usage = chunk["usage"]
    if isinstance(chunk.get("timings"), dict):
        answer.timings = chunk["timings"]
    return False


class RemoteError(RuntimeError):
    """The server could not be reached or refused the request; the message says which and why."""


class RemoteClient:
    """One server's pages and answers; safe to share between threads (httpx.Client is)."""

    def __init__(self, config: RemoteConfig, transport: httpx.BaseTransport | None = None):
        self.config = config
        headers = {"Authorization": f"Bearer {config.key}"} if config.key else {}
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        self._http = httpx.Client(base_url=config.base, headers=headers, timeout=timeout, transport=transport)

    def __repr__(self) -> str:
        return f"RemoteClient(url={self.config.base!r}, key={'set' if self.config.key else 'none'})"

    def close(self) -> None:
        self._http.close()

    def get(self, path: str, timeout_s: float | None = None) -> httpx.Response:
        """GET with the retries; raises RemoteError when no answer came."""
        return self._with_retries(lambda: self._http.get(path, timeout=timeout_s or httpx.USE_CLIENT_DEFAULT))[0]

    def get_json(self, path: str) -> dict | None:
        """The page as JSON, or None where the server has no such page or it is not JSON."""
        r = self.get(path)
        if r.status_code != 200:
            return None
        try:
            out = r.json()
        except ValueError:
            return None
        return out if isinstance(out, dict) else None

    def metrics_text(self) -> str | None:
        """/metrics, or None where the server publishes none (llama-server without --metrics answers 501)."""
        r = self.get("/metrics")
        return r.text if r.status_code == 200 else None

    def stream_chat(self, body: dict) -> Iterator[str]:
        """Stream /v1/chat/completions: yields the text as it comes and returns the RemoteAnswer (a generator's
        return value; `chat` collects both). A server gone mid-answer ends it with `error` set, not an
        exception; one that cannot be reached or refuses raises RemoteError before anything is yielded."""
        answer = RemoteAnswer()
        t0 = time.perf_counter()
        request = {**body, "stream": True}
        request.setdefault("stream_options", {"include_usage": True})
        response, answer.attempts = self._with_retries(lambda: self._open_stream(request))
        try:
            for data in _sse_data(response):
                before = len(answer.text)
                done = read_event(answer, data)
                if len(answer.text) > before:
                    answer.t_first_s = answer.t_first_s if answer.t_first_s is not None else time.perf_counter() - t0
                    yield answer.text[before:]
                if done:
                    break
            else:
                if answer.finish_reason is None and answer.error is None:
                    answer.error = "the server closed the stream before the answer ended"
        except httpx.TimeoutException:
            answer.error = (f"the server fell silent mid-answer after {answer.n_chunks} pieces (nothing for "
                            f"{self.config.read_timeout_s:g} s)")
        except (httpx.TransportError, httpx.StreamError) as e:
            answer.error = (f"the server went away mid-answer after {answer.n_chunks} pieces "
                            f"({type(e).__name__}: {e or 'no detail'})")
        finally:
            response.close()
        answer.t_total_s = time.perf_counter() - t0
        return answer

    def chat(self, body: dict) -> RemoteAnswer:
        """The whole streamed answer at once."""
        stream = self.stream_chat(body)
        while True:
            try:
                next(stream)
            except StopIteration as done:
                return done.value

    def _open_stream(self, body: dict) -> httpx.Response:
        req = self._http.build_request("POST", "/v1/chat/completions", json=body)
        return self._http.send(req, stream=True)

    def _with_retries(self, call) -> tuple[httpx.Response, int]:
        """(response, attempts): `call` again after a back-off while it fails before the answer's first byte."""
        cfg = self.config
        reason = ""
        for attempt in range(cfg.retries + 1):
            if attempt:
                time.sleep(cfg.backoff_s * 2 ** (attempt - 1))
            try:
                response = call()
            except httpx.TimeoutException as e:
                reason = f"no answer within the timeout ({type(e).__name__})"
                continue
            except httpx.TransportError as e:
                reason = f"cannot reach the server ({type(e).__name__}: {e})"
                continue
            if response.status_code in RETRY_STATUS:
                reason = f"HTTP {response.status_code}: {_error_text(response)}"
                response.close()
                continue
            if response.status_code in (401, 403):  # a wrong or missing key: no page of the server will answer
                response.close()
                raise RemoteError(f"{cfg.base} refused the key: HTTP {response.status_code} (give it in "
                                  "SPECPLAY_REMOTE_KEY or a key file)")
            if response.status_code >= 400 and response.request.method == "POST":
                text = _error_text(response)
                response.close()
                raise RemoteError(f"{cfg.base} refused the request: HTTP {response.status_code}: {text}")
            return response, attempt + 1
        raise RemoteError(f"{cfg.base}: {reason} after {cfg.retries + 1} tries")


def _sse_data(response: httpx.Response) -> Iterator[str]:
    """The data of each server-sent event (one `data:` line each, as OpenAI-compatible servers send them)."""
    for line in response.iter_lines():
        if line.startswith("data:"):
            yield line[5:].strip()


def _error_text(response: httpx.Response) -> str:
    """The server's own words for a refusal, short."""
    try:
        response.read()
    except httpx.HTTPError:
        return response.reason_phrase
    try:
        body = response.json()
    except ValueError:
        return response.text[:200] or response.reason_phrase
    err = body.get("error", body) if isinstance(body, dict) else body
    text = err.get("message", err) if isinstance(err, dict) else err
    return str(text)[:200] or response.reason_phrase
