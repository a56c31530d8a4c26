"""The app's front door: an ASGI middleware that every request passes before Gradio's or the API's routes.

- `Host` must be an IP literal, a loopback name or a name the host allowed (`--allowed-host`): a DNS-rebinding
  page reaches the port under its own domain name, so its requests are refused here.
- `Origin`, when a browser sends one, must be the page's own origin or a listed host's: a foreign site's form
  or fetch (a text/plain POST needs no CORS preflight) cannot start generations or read answers.
- The API and /metrics ask for `Authorization: Bearer KEY` when keys are set (`--api-key`, OpenAI's form).
- A body may hold at most `body_max` bytes (uploads `upload_max`): a declared Content-Length over it gets 413
  before a byte is read, and a body that grows past it while read is cut off with 413.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost",)
API_PREFIXES = ("/v1/", "/metrics")  # what the key guards (the page is guarded by Gradio's login when shared)
UPLOAD_SUFFIX = "/upload"  # Gradio's upload route (its own max_file_size applies as well)


@dataclass(frozen=True)
class GuardConfig:
    keys: tuple[str, ...] = ()  # API keys; empty: the API asks for none (loopback only, app.py enforces it)
    allowed_hosts: tuple[str, ...] = ()  # names besides IP literals and localhost; "*" any; ".x.org" a suffix
    body_max: int = 1 << 20  # bytes a request body may hold
    upload_max: int = 10 << 20  # bytes an uploaded file may hold

    def key_ok(self, header: str | None) -> bool:
        """Whether an Authorization header carries one of the keys (compared in constant time)."""
        if not self.keys:
            return True
        scheme, _, given = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not given:
            return False
        matches = [hmac.compare_digest(given.strip().encode(), key.encode()) for key in self.keys]
        return any(matches)

    def listed(self, name: str) -> bool:
        """Whether the host named this name (`--allowed-host`, "*" any, ".x.org" a suffix)."""
        name = name.lower().rstrip(".")
        return any(a == "*" or name == a or (a.startswith(".") and name.endswith(a)) for a in self.allowed_hosts)

    def host_ok(self, name: str) -> bool:
        """Whether a Host header's name may reach the app: a rebinding page needs a name of its own, so address
        literals and loopback names pass, other names only when listed."""
        name = name.lower().rstrip(".")
        if name in LOOPBACK_NAMES or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            return self.listed(name)


def host_name(host: str) -> str:
    """The name part of a Host header or an origin's netloc: "[::1]:7860" -> "::1", "a.b:80" -> "a.b"."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def refusal(scope: dict, status: int, message: str) -> tuple[int, list, bytes]:
    """(status, headers, body) of a refusal: OpenAI's error body on the API, a plain line elsewhere."""
    kind = "permission_error" if status == 403 else "invalid_request_error"
    if scope.get("path", "").startswith(API_PREFIXES):
        code = "invalid_api_key" if status == 401 else None
        body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
        headers = [(b"content-type", b"application/json")]
    else:
        body, headers = message.encode(), [(b"content-type", b"text/plain; charset=utf-8")]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    return status, headers + [(b"content-length", str(len(body)).encode())], body


def check(config: GuardConfig, scope: dict) -> tuple[int, str] | None:
    """Why this request is refused before any route sees it: (status, reason), or None."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    host = headers.get("host")
    if host is not None and not config.host_ok(host_name(host)):
        return 403, (f"host {host_name(host)!r} is not allowed: the app answers to its addresses, localhost and "
                     "the names its host allows (--allowed-host)")
    origin = headers.get("origin")
    if origin is not None:
        netloc = urlsplit(origin).netloc
        same = host is not None and netloc.lower() == host.lower()
        if not same and (not netloc or not config.listed(host_name(netloc))):
            return 403, f"requests from the page {origin!r} are not allowed (another site's page)"
    if scope.get("path", "").startswith(API_PREFIXES) and not config.key_ok(headers.get("authorization")):
        return 401, "a valid API key is needed: send it as 'Authorization: Bearer KEY'"
    if scope["type"] == "http":
        limit = config.upload_max if scope.get("path", "").endswith(UPLOAD_SUFFIX) else config.body_max
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            return 413, f"the request body holds {int(length)} bytes; at most {limit} are taken"
    return None


class Guard:
    """ASGI middleware applying a GuardConfig to every http and websocket request."""

    def __init__(self, app, config: GuardConfig):
        self.app, self.config = app, config

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        refused = check(self.config, scope)
        if refused is not None:
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008, "reason": refused[1][:120]})
            return await respond(send, *refusal(scope, *refused))
        if scope["type"] == "websocket":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        limit = self.config.upload_max if path.endswith(UPLOAD_SUFFIX) else self.config.body_max
        await self.app(scope, *bounded(scope, receive, send, limit))


async def respond(send, status: int, headers: list, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def bounded(scope: dict, receive, send, limit: int):
    """(receive, send) that cut a body growing past `limit` bytes (a chunked one declares no length): the client
    gets 413, the route reads a disconnect and whatever it answers then is dropped."""
    state = {"seen": 0, "started": False, "cut": False}

    async def receive_bounded():
        message = await receive()
        if message["type"] == "http.request" and not state["cut"]:
            state["seen"] += len(message.get("body", b""))
            if state["seen"] > limit:
                state["cut"] = True
                if not state["started"]:
                    await respond(send, *refusal(scope, 413, f"the request body holds over {limit} bytes; at "
                                                             f"most {limit} are taken"))
                return {"type": "http.disconnect"}
        return message

    async def send_unless_cut(message):
        if state["cut"]:
            return
        state["started"] = state["started"] or message["type"] == "http.response.start"
        await send(message)

    return receive_bounded, send_unless_cut
