"""One draft budget for the whole forward: which nodes of which slot's tree the target checks this round.

Every generating slot puts its sampled token in the forward (one row each, n_base rows). Each draft node v
adds a row and is reached by the target's walk with chance s_v (its score: the draft head's path probability,
or an n-gram drafter's acceptance rates multiplied along the path, engine/draft/tree.py). A round that verifies a
set N of nodes emits n_base + sum_{v in N} s_v tokens in expectation and costs c(n_base + |N|) single-row
forwards (the curve `Engine.calibrate` measures, engine/cost/curve.py). The budget keeps the N that maximises

    goodput(N) = (n_base + sum_{v in N} s_v) / c(n_base + |N|),

expected tokens per unit of forward time for the batch as a whole. Since c is increasing, the best N of a
given size is the |N| best-scored nodes, so one pass over the nodes sorted by score finds it (a child never
outscores its parent, so that prefix is a set of whole paths). One slot alone can then take a deep tree; four
slots share the rows that are still nearly free; when no node pays its row the budget is zero and the round is
plain decoding. A slot whose nodes were all refused for `probe_every` rounds gets its best node anyway, so the
acceptance estimates behind its scores can recover (as the length policy's probe), where the other slots of
the forward can afford the row. Beside other slots, one refused twice rests: it drafts only on probe rounds,
every 4, 8, ... up to `probe_max` rounds while its probes keep being refused.

The budget is also fair (engine/budget/fair_share.py): no slot of the forward should expect to fall behind plain
decoding for the rows the others take, unless `SlotLedger.fair` is off.

The goodput is only as good as the scores. The draft head's are calibrated (docs/draft-head.md); an n-gram
drafter's are a product of per-position acceptance rates that start from priors and are learned only where its
drafts were verified, and on open text the nodes it had scored 0.3 to 0.4 were reached 12% of the time. So each
slot's scores from each drafter are scaled by what its verified nodes showed (`ScoreCorrection`): reached /
predicted over the slot's recent rounds, starting at 1 (a copying slot and an open one beside it differ). A
drafter whose nodes are never reached stops taking rows; one that beats its scores gets them raised, capped
at 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.cost.curve import CostModel, RoundCost
from engine.budget.accounts import Accounts
from engine.draft.tree import DraftTree
from engine.budget.fair_share import fair_take, leaves_first, others_afford


@dataclass
class NodeChoice:
    n_rows: int  # rows of the forward: the slots' own rows plus the draft nodes kept
    n_base: int  # rows it would have without drafts: the plain forward a slot's balance is measured against
    kept: dict[int, list[int]]  # seq -> the nodes of its tree kept (indices into that tree)
    offered: dict[int, int]  # seq -> the nodes its drafters offered
    expected: float  # expected tokens the forward emits
    goodput: float  # expected tokens per single-row forward time
    why: str  # one line for the UI
    factors: dict[int, dict[str, float]] = field(default_factory=dict)  # seq -> drafter -> correction applied
    # the score one more node would need to raise the goodput of the forward chosen: expected * (c(n + 1) /
    # c(n) - 1), from (expected + s) / c(n + 1) > expected / c(n)
    threshold: float = 0.0
    cost: RoundCost | None = None  # the round's cost curve the choice was made on (the forward is charged by it)


@dataclass
class ScoreCorrection:
    """Per (slot, drafter), nodes reached by the target's walk against the scores the budget ranked them by."""

    prior: float = 2.0  # pseudo-nodes, reached as predicted, that every drafter starts with
    decay: float = 0.9  # per observed round, the weight left to the rounds before it
    # seq -> its account (engine/budget/accounts.py): per drafter, the decayed count of its nodes reached and the
    # decayed sum of their raw scores
    records: Accounts = field(default_factory=Accounts)

    def factor(self, seq: int, drafter: str) -> float:
        record = self.records.of(seq)
        return (record.reached.get(drafter, 0.0) + self.prior) / (record.predicted.get(drafter, 0.0) + self.prior)

    def forget(self, seq: int) -> None:
        record = self.records.get(seq)
        if record is not None:
            record.reached, record.predicted = {}, {}

    def observe(self, seq: int, tree: DraftTree, path: list[int], factors: dict[str, float]) -> None:
        """A verified tree (the nodes the budget kept, their scores as ranked) and the target's path through it.
        factors: the ones the scores were ranked with; dividing by them compares raw scores with outcomes."""
        on_path = set(path)
        seen: dict[str, tuple[float, float]] = {}
        for v, drafter in enumerate(tree.drafters):
            raw = tree.scores[v] / max(factors.get(drafter, 1.0), 1e-6)
            hit, pred = seen.get(drafter, (0.0, 0.0))
            seen[drafter] = (hit + (v in on_path), pred + raw)
        record = self.records.of(seq)
        for drafter, (hit, pred) in seen.items():
            record.reached[drafter] = self.decay * record.reached.get(drafter, 0.0) + hit
            record.predicted[drafter] = self.decay * record.predicted.get(drafter, 0.0) + pred


