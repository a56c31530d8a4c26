"""Adaptive draft length: draft only as far as it pays on this machine.

Verifying k tokens is not free, and what it costs depends on the machine and the model: the engine times
forwards of 1 to 16 rows at start (`Engine.calibrate`) and this policy reads that curve. With a_i the chance
that draft position i is accepted given i-1 was, a round with k draft tokens emits
E(k) = 1 + sum_{j<=k} prod_{i<=j} a_i tokens and costs c(k+1) single-token forwards, so the policy keeps the k
that maximises E(k) / c(k+1), and drafts nothing when no k beats plain decoding (E = 1, c = 1). The a_i are
exponential moving averages per (sequence, drafter), so one prompt that copies well does not make another
prompt pay. Acceptance is conditional per position: once the first draft token is right, a copy tends to go
on (n-gram drafts are right or wrong in runs), so unseen deeper positions start from a higher prior than the
first; without that the policy never verifies deep enough to learn that deep drafts pay. A suppressed drafter
still gets a 1-token probe every `probe_every` rounds so it can recover.
This is the speedup formula (1 - a^(k+1)) / ((1 - a)(c + 1)), for a constant a and a round costing c + 1
forwards, turned into a per-round decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.cost.curve import CostModel
from engine.budget.accounts import Accounts


@dataclass
class PolicyParams:
    prior: float = 0.6  # a_1 assumed before any evidence
    prior_deep: float = 0.85  # a_i, i > 1, assumed before evidence: a draft that starts right tends to go on
    decay: float = 0.6  # weight of the old estimate in each update
    probe_every: int = 4  # a suppressed drafter gets a 1-token probe this often


class DraftLengthPolicy:
    def __init__(self, cost: CostModel, params: PolicyParams | None = None, records: Accounts | None = None):
        self.cost = cost
        self.params = params or PolicyParams()
        # seq -> its account (engine/budget/accounts.py): a_i per position and rounds in a row with k = 0, per drafter
        self.records = records if records is not None else Accounts()

    def position_rates(self, seq: int, drafter: str, k: int) -> list[float]:
        """a_i for draft positions 1..k (at least k entries) of this drafter on this sequence, priors where unseen."""
        rates = self.records.of(seq).rates.setdefault(drafter, [])
        while len(rates) < k:
            # deeper positions start from the deep prior, never below what the last known position shows
            rates.append(self.params.prior if not rates else max(rates[-1], self.params.prior_deep))
        return rates

    def rates_view(self, seq: int, drafter: str, k: int) -> list[float]:
        """position_rates without keeping the priors it adds (the allowance is read before the round ends)."""
        rates = list(self.records.of(seq).rates.get(drafter, []))
        while len(rates) < k:
            rates.append(self.params.prior if not rates else max(rates[-1], self.params.prior_deep))
        return rates

    def expected_tokens(self, rates: list[float], k: int) -> float:
        total, run = 1.0, 1.0
        for a in rates[:k]:
            run *= a
            total += run
        return total

    def best_k(self, seq: int, drafter: str, k_offered: int) -> int:
        """The k <= k_offered that maximises E[tokens](k) / c(k + 1); 0 if no draft beats a plain step."""
        return self.best_ks(seq, drafter, k_offered)[k_offered] if k_offered > 0 else 0

    def best_ks(self, seq: int, drafter: str, n_max: int) -> list[int]:
        """best_k for every k_offered in 0..n_max, in one pass: the k are scanned in order, so the best up to
        k_offered is the scan's best at k_offered. Changes nothing."""
        rates = self.rates_view(seq, drafter, n_max)
        out, best_k, best_v, total, run = [0], 0, 1.0, 1.0, 1.0
        for k in range(1, n_max + 1):
            run *= rates[k - 1]
            total += run
            v = total / self.cost.c(k + 1)
            if v > best_v * 1.001:
                best_k, best_v = k, v
            out.append(best_k)
        return out

    def cuts(self, seq: int, drafter: str, n_max: int) -> tuple[int, ...]:
        """What `choose` answers for every k_offered in 0..n_max this round, changing nothing."""
        probe = (self.records.of(seq).n_suppressed.get(drafter, 0) + 1) % self.params.probe_every == 0
        return tuple(k if k > 0 else int(probe and i > 0) for i, k in enumerate(self.best_ks(seq, drafter, n_max)))

    def choose(self, seq: int, drafter: str, k_offered: int) -> int:
        """How many of the k_offered draft tokens to verify (0 = none; a 1-token probe now and then)."""
        if k_offered <= 0:
            return 0
        self.position_rates(seq, drafter, k_offered)
        best_k = self.best_k(seq, drafter, k_offered)
        n_suppressed = self.records.of(seq).n_suppressed
        if best_k == 0:
            n_suppressed[drafter] = n_suppressed.get(drafter, 0) + 1
            if n_suppressed[drafter] % self.params.probe_every == 0:
                return 1
            return 0
        n_suppressed[drafter] = 0
        return best_k

    def update(self, seq: int, drafter: str, k: int, n_accepted: int) -> None:
        """A k-token draft had its first n_accepted kept: positions up to n_accepted+1 were judged."""
        rates = self.position_rates(seq, drafter, k)
        d = self.params.decay
        for i in range(min(k, n_accepted + 1)):
            hit = 1.0 if i < n_accepted else 0.0
            rates[i] = d * rates[i] + (1 - d) * hit
