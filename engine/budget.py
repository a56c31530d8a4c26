"""One draft budget for the whole forward: which nodes of which slot's tree the target checks this round.

Every generating slot puts its sampled token in the forward (one row each, n_base rows). Each draft node v
adds a row and is reached by the target's walk with chance s_v (its score: the draft head's path probability,
or an n-gram drafter's acceptance rates multiplied along the path, engine/tree.py). A round that verifies a
set N of nodes emits n_base + sum_{v in N} s_v tokens in expectation and costs c(n_base + |N|) single-row
forwards (the curve `Engine.calibrate` measures, engine/policy.py). The budget keeps the N that maximises

    goodput(N) = (n_base + sum_{v in N} s_v) / c(n_base + |N|),

expected tokens per unit of forward time for the batch as a whole. Since c is increasing, the best N of a
given size is the |N| best-scored nodes, so one pass over the nodes sorted by score finds it (a child never
outscores its parent, so that prefix is a set of whole paths). One slot alone can then take a deep tree; four
slots share the rows that are still nearly free; when no node pays its row the budget is zero and the round is
plain decoding. A slot whose nodes were all refused for `probe_every` rounds gets its best node anyway, so the
acceptance estimates behind its scores can recover (as the length policy's probe).

Goodput alone would let a copying slot take rows that slow an open slot beside it: the batch emits more, the
open answer comes slower than plain decoding would give it. So the budget is also fair: a slot expects
1 + (its kept nodes' scores) tokens from a forward that costs c(n_rows) / c(n_base) times the plain one, and no
slot may expect less than its plain speed. The forward grows by at most the factor of the slot expecting the
least; while one slot has no draft at all, only the rows the curve gives for free are spent.

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

from engine.policy import CostModel
from engine.tree import DraftTree


@dataclass
class Budget:
    n_rows: int  # rows of the forward: the slots' own rows plus the draft nodes kept
    kept: dict[int, list[int]]  # seq -> the nodes of its tree kept (indices into that tree)
    offered: dict[int, int]  # seq -> the nodes its drafters offered
    expected: float  # expected tokens the forward emits
    goodput: float  # expected tokens per single-row forward time
    why: str  # one line for the UI
    factors: dict[int, dict[str, float]] = field(default_factory=dict)  # seq -> drafter -> correction applied
    # the score one more node would need to raise the goodput of the forward chosen: expected * (c(n + 1) /
    # c(n) - 1), from (expected + s) / c(n + 1) > expected / c(n)
    threshold: float = 0.0


@dataclass
class ScoreCorrection:
    """Per (slot, drafter), nodes reached by the target's walk against the scores the budget ranked them by."""

    prior: float = 2.0  # pseudo-nodes, reached as predicted, that every drafter starts with
    decay: float = 0.9  # per observed round, the weight left to the rounds before it
    reached: dict[tuple[int, str], float] = field(default_factory=dict)  # decayed count of its nodes reached
    predicted: dict[tuple[int, str], float] = field(default_factory=dict)  # decayed sum of their raw scores

    def factor(self, seq: int, drafter: str) -> float:
        key = (seq, drafter)
        return (self.reached.get(key, 0.0) + self.prior) / (self.predicted.get(key, 0.0) + self.prior)

    def forget(self, seq: int) -> None:
        for key in [key for key in self.predicted if key[0] == seq]:
            del self.predicted[key], self.reached[key]

    def observe(self, seq: int, tree: DraftTree, path: list[int], factors: dict[str, float]) -> None:
        """A verified tree (the nodes the budget kept, their scores as ranked) and the target's path through it.
        factors: the ones the scores were ranked with; dividing by them compares raw scores with outcomes."""
        on_path = set(path)
        seen: dict[str, tuple[float, float]] = {}
        for v, drafter in enumerate(tree.drafters):
            raw = tree.scores[v] / max(factors.get(drafter, 1.0), 1e-6)
            hit, pred = seen.get(drafter, (0.0, 0.0))
            seen[drafter] = (hit + (v in on_path), pred + raw)
        for drafter, (hit, pred) in seen.items():
            key = (seq, drafter)
            self.reached[key] = self.decay * self.reached.get(key, 0.0) + hit
            self.predicted[key] = self.decay * self.predicted.get(key, 0.0) + pred