@dataclass
class SlotLedger:
    probe_every: int = 4  # rounds a slot may go without a single node before it gets a probe
    # a slot beside others whose nodes were all refused this many rounds in a row rests: it drafts only every
    # probe_every rounds, and what it drafts then is a probe. On open text the budget refuses nearly every
    # draft, and then the drafting, small per drafter and slot but paid every round by every slot of the
    # forward, is all a round costs beyond plain decoding. All slots probe on the same rounds: the others are plain
    rest_after: int = 2
    # each probe a resting slot makes that still wins no row on its merit doubles its interval, up to this; a
    # node kept on its merit ends the rest: a fixed interval still spent a share of every round on drafts nobody
    # verified (docs/history.md#what-the-budgets-rules-answer)
    probe_max: int = 32
    n_rounds: int = 0  # rounds run: probe rounds are those with n_rounds % (the slot's interval) == 0
    waking: set[int] = field(default_factory=set)  # resting slots drafting this round (their probe round)
    # every slot of the forward must expect at least its plain-decoding speed: the forward grows by no more
    # than 1 + the kept scores of the slot that expects the least. False: the batch's goodput alone decides
    fair: bool = True
    # seq -> its account (engine/budget/accounts.py): rounds in a row its nodes were all refused, its probe interval,
    # its balance against plain decoding, the model drafters' nodes its last tree kept, its score correction
    records: Accounts = field(default_factory=Accounts)
    correction: ScoreCorrection | None = None  # over the same records (None: made so)
    # the last round's NodeChoice.threshold: a model drafter growing a tree need not expand nodes scored below it,
    # whose children could not get a row either (engine/draft/head/tree.py)
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.correction is None:
            self.correction = ScoreCorrection(records=self.records)

    def balance_of(self, seq: int) -> float:
        """The slot's balance, 0 before its first settled round (or for a slot the budget does not know)."""
        record = self.records.get(seq)
        return record.balance if record is not None and record.balance is not None else 0.0

    def settle(self, seq: int, n_emitted: int, cost_ratio: float) -> None:
        """cost_ratio: the round's forward in plain forwards of its base rows."""
        self.records.of(seq).balance = self.balance_of(seq) + n_emitted - cost_ratio

    def next_round(self) -> None:
        self.n_rounds += 1
        self.waking.clear()

    def rests(self, seq: int) -> bool:
        """Whether the slot drafts nothing this round (rest_after); on a probe round it wakes instead."""
        return self.records.of(seq).refused >= self.rest_after and not self.wakes(seq)

    def rest(self, seq: int) -> int:
        """A round the slot rests counts as one whose nodes were refused (a probe round that found nothing backs
        its interval off); returns the rounds until it drafts."""
        self.records.of(seq).refused += 1
        self.back_off(seq)
        return -self.n_rounds % self.interval_of(seq)

    def wakes(self, seq: int) -> bool:
        """Whether a resting slot drafts this round (a probe round); if its nodes are all refused, they make a
        probe. The intervals are probe_every times powers of 2, so the probe rounds of a slot that probes
        more often include those of every other: their probes share one batched draft."""
        if self.records.of(seq).refused < self.rest_after:
            return False
        if self.n_rounds % self.interval_of(seq) != 0:
            return False
        self.waking.add(seq)
        return True

    def back_off(self, seq: int) -> None:
        """A waking slot's drafts won no row on their merit: it probes half as often from now."""
        if seq in self.waking:
            self.records.of(seq).interval = min(2 * self.interval_of(seq), self.probe_max)

    def interval_of(self, seq: int) -> int:
        """Rounds between the slot's probes while it rests."""
        interval = self.records.of(seq).interval
        return self.probe_every if interval is None else interval

    def probes(self, seq: int) -> bool:
        """Whether a slot whose nodes were all refused this round gets its best path anyway: a resting slot on
        the round it drafts, another every probe_every rounds refused."""
        return seq in self.waking or self.records.of(seq).refused % self.probe_every == 0

    def begin(self, seq: int) -> None:
        """A new generation in the slot: its answer is measured against plain decoding from here. What its
        drafters' scores proved (the correction) stays: the next turn of a chat is much like the last."""
        self.records.of(seq).begin_answer()

    def forget(self, seq: int) -> None:
        self.begin(seq)
        self.correction.forget(seq)


