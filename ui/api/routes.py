"""An OpenAI-compatible chat endpoint and /metrics, served beside the page, through the same scheduler and slots.

POST /v1/chat/completions takes OpenAI's and llama-server's request shapes (ui/api/request.py) and answers with
OpenAI's response, streamed as server-sent events or whole, plus llama-server's `timings` (ui/api/answer.py).
A request is submitted exactly as a page message is: to the loaded runtime's scheduler (after a model load, the
new one), so API answers wait in the page's line and share its batched rounds. GET /metrics is the engine's
counters in Prometheus' format (ui/metrics.py), GET /v1/models names the loaded target.

Before a route runs, ui/api/guard.py has checked the host, the origin, the key and the body's size. The routes
then bound each visitor's requests in flight and salt its prefixes with its identity (ui/visitors.py), and do
their slow work (parsing, the chat template, a grammar's compilation, waiting for the engine thread) in a pool
of their own: Gradio's worker threads, which Send, Stop, Step and page loads need, are never taken by the API.

`api_routes(app)` gives the routes; app.py hands them to Blocks.launch(app_kwargs={"routes": ...}), so they join
the FastAPI app Gradio builds and are served on its host and port, ahead of Gradio's own routes.
"""

from __future__ import annotations

import asyncio
import json
import queue
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import AsyncIterator, Awaitable, Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from engine import ErrorEvent, QueueFull, WaitEvent
from ui.api.answer import StopCut, Tally
from ui.api.request import ApiError, ChatRequest, parse_body, parse_chat
from ui.limits import text_bound
from ui.metrics import exposition, registry_for
from ui.settings import default_chain, default_tree_nodes
from ui.state import AppState, Runtime
from ui.visitors import ClientLimits, DuplicateHeader, ShareExceeded, bearer, digest, single_header, visitor_id

# how long a reader sleeps when its generation has no new event (the loop's other tasks run): POLL_S while it
# streams, doubling to POLL_MAX_S while nothing comes (waiting in line), so 60 requests in line do not wake the
# event loop thousands of times a second
POLL_S = 0.01
POLL_MAX_S = 0.2
DISCONNECT_CHECK_S = 0.25  # how often a whole (non-streamed) answer asks whether its client is still there
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}  # proxies pass each event on at once
API_WORKERS = 8  # the API's own threads: requests past them wait their turn without holding the page's


