"""What a server's own numbers say about its speculation: does it pay, where acceptance falls off, and the n_max
its per-position rates suggest.

The server's tokens/s with speculation and without (the same prompt asked plainly) give the speedup and, with the
mean acceptance length L, the round's cost: a drafted round takes L * plain_tps / spec_tps plain steps, i.e.
c = L * plain_tps / spec_tps - 1 in the formula (1 - a^(k+1)) / ((1 - a)(c + 1)). Spread evenly over the mean
draft length k, each draft position costs c / k of a step, so n_max = m is predicted to give
(1 + r_0 + ... + r_(m-1)) / (1 + m c / k), r_i the share of drafted rounds that kept position i. Positions the
server never drafted are not predicted; a draft cut short (p_min, an n-gram that ran out) lowers the later
r_i as a rejection would, so the suggestion is for the drafts as the server makes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.remote.counters import SpecDelta

FALL_OFF = 0.5  # a position kept by fewer than half the drafted rounds: acceptance has fallen off there
PAYS = 1.02  # below this a speedup is within the noise of one answer's timing (as ui/advisor.py's)


@dataclass(frozen=True)
class RemoteReading:
    """The server's speculation judged from its own figures."""

    speedup: float | None  # tokens/s with speculation over without; None: no plain figure
    mean_acceptance_length: float | None  # 1 + accepted / drafts
    mean_draft_length: float | None  # draft tokens / drafts: the k the server drafted on average
    round_cost: float | None  # c: a drafted round's time in plain steps, minus one (None: no plain figure)
    falls_off_at: int | None  # first draft position (1-based) kept by fewer than FALL_OFF of drafted rounds
    predicted: tuple[float, ...]  # predicted speedup at n_max = 1, 2, ... up to the positions measured
    suggested_n_max: int | None  # the n_max of the best prediction; None: nothing to predict from

    @property
    def pays(self) -> bool | None:
        return None if self.speedup is None else self.speedup >= PAYS

    def lines(self, scope: str = "this prompt") -> list[str]:
        """The reading in sentences, for the page and the bench; `scope` names what was measured."""
        out = []
        if self.speedup is not None:
            verdict = "pays" if self.pays else "does not pay"
            out.append(f"speculation {verdict} on {scope}: {self.speedup:.2f}x the plain tokens/s of the same server"
                       + (f"; a drafted round costs {self.round_cost + 1:.2f} plain steps"
                          if self.round_cost is not None else ""))
        if self.falls_off_at is not None:
            out.append(f"acceptance falls below {FALL_OFF:.0%} of drafted rounds at draft position "
                       f"{self.falls_off_at}")
        if self.suggested_n_max is not None and self.predicted:
            best = self.predicted[self.suggested_n_max - 1]
            out.append(f"n_max {self.suggested_n_max} is predicted best ({best:.2f}x), the draft's positions each "
                       f"costing {self.round_cost / self.mean_draft_length:.2f} of a step")
        return out


def read_remote(spec_tps: float | None, plain_tps: float | None, spec: SpecDelta | None) -> RemoteReading:
    """The reading of one answer's (or one run's) figures; any of them may be missing."""
    rates = spec.per_position if spec is not None else ()
    length = spec.mean_acceptance_length if spec is not None else None
    k = spec.draft_tokens / spec.drafts if spec is not None and spec.drafts else None
    speedup = spec_tps / plain_tps if spec_tps and plain_tps else None
    cost = max(0.0, length / speedup - 1.0) if speedup and length else None
    falls = next((i + 1 for i, r in enumerate(rates) if r < FALL_OFF), None)
    predicted: tuple[float, ...] = ()
    if cost is not None and k:
        predicted = tuple((1.0 + sum(rates[:m])) / (1.0 + m * cost / k) for m in range(1, len(rates) + 1))
    best = max(range(len(predicted)), key=predicted.__getitem__) + 1 if predicted else None
    return RemoteReading(speedup=speedup, mean_acceptance_length=length, mean_draft_length=k, round_cost=cost,
                         falls_off_at=falls, predicted=predicted, suggested_n_max=best)
