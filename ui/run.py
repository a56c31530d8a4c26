"""One generation as the UI sees it: its events, the HTML of each finished round cached, and its speed.

Rendering is done once per round when the event arrives; the views then join cached strings, so a long answer
costs the UI O(1) renders per round instead of re-rendering every token each time.
"""

from __future__ import annotations

import html
import time
from dataclasses import dataclass, field

from ui import charts
from ui.render import answer_bubble, round_html, speed_line, tps
from ui.timeline import timeline_row
from ui.tokens import Vocab

CONTEXT_TAIL = 8  # answer tokens handed to renderers as decoding context


@dataclass
class RunRecord:
    vocab: Vocab
    prompt_ids: list[int]  # what was submitted (the whole conversation, chat template applied)
    manual: bool = False  # step mode: rounds run when the user clicks, so there is no speed to measure
    t_submit: float = field(default_factory=time.perf_counter)
    events: list = field(default_factory=list)  # every RoundEvent, in order
    ids: list[int] = field(default_factory=list)  # the answer: emitted token ids
    answer_parts: list[str] = field(default_factory=list)  # cached HTML of each round of the answer
    timeline_rows: list[str] = field(default_factory=list)  # cached HTML row of each round
    rounds: list[int] = field(default_factory=list)  # speed series after the prefill: round index,
    emitted: list[int] = field(default_factory=list)  # tokens emitted that round,
    elapsed: list[float] = field(default_factory=list)  # seconds since the prefill event
    n_first: int = 0  # tokens emitted by the prefill round (not counted in the decode speed)
    t_first: float | None = None  # when the prefill event arrived
    t_last: float | None = None  # when the latest event arrived
    last: object = None  # the latest event that ran a batch (a bare stop event has none): cache and step views
    context_last: list[int] = field(default_factory=list)  # answer tail before `last` (step view decoding)
    done: bool = False
    stop_reason: str | None = None
    error: str | None = None
    format_complete: bool | None = None  # the grammar's verdict on the whole answer (RoundEvent.format_complete)
    # the page draws this run's rounds; the comparison's timed runs are never drawn, and rendering each round's
    # HTML in the web thread while the engine thread decodes would take the GIL from the run being timed
    shown: bool = True

    def add(self, ev, t_recv: float | None = None) -> None:
        """Take one event: render its round once, extend the answer and the speed series."""
        # the engine stamps each round when it ends; arrival time lags when the page is slow to read events
        stamp = getattr(ev, "t_end", 0.0) or 0.0
        t = stamp if stamp > 0 else (time.perf_counter() if t_recv is None else t_recv)
        context = self.ids[-CONTEXT_TAIL:]
        self.events.append(ev)
        if ev.emitted or ev.drafted:
            if self.shown:
                self.answer_parts.append(round_html(ev, self.vocab, context))
                self.timeline_rows.append(timeline_row(ev, self.vocab, context))
            self.last = ev
            self.context_last = context
        self.ids.extend(ev.emitted)
        if ev.kind == "prefill":
            self.t_first = t
            self.n_first = len(ev.emitted)
        elif self.t_first is not None and ev.emitted:
            self.rounds.append(ev.round)
            self.emitted.append(len(ev.emitted))
            self.elapsed.append(t - self.t_first)
        self.t_last = t
        if ev.done:
            self.done = True
            self.stop_reason = ev.stop_reason
            self.format_complete = getattr(ev, "format_complete", None)

    def fail(self, message: str) -> None:
        self.done = True
        self.error = message
        self.stop_reason = "error"

    # ---- measured speed --------------------------------------------------------------------------------

    @property
    def n_decode(self) -> int:
        """Tokens after the first: the prefill round's token is the prompt's cost, not the decoder's."""
        return max(0, len(self.ids) - self.n_first)

    @property
    def decode_seconds(self) -> float:
        if self.t_first is None or self.t_last is None:
            return 0.0
        return self.t_last - self.t_first

    @property
    def tps(self) -> float | None:
        """Tokens per second of the decoding rounds (sum emitted / wall time between the engine's round stamps)."""
        return tps(self.n_decode, self.decode_seconds)

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    def cache_ids(self) -> list[int]:
        """Tokens in the sequence's cells after the latest round, in position order: prompt, then the answer
        up to the cache size the engine reports (the target's newest token is not cached until next round)."""
        n = self.last.seq_cells if self.last is not None and self.last.seq_cells else len(self.prompt_ids)
        return (self.prompt_ids + self.ids)[:n]

    def sampled_last(self) -> int | None:
        """The first row of the latest batch: the token the round before it emitted last."""
        return self.context_last[-1] if self.context_last else None

    def stats(self):
        return charts.stats_from_events(self.events)

    def shared_rounds(self) -> tuple[int, int]:
        """(decode rounds whose forward other generations shared, all decode rounds)."""
        decode = [ev for ev in self.events if ev.kind != "prefill" and ev.emitted]
        return sum(ev.n_seqs > 1 for ev in decode), len(decode)

    def used_rejection(self) -> bool:
        return any(getattr(ev, "verify_mode", "match") == "rejection" for ev in self.events)

    # ---- views -----------------------------------------------------------------------------------------

    def meta_html(self) -> str:
        reason = (self.error or self.stop_reason) if self.done else None
        if self.manual:
            return f"{len(self.ids)} tokens · {self.n_rounds} rounds · step mode" + (f" · stop: {html.escape(reason)}" if reason else "")
        return speed_line(len(self.ids), self.n_decode, self.decode_seconds, self.n_rounds, reason)

    def answer_html(self, live: bool) -> str:
        return answer_bubble("".join(self.answer_parts), self.meta_html(), live=live and not self.done)
