"""One record per sequence: what the relay (chain.py) keeps about one sequence between its calls.

The drafters' own caches (an n-gram index, a draft model's cells) stay with each drafter and go with its
`seq_rm`; what the draft budget keeps about a sequence is the budget's (engine/budget/accounts.py). A record is
made when the relay first meets the sequence (its `begin`, or a test that drives the relay on its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SeqRecord:
    types: list[str] = field(default_factory=list)  # its drafter types, in relay order
    impl_last: str | None = None  # the drafter whose draft is being verified (None: nobody drafted)

    def forget_drafting(self) -> None:
        """The sequence holds another text: its drafters are chosen again at its next begin."""
        self.types, self.impl_last = [], None


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
