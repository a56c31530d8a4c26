"""The app's front door: an ASGI middleware that every request passes before Gradio's or the API's routes.

- `Host` must be an IP literal, a loopback name or a name the host allowed (`--allowed-host`): a DNS-rebinding
  page reaches the port under its own domain name, so its requests are refused here.
- `Origin`, when a browser sends one, must be the page's own origin or one the host listed exactly
  (`--allowed-origin scheme://host:port`): a foreign site's form or fetch (a text/plain POST needs no CORS
  preflight) cannot start generations or read answers. A host name allowed is not an origin trusted.
- `Authorization`, `Host`, `Origin` and `Cookie` come once: a second copy is a 400 (ui/visitors.py), so what the
  guard checks is what the routes read.
- The API and /metrics ask for `Authorization: Bearer KEY` when keys are set (`--api-key`, OpenAI's form); when
  the page has a login, every Gradio route but the login's own asks for its session cookie (Gradio leaves its
  heartbeat stream open to anyone).
- A body may hold at most `body_max` bytes (uploads `upload_max`): a declared Content-Length over it gets 413
  before a byte is read, and a body that grows past it while read is cut off with 413.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from urllib.parse import urlsplit

from ui.api.openings import Openings
from ui.visitors import Logins, bearer, digest, duplicated, visitor_id

LOOPBACK_NAMES = ("localhost",)
API_PREFIXES = ("/v1/", "/metrics")  # what the key guards (the page is guarded by Gradio's login when shared)
UPLOAD_SUFFIX = "/upload"  # Gradio's upload route (its own max_file_size applies as well)
GRADIO_PREFIX = "/gradio_api/"
# Gradio routes a page that is not signed in needs to show its login form, and the one launch() itself calls
# (it runs the app's startup events once; later calls do nothing)
LOGIN_FREE = ("/gradio_api/login_check", "/gradio_api/app_id", "/gradio_api/user", "/gradio_api/token",
              "/gradio_api/startup-events")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True)
class GuardConfig:
    keys: tuple[str, ...] = ()  # API keys; empty: the API asks for none (loopback only, app.py enforces it)
    allowed_hosts: tuple[str, ...] = ()  # names besides IP literals and localhost; "*" any; ".x.org" a suffix
    # origins (scheme://host:port, compared exactly) whose pages may call the app besides its own
    allowed_origins: tuple[str, ...] = ()
    body_max: int = 1 << 20  # bytes a request body may hold
    upload_max: int = 10 << 20  # bytes an uploaded file may hold
    page_login: bool = False  # the page asks for a key as its password: Gradio's routes need its session cookie
    logins: Logins = field(default_factory=Logins)  # which key each signed-in name used (the page's identity)
    # names known only after launch (--share's own link): the host and origin of that one link
    late_hosts: list = field(default_factory=list)
    late_origins: list = field(default_factory=list)

    def key_ok(self, header: str | None) -> bool:
        """Whether an Authorization header carries one of the keys (compared in constant time)."""
        if not self.keys:
            return True
        return self.valid_key(bearer(header))

    def valid_key(self, given: str) -> bool:
        """Whether `given` is one of the keys (compared in constant time, every key compared)."""
        if not given:
            return False
        matches = [hmac.compare_digest(given.encode(), key.encode()) for key in self.keys]
        return any(matches)

    def listed(self, name: str) -> bool:
        """Whether the host named this name (`--allowed-host`, "*" any, ".x.org" a suffix)."""
        name = name.lower().rstrip(".")
        allowed = (*self.allowed_hosts, *self.late_hosts)
        return any(a == "*" or name == a or (a.startswith(".") and name.endswith(a)) for a in allowed)

    def origin_listed(self, origin: str) -> bool:
        """Whether a page of this origin may call the app: listed exactly (scheme, host and port)."""
        mine = normal_origin(origin)
        return mine is not None and mine in {normal_origin(o) for o in (*self.allowed_origins, *self.late_origins)}

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


def normal_origin(origin: str) -> str | None:
    """"HTTPS://Lab.Example.org" -> "https://lab.example.org:443"; None for what is no origin ("null")."""
    parts = urlsplit(origin.strip())
    if parts.scheme.lower() not in DEFAULT_PORTS or not parts.hostname:
        return None
    try:
        port = parts.port or DEFAULT_PORTS[parts.scheme.lower()]
    except ValueError:
        return None
    return f"{parts.scheme.lower()}://{parts.hostname.lower()}:{port}"


def session_token(headers: dict) -> str | None:
    """Gradio's session cookie (access-token-<id>, or its -unsecure twin sent over plain http)."""
    try:
        jar = SimpleCookie(headers.get("cookie", ""))
    except CookieError:
        return None
    for name, morsel in jar.items():
        if name.startswith("access-token-"):
            return morsel.value
    return None


