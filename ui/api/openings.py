"""How many requests may be open at once, in all and per visitor, and how often an address may try to sign in.

Uvicorn takes every connection and Gradio keeps some open for as long as the client likes (the heartbeat stream
of each tab, the queue's event streams, the API's streamed answers), so a client that opens thousands would hold
the event loop's sockets and memory while the page's visitors wait. Each request the guard lets in holds an
opening until its response ends: past `total_max` open ones a request gets 503, past `each_max` for its visitor
429 (the operator's loopback tabs are exempt with `--exempt-loopback`). The sign-in form is a password guess:
each address may post it `login_max` times a minute.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from ui.visitors import operator

LOGIN_WINDOW_S = 60.0  # the sign-in attempts of an address are counted over this window
ADDRESSES_KEPT = 4096  # addresses whose attempts are remembered; the oldest forgotten past it


@dataclass
class Openings:
    total_max: int = 1000  # requests open at once, every visitor together: past it 503
    each_max: int = 64  # requests one visitor may hold open at once (streams, long polls): past it 429
    login_max: int = 10  # sign-in attempts an address may make per LOGIN_WINDOW_S: past it 429
    exempt_loopback: bool = False  # loopback visitors are not counted (the operator's own tabs, local apps only)
    open_each: dict[str, int] = field(default_factory=dict)  # visitor -> its requests open now
    open_total: int = 0
    attempts: OrderedDict = field(default_factory=OrderedDict)  # address -> deque of sign-in times
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, visitor: str) -> tuple[int, str] | None:
        """Count a request in, or say why not: (status, reason). A request let in must `leave` once."""
        exempt = self.exempt_loopback and operator(visitor)
        with self.lock:
            if self.open_total >= self.total_max:
                return 503, f"the server has {self.open_total} requests open (at most {self.total_max}): try again"
            n = self.open_each.get(visitor, 0)
            if n >= self.each_max and not exempt:
                return 429, (f"this visitor has {n} requests open (at most {self.each_max} at once): close some "
                             "tabs or streams")
            self.open_total += 1
            self.open_each[visitor] = n + 1
        return None

    def leave(self, visitor: str) -> None:
        with self.lock:
            self.open_total -= 1
            n = self.open_each.get(visitor, 0) - 1
            if n > 0:
                self.open_each[visitor] = n
            else:
                self.open_each.pop(visitor, None)

    def sign_in_refused(self, address: str, now: float | None = None) -> tuple[int, str] | None:
        """Count one sign-in attempt of this address; (429, reason) past login_max in the window."""
        now = time.monotonic() if now is None else now
        with self.lock:
            seen = self.attempts.pop(address, None) or deque()
            while seen and now - seen[0] > LOGIN_WINDOW_S:
                seen.popleft()
            self.attempts[address] = seen  # most recent last
            while len(self.attempts) > ADDRESSES_KEPT:
                self.attempts.popitem(last=False)
            if len(seen) >= self.login_max:
                wait = LOGIN_WINDOW_S - (now - seen[0])
                return 429, f"too many sign-in attempts from this address: try again in {wait:.0f} s"
            seen.append(now)
        return None
