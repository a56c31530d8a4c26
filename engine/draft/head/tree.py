"""Dynamic draft trees from the draft head, in the manner of EAGLE-2 (Li et al. 2024, arXiv:2406.16858).

A node's score is the head's probability of its whole path (the product of its tokens' probabilities along the
way), which the head's calibration makes an estimate of the chance that the target's walk reaches the node.
Growing by depth: the `width` best-scored nodes of the newest depth are expanded, those of every sequence
drafting this round together in one batched head step (each node attends to its sequence's confirmed entries
and its own ancestors' entries, a tree mask over one key set), and each expanded node offers its `branch` most
likely tokens as children. The tree handed on is the `n_nodes` best-scored nodes (EAGLE-2's reranking); a child
never outscores its parent, so the best nodes always include their ancestors. The round's budget
(engine/budget/tree_budget.py) then keeps what pays.

Each depth is a head step that costs its time whether or not the budget keeps what it adds. So a further depth
is grown only when it is expected to pay for it: its frontier's scores S (summed over all sequences of the
call) times rho, the share of a frontier's score its children brought above the budget's threshold in earlier
steps, must beat the step's time in tokens, t_step / (the batch's seconds per emitted token): alone, a step is
a small share of a token's time; beside three other slots a step over the four frontiers costs more while a
token costs less, so fewer of the deep, unlikely depths pay (docs/history.md#the-heads-own-costs).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.draft.tree import DraftTree


@dataclass
class HeadTreeParams:
    branch: int = 4  # children offered per expanded node (the head's most likely tokens)
    width: int = 4  # nodes expanded per depth (the best-scored of the newest depth)
    # a node scored below this is not expanded. Each depth costs a head step whether or not the budget keeps
    # what it adds; on open prompts trees cut at 0.02, 0.2 and 0.45 took the same number of target forwards,
    # and 0.2 the least time (docs/history.md#the-head-in-trees)
    min_score: float = 0.2


@dataclass
class StepCost:
    """What the depth steps of earlier trees cost and gave, for the decision to grow one more depth."""

    decay: float = 0.8  # weight of the old estimate in each update
    seconds: float | None = None  # one depth step's time
    rho: float = 0.5  # children's score above the threshold over their frontier's score (a prior until seen)

    def pays(self, frontier_score: float, token_seconds: float) -> bool:
        if self.seconds is None or token_seconds <= 0:
            return True
        return self.rho * frontier_score * token_seconds > self.seconds

    def note(self, seconds: float, frontier_score: float, gained: float) -> None:
        d = self.decay
        self.seconds = seconds if self.seconds is None else d * self.seconds + (1 - d) * seconds
        if frontier_score > 0:
            self.rho = d * self.rho + (1 - d) * min(1.0, gained / frontier_score)


@dataclass
class _Node:
    token: int  # target id
    parent: int  # index in the node list, -1: the root
    depth: int  # 1 for a child of the root
    score: float  # product of the head's probabilities along the path
    g_parent: torch.Tensor  # [hidden] the parent's head feature: this node's input
    entry: int = -1  # index of its KV entry among the tree entries, once expanded


@dataclass
class TreeSeed:
    """One sequence's start: st_k, st_v [base, kv_heads, d] the head's entries of its confirmed positions; g0
    [hidden] and logits0 [draft_vocab] the head's step at id_last's position."""

    st_k: torch.Tensor
    st_v: torch.Tensor
    base: int
    g0: torch.Tensor
    logits0: torch.Tensor
    n_nodes: int  # the tree handed on keeps this many best-scored nodes
    depth_max: int
    # nodes scored below this are not expanded either: the round's budget would give their children no row
    min_score: float = 0.0


@dataclass
class _Growing:
    seed: TreeSeed
    nodes: list[_Node] = field(default_factory=list)
    tree_k: list[torch.Tensor] = field(default_factory=list)  # entries of expanded nodes, [kv_heads, d] each
    tree_v: list[torch.Tensor] = field(default_factory=list)
    newest: list[int] = field(default_factory=list)


def grow_many(head, seeds: list[TreeSeed], params: HeadTreeParams, cost: StepCost | None = None,
              token_seconds: float = 0.0) -> list[DraftTree]:
    """Every sequence's tree, grown depth by depth together: one head step per depth for all their frontiers
    (the linears take all rows at once; attention stays per sequence, over its own entries). The head's linears
    give a row the same bits in any batch (engine/forward/prepack.py), so each tree is the one grown alone. cost: the
    steps' time and yield, updated here; token_seconds: the batch's time per emitted token (0: grow by score
    alone)."""
    growing = [_Growing(seed) for seed in seeds]
    if seeds:
        tops = _tops(head, torch.stack([seed.logits0 for seed in seeds]), params.branch)
        for gr, top in zip(growing, tops):
            _offer(gr.nodes, -1, 0, 1.0, gr.seed.g0, top)
            gr.newest = list(range(len(gr.nodes)))
    depth = 1
    while True:
        fronts = []  # (state, its expanded nodes)
        for gr in growing:
            if depth >= gr.seed.depth_max or not gr.newest:
                continue
            front = sorted(gr.newest, key=lambda i: -gr.nodes[i].score)[: params.width]
            floor = max(params.min_score, gr.seed.min_score, _kth_score(gr.nodes, gr.seed.n_nodes))
            front = [i for i in front if gr.nodes[i].score >= floor]
            gr.newest = []
            if front:
                fronts.append((gr, front))
        if not fronts:
            break
        mass = sum(gr.nodes[i].score for gr, front in fronts for i in front)
        if cost is not None and not cost.pays(mass, token_seconds):
            break
        t0 = time.perf_counter()
        feats = torch.stack([gr.nodes[i].g_parent for gr, front in fronts for i in front])
        toks = torch.tensor([gr.nodes[i].token for gr, front in fronts for i in front], device=feats.device)
        pos = torch.tensor([gr.seed.base + depth - 1 for gr, front in fronts for _ in front], device=feats.device)
        q, k, v = head.qkv(feats, toks, pos)  # [F, heads, d], [F, kv_heads, d]
        attn, row = [], 0
        for gr, front in fronts:
            for j, i in enumerate(front):
                gr.nodes[i].entry = len(gr.tree_k)
                gr.tree_k.append(k[row + j])
                gr.tree_v.append(v[row + j])
            attn.append(_attend(head, q[row:row + len(front)], gr.seed.st_k, gr.seed.st_v, torch.stack(gr.tree_k),
                                torch.stack(gr.tree_v), [_ancestor_entries(gr.nodes, i) for i in front]))
            row += len(front)
        g = head.finish(feats, torch.cat(attn))
        tops = _tops(head, head.logits(g).float(), params.branch)
        row, gained = 0, 0.0
        for gr, front in fronts:
            for i in front:
                first = len(gr.nodes)
                _offer(gr.nodes, i, depth, gr.nodes[i].score, g[row], tops[row])
                gr.newest += range(first, len(gr.nodes))
                gained += sum(max(0.0, n.score - gr.seed.min_score) for n in gr.nodes[first:])
                row += 1
        if cost is not None:
            cost.note(time.perf_counter() - t0, mass, gained)
        depth += 1
    return [_best(gr.nodes, gr.seed.n_nodes) for gr in growing]


def _kth_score(nodes: list[_Node], n_nodes: int) -> float:
    """A node scored no higher than the n_nodes-th best so far cannot put a child into the tree handed on: a
    child never outscores its parent, and ties go to the shallower node (_best). Expanding it would be a head
    step for nothing (one slot's tree of one node is its first step alone). Just above that score: nodes at
    it are not expanded."""
    if n_nodes <= 0 or len(nodes) < n_nodes:
        return 0.0
    kth = sorted((n.score for n in nodes), reverse=True)[n_nodes - 1]
    return math.nextafter(kth, math.inf)


def _best(nodes: list[_Node], n_nodes: int) -> DraftTree:
    """The n_nodes best-scored nodes as a tree (a child never outscores its parent: ancestors come along)."""
    best = sorted(range(len(nodes)), key=lambda i: (-nodes[i].score, nodes[i].depth))[:n_nodes]
    tree = DraftTree()
    where = {-1: -1}
    for i in sorted(best, key=lambda i: nodes[i].depth):  # parents first
        if nodes[i].parent in where:
            where[i] = tree.add(where[nodes[i].parent], nodes[i].token, "draft-head", nodes[i].score)
    return tree


def _tops(head, logits: torch.Tensor, branch: int) -> list[list[tuple[float, int]]]:
    """Per row of logits [rows, draft_vocab]: its `branch` most likely tokens as (probability, target id), for
    all rows in one softmax and one top-k."""
    top = torch.topk(torch.softmax(logits, dim=-1), min(branch, logits.shape[-1]), dim=-1)
    ids = head.d2t[top.indices].tolist()
    return [list(zip(p, t)) for p, t in zip(top.values.tolist(), ids)]


def _offer(nodes: list[_Node], parent: int, depth: int, score: float, g: torch.Tensor,
           top: list[tuple[float, int]]) -> None:
    for p, token in top:
        nodes.append(_Node(token=token, parent=parent, depth=depth + 1, score=score * p, g_parent=g))


def _ancestor_entries(nodes: list[_Node], i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(nodes[i].entry)
        i = nodes[i].parent
    return out


def _attend(head, q: torch.Tensor, st_k, st_v, tree_k, tree_v, seen: list[list[int]]) -> torch.Tensor:
    """q [F, heads, d] over the confirmed entries and, per row, the tree entries listed in `seen` -> [F, heads*d]."""
    keys = torch.cat([st_k, tree_k]).transpose(0, 1)[None]  # [1, kv_heads, base + E, d]
    values = torch.cat([st_v, tree_v]).transpose(0, 1)[None]
    base = st_k.shape[0]
    mask = torch.zeros(len(seen), base + tree_k.shape[0], dtype=torch.bool, device="cpu")  # filled row by row
    mask[:, :base] = True
    for r, entries in enumerate(seen):
        mask[r, [base + e for e in entries]] = True
    mask = mask.to(q.device)  # one copy to the head's device
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys, values, attn_mask=mask[None, None],
                                         enable_gqa=True)  # [1, heads, F, d]
    return out[0].transpose(0, 1).reshape(len(seen), -1)
