"""One API answer as it arrives: its text cut at a stop string, and its counts and times from the RoundEvents.

No web framework here: ui/api/routes.py feeds events in and sends out what these give, so the text, usage and timings
are testable with made-up events.
"""

from __future__ import annotations

from dataclasses import dataclass

FINISH = {"eos": "stop", "stopped": "stop", "length": "length", "context": "length"}  # engine -> OpenAI


@dataclass
class StopCut:
    """Text given out up to the first stop string. Text that could still become a stop string is held back
    until the next piece says whether it does (llama-server holds back partial stop words the same way)."""

    stops: list[str]
    held: str = ""  # text not given out yet
    hit: bool = False  # a stop string was found: nothing more is given out

    def feed(self, text: str) -> str:
        """What of `text` (after what was held) may go out now."""
        if self.hit:
            return ""
        self.held += text
        cuts = [i for i in (self.held.find(s) for s in self.stops) if i >= 0]
        if cuts:
            self.hit = True
            out, self.held = self.held[: min(cuts)], ""
            return out
        keep = max((n for s in self.stops for n in range(1, len(s)) if self.held.endswith(s[:n])), default=0)
        out = self.held[: len(self.held) - keep]
        self.held = self.held[len(out):]
        return out

    def flush(self) -> str:
        """The held text at the answer's end: it never became a stop string."""
        out, self.held = ("" if self.hit else self.held), ""
        return out


@dataclass
class Tally:
    """Counts and times of one answer, llama-server's `timings` among them."""

    prompt_n: int  # the prompt's tokens (usage.prompt_tokens)
    completion_n: int = 0  # tokens the engine gave this answer (those after a stop string's round included)
    draft_n: int = 0  # draft tokens proposed in its rounds
    draft_n_accepted: int = 0  # of those, kept
    prompt_ms: float = 0.0  # the prefill's forwards and its first token
    prompt_rows: int = 0  # prompt tokens the prefill forwarded (a reused prefix is not)
    t_first: float | None = None  # the prefill round's end (engine clock, time.perf_counter)
    t_last: float | None = None  # the latest round's end
    stop_reason: str | None = None  # the engine's: eos | length | context | stopped

    def add(self, ev) -> None:
        """Take one RoundEvent."""
        self.completion_n += len(ev.emitted)
        if ev.drafted:
            self.draft_n += len(ev.drafted)
            self.draft_n_accepted += ev.n_accepted
        if ev.kind == "prefill":
            self.prompt_ms, self.prompt_rows, self.t_first = ev.t_verify_ms, ev.batch_rows, ev.t_end
        if ev.t_end > 0:
            self.t_last = ev.t_end
        if ev.done:
            self.stop_reason = ev.stop_reason

    def finish_reason(self, stopped_by_string: bool) -> str:
        return "stop" if stopped_by_string else FINISH.get(self.stop_reason or "", "stop")

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_n, "completion_tokens": self.completion_n,
                "total_tokens": self.prompt_n + self.completion_n}

    def timings(self) -> dict:
        """llama-server's timings: prompt_n the prompt tokens forwarded (cache_n: those of a prefix reused from
        the cache), then the answer from its first token to its last."""
        predicted_ms = (self.t_last - self.t_first) * 1e3 if self.t_first is not None and self.t_last else 0.0
        rows, ms, n = self.prompt_rows, self.prompt_ms, self.completion_n
        return {"cache_n": max(0, self.prompt_n - rows) if rows else 0,
                "prompt_n": rows, "prompt_ms": ms, "prompt_per_token_ms": ms / rows if rows else 0.0,
                "prompt_per_second": rows * 1e3 / ms if ms > 0 else 0.0,
                "predicted_n": n, "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / n if n else 0.0,
                "predicted_per_second": n * 1e3 / predicted_ms if predicted_ms > 0 else 0.0,
                "draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}