@dataclass
class Call:
    """One request in flight: its generation on the runtime that took it, and what it has given out."""

    runtime: Runtime
    gen: object  # the scheduler's Generation: id and events
    chat: ChatRequest
    tally: Tally
    cut: StopCut
    client: str = ""  # ui/visitors.visitor_id: its request counts against this visitor until the answer ends
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))
    ended: bool = False  # its last event was read: nothing to cancel
    stopping: bool = False  # a stop string was found and the engine asked to stop
    model: str = field(init=False, default="")  # the name clients see (public_name), once: it stats the path

    def __post_init__(self):
        self.model = public_name(self.runtime.target.name)

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, delta: dict, finish: str | None = None) -> dict:
        return {**self.head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def ending(self) -> dict:
        """What the last chunk and the whole answer both carry."""
        return {"usage": self.tally.usage(), "timings": self.tally.timings()}

    def finish_reason(self) -> str:
        return self.tally.finish_reason(self.cut.hit)


def sse(data: dict | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def public_name(name: str) -> str:
    """A model's name as clients may see it: a local path's last part, never the operator's folders."""
    from pathlib import Path

    local = name.startswith(("/", ".", "~")) or Path(name).exists()
    return Path(name).name if local else name


def visitor_of(request: Request, keyed: bool) -> str:
    """The request's visitor as the guard named it (ui/api/guard.py identity); without the guard (an app built
    in a test), the key it presents and its address. Raises ApiError 400 for a header sent twice."""
    named = getattr(request.state, "visitor", None)
    if named:
        return named
    try:
        key = bearer(single_header(request.scope.get("headers", []), "authorization")) if keyed else ""
    except DuplicateHeader as e:
        raise ApiError(str(e), param=e.name) from None
    return visitor_id(digest(key) if key else None, request.client.host if request.client else None)


def submit(runtime: Runtime, chat: ChatRequest, salt: str | None, client: str | None = None):
    """Encode, build the parameters and submit, as ui/session.submit does for a page (on the API's pool: a
    chat template, a grammar's compilation and the engine thread's reply all take time)."""
    try:
        ids = runtime.target.encode_chat(chat.messages)
    except Exception as e:  # a chat template's own errors (jinja2's) have no common type
        raise ApiError(f"the chat template refused these messages: {e}", param="messages") from e
    limit = getattr(runtime.engine, "prompt_limit", None)
    params = chat.gen_params(room=(limit - len(ids)) if limit is not None else 1)
    params.cache_salt = salt
    params.client = client
    try:
        return ids, runtime.scheduler.submit(ids, params)
    except QueueFull as e:  # before RuntimeError: it is one
        raise ApiError(f"the engine is busy: {e}", 429, "rate_limit_error") from e
    except ValueError as e:  # prompt too long, a grammar that does not compile for this model, ...
        raise ApiError(f"cannot start: {e}") from e
    except RuntimeError as e:  # the engine shut down: a model load replaced it
        raise ApiError(f"the engine is not available: {e}", 503, "server_error") from e


@dataclass
class Api:
    app: AppState
    keyed: bool = False  # the app asks for API keys: a visitor is its key and its address
    limits: ClientLimits | None = None  # the app's per-visitor share, the page's too (AppState.limits)
    registry: object = None  # the app's own prometheus_client CollectorRegistry
    chains: tuple = (None, [])  # (runtime, the page's default chain for it): the head's fit check reads weights
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(API_WORKERS, "api"))

    def __post_init__(self):
        if self.registry is None:
            self.registry = registry_for(self.app)
        if self.limits is None:
            self.limits = self.app.limits

    def chain(self, runtime: Runtime) -> list[str]:
        known, chain = self.chains
        if known is not runtime:
            chain = default_chain(runtime, self.app.options.eagle3)
            self.chains = (runtime, chain)
        return list(chain)

    def prepare(self, runtime: Runtime, raw: bytes, client: str):
        """The body checked and submitted (on the pool): (chat, prompt ids, generation)."""
        chat = parse_chat(parse_body(raw), self.chain(runtime), text_bound(runtime), default_tree_nodes(runtime))
        salt = None if self.app.options.share_prefix_cache else f"{client}/{chat.cache_salt}"
        return (chat, *submit(runtime, chat, salt, client))

    async def off_loop(self, runtime: Runtime, raw: bytes, client: str):
        """prepare() on the API's pool. A client that leaves meanwhile cancels the wait, not the work: the
        generation it may still start is cancelled as soon as it exists."""
        job: Future = self.pool.submit(self.prepare, runtime, raw, client)
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            job.add_done_callback(lambda f: f.exception() is None and runtime.scheduler.cancel(f.result()[2].id))
            raise

    async def chat(self, request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            return error_response(ApiError("the request body must be JSON, sent as Content-Type: application/json",
                                           415))
        try:
            client = visitor_of(request, self.keyed)
            self.limits.take(client)
        except ApiError as e:
            return error_response(e)
        except ShareExceeded as e:
            return error_response(ApiError(str(e), 429, "rate_limit_error"))
        try:
            runtime = self.app.runtime
            if runtime is None:
                raise ApiError("no model is loaded", 503, "server_error")
            try:
                raw = await request.body()
            except ClientDisconnect:  # gone, or cut off by the guard's body limit (its 413 is sent already)
                raise ApiError("the client left before its body arrived", 499) from None
            chat, ids, gen = await self.off_loop(runtime, raw, client)
        except ApiError as e:
            self.limits.give(client)
            return error_response(e)
        except BaseException:
            self.limits.give(client)
            raise
        call = Call(runtime=runtime, gen=gen, chat=chat, tally=Tally(prompt_n=len(ids)), cut=StopCut(chat.stop),
                    client=client)
        if chat.stream:
            return StreamingResponse(self.stream(call), media_type="text/event-stream", headers=SSE_HEADERS)
        return await self.whole(call, request)

    async def pieces(self, call: Call, gone: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[str]:
        """The answer's text as it may go out; at the end call.tally holds its counts. Raises ApiError when
        the engine ends it. Left early, or when `gone()` says the client left, it cancels the generation and
        frees its slot (a streamed answer is left early: Starlette cancels it when its client disconnects)."""
        due = time.monotonic() + DISCONNECT_CHECK_S
        pause = POLL_S
        try:
            while not call.ended:
                if gone is not None and time.monotonic() >= due:
                    due = time.monotonic() + DISCONNECT_CHECK_S
                    if await gone():
                        return
                try:
                    ev = call.gen.events.get_nowait()
                except queue.Empty:
                    if call.runtime.scheduler.closed:
                        raise ApiError("the engine shut down: a new model was loaded", 503, "server_error") from None
                    await asyncio.sleep(pause)
                    pause = min(POLL_MAX_S, pause * 2)
                    continue
                pause = POLL_S
                if isinstance(ev, WaitEvent):
                    continue
                call.ended = ev.done
                if isinstance(ev, ErrorEvent):
                    raise ApiError(f"the engine ended this answer: {ev.message}", 503, "server_error")
                text = self.take(call, ev)
                if text:
                    yield text
        finally:
            self.end(call)

    def end(self, call: Call) -> None:
        """The answer is over for its client: an unfinished generation is cancelled (its slot freed at the next
        round) and the client's request stops counting, once."""
        if not call.ended:
            call.runtime.scheduler.cancel(call.gen.id)
            call.ended = True
        if call.client:
            self.limits.give(call.client)
            call.client = ""

    def take(self, call: Call, ev) -> str:
        """One round's text, cut at a stop string. After a stop string the engine is asked to stop and its last
        rounds are still read, so that usage and timings count every round it ran for this answer."""
        call.tally.add(ev)
        text = call.cut.feed(ev.text_delta)
        if call.cut.hit and not call.stopping and not ev.done:
            call.stopping = True
            call.runtime.scheduler.stop(call.gen.id)
        return text + call.cut.flush() if ev.done else text

    async def stream(self, call: Call) -> AsyncIterator[str]:
        try:
            yield sse(call.chunk({"role": "assistant", "content": ""}))
            async with aclosing(self.pieces(call)) as pieces:
                try:
                    async for text in pieces:
                        yield sse(call.chunk({"content": text}))
                except ApiError as e:  # the answer began: the error goes in the stream, as llama-server sends it
                    yield sse(e.body())
                    return
            yield sse({**call.chunk({}, call.finish_reason()), **call.ending()})
            yield sse("[DONE]")
        finally:  # also when the client left before the first piece
            self.end(call)

    async def whole(self, call: Call, request: Request) -> Response:
        parts = []
        async with aclosing(self.pieces(call, gone=request.is_disconnected)) as pieces:
            try:
                async for text in pieces:
                    parts.append(text)
            except ApiError as e:
                return error_response(e)
        message = {"role": "assistant", "content": "".join(parts)}
        return JSONResponse({**call.head("chat.completion"),
                             "choices": [{"index": 0, "message": message, "finish_reason": call.finish_reason()}],
                             **call.ending()})

    async def models(self) -> Response:
        runtime = self.app.runtime
        data = [] if runtime is None else [{"id": public_name(runtime.target.name), "object": "model", "created": 0,
                                            "owned_by": "spec-playground"}]
        return JSONResponse({"object": "list", "data": data})

    async def metrics(self) -> Response:
        body, content_type = exposition(self.registry)
        return Response(body, media_type=content_type)


def api_routes(app: AppState, keyed: bool = False, max_each: int | None = None) -> list:
    """The API's routes, for the FastAPI app that serves the page; keyed: visitors are told apart by their API
    key too; max_each: requests one visitor may have in flight (None: the app's own limits, the page's too)."""
    api = Api(app, keyed=keyed, limits=None if max_each is None else ClientLimits(max_each=max_each))
    router = APIRouter()
    router.add_api_route("/v1/chat/completions", api.chat, methods=["POST"])
    router.add_api_route("/v1/models", api.models, methods=["GET"])
    router.add_api_route("/metrics", api.metrics, methods=["GET"])
    return list(router.routes)
