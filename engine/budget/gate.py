"""Whether a model drafter's drafting pays for a slot in tree mode, where every drafter of the slot drafts.

In llama.cpp's relay a model drafter drafts only when the n-gram drafters before it found nothing. In tree mode
(engine/draft/chain.py) every drafter proposes every round, so the draft head spends its drafting time even
where the n-grams already found the text the target will write. The round's budget (engine/budget/tree_budget.py)
chooses among the nodes once they exist; it cannot give back the time it took to draft them. This gate decides before
drafting, for each (slot, model drafter), from what drafting gave that slot in earlier rounds:

- gain g: tokens of the slot's kept path that only this drafter had proposed (the path's length minus the
  longest prefix another drafter of the same tree also proposed), per round it drafted. The n-gram drafters,
  first in the relay, are credited all the kept tokens they proposed (DraftBudget.settle): a model
  drafter's gain is then what it adds beyond them, and where both read a repeated passage the n-grams stay;
- cost t: its drafting time charged to the slot (one batched call's time shared by the slots in it), plus the
  forward time of the rows its nodes took (nodes it was first to propose that the budget kept, at the round's
  marginal time per row): the budget keeps a node when its score pays for its row, so the gain of those rows
  is not free, and a drafter whose gain only pays its rows does not pay its drafting;
- the batch's time per emitted token, T / N, over recent rounds.

Drafting for the slot adds g tokens and t seconds to a round of N tokens in T seconds; it raises the batch's
tokens per second when (N + g) / (T + t) > N / T, that is when g * T / N > t. While that fails the drafter skips
the slot, drafting anyway every `probe_every` rounds so the estimates follow the text (an open answer that
starts to copy, or the reverse), twice as seldom after each probe that found nothing worth its time; the probes
of all slots fall on the same rounds, so they share one batched call. The n-gram drafters are weighed as one
drafter (`NGRAMS`, engine/draft/chain.py): each costs microseconds, all of them together a few percent of a
one-row forward, which on open text, where their nodes are seldom kept, is a round's cost for nothing.

A new answer has no rounds of its own yet. Alone, a slot drafts from the start. Beside others, it starts from
what the drafter gave the answers before it at the same number of slots (the engine's memory, `by_crowd`),
probing as seldom as their last probes had come to. Where nobody has measured that many slots yet (a fresh
engine), a model drafter starts on the probe rounds, and its first probe's gain stands alone, without the
prior: beside others the head's first rounds are dear (docs/history.md#what-the-budgets-rules-answer), and a
prior near break-even let it draft at a loss. The n-gram drafters (`cheap`) keep the prior and draft from the start:
a copying answer gains from its first rounds, and an unlucky first round of theirs costs microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.budget.accounts import Accounts


@dataclass
class GateParams:
    decay: float = 0.8  # weight of the old estimate in each update
    prior_gain: float = 1.0  # tokens per round assumed before any evidence: one unlucky first round must not
    # shut a drafter out for probe_every rounds
    probe_every: int = 8  # a drafter that does not pay for a slot still drafts for it this often at first
    # each probe that still does not pay doubles the slot's interval, up to this; one that pays resets it. With
    # four open slots each of the head's probe rounds costs a large share of a round, every 8th round
    probe_max: int = 64
    covered_at: float = 0.5  # the drafters before it guess the next token with this chance: a "covered" round
    # rounds of earlier answers at the same number of slots before their estimate stands in for a new answer's
    seed_after: int = 8


@dataclass
class _Estimate:
    gain: float | None = None  # tokens per round only this drafter put on the slot's kept path
    cost: float | None = None  # seconds of drafting per round charged to the slot
    pending: float | None = None  # this round's drafting time, until the round's gain is known
    n: int = 0  # rounds measured
    period: int = 0  # rounds between its probes while it does not pay (0: probe_every)
    probing: bool = False  # this round's drafting is a probe
    crowd: int = 1  # slots in the round its pending drafting was for
    cheap: bool = False  # its drafting costs microseconds (the n-grams): the prior applies at any crowd


@dataclass
class DrafterGate:
    params: GateParams = field(default_factory=GateParams)
    # seq -> its account (engine/budget/accounts.py): its estimates by (drafter, covered), where covered means the
    # drafters before it already guess the next token, and each drafter's covered this round
    records: Accounts = field(default_factory=Accounts)
    seconds_per_token: float | None = None  # the batch's round time over the tokens the round emitted
    # this round's forward time per draft row beyond the rows it has anyway (set after the forward, read when
    # the drafters are credited): (t(n) - t(n_base)) / (n - n_base) from the measured cost curve
    row_seconds: float = 0.0
    n_rounds: int = 0  # rounds seen; probes fall on the same rounds for every slot, so they share one call
    crowd: int = 1  # slots in this round (set by the round before drafting)
    # (drafter, covered, slots in the round) -> estimates over every answer drafted for at that many slots: a
    # new answer's start, until rounds of its own come back
    by_crowd: dict[tuple[str, bool, int], _Estimate] = field(default_factory=dict)

    def _ema(self, old: float | None, new: float, n: int) -> float:
        """The mean of the first rounds (the prior counting as one), then an exponential average: a drafter
        that finds nothing is out after 2 or 3 rounds instead of the 6 a plain average from the prior takes."""
        if old is None:
            return new
        weight = max(1 - self.params.decay, 1 / (n + 1))
        return (1 - weight) * old + weight * new

    def _estimate(self, seq: int, name: str) -> _Estimate:
        record = self.records.of(seq)
        return record.estimates.setdefault((name, record.covered.get(name, False)), _Estimate())

    def _current(self, seq: int, name: str) -> _Estimate | None:
        """The estimate this round's decision for `name` on `seq` reads and charges (None: none yet)."""
        record = self.records.of(seq)
        return record.estimates.get((name, record.covered.get(name, False)))

    def pays(self, seq: int, name: str, p_covered: float = 0.0, cheap: bool = False) -> bool:
        """Whether `name` drafts for `seq` this round. p_covered: the chance that the drafters before it guessed
        the next token (their first tokens' scores, summed). What a model drafter adds differs with that (on a
        copied passage the n-grams find what the head would; where they find nothing it adds the most), so
        rounds with p_covered >= covered_at and the others keep estimates of their own. cheap: its drafting
        costs microseconds, so without evidence it drafts at any crowd."""
        self.settle_pending(seq, name)
        self.records.of(seq).covered[name] = p_covered >= self.params.covered_at
        e = self._estimate(seq, name)
        e.cheap = cheap
        ref = self._reference(seq, name)
        if ref is not None and ref is not e:  # the answer's own estimate starts from the earlier answers'
            e.gain, e.cost, e.period, e.n, ref = ref.gain, ref.cost, ref.period, 1, e
        if ref is None and self.crowd > 1 and not cheap:  # nobody measured this many slots: start on the probes
            return self._probe(e)
        if ref is None or self.seconds_per_token is None:
            return True
        if ref.gain * self.seconds_per_token > ref.cost:
            return True
        # a model drafter drafts for all its slots in one batched call that costs about the same for one slot
        # as for four: slots probing on rounds of their own would each pay a whole call. The intervals are
        # probe_every times powers of 2, so a slot's probe rounds include those of every slot probing less often
        return self._probe(e)

    def settle_pending(self, seq: int, name: str) -> None:
        """Drafted last round and no kept path came back: nothing was gained (noted before this round's call)."""
        last = self._current(seq, name)
        if last is not None and last.pending is not None:
            self.note_gain(seq, name, 0)

    def would_pay(self, seq: int, name: str, covered: bool, cheap: bool = False) -> bool:
        """What `pays` answers this round for a round covered or not (after `settle_pending`), changing
        nothing: the relay reads it from the allowance before the covered chance is known."""
        e = self.records.of(seq).estimates.get((name, covered))
        ref = self._reference(seq, name, covered)
        period = e.period if e is not None else 0
        if ref is not None and ref is not e:  # pays starts the answer's estimate from this one
            period = ref.period
        probe = self.n_rounds % (period or self.params.probe_every) == 0
        if ref is None and self.crowd > 1 and not cheap:
            return probe
        if ref is None or self.seconds_per_token is None:
            return True
        return ref.gain * self.seconds_per_token > ref.cost or probe

    def _probe(self, e: _Estimate) -> bool:
        """Whether this round is one of the estimate's probe rounds (its drafting is then a probe)."""
        e.probing = self.n_rounds % (e.period or self.params.probe_every) == 0
        return e.probing

    def _reference(self, seq: int, name: str, covered: bool | None = None) -> _Estimate | None:
        """What the decision reads: the slot's own estimate, else (beside other slots) the estimate of earlier
        answers at this many slots once it has seed_after rounds, else None (draft, and measure). covered:
        which of its estimates (None: this round's)."""
        record = self.records.of(seq)
        covered = record.covered.get(name, False) if covered is None else covered
        e = record.estimates.get((name, covered))
        if e is not None and e.gain is not None and e.cost is not None:
            return e
        seed = self.by_crowd.get((name, covered, self.crowd)) if self.crowd > 1 else None
        if seed is not None and seed.n >= self.params.seed_after:
            return seed
        return None

    def note_cost(self, seq: int, name: str, seconds: float) -> None:
        e = self._estimate(seq, name)
        e.pending, e.crowd = seconds, self.crowd

    def note_rows(self, seq: int, name: str, n_rows: int) -> None:
        """This round's forward gave n_rows rows to nodes that `name` proposed for `seq`: their time is its cost."""
        e = self._current(seq, name)
        if e is not None and e.pending is not None:
            e.pending += n_rows * self.row_seconds

    def note_gain(self, seq: int, name: str, tokens: int) -> None:
        e = self._current(seq, name)
        if e is None or e.pending is None:
            return
        seed = self.by_crowd.setdefault((name, self.records.of(seq).covered.get(name, False), e.crowd), _Estimate())
        prior = e.cheap or e.crowd == 1  # beside others a model drafter's first probe stands alone (see above)
        for est in (e, seed):
            est.n += 1
            est.cost = self._ema(est.cost, e.pending, est.n - 1)
            start = self.params.prior_gain if est.gain is None and prior else est.gain
            est.gain = self._ema(start, float(tokens), est.n if prior else est.n - 1)
        e.pending = None
        if e.probing:
            pays = self.seconds_per_token is not None and e.gain * self.seconds_per_token > e.cost
            period = e.period or self.params.probe_every
            e.period = seed.period = self.params.probe_every if pays else min(2 * period, self.params.probe_max)
            e.probing = False

    def nothing_kept(self, seq: int) -> None:
        """The round's budget kept no node of this slot: whatever drafted for it gained nothing. Noted now, not at
        its next draft, which a slot that rests from here may not make before its answer ends."""
        for name in list(self.records.of(seq).covered):
            self.note_gain(seq, name, 0)

    def note_round(self, seconds: float, n_emitted: int) -> None:
        self.n_rounds += 1
        if n_emitted > 0:
            self.seconds_per_token = self._ema(self.seconds_per_token, seconds / n_emitted, self.n_rounds)

    def why(self, seq: int, name: str) -> str:
        covered = self.records.of(seq).covered.get(name, False)
        e = self._reference(seq, name)
        if e is None or self.seconds_per_token is None:
            return f"{name}: no estimate yet" + ("; beside other slots it starts on the probe rounds"
                                                 if self.crowd > 1 else "")
        when = "when the others already guess" if covered else "when the others guess little"
        return (f"{name}: {e.gain:.2f} tokens only it found {when} x {self.seconds_per_token * 1e3:.1f} ms a "
                f"token vs {e.cost * 1e3:.1f} ms drafting and rows")

    def forget(self, seq: int) -> None:
        record = self.records.get(seq)
        if record is not None:
            record.estimates, record.covered = {}, {}


def exclusive_gains(credit: dict[str, tuple[int, int]], n_kept: int) -> dict[str, int]:
    """drafter -> kept-path tokens no other drafter of the tree had proposed. credit: DraftTree.credit's
    (depth, kept prefix it proposed) per drafter."""
    out = {}
    for name in credit:
        others = max((m for other, (_, m) in credit.items() if other != name), default=0)
        out[name] = max(0, min(credit[name][1], n_kept) - others)
    return out
