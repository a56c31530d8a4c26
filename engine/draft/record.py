"""One record per sequence: what the relay, the gate, the length policy and the budget keep about one sequence.

Each part of the engine that remembers something about a sequence keeps it here rather than in a mapping of
its own, so a released sequence leaves nothing behind once its record goes (`SeqRecords.release`). The drafters'
own caches (an n-gram index, a draft model's cells) stay with each drafter and go with its `seq_rm`. A record is
made when something first notes the sequence (the engine's start, or a part used on its own, as the tests do).

Two parts of a record end before the record does: a sequence placed anew (engine/serve/placement.py) forgets
what its drafters taught the relay, the gate and the length policy (`forget_drafting`), and a new answer in the
slot is measured against plain decoding from its start (`begin_answer`); what its drafters' scores proved to the
budget (the correction) stays until the sequence is released: the next turn of a chat is much like the last.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SeqRecord:
    # the relay (engine/draft/chain.py)
    types: list[str] = field(default_factory=list)  # its drafter types, in relay order
    adaptive: bool = True  # whether the length policy cuts its drafts
    impl_last: str | None = None  # the drafter whose draft is being verified (None: nobody drafted)
    k_last: int | None = None  # the length of that draft
    skipped: list[str] = field(default_factory=list)  # this round's gate decisions against drafting, and why
    retokenized: Any = None  # this round's draft from a drafter of another vocabulary, in both tokenisations
    relay: list["RelayStep"] = field(default_factory=list)  # this round's drafters asked, in order (`offer`)
    relay_request: Any = None  # the request `relay` belongs to: a new request is a new round's relay
    # the gate (engine/budget/gate.py)
    estimates: dict[tuple[str, bool], Any] = field(default_factory=dict)  # (drafter, covered) -> its estimates
    covered: dict[str, bool] = field(default_factory=dict)  # drafter -> the drafters before it guess this round
    # the length policy (engine/budget/policy.py)
    rates: dict[str, list[float]] = field(default_factory=dict)  # drafter -> a_i per draft position
    n_suppressed: dict[str, int] = field(default_factory=dict)  # drafter -> rounds in a row it was cut to k = 0
    # the budget (engine/budget/tree_budget.py)
    refused: int = 0  # rounds in a row its nodes were all refused
    interval: int | None = None  # rounds between its probes while it rests (None: the budget's probe_every)
    # tokens its answer got beyond what plain decoding would have given it in the same time: each round adds its
    # emitted tokens minus c(rows) / c(n_base), the forward's cost in plain forwards (None: no round settled)
    balance: float | None = None
    # nodes of model drafters (the draft head) the last round kept of its tree: beside other slots it is offered
    # one more (DraftRequest.model_tree_max), not a whole tree the batch waits for step by step
    model_nodes: int = 0
    # the budget's score correction (engine/budget/tree_budget.py, ScoreCorrection): per drafter, decayed counts
    reached: dict[str, float] = field(default_factory=dict)  # drafter -> its nodes the target's walk reached
    predicted: dict[str, float] = field(default_factory=dict)  # drafter -> the sum of their raw scores

    def forget_drafting(self) -> None:
        """The sequence holds another text: what its drafters taught the relay, gate and length policy is void."""
        self.types, self.adaptive, self.impl_last, self.k_last = [], True, None, None
        self.skipped, self.retokenized, self.relay, self.relay_request = [], None, [], None
        self.estimates, self.covered, self.rates, self.n_suppressed = {}, {}, {}, {}

    def begin_answer(self) -> None:
        """A new generation in the slot: its balance, refusals and rests start over."""
        self.refused, self.interval, self.balance, self.model_nodes = 0, None, None, 0


@dataclass(frozen=True)
class RelayStep:
    """One drafter's turn in a round's relay, as the chain saw its result before cutting it."""
    name: str
    offered: int  # tokens (a chain) or nodes (a tree) the drafter returned
    allowed: int  # of those, what n_max and the grammar let through (a tree: every node, the budget cuts later)
    n_max: int
    n_min: int
    limit: str  # what cut `offered` to `allowed`: "" | "n_max" | "grammar"
    source: str  # "model" (a network: stops under p_min) | "ngram" (a lookup) | "grammar" | "other"


def offer(record: SeqRecord, name: str, r, model: bool) -> None:
    """Note drafter `name`'s result for request `r` (engine/draft/base.py DraftRequest) in the round's relay,
    before the chain cuts or merges it."""
    if record.relay_request is not r:
        record.relay, record.relay_request = [], r
    source = "model" if model else "ngram" if name.startswith("ngram") else name if name == "grammar" else "other"
    if r.tree_max > 0:
        n = (len(r.result_tree) if r.result_tree is not None
             else len(r.result) + sum(len(tokens) for tokens, _ in r.result_alts))
        record.relay.append(RelayStep(name, n, n, r.n_max, r.n_min, "", source))
        return
    offered = len(r.result)
    allowed = min(offered, r.n_max)
    limit = "n_max" if allowed < offered else ""
    if r.grammar is not None and allowed > 0:
        valid = r.grammar.valid_prefix(r.result[:allowed])  # the matcher's state does not change
        limit, allowed = ("grammar", valid) if valid < allowed else (limit, allowed)
    record.relay.append(RelayStep(name, offered, allowed, r.n_max, r.n_min, limit, source))


def take_relay(record: SeqRecord, r, verified: dict[str, int], tree: bool) -> list[tuple[str, int, int, str]]:
    """The relay of request `r`'s round for its event, once (the record forgets it): each drafter asked, in
    order, as (name, offered, verified, why not more). `verified`: drafter -> its tokens (a chain) or nodes (a
    tree) in the forward."""
    steps = record.relay if record.relay_request is r else []
    record.relay, record.relay_request = [], None
    return [(s.name, s.offered, verified.get(s.name, 0), why_short(s, verified.get(s.name, 0), tree)) for s in steps]


def why_short(s: RelayStep, n: int, tree: bool) -> str:
    """Why drafter step `s` put only `n` of its offer into the forward ("" when all of it went)."""
    ended = {"model": "stopped under p_min", "ngram": "the match ended", "grammar": "the forced run ended"}
    if s.offered == 0:
        return {"model": "nothing above p_min", "ngram": "no match", "grammar": "nothing forced"}.get(
            s.source, "nothing to offer")
    if tree:
        return "" if n >= s.offered else "the rest were in the tree already, or the node limit or budget left them out"
    if s.allowed < max(s.n_min, 1):
        return "the grammar forbids its first token" if s.limit == "grammar" and s.allowed == 0 else "under n_min"
    if n < s.allowed:
        return "the length policy cut it"
    if n < s.offered:
        return "cut at n_max" if s.limit == "n_max" else "cut where the grammar forbids a token"
    return ended.get(s.source, "") if s.offered < s.n_max else ""


class SeqRecords(dict):
    """seq -> its SeqRecord; shared by the relay, the gate, the length policy and the budget."""

    def of(self, seq: int) -> SeqRecord:
        """The sequence's record, made on first use."""
        record = self.get(seq)
        if record is None:
            record = self[seq] = SeqRecord()
        return record

    def release(self, seq: int) -> None:
        """The sequence is gone: everything the engine kept about it goes with its record."""
        self.pop(seq, None)
