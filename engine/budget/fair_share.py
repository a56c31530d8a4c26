"""The fair budget: draft rows only where no slot of the forward expects to fall behind plain decoding.

Goodput alone would let a copying slot take rows that slow an open slot beside it: the batch emits more, the
open answer comes slower than plain decoding would give it. So the budget (engine/budget/tree_budget.py) is also
fair: a forward that costs c(n_rows) / c(n_base) plain forwards spends tau = that ratio - 1 more on every slot in
it than plain decoding would, and each slot must expect to make it up: its kept nodes' scores plus its balance
(the tokens it got so far beyond plain decoding, counted on what the rounds emitted) reach tau. A slot ahead can
share a dearer forward; one whose scores promised more than its rounds gave asks more of them; one without a
tree has only its balance. Probes, too, go in only where the other slots can afford their rows. A slot that
wants fewer tokens than another leaves the batch first, and each token it gains is a forward earlier that the
other runs without it, cheaper by that slot's share of the forward (its row and what a sequence costs beyond
one): the tokens it expects from its kept nodes count that much towards the other's share (`leaves_first`,
RoundCost.seq_share).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from engine.cost.curve import CostModel

EPS = 1e-12  # a tau at or below this is a forward no dearer than the plain one
GAIN = 1.001  # a larger set must beat the best so far by this factor: ties and rounding keep the smaller


@dataclass
class _Shares:
    """What every size of forward is weighed on: the ranking and each slot's sums of its own best scores."""

    ranked: list  # (score, -depth, seq, node) of every node, best first
    mine: dict[int, list[float]]  # seq -> sums of its best 0, 1, 2, ... scores
    rank: list[int]  # rank[i]: how many nodes of its own slot come before ranked[i]
    bare: list[int]  # slots in the forward without a tree
    balance: dict[int, float]  # seq -> tokens it got so far beyond plain decoding
    before: dict[int, list[int]]  # seq -> the slots that leave the batch before it
    share: float  # a forward's share that a slot leaving early saves each of the others


def leaves_first(remaining: dict[int, int] | None, seqs: list[int]) -> dict[int, list[int]]:
    """seq -> the slots of the forward that want fewer tokens than it: those leave the batch before it does, and
    every token they gain now is a forward earlier that it runs without them."""
    if not remaining:
        return {seq: [] for seq in seqs}
    return {seq: [k for k in seqs if k != seq and k in remaining and seq in remaining
                  and remaining[k] < remaining[seq]] for seq in seqs}


def others_afford(trees, kept, bare: list[int], seq: int, n_probe: int, n_base: int, cost: CostModel,
                  balance: dict[int, float]) -> bool:
    """Whether slot `seq` may add a probe of n_probe rows: it explores on its own account, and every other slot
    of the forward can pay the dearer forward from its kept scores and its balance (or the rows are free)."""
    n_rows = n_base + sum(len(k) for k in kept.values())
    tau = cost.c(n_rows + n_probe) / cost.c(n_base) - 1.0
    if tau <= EPS:
        return True
    own = {other: sum(trees[other].scores[v] for v in vs) for other, vs in kept.items() if other != seq}
    own.update({other: 0.0 for other in bare})
    return all(score + balance.get(other, 0.0) >= tau for other, score in own.items())


def fair_take(trees, ranked, n_base: int, cost: CostModel, balance: dict[int, float], bare: list[int],
              before: dict[int, list[int]] | None = None, share: float = 0.0) -> dict[int, int]:
    """seq -> how many of its best nodes to keep: the set of the best goodput among those under which no slot
    expects to fall behind plain decoding.

    A forward of n_base + n rows costs c(n_base + n) / c(n_base) plain forwards, tau(n) more than plain decoding
    spends on a slot, so a slot must expect at least tau(n) - (its balance) tokens from its kept nodes: the
    balance (`SlotLedger.balance`, what it got so far beyond plain decoding, measured on emitted tokens, not
    scores) lets a slot that is ahead share a dearer forward, and makes a slot whose scores promised more than
    its rounds gave ask more of them. A slot without a tree has only its balance. For each n the cheapest way
    to give every slot its share is the shortest prefix of its own ranking that reaches it; the rows left go to
    the best remaining nodes of any slot. A prefix of the one global ranking would not do: a copying slot's deep
    chain ranks first and makes the forward too dear for the open slots beside it before their one likely node
    is reached.

    A slot that leaves the batch early saves those still generating its share of every later forward (`share`,
    RoundCost.seq_share): each token the slots before it in `before` expect from their kept nodes counts that
    much towards its own share. A copying slot's sure chain then pays the open slot beside it for its rows where
    a sequence costs more than a row (CostModel.seq_seconds;
    docs/measured.md#epyc-avx2-the-forwards-cost-curve)."""
    shares = _shares(trees, ranked, balance, bare, before or {}, share)
    credited = share > 0 and any(shares.before.values())
    c_base = cost.c(n_base)
    best: dict[int, int] = {}
    best_value = n_base / c_base
    prefix = _prefix_sums(ranked)
    lowest_bare = min((balance[seq] for seq in bare), default=float("inf"))
    for n in range(1, len(ranked) + 1):
        c_n = cost.c(n_base + n)
        tau = c_n / c_base - 1.0
        if _past_peak(prefix, n, n_base, c_n, cost, best_value):
            break
        if tau > EPS and tau > lowest_bare and not credited:
            break  # a slot without a tree would fall behind, the more so in a larger forward
        take, gets = _take_shares(shares, n, tau, credited)
        if take is None:
            continue
        if tau > EPS and _falls_behind(shares, take, gets, tau):
            if not credited:
                break  # some slot cannot reach its share with all its nodes, nor the larger share of a larger forward
            continue
        value = (n_base + sum(shares.mine[seq][k] for seq, k in take.items())) / c_n
        if value > best_value * GAIN:
            best, best_value = take, value
    return best


