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


@dataclass
class BudgetState:
    probe_every: int = 4  # rounds a slot may go without a single node before it gets a probe
    refused: dict[int, int] = field(default_factory=dict)  # seq -> rounds in a row its nodes were all refused


def plan(trees: dict[int, DraftTree], n_base: int, cost: CostModel, state: BudgetState) -> Budget:
    """Choose among every slot's tree nodes. trees: seq -> its tree (scores filled); n_base: rows the forward
    has without drafts (each slot's sampled token, replay rows)."""
    for t in trees.values():
        t.bound_scores()
    nodes = sorted(((t.scores[v], -t.depth(v), seq, v) for seq, t in trees.items() for v in range(len(t))),
                   reverse=True)
    kept: dict[int, list[int]] = {seq: [] for seq in trees}
    chosen: list[tuple[int, int]] = []
    chosen_set: set[tuple[int, int]] = set()
    best_n, best_value = 0, n_base / cost.c(n_base)
    total = float(n_base)
    for score, _, seq, v in nodes:
        parent = trees[seq].parents[v]
        if parent >= 0 and (seq, parent) not in chosen_set:
            continue  # a node whose parent did not make it cannot be reached
        chosen.append((seq, v))
        chosen_set.add((seq, v))
        total += score
        value = total / cost.c(n_base + len(chosen))
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
    return Budget(n_rows=n_base + n_nodes, kept=kept, offered={seq: len(t) for seq, t in trees.items()},
                  expected=expected,
                  goodput=expected / cost.c(n_base + n_nodes), why=why)