@dataclass
class BudgetState:
    probe_every: int = 4  # rounds a slot may go without a single node before it gets a probe
    # every slot of the forward must expect at least its plain-decoding speed: the forward grows by no more
    # than 1 + the kept scores of the slot that expects the least. False: the batch's goodput alone decides
    fair: bool = True
    refused: dict[int, int] = field(default_factory=dict)  # seq -> rounds in a row its nodes were all refused
    correction: ScoreCorrection = field(default_factory=ScoreCorrection)
    # the last round's Budget.threshold: a model drafter growing a tree need not expand nodes scored below it,
    # whose children could not get a row either (engine/drafters/head_tree.py)
    threshold: float = 0.0

    def forget(self, seq: int) -> None:
        self.refused.pop(seq, None)
        self.correction.forget(seq)


def plan(trees: dict[int, DraftTree], n_base: int, cost: CostModel, state: BudgetState) -> Budget:
    """Choose among every slot's tree nodes. trees: seq -> its tree (scores filled); n_base: rows the forward
    has without drafts (each slot's sampled token, replay rows). The trees' scores are corrected and bounded
    in place: the kept trees carry the scores they were ranked by."""
    factors = {seq: {d: state.correction.factor(seq, d) for d in set(t.drafters)} for seq, t in trees.items()}
    for seq, t in trees.items():
        t.scores = [min(1.0, s * factors[seq][d]) for s, d in zip(t.scores, t.drafters)]
        t.bound_scores()
    nodes = sorted(((t.scores[v], -t.depth(v), seq, v) for seq, t in trees.items() for v in range(len(t))),
                   reverse=True)
    kept: dict[int, list[int]] = {seq: [] for seq in trees}
    chosen: list[tuple[int, int]] = []
    chosen_set: set[tuple[int, int]] = set()
    best_n, best_value = 0, n_base / cost.c(n_base)
    total = float(n_base)
    # fair: no slot may expect to be served slower than plain decoding would serve it, so the forward may
    # grow by at most the factor of the slot that expects the least, 1 + its kept scores (1 with none)
    own = {seq: 1.0 for seq in trees}
    floor = [1.0] if n_base > len(trees) else []  # a slot without a tree (or a replay) expects its 1 token
    c_base = cost.c(n_base)
    for score, _, seq, v in nodes:
        parent = trees[seq].parents[v]
        if parent >= 0 and (seq, parent) not in chosen_set:
            continue  # a node whose parent did not make it cannot be reached
        chosen.append((seq, v))
        chosen_set.add((seq, v))
        total += score
        own[seq] += score
        c_n = cost.c(n_base + len(chosen))
        if state.fair and c_n / c_base > min(floor + list(own.values())):
            continue
        value = total / c_n
        if value > best_value * 1.001:
            best_n, best_value = len(chosen), value
    for seq, v in chosen[:best_n]:
        kept[seq].append(v)
    for seq, t in trees.items():
        if kept[seq] or not len(t):
            state.refused[seq] = 0
            continue
        state.refused[seq] = state.refused.get(seq, 0) + 1
        if state.refused[seq] % state.probe_every == 0:
            kept[seq] = t.path(max(range(len(t)), key=lambda v: (t.scores[v], -t.depth(v))))
    n_nodes = sum(len(k) for k in kept.values())
    expected = n_base + sum(trees[seq].scores[v] for seq, vs in kept.items() for v in vs)
    offered = sum(len(t) for t in trees.values())
    why = (f"{n_nodes} of {offered} draft nodes: {expected:.2f} expected tokens for a forward of "
           f"{n_base + n_nodes} rows ({cost.c(n_base + n_nodes):.2f}x one row)")
    if n_nodes == 0 and offered:
        why = f"no draft node pays its row this round ({offered} offered): plain decoding"
    n_rows = n_base + n_nodes
    state.threshold = expected * (cost.c(n_rows + 1) / cost.c(n_rows) - 1)
    return Budget(n_rows=n_base + n_nodes, kept=kept, offered={seq: len(t) for seq, t in trees.items()},
                  expected=expected,
                  goodput=expected / cost.c(n_base + n_nodes), why=why, factors=factors, threshold=state.threshold)
