"""Recursive rejection sampling over a tree of drafts: temperature > 0 with drafters that draw from q.

p = the target's distribution at a node's row, q = the distribution a drafter drew a child token from.
At the node the target has reached, every sampled draft token that hangs below the path (SampledChain, in
relay order) is tested in turn, as SpecInfer (Miao et al. 2024) and multi-candidate speculative decoding (Yang
et al. 2024) do for siblings drawn independently:

    accept d with probability min(1, p(d) / q(d)); on a rejection, p <- norm(max(0, p - q)) and try the next.

When every sampled sibling is rejected, the node's token is drawn from what is left of p, and the walk goes on
where a node of the tree holds it: a child that an n-gram or a top-k proposed (q a point mass) is kept with the
chance that draw gives it, exactly what testing it explicitly would give. Each step is one rejection sampler of
p_i with proposal q_i, so the node's token is distributed as the target's p whatever the siblings were (the
proof of Leviathan et al. 2023, applied once per sibling): the output is the target's distribution. A sampled
token is tested from its parent's row even where the round's budget left its own node out; it then ends the
round as the target's token.

Tokens drawn independently of their value is what the proof needs: a chain's existence here depends on its
prefix, p_min on q's top and the length limits, never on the token drawn.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.round.verify import Verdict, align_q, p_of, residual
from engine.sampling import Sampler


@dataclass(frozen=True)
class SiblingTry:
    """One sampled draft token tested at a node of the target's walk."""
    depth: int  # tokens already kept this round above it (0: right after the token sampled last round)
    token: int
    drafter: str
    p: float  # the target's probability of it there (after the siblings rejected before it)
    q: float  # the drafter's probability of it, the distribution it was drawn from
    accepted: bool


def siblings(tree, prefix: list[int]) -> list[tuple[int, str, torch.Tensor]]:
    """(token, drafter, q) of every sampled chain whose tokens start with `prefix` and go on past it."""
    d = len(prefix)
    return [(c.tokens[d], c.drafter, c.q[d]) for c in tree.sampled if len(c.tokens) > d and c.tokens[:d] == prefix]


def tree_rejection(sampler: Sampler, logits: torch.Tensor, tree) -> tuple[Verdict, list[int], list[SiblingTry]]:
    """logits: [1 + len(tree), V], row 0 the root, row i + 1 node i (as verify.tree_match). Returns the verdict,
    the kept path (node indices, root's child first) and each sibling tested, in order."""
    assert logits.shape[0] == len(tree) + 1, "need one logits row per tree node plus the root's"
    assert not sampler.greedy, "at temperature 0 the walk is argmax matching (verify.tree_match)"
    n_draws0 = sampler.n_draws
    tokens: list[int] = []
    p_target: list[float] = []
    path: list[int] = []
    tries: list[SiblingTry] = []
    node = -1
    while True:
        p_row = sampler.probs(logits[node + 1:node + 2])[0]
        p = p_row
        tok = None
        for d, drafter, q in siblings(tree, [tree.tokens[n] for n in path]):
            q = align_q(q.to(p.device, p.dtype), p.shape[-1])
            q_d = float(q[d]) if d < q.shape[-1] else 0.0
            p_d = p_of(p, d)
            u = sampler.uniform()  # from the target's stream: independent of how the draft was drawn
            ok = q_d > 0 and p_d > 0 and u * q_d <= p_d
            tries.append(SiblingTry(len(path), d, drafter, p_d, q_d, ok))
            if ok:
                tok = d
                break
            r = residual(p, q)
            p = r / r.sum()
        if tok is None:
            tok = sampler.sample_probs(p)
        tokens.append(tok)
        p_target.append(float(p_row[tok]))
        child = tree.child(node, tok)
        if child is None:
            break
        path.append(child)
        node = child
    verdict = Verdict(tokens=tokens, n_accepted=len(path), p_target=p_target,
                      p_draft_rows=[1.0 if i in path else 0.0 for i in range(len(tree))],
                      n_draws=sampler.n_draws - n_draws0)
    return verdict, path, tries
