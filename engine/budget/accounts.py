"""One account per sequence: what the draft budget (the gate, the length policy, the slots' shared budget)
keeps about one sequence.

Each part of the budget that remembers something about a sequence keeps it here rather than in a mapping of
its own, so a released sequence leaves nothing behind once its account goes (`Accounts.release`). An account
is made when something first notes the sequence (the engine's begin, or a part used on its own, as the tests
do). What the relay keeps of a sequence is the relay's (engine/draft/record.py).

Two parts of an account end before the account does: a sequence placed anew forgets what its drafters taught
the gate and the length policy (`forget_drafting`), and a new answer in the slot is measured against plain
decoding from its start (`begin_answer`); what its drafters' scores proved to the budget (the correction)
stays until the sequence is released: the next turn of a chat is much like the last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.draft.record import SeqRecords


@dataclass
class SeqAccount:
    # what the sequence drafts with (given at its begin)
    types: list[str] = field(default_factory=list)  # its drafter types, in relay order
    adaptive: bool = True  # whether the length policy and the gate cut its drafts (SpecParams.adaptive)
    models: list[str] = field(default_factory=list)  # those of its drafters that run a network (needs_model)
    skipped: list[str] = field(default_factory=list)  # this round's gate decisions against drafting, and why
    # the gate (engine/budget/gate.py)
    estimates: dict[tuple[str, bool], Any] = field(default_factory=dict)  # (drafter, covered) -> its estimates
    covered: dict[str, bool] = field(default_factory=dict)  # drafter -> the drafters before it guess this round
    # the length policy (engine/budget/policy.py)
    rates: dict[str, list[float]] = field(default_factory=dict)  # drafter -> a_i per draft position
    n_suppressed: dict[str, int] = field(default_factory=dict)  # drafter -> rounds in a row it was cut to k = 0
    # the slots' budget over their trees (engine/budget/tree_budget.py)
    refused: int = 0  # rounds in a row its nodes were all refused
    interval: int | None = None  # rounds between its probes while it rests (None: the budget's probe_every)
    # tokens its answer got beyond what plain decoding would have given it in the same time: each round adds its
    # emitted tokens minus c(rows) / c(n_base), the forward's cost in plain forwards (None: no round settled)
    balance: float | None = None
    # nodes of model drafters (the draft head) the last round kept of its tree: beside other slots it is offered
    # one more (Allowance.model_tree_max), not a whole tree the batch waits for step by step
    model_nodes: int = 0
    # the budget's score correction (engine/budget/tree_budget.py, ScoreCorrection): per drafter, decayed counts
    reached: dict[str, float] = field(default_factory=dict)  # drafter -> its nodes the target's walk reached
    predicted: dict[str, float] = field(default_factory=dict)  # drafter -> the sum of their raw scores

    def forget_drafting(self) -> None:
        """The sequence holds another text: what its drafters taught the gate and length policy is void."""
        self.types, self.adaptive, self.models, self.skipped = [], True, [], []
        self.estimates, self.covered, self.rates, self.n_suppressed = {}, {}, {}, {}

    def begin_answer(self) -> None:
        """A new generation in the slot: its balance, refusals and rests start over."""
        self.refused, self.interval, self.balance, self.model_nodes = 0, None, None, 0


class Accounts(SeqRecords):
    """seq -> its SeqAccount, made on first use (`of`) and dropped on release; shared by the gate, the length
    policy and the slots' trees."""

    kind = SeqAccount