def signed_in_name(scope: dict, headers: dict) -> str | None:
    """The user name a request's session cookie signed in as, from the Gradio app's own table of tokens."""
    token = session_token(headers)
    tokens = getattr(scope.get("app"), "tokens", None) or {}
    return tokens.get(token) if token else None


def identity(config: GuardConfig, address: str | None, headers: dict, user: str | None) -> str:
    """A request's visitor (ui/visitors.py): the key it presents, through the API's header or the page's
    sign-in as `user`, and its address."""
    if not config.keys:
        return visitor_id(None, address)
    key = bearer(headers.get("authorization"))
    if key and config.valid_key(key):
        return visitor_id(digest(key), address)
    return visitor_id(config.logins.key_digest(user), address)


def page_visitor(config: GuardConfig, request) -> str:
    """The visitor of a page event (a gr.Request: its headers, address and signed-in user), named as the guard
    names the request that carried it."""
    headers = {k.lower(): v for k, v in dict(getattr(request, "headers", None) or {}).items()}
    client = getattr(request, "client", None)
    return identity(config, getattr(client, "host", None), headers, getattr(request, "username", None))


def host_name(host: str) -> str:
    """The name part of a Host header or an origin's netloc: "[::1]:7860" -> "::1", "a.b:80" -> "a.b"."""
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def refusal(scope: dict, status: int, message: str) -> tuple[int, list, bytes]:
    """(status, headers, body) of a refusal: OpenAI's error body on the API, a plain line elsewhere."""
    kind = {403: "permission_error", 429: "rate_limit_error", 503: "server_error"}.get(status,
                                                                                      "invalid_request_error")
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
    twice = duplicated(scope.get("headers", []))
    if twice is not None:
        return 400, f"the request sends the {twice!r} header more than once: send it once"
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
    host = headers.get("host")
    if host is not None and not config.host_ok(host_name(host)):
        return 403, (f"host {host_name(host)!r} is not allowed: the app answers to its addresses, localhost and "
                     "the names its host allows (--allowed-host)")
    origin = headers.get("origin")
    if origin is not None:
        netloc = urlsplit(origin).netloc
        same = host is not None and netloc.lower() == host.lower()
        if not same and not config.origin_listed(origin):
            return 403, (f"requests from the page {origin!r} are not allowed (another site's page; the host lists "
                         "trusted origins with --allowed-origin)")
    path = scope.get("path", "")
    if path.startswith(API_PREFIXES) and not config.key_ok(headers.get("authorization")):
        return 401, "a valid API key is needed: send it as 'Authorization: Bearer KEY'"
    if config.page_login and path.startswith(GRADIO_PREFIX) and path.rstrip("/") not in LOGIN_FREE \
            and signed_in_name(scope, headers) is None:
        return 401, "sign in first: this playground is shared"
    if scope["type"] == "http":
        limit = config.upload_max if scope.get("path", "").endswith(UPLOAD_SUFFIX) else config.body_max
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > limit:
            return 413, f"the request body holds {int(length)} bytes; at most {limit} are taken"
    return None


def is_sign_in(scope: dict) -> bool:
    return scope.get("method") == "POST" and scope.get("path", "").rstrip("/") == "/login"


class Guard:
    """ASGI middleware applying a GuardConfig to every http and websocket request, and counting the requests
    each visitor holds open (ui/api/openings.py)."""

    def __init__(self, app, config: GuardConfig, openings: Openings | None = None):
        self.app, self.config = app, config
        self.openings = openings if openings is not None else Openings()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        refused = check(self.config, scope)
        if refused is None and is_sign_in(scope):
            refused = self.openings.sign_in_refused((scope.get("client") or ("unknown", 0))[0])
        visitor = None
        if refused is None:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            address = (scope.get("client") or ("unknown", 0))[0]
            visitor = identity(self.config, address, headers, signed_in_name(scope, headers))
            refused = self.openings.enter(visitor)
        if refused is not None:
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008, "reason": refused[1][:120]})
            return await respond(send, *refusal(scope, *refused))
        scope.setdefault("state", {})["visitor"] = visitor  # the routes and the page read it (ui/visitors.py)
        try:
            if scope["type"] == "websocket":
                return await self.app(scope, receive, send)
            path = scope.get("path", "")
            limit = self.config.upload_max if path.endswith(UPLOAD_SUFFIX) else self.config.body_max
            await self.app(scope, *bounded(scope, receive, send, limit))
        finally:
            self.openings.leave(visitor)


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
