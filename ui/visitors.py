"""Who is asking, read once per request, and how much of the engine each visitor may hold at once.

One identity serves the page and the API alike, for the per-visitor share of slots and line, for the grammar
cache's partition and (with the browser session or the API's own `cache_salt`) for the prefix cache's salt:

- a keyed app (`--api-key`): the digest of the key the request presents (the API's `Authorization` header, the
  page's login) and the address it comes from; a class given one key each is that many visitors, and a class
  sharing one key is told apart by address;
- an app without keys (loopback only): the address.

The address is the TCP peer's, or the one a `--trusted-proxy` forwards (uvicorn rewrites it only for those).
Every header the identity rests on is read through `single_header`: a request that sends one twice is refused,
so a decoy `Authorization` cannot name a new visitor while the guard checks the real key.
"""

from __future__ import annotations

import hashlib
import ipaddress
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

SINGLE_HEADERS = ("authorization", "host", "origin", "cookie")  # more than one of these: 400


class DuplicateHeader(ValueError):
    """A request sent a header twice that must come once; `name` is the header."""

    def __init__(self, name: str):
        super().__init__(f"the request sends the {name!r} header more than once: send it once")
        self.name = name


class ShareExceeded(Exception):
    """A visitor asked for more than its share of the engine (the API answers 429, the page says wait)."""


def single_header(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    """The value of header `name` (lower case) in an ASGI scope's header list; None when absent. Raises
    DuplicateHeader when it comes more than once."""
    key = name.encode("latin-1")
    found = [v for k, v in headers if k.lower() == key]
    if len(found) > 1:
        raise DuplicateHeader(name)
    return found[0].decode("latin-1") if found else None


def duplicated(headers: list[tuple[bytes, bytes]]) -> str | None:
    """The first of SINGLE_HEADERS that this header list sends more than once, or None."""
    seen: set[bytes] = set()
    for k, _ in headers:
        k = k.lower()
        if k in seen and k.decode("latin-1") in SINGLE_HEADERS:
            return k.decode("latin-1")
        seen.add(k)
    return None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def bearer(authorization: str | None) -> str:
    """The key of an `Authorization: Bearer KEY` header ("" for none or another scheme)."""
    scheme, _, given = (authorization or "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def visitor_id(key_digest: str | None, address: str | None) -> str:
    """A stable, non-secret name for a visitor: its key's digest (when the app is keyed) and its address."""
    where = address or "unknown"
    return f"key:{key_digest}@{where}" if key_digest else f"addr:{where}"


def address_of(visitor: str) -> str:
    """The address part of a visitor_id ("key:D@ADDR" or "addr:ADDR")."""
    where = visitor.rpartition("@")[2]
    return where.removeprefix("addr:")


def operator(visitor: str) -> bool:
    """A visitor with no key on a loopback address: the operator's own tab or script on a local app."""
    return visitor.startswith("addr:") and is_loopback_address(address_of(visitor))


def is_loopback_address(address: str | None) -> bool:
    try:
        return address is not None and ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


@dataclass
class ClientLimits:
    """Requests in flight per visitor (running or waiting for a slot), page sends and API requests together."""

    max_each: int  # requests one visitor may have in flight; past it ShareExceeded
    exempt_loopback: bool = False  # keyless loopback visitors (the operator's tabs, local apps only) not counted
    held: dict[str, int] = field(default_factory=dict)  # visitor -> its requests in flight
    lock: threading.Lock = field(default_factory=threading.Lock)

    def exempt(self, visitor: str) -> bool:
        return self.exempt_loopback and operator(visitor)

    def take(self, visitor: str) -> None:
        """Count one more request of this visitor in flight; raises ShareExceeded past the limit. An unnamed
        visitor ("") is the process itself (a script or test driving the page's functions): never counted."""
        if not visitor or self.exempt(visitor):
            return
        with self.lock:
            n = self.held.get(visitor, 0)
            if n >= self.max_each:
                raise ShareExceeded(f"this visitor already has {n} requests in flight (at most {self.max_each} at "
                                    "once, page tabs and API together): wait for one to finish")
            self.held[visitor] = n + 1

    def give(self, visitor: str) -> None:
        if not visitor or self.exempt(visitor):
            return
        with self.lock:
            n = self.held.get(visitor, 0) - 1
            if n > 0:
                self.held[visitor] = n
            else:
                self.held.pop(visitor, None)

    @contextmanager
    def holding(self, visitor: str):
        self.take(visitor)
        try:
            yield
        finally:
            self.give(visitor)

    def in_flight(self) -> int:
        with self.lock:
            return sum(self.held.values())


@dataclass
class Logins:
    """The page's sign-ins (any user name, a key as the password): each name belongs to the first key that used
    it, so the page knows which key a tab signed in with and a name cannot be taken over with another key."""

    max_names: int = 10_000  # names remembered; past it a new name is refused (the login is rate-limited too)
    key_of_name: dict[str, str] = field(default_factory=dict)  # user name -> its key's digest
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bind(self, name: str, key: str) -> bool:
        """Whether `name` may sign in with `key` (a valid key, checked by the caller): a new name is bound to it."""
        with self.lock:
            known = self.key_of_name.get(name)
            if known is None:
                if len(self.key_of_name) >= self.max_names:
                    return False
                self.key_of_name[name] = digest(key)
                return True
            return known == digest(key)

    def key_digest(self, name: str | None) -> str | None:
        with self.lock:
            return self.key_of_name.get(name) if name else None
