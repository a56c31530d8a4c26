"""One record per sequence: what the relay (chain.py) keeps about one sequence between its calls.

The drafters' own caches (an n-gram index, a draft model's cells) stay with each drafter and go with its
`seq_rm`; what the draft budget keeps about a sequence is the budget's (engine/budget/accounts.py). A record is
made when the relay first meets the sequence (its `begin`, or a test that drives the relay on its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class SeqRecord:
    types: list[str] = field(default_factory=list)  # its drafter types, in relay order
    impl_last: str | None = None  # the drafter whose draft is being verified (None: nobody drafted)
    relay: list["RelayStep"] = field(default_factory=list)  # this round's drafters asked, in order (`offer`)
    relay_request: Any = None  # the request `relay` belongs to: a new request is a new round's relay

    def forget_drafting(self) -> None:
        """The sequence holds another text: its drafters are chosen again at its next begin."""
        self.types, self.impl_last, self.relay, self.relay_request = [], None, [], None


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
    """seq -> its record (a SeqRecord: the relay's; a subclass names another kind, as the budget's accounts)."""

    kind: type = SeqRecord  # what one sequence's entry is

    def of(self, seq: int):
        """The sequence's record, made on first use."""
        record = self.get(seq)
        if record is None:
            record = self[seq] = self.kind()
        return record

    def release(self, seq: int) -> None:
        """The sequence is gone: what was kept about it goes with its record."""
        self.pop(seq, None)
