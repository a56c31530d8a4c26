"""Who is asking, and how much of the engine they may hold at once.

A client is its API key where keys are set (a class given one key each is that many clients), else its address.
Its identity salts the prefix cache (`GenParams.cache_salt`), so prefixes pass only within one client, and it
bounds the client's requests in flight, running or waiting in line: past `max_each` a request gets 429, so one
client cannot fill every slot and the whole line while the page's visitors read "busy".
"""

from __future__ import annotations

import hashlib
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from ui.api.request import ApiError


def client_id(authorization: str | None, address: str | None, keyed: bool) -> str:
    """A stable, non-secret name for a client: a digest of its key (keyed apps) or its address."""
    who = (authorization or "").partition(" ")[2].strip() if keyed else (address or "unknown")
    return ("key:" if keyed else "addr:") + hashlib.sha256(who.encode()).hexdigest()[:16]


@dataclass
class ClientLimits:
    max_each: int  # requests one client may have in flight (running or waiting for a slot)
    held: dict[str, int] = field(default_factory=dict)  # client -> its requests in flight
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, client: str) -> None:
        """Count one more request of this client in flight; raises ApiError 429 past the limit."""
        with self.lock:
            n = self.held.get(client, 0)
            if n >= self.max_each:
                raise ApiError(f"this client already has {n} requests in flight (at most {self.max_each} at "
                               "once): wait for one to finish", 429, "rate_limit_error")
            self.held[client] = n + 1

    def give(self, client: str) -> None:
        with self.lock:
            n = self.held.get(client, 0) - 1
            if n > 0:
                self.held[client] = n
            else:
                self.held.pop(client, None)

    @contextmanager
    def holding(self, client: str):
        self.take(client)
        try:
            yield
        finally:
            self.give(client)

    def in_flight(self) -> int:
        with self.lock:
            return sum(self.held.values())
