"""Per-drafter counters, printed the way llama.cpp's common_speculative_print_stats prints them."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class DrafterStats:
    name: str
    n_call_begin: int = 0  # begin() calls: one per new prompt of a sequence
    n_call_draft: int = 0  # draft() calls that had this drafter's turn for at least one sequence
    n_call_accept: int = 0  # accept() calls credited to this drafter (it won the round)
    n_gen_drafts: int = 0  # rounds in which it produced a non-empty draft
    n_acc_drafts: int = 0  # rounds in which at least one of its tokens was accepted
    n_gen_tokens: int = 0  # draft tokens it proposed
    n_acc_tokens: int = 0  # of those, accepted by the target
    n_acc_tokens_per_pos: list[int] = field(default_factory=list)  # [i] = rounds whose position i was accepted
    n_gen_tokens_per_pos: list[int] = field(default_factory=list)  # [i] = rounds whose draft reached position i
    t_begin_us: float = 0.0  # time spent in begin()
    t_draft_us: float = 0.0  # time spent in draft()
    t_accept_us: float = 0.0  # time spent in accept()

    def on_draft(self, n_tokens: int) -> None:
        if n_tokens <= 0:
            return
        self.n_gen_drafts += 1
        self.n_gen_tokens += n_tokens
        if len(self.n_gen_tokens_per_pos) < n_tokens:
            self.n_gen_tokens_per_pos.extend([0] * (n_tokens - len(self.n_gen_tokens_per_pos)))
        for i in range(n_tokens):
            self.n_gen_tokens_per_pos[i] += 1

    def on_accept(self, n_accepted: int) -> None:
        self.n_call_accept += 1
        if len(self.n_acc_tokens_per_pos) < n_accepted:
            self.n_acc_tokens_per_pos.extend([0] * (n_accepted - len(self.n_acc_tokens_per_pos)))
        for i in range(n_accepted):
            self.n_acc_tokens_per_pos[i] += 1
        if n_accepted > 0:
            self.n_acc_drafts += 1
            self.n_acc_tokens += n_accepted

    @property
    def mean_acc_len(self) -> float:
        """Tokens emitted per verified round: 1 (the target's own) + accepted draft tokens."""
        if self.n_call_accept == 0:
            return 0.0
        return 1.0 + self.n_acc_tokens / self.n_call_accept

    @property
    def acc_rate(self) -> float:
        return self.n_acc_tokens / self.n_gen_tokens if self.n_gen_tokens else 0.0

    def acc_rate_pos(self) -> list[float]:
        """llama.cpp's #acc rate/pos: accepted at position i over rounds credited to this drafter."""
        if self.n_call_accept == 0:
            return []
        n = max(len(self.n_acc_tokens_per_pos), len(self.n_gen_tokens_per_pos))
        acc = self.n_acc_tokens_per_pos + [0] * (n - len(self.n_acc_tokens_per_pos))
        return [a / self.n_call_accept for a in acc]

    def acc_rate_pos_conditional(self) -> list[float]:
        """Accepted at position i over drafts that reached position i (what a chart of 'how far it sees' wants)."""
        out = []
        for i, n_gen in enumerate(self.n_gen_tokens_per_pos):
            n_acc = self.n_acc_tokens_per_pos[i] if i < len(self.n_acc_tokens_per_pos) else 0
            out.append(n_acc / n_gen if n_gen else 0.0)
        return out

    def format(self) -> str:
        line = (
            f"statistics {self.name:>16}: #calls(b,g,a) = {self.n_call_begin:4d} {self.n_call_draft:6d} "
            f"{self.n_call_accept:6d}, #gen drafts = {self.n_gen_drafts:6d}, #acc drafts = {self.n_acc_drafts:5d}, "
            f"#gen tokens = {self.n_gen_tokens:6d}, #acc tokens = {self.n_acc_tokens:5d}"
        )
        if self.n_call_accept > 0:
            rates = ", ".join(f"{r:.3f}" for r in self.acc_rate_pos())
            line += f", #mean acc len = {self.mean_acc_len:.3f}, #acc rate/pos = ({rates})"
        line += (
            f", dur(b,g,a) = {self.t_begin_us / 1e3:.3f}, {self.t_draft_us / 1e3:.3f}, "
            f"{self.t_accept_us / 1e3:.3f} ms"
        )
        return line


@contextmanager
def timed(attr: str, total: DrafterStats, *per_seq: DrafterStats, share: float = 1.0):
    """Add the wall time of the block, in microseconds, to `total.<attr>` and `share` of it to each per-sequence
    `<attr>`, so a sequence's counters show the same durations as the counters over all sequences."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        us = (time.perf_counter() - t0) * 1e6
        setattr(total, attr, getattr(total, attr) + us)
        for stats in per_seq:
            setattr(stats, attr, getattr(stats, attr) + us * share)


def stats_from_events(events) -> dict[str, DrafterStats]:
    """Per-drafter counters of the verified drafts among `events` (calls and durations stay zero)."""
    out: dict[str, DrafterStats] = {}
    for ev in events:
        if ev.kind != "spec" or not ev.drafter or not ev.drafted:
            continue
        s = out.setdefault(ev.drafter, DrafterStats(ev.drafter))
        s.on_draft(len(ev.drafted))
        s.on_accept(ev.n_accepted)
    return out
