"""Whether a model drafter's drafting pays for a slot in tree mode, where every drafter of the slot drafts.

In llama.cpp's relay a model drafter drafts only when the n-gram drafters before it found nothing. In tree mode
(engine/drafters/chain.py) every drafter proposes every round, so the draft head spends its drafting time even
where the n-grams already found the text the target will write. The round's budget (engine/budget.py) chooses
among the nodes once they exist; it cannot give back the time it took to draft them. This gate decides before
drafting, for each (slot, model drafter), from what drafting gave that slot in earlier rounds:

- gain g: tokens of the slot's kept path that only this drafter had proposed (the path's length minus the
  longest prefix another drafter of the same tree also proposed), per round it drafted;
- cost t: its drafting time charged to the slot (one batched call's time shared by the slots in it);
- the batch's time per emitted token, T / N, over recent rounds.

Drafting for the slot adds g tokens and t seconds to a round of N tokens in T seconds; it raises the batch's
tokens per second when (N + g) / (T + t) > N / T, that is when g * T / N > t. While that fails the drafter skips
the slot, drafting anyway every `probe_every` rounds so the estimates follow the text (an open answer that
starts to copy, or the reverse); the probes of all slots fall on the same rounds, so they share one batched
call. The n-gram drafters cost microseconds and are not gated.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GateParams:
    decay: float = 0.8  # weight of the old estimate in each update
    prior_gain: float = 1.0  # tokens per round assumed before any evidence: one unlucky first round must not
    # shut a drafter out for probe_every rounds
    probe_every: int = 8  # a drafter that does not pay for a slot still drafts for it this often


@dataclass
class _Estimate:
    gain: float | None = None  # tokens per round only this drafter put on the slot's kept path
    cost: float | None = None  # seconds of drafting per round charged to the slot
    skipped: int = 0  # rounds in a row it did not draft for the slot
    pending: float | None = None  # this round's drafting time, until the round's gain is known


@dataclass
class DrafterGate:
    params: GateParams = field(default_factory=GateParams)
    estimates: dict[tuple[int, str], _Estimate] = field(default_factory=dict)  # (seq, drafter) ->
    seconds_per_token: float | None = None  # the batch's round time over the tokens the round emitted
    n_rounds: int = 0  # rounds seen; probes fall on the same rounds for every slot, so they share one call

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else self.params.decay * old + (1 - self.params.decay) * new

    def pays(self, seq: int, name: str) -> bool:
        """Whether `name` drafts for `seq` this round."""
        e = self.estimates.setdefault((seq, name), _Estimate())
        if e.pending is not None:  # drafted last round and no kept path came back: nothing was gained
            self.note_gain(seq, name, 0)
        if e.gain is None or e.cost is None or self.seconds_per_token is None:
            return True
        if e.gain * self.seconds_per_token > e.cost:
            e.skipped = 0
            return True
        e.skipped += 1
        # a model drafter drafts for all its slots in one batched call that costs about the same for one slot
        # as for four: slots probing on rounds of their own would each pay a whole call
        return self.n_rounds % self.params.probe_every == 0

    def note_cost(self, seq: int, name: str, seconds: float) -> None:
        self.estimates.setdefault((seq, name), _Estimate()).pending = seconds

    def note_gain(self, seq: int, name: str, tokens: int) -> None:
        e = self.estimates.get((seq, name))
        if e is None or e.pending is None:
            return
        e.cost = self._ema(e.cost, e.pending)
        e.gain = self._ema(self.params.prior_gain if e.gain is None else e.gain, float(tokens))
        e.pending = None

    def note_round(self, seconds: float, n_emitted: int) -> None:
        self.n_rounds += 1
        if n_emitted > 0:
            self.seconds_per_token = self._ema(self.seconds_per_token, seconds / n_emitted)

    def why(self, seq: int, name: str) -> str:
        e = self.estimates.get((seq, name))
        if e is None or e.gain is None or e.cost is None or self.seconds_per_token is None:
            return f"{name}: no estimate yet"
        return (f"{name}: {e.gain:.2f} tokens only it found x {self.seconds_per_token * 1e3:.1f} ms a token "
                f"vs {e.cost * 1e3:.1f} ms drafting")

    def forget(self, seq: int) -> None:
        for key in [k for k in self.estimates if k[0] == seq]:
            del self.estimates[key]


def exclusive_gains(credit: dict[str, tuple[int, int]], n_kept: int) -> dict[str, int]:
    """drafter -> kept-path tokens no other drafter of the tree had proposed. credit: DraftTree.credit's
    (depth, kept prefix it proposed) per drafter."""
    out = {}
    for name in credit:
        others = max((m for other, (_, m) in credit.items() if other != name), default=0)
        out[name] = max(0, min(credit[name][1], n_kept) - others)
    return out