def _shares(trees, ranked, balance: dict[int, float], bare: list[int], before: dict[int, list[int]],
            share: float) -> _Shares:
    mine: dict[int, list[float]] = {seq: [0.0] for seq in trees}
    rank = []
    for score, _, seq, _ in ranked:
        rank.append(len(mine[seq]) - 1)
        mine[seq].append(mine[seq][-1] + score)
    return _Shares(ranked=ranked, mine=mine, rank=rank, bare=bare, balance=balance, before=before, share=share)


def _prefix_sums(ranked) -> list[float]:
    """The best n scores of any slots: (n_base + prefix[n]) / c(n_base + n) bounds a fair set of n."""
    prefix = [0.0]
    for score, _, _, _ in ranked:
        prefix.append(prefix[-1] + score)
    return prefix


def _past_peak(prefix: list[float], n: int, n_base: int, c_n: float, cost: CostModel, best_value: float) -> bool:
    """Whether no set of n nodes or more can beat the best: past its peak the bound only falls (prefix concave,
    c increasing). From the second node only: the first row also pays a drafted round's fixed cost
    (CostModel.step_fit)."""
    bound = (n_base + prefix[n]) / c_n
    return n > 1 and bound <= best_value * GAIN and bound < (n_base + prefix[n - 1]) / cost.c(n_base + n - 1)


def _take_shares(shares: _Shares, n: int, tau: float,
                 credited: bool) -> tuple[dict[int, int] | None, dict[int, float]]:
    """The n nodes that give every slot its share first, and what the slots leaving before each one expect
    from theirs (None: the shares alone need more than n rows)."""
    gets = dict.fromkeys(list(shares.mine) + shares.bare, 0.0)
    take = None
    for _ in range(2 if credited else 1):  # what the others' nodes promise lowers each share: once more
        take = _fill(shares, _need(shares, tau, gets), n)
        if take is None:
            break
        gets = _credit(shares, take)
    return take, gets


def _need(shares: _Shares, tau: float, gets: dict[int, float]) -> dict[int, int]:
    """seq -> the shortest prefix of its own ranking that reaches its share (all of it where none does); a
    forward that costs no more than the plain one takes nothing from anyone."""
    if tau <= EPS:
        return {seq: 0 for seq in shares.mine}
    return {seq: min(len(sums) - 1, bisect.bisect_left(sums, tau - shares.balance[seq] - gets[seq] - EPS))
            for seq, sums in shares.mine.items()}


def _fill(shares: _Shares, need: dict[int, int], n: int) -> dict[int, int] | None:
    """The shares, then the rows left to the best remaining nodes of any slot (None: the shares need more)."""
    spare = n - sum(need.values())
    if spare < 0:
        return None
    take = dict(need)
    for i in range(len(shares.ranked)):
        if spare == 0:
            break
        seq = shares.ranked[i][2]
        if shares.rank[i] >= take[seq]:  # the next of its slot's ranking: the one before it is in already
            take[seq] += 1
            spare -= 1
    return take


def _credit(shares: _Shares, take: dict[int, int]) -> dict[int, float]:
    """seq -> what the slots leaving before it expect from their kept nodes, at a forward's share a token."""
    return {seq: shares.share * sum(shares.mine[k][take[k]] for k in shares.before.get(seq, []) if k in take)
            for seq in list(shares.mine) + shares.bare}


def _falls_behind(shares: _Shares, take: dict[int, int], gets: dict[int, float], tau: float) -> bool:
    """Whether some slot, with or without a tree, expects less than the forward costs it beyond plain decoding."""
    mine, balance = shares.mine, shares.balance
    return (any(mine[seq][k] + balance[seq] + gets[seq] < tau - EPS for seq, k in take.items())
            or any(balance[seq] + gets[seq] < tau - EPS for seq in shares.bare))