def choose_nodes(trees: dict[int, DraftTree], n_base: int, cost: CostModel | RoundCost, state: SlotLedger,
         bare: list[int] | None = None, remaining: dict[int, int] | None = None) -> NodeChoice:
    """Choose among every slot's tree nodes. trees: seq -> its tree (scores filled); n_base: rows the forward
    has without drafts (each slot's sampled token, replay rows); bare: the slots in the forward without a tree
    (None: one unknown slot if n_base has more rows than trees); remaining: seq -> tokens it still wants (None:
    no slot is known to finish before another). The trees' scores are corrected and bounded in place: the kept
    trees carry the scores they were ranked by."""
    factors = {seq: {d: state.correction.factor(seq, d) for d in set(t.drafters)} for seq, t in trees.items()}
    for seq, t in trees.items():
        t.scores = [min(1.0, s * factors[seq][d]) for s, d in zip(t.scores, t.drafters)]
        t.bound_scores()
    # every node of every tree, best first; a child never outscores its parent and ties go to the shallower,
    # so any prefix of one slot's nodes in this order is a set of whole paths
    ranked = sorted(((t.scores[v], -t.depth(v), seq, v) for seq, t in trees.items() for v in range(len(t))),
                    reverse=True)
    if bare is None:
        bare = [-1] if n_base > len(trees) else []
    # a slot alone in the forward pays for its rows with its own time: the goodput is its speed
    if state.fair and len(set(trees) | set(bare)) > 1:
        balance = {seq: state.balance_of(seq) for seq in list(trees) + bare}
        share = cost.seq_share() if isinstance(cost, RoundCost) else 0.0
        take = fair_take(trees, ranked, n_base, cost, balance, bare, leaves_first(remaining, list(trees) + bare),
                         share)
    else:
        take = _greedy_take(ranked, n_base, cost)
    kept: dict[int, list[int]] = {seq: [] for seq in trees}
    for _, _, seq, v in ranked:
        if len(kept[seq]) < take.get(seq, 0):
            kept[seq].append(v)
    for seq, t in trees.items():
        record = state.records.of(seq)
        if kept[seq] or not len(t):
            record.refused, record.interval = 0, None
            continue
        record.refused += 1
        state.back_off(seq)
        if state.probes(seq):
            probe = t.path(max(range(len(t)), key=lambda v: (t.scores[v], -t.depth(v))))
            balances = {other: state.balance_of(other) for other in list(trees) + bare}
            if not state.fair or others_afford(trees, kept, bare, seq, len(probe), n_base, cost, balances):
                kept[seq] = probe
    n_nodes = sum(len(k) for k in kept.values())
    expected = n_base + sum(trees[seq].scores[v] for seq, vs in kept.items() for v in vs)
    offered = sum(len(t) for t in trees.values())
    why = (f"{n_nodes} of {offered} draft nodes: {expected:.2f} expected tokens for a forward of "
           f"{n_base + n_nodes} rows ({cost.c(n_base + n_nodes):.2f}x one row)")
    if n_nodes == 0 and offered:
        why = f"no draft node pays its row this round ({offered} offered): plain decoding"
        if state.fair and _greedy_take(ranked, n_base, cost):
            behind = min([s for s in list(trees) + bare if s >= 0], key=state.balance_of)
            why = (f"no draft node pays its row without slowing a slot below plain decoding ({offered} offered; "
                   f"slot {behind} stands at {state.balance_of(behind):+.2f} tokens against it): plain decoding")
    n_rows = n_base + n_nodes
    state.threshold = expected * (cost.c(n_rows + 1) / cost.c(n_rows) - 1)
    return NodeChoice(n_rows=n_rows, n_base=n_base, kept=kept, offered={seq: len(t) for seq, t in trees.items()},
                  expected=expected, goodput=expected / cost.c(n_rows), why=why, factors=factors,
                  threshold=state.threshold, cost=cost)


def _greedy_take(ranked, n_base: int, cost: CostModel) -> dict[int, int]:
    """seq -> how many of its best nodes to keep: the prefix of `ranked` with the best goodput."""
    best_n, best_value = 0, n_base / cost.c(n_base)
    total = float(n_base)
    for n, (score, _, _, _) in enumerate(ranked, start=1):
        total += score
        value = total / cost.c(n_base + n)
        if value > best_value * 1.001:
            best_n, best_value = n, value
    take: dict[int, int] = {}
    for _, _, seq, _ in ranked[:best_n]:
        take[seq] = take.get(seq, 0) + 1
    return take
