"""Counters over every generation's rounds, kept apart by what the generation was for.

The scheduler hands each RoundEvent to its listeners on the engine thread (Scheduler(on_event=...)) with its
generation's purpose; these are plain numbers that the app exposes however it likes (ui/metrics.py: Prometheus),
so the engine imports no exporter. CHAT counts answers somebody asked for (the page, the API); the runs that
only measure (a page answer's comparison runs the same prompt twice more, the Benchmark tab's synthetic
acceptance, the Arena's oracle that drafts the known answer) are counted under their own purpose, so the chat
figures are neither tripled nor flattered by drafts accepted by construction. They count what vLLM's spec_decode_* counters count: a draft is a round whose verified draft is not
empty, its tokens are `len(ev.drafted)` and its accepted tokens `ev.n_accepted`, credited to draft positions
0..n_accepted-1. For a tree round `drafted` is the chain the event shows (the kept path and the first branch
below it), not every node the tree offered.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from engine.events import RoundEvent

TPS_WINDOW = 16  # finished generations the tokens-per-second figure is taken over
CHAT = "chat"  # an answer somebody asked for: a page message or an API request
# runs that measure: a page answer's comparison (plain, then speculative again), the Benchmark tab, the Arena
MEASUREMENTS = ("compare", "bench", "arena")
PURPOSES = (CHAT,) + MEASUREMENTS


def check_purpose(purpose: str) -> str:
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {', '.join(PURPOSES)}, got {purpose!r}")
    return purpose


@dataclass
class Totals:
    """A consistent copy of the counters, taken under their lock."""

    drafts: int = 0  # rounds with a non-empty draft
    draft_tokens: int = 0  # draft tokens proposed (and verified)
    accepted_tokens: int = 0  # of those, kept
    accepted_per_pos: list[int] = field(default_factory=list)  # kept tokens by draft position, 0-based
    prompt_tokens: int = 0  # prompt tokens of the generations that started
    generation_tokens: int = 0  # tokens given out to callers
    tokens_per_second: float = 0.0  # decode tokens / decode seconds over the last TPS_WINDOW finished generations


@dataclass
class Decoding:
    """One generation's decode so far, between its prefill and its last round: for tokens per second."""

    t_first: float  # the prefill round's end (its token is the prompt's cost, not the decoder's)
    t_last: float
    tokens: int = 0  # emitted after the prefill round


@dataclass
class Tally:
    """One purpose's counters (SpecCounters holds one per purpose)."""

    totals: Totals = field(default_factory=Totals)
    # by slot: a slot runs one generation at a time and each starts with its prefill event, so this holds at most
    # one entry per slot and a generation that ended on an error is overwritten by the next one
    decoding: dict[int, Decoding] = field(default_factory=dict)
    recent: deque = field(default_factory=lambda: deque(maxlen=TPS_WINDOW))  # (tokens, seconds) finished

    def observe(self, ev: RoundEvent, manual: bool) -> None:
        t = self.totals
        if ev.drafted:
            t.drafts += 1
            t.draft_tokens += len(ev.drafted)
            t.accepted_tokens += ev.n_accepted
            if len(t.accepted_per_pos) < ev.n_accepted:
                t.accepted_per_pos.extend([0] * (ev.n_accepted - len(t.accepted_per_pos)))
            for i in range(ev.n_accepted):
                t.accepted_per_pos[i] += 1
        t.generation_tokens += len(ev.emitted)
        if ev.kind == "prefill":
            t.prompt_tokens += ev.batch_rows
        self._time(ev, manual)

    def _time(self, ev: RoundEvent, manual: bool) -> None:
        if manual or ev.seq < 0 or ev.t_end <= 0:  # a bare event of a request that never had a slot
            self.decoding.pop(ev.seq, None)
            return
        if ev.kind == "prefill":
            self.decoding[ev.seq] = Decoding(t_first=ev.t_end, t_last=ev.t_end)
        elif ev.seq in self.decoding:
            d = self.decoding[ev.seq]
            d.t_last, d.tokens = ev.t_end, d.tokens + len(ev.emitted)
        if ev.done and ev.seq in self.decoding:
            d = self.decoding.pop(ev.seq)
            if d.tokens and d.t_last > d.t_first:
                self.recent.append((d.tokens, d.t_last - d.t_first))

    def snapshot(self) -> Totals:
        t = self.totals
        tokens, seconds = sum(n for n, _ in self.recent), sum(s for _, s in self.recent)
        return Totals(drafts=t.drafts, draft_tokens=t.draft_tokens, accepted_tokens=t.accepted_tokens,
                      accepted_per_pos=list(t.accepted_per_pos), prompt_tokens=t.prompt_tokens,
                      generation_tokens=t.generation_tokens,
                      tokens_per_second=tokens / seconds if seconds > 0 else 0.0)


@dataclass
class SpecCounters:
    tallies: dict[str, Tally] = field(default_factory=lambda: {p: Tally() for p in PURPOSES})
    lock: threading.Lock = field(default_factory=threading.Lock)  # written on the engine thread, read by scrapes

    def observe(self, ev: RoundEvent, manual: bool = False, purpose: str = CHAT) -> None:
        """Count one round of a generation made for `purpose` (one of PURPOSES). manual: a step-mode
        generation, whose pace is the user's clicks, stays out of the speed figure (its tokens still count)."""
        with self.lock:
            self.tallies[purpose].observe(ev, manual)

    def snapshot(self, purpose: str = CHAT) -> Totals:
        """A consistent copy of one purpose's counters: CHAT unless asked (what /metrics has always shown)."""
        with self.lock:
            return self.tallies[purpose].snapshot()
