"""Fake llama-server and vLLM servers for tests/test_remote.py, speaking their formats as their sources write them:
streamed chat chunks (llama-server: `timings` with draft_n / draft_n_accepted on the last; vLLM: a last chunk of
`usage` with no choices), /metrics in Prometheus' text format (`llamacpp:` names; `vllm:` names labelled by engine
and model, with `_created` samples), llama-server's /props and /v1/models. Each serves on a loopback port from a
thread (uvicorn), so the client under test speaks real HTTP; `serve_asgi` serves any ASGI app the same way."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from loadclient import free_port

WORDS = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."]
# one answer's rounds: (draft length, kept); kept per position follows from it
ROUNDS = [(4, 4), (4, 2), (4, 0), (4, 3)]


@dataclass
class FakeServer:
    """A server's state and its misbehaviour, set by a test before it asks."""

    kind: str = "llama-server"  # or "vllm"
    refuse_first: int = 0  # answer the next N chat requests with 503 (a model still loading)
    vanish_after: int | None = None  # break the stream off after N text chunks
    stall_s: float = 0.0  # wait this long before answering a chat request
    stall_mid_s: float = 0.0  # wait this long after the first text chunk
    metrics: bool = True  # llama-server without --metrics answers 501
    key: str | None = None  # every page wants "Authorization: Bearer KEY" when set (401 otherwise)
    honours_plain: bool = True  # False: a build that ignores a request's speculative.n_max (drafts anyway)
    words: list = field(default_factory=lambda: list(WORDS))  # the answer's text, a piece a chunk
    requests: list = field(default_factory=list)  # each chat request's (headers, body)
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list = field(default_factory=lambda: [0, 0, 0, 0])
    generated: int = 0

    def count_answer(self) -> None:
        for n, kept in ROUNDS:
            self.drafts += 1
            self.draft_tokens += n
            self.accepted += kept
            for i in range(kept):
                self.per_pos[i] += 1
        self.generated += len(self.words)

    def exposition(self) -> str:
        if self.kind == "vllm":
            lab = 'engine="0",model_name="fake/model"'
            lines = [f"vllm:spec_decode_num_drafts_total{{{lab}}} {float(self.drafts)}",
                     f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e9",
                     f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {float(self.draft_tokens)}",
                     f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {float(self.accepted)}",
                     f"vllm:generation_tokens_total{{{lab}}} {float(self.generated)}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {float(n)}'
                      for i, n in enumerate(self.per_pos)]
            return "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.\n" + "\n".join(lines) + "\n"
        out = []
        for name, value in (("tokens_predicted_total", self.generated), ("spec_decode_num_drafts_total", self.drafts),
                            ("spec_decode_num_draft_tokens_total", self.draft_tokens),
                            ("spec_decode_num_accepted_tokens_total", self.accepted)):
            out += [f"# HELP llamacpp:{name} Total.", f"# TYPE llamacpp:{name} counter", f"llamacpp:{name} {value}"]
        out += ["# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position",
                "# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter"]
        out += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
                for i, n in enumerate(self.per_pos)]
        return "\n".join(out) + "\n"

    def chunk(self, delta: dict, finish: str | None = None, **extra) -> str:
        body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1700000000, "model": "fake/model",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
        return f"data: {json.dumps(body)}\n\n"

    async def answer(self, plain: bool):
        yield self.chunk({"role": "assistant", "content": None})
        for i, word in enumerate(self.words):
            if self.vanish_after is not None and i == self.vanish_after:
                raise ConnectionResetError("the fake server vanishes")  # uvicorn drops the connection
            yield self.chunk({"content": word})
            if i == 0 and self.stall_mid_s:
                await asyncio.sleep(self.stall_mid_s)
        if not plain:
            self.count_answer()
        else:
            self.generated += len(self.words)
        usage = {"prompt_tokens": 7, "completion_tokens": len(self.words), "total_tokens": 7 + len(self.words)}
        drafted = 0 if plain else sum(n for n, _ in ROUNDS)
        kept = 0 if plain else sum(k for _, k in ROUNDS)
        if self.kind == "vllm":
            yield self.chunk({}, "stop")
            yield f"data: {json.dumps({'id': 'chatcmpl-1', 'choices': [], 'usage': usage})}\n\n"
        else:
            timings = {"prompt_n": 7, "prompt_ms": 3.5, "prompt_per_token_ms": 0.5, "prompt_per_second": 2000.0,
                       "predicted_n": len(self.words), "predicted_ms": 50.0, "predicted_per_token_ms": 5.0,
                       "predicted_per_second": 100.0 if plain else 180.0, "draft_n": drafted,
                       "draft_n_accepted": kept}
            yield self.chunk({}, "stop", usage=usage, timings=timings)
        yield "data: [DONE]\n\n"

    async def chat(self, request: Request):
        body = await request.json()
        self.requests.append((dict(request.headers), body))
        if self.stall_s:
            await asyncio.sleep(self.stall_s)
        if self.refuse_first > 0:
            self.refuse_first -= 1
            return JSONResponse({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}},
                                status_code=503)
        plain = body.get("speculative.n_max") == 0 and self.honours_plain
        return StreamingResponse(self.answer(plain), media_type="text/event-stream")

    async def metrics_page(self, request: Request):
        if not self.metrics:
            return JSONResponse({"error": {"code": 501, "message": "This server does not support metrics endpoint.",
                                           "type": "not_supported_error"}}, status_code=501)
        return PlainTextResponse(self.exposition(), media_type="text/plain; version=0.0.4")

    async def models(self, request: Request):
        owner = "vllm" if self.kind == "vllm" else "llamacpp"
        return JSONResponse({"object": "list", "data": [{"id": "fake/model", "object": "model",
                                                         "created": 1700000000, "owned_by": owner}]})

    async def props(self, request: Request):
        if self.kind == "vllm":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse({"default_generation_settings": {"id": 0, "n_ctx": 4096, "params": {
            "n_predict": -1, "temperature": 0.8, "speculative.n_max": 16, "speculative.n_min": 0,
            "speculative.p_min": 0.75}}, "total_slots": 1, "model_path": "/models/fake.gguf",
            "build_info": "b0000-fake"})

    def app(self):
        routes = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                   Route("/metrics", self.metrics_page), Route("/v1/models", self.models),
                                   Route("/props", self.props)])

        async def keyed(scope, receive, send):  # plain ASGI: a stream that raises is dropped, not closed cleanly
            auth = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
            if scope["type"] == "http" and self.key and auth != f"Bearer {self.key}":
                refusal = JSONResponse({"error": {"code": 401, "message": "Invalid API Key"}}, status_code=401)
                return await refusal(scope, receive, send)
            await routes(scope, receive, send)

        return keyed


@contextmanager
def serve_asgi(app):
    """http://127.0.0.1:PORT serving `app` from a thread until the block ends."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
