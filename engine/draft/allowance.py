"""What the relay may draft for one request this round, and what it did: the seam between the relay and the
draft budget.

The budget (engine/budget/draft_budget.py) answers every question the relay would ask it before drafting
starts, as data: which drafters may draft, how far, how a chain's nodes score (`Allowance`, frozen). The relay
(chain.py) reads only that, and writes down what each drafter cost and proposed (`DraftReport`); after drafting
the budget reads the reports and updates its estimates. So the relay never calls the budget, and a request
drafted without a budget (`unlimited`) drafts what every drafter offers, as llama.cpp's relay does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class DrafterAllowance:
    """One drafter's part of a request's allowance."""

    n_max: int  # the longest draft it is asked for: a network that drafts token by token is cut to what pays
    # cuts[k]: how many of an offered k draft tokens are verified (the length policy; 0 = none), k = 0..n_max
    cuts: tuple[int, ...] = ()
    # tree mode: the chance that each position of a chain from it is reached (its acceptance rates multiplied)
    scores: tuple[float, ...] = ()
    drafts: bool = True  # tree mode: whether it drafts where the drafters before it guess little
    drafts_covered: bool = True  # ... and where they already guess the next token (`Allowance.covered_at`)

    def cut(self, k: int) -> int:
        """The verified length of an offered k-token draft (k itself where the table stops short)."""
        return self.cuts[k] if k < len(self.cuts) else k

    def path_scores(self, k: int) -> list[float]:
        """The reach of a k-token chain's positions (1.0 past what the table holds)."""
        return [self.scores[i] if i < len(self.scores) else 1.0 for i in range(k)]


@dataclass(frozen=True)
class Allowance:
    """What one request may draft this round, filled once by the budget before drafting (read-only after)."""

    drafters: Mapping[str, DrafterAllowance] = field(default_factory=dict)  # name -> its part; absent: may not draft
    # a model drafter counts as covered when the first tokens of the drafters before it reach this chance
    covered_at: float = 1.0
    # tree mode: the least score a model drafter's node needs (the last round's threshold of the budget)
    tree_min_score: float = 0.0
    model_tree_max: int = 0  # tree mode: at most this many nodes from a model drafter (0: tree_max)
    probe: bool = False  # tree mode: a resting slot's probe round: the n-gram drafters look, networks do not
    token_seconds: float = 0.0  # tree mode: the batch's time per emitted token (0: not known yet)

    def of(self, name: str) -> DrafterAllowance | None:
        return self.drafters.get(name)

    def drafts(self, name: str, p_covered: float = 0.0) -> bool:
        """Whether `name` drafts, given the chance that the drafters before it guessed the next token."""
        part = self.drafters.get(name)
        if part is None:
            return False
        return part.drafts_covered if p_covered >= self.covered_at else part.drafts


def unlimited(types: list[str], n_max: int) -> Allowance:
    """Every drafter drafts what it offers, up to n_max (no budget: the relay of llama.cpp)."""
    return Allowance(drafters={name: DrafterAllowance(n_max=n_max) for name in types})


@dataclass
class DraftReport:
    """What the relay did for one request this round, written by the relay alone and read by the budget after
    drafting: whom it asked, what each cost and offered, and what it read of the allowance."""

    asked: list[str] = field(default_factory=list)  # drafters that drafted for it, in relay order
    seconds: dict[str, float] = field(default_factory=dict)  # drafter -> its share of its drafting call's time
    # tree mode: model drafter -> the chance the drafters before it guessed the next token, when it was weighed
    p_covered: dict[str, float] = field(default_factory=dict)
    offered: dict[str, int] = field(default_factory=dict)  # drafter -> the k its draft offered to the cut
    scored: dict[str, int] = field(default_factory=dict)  # drafter -> the longest chain whose scores it read
    retokenized: Any = None  # a drafter of another vocabulary's draft in both tokenisations (for the event)
