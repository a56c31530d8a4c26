"""Deciding how much of a draft the target keeps.

Notation, used everywhere in this project: p = the target's distribution, q = the draft's distribution.

The target ran one forward over [sampled, d1..dk]; row i of `logits` is p for the token after row i's token,
so row i judges d(i+1) and row k gives the bonus token. Every function returns the emitted tokens: the m
accepted draft tokens followed by exactly one token chosen by the target (the correction or the bonus), so a
round always makes progress.

* sample-and-match: draw from p row by row (one uniform per emitted token, as plain sampling does) and keep the
  draft token while it equals the draw. At temp 0 this is argmax matching. Same seed, same text as plain decoding.
* rejection sampling: accept d with probability min(1, p(d)/q(d)); on rejection draw from norm(max(0, p - q)).
  The output is distributed exactly as p (Leviathan et al. 2023), and accepts more than matching when the
  draft samples.
* grammar: with `allowed` (bool [k+1, V], row i = what the grammar allows after the draft tokens before row
  i), every row's logits are masked to -inf outside it before the sampler's softmax, which renormalises p over
  the allowed ids; rejection sampling masks and renormalises q likewise (`mask_q`). The chain has cut the draft
  at its first forbidden token, so every draft token is allowed where it stands.
* tree match: sample-and-match over a tree of drafts (engine/draft/tree.py). From the root row, draw the target's
  token; where a child holds it, keep it and go on from the child's row. One uniform per emitted token, as plain
  sampling, so the same seed gives the same text, where every draft is deterministic (n-grams, a top-k tree).
  Where a drafter drew its chain from q at temperature > 0, the tree is verified by rejection sampling over the
  siblings instead (engine/round/tree_rejection.py): the same distribution, more of the draws kept.
* replay: after a checkpoint restore, re-run the sampler over already decided tokens so its stream advances
  exactly as it did the first time, deciding nothing new.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.sampling import Sampler, argmax_rows


@dataclass
class Verdict:
    tokens: list[int]  # emitted: accepted draft tokens then the target's token
    n_accepted: int  # draft tokens kept (len(tokens) - 1)
    p_target: list[float]  # p of each emitted token under the target (for display)
    p_draft_rows: list[float]  # p of each draft token under the target, rows 0..k-1 (for display)
    n_draws: int = 0  # uniforms taken from the sampler's stream (a replay takes as many)
    uniforms: list[float] = field(default_factory=list)  # rejection sampling: the uniform u drawn for each judged d
    # rejection sampling, after a rejection: the residual norm(max(0, p - q))'s most likely tokens (id, probability)
    residual_top: list[tuple[int, float]] = field(default_factory=list)


RESIDUAL_SHOWN = 5  # tokens of the residual an explained event carries (GenParams.explain)


def p_of(probs: torch.Tensor, token: int) -> float:
    """The target's probability of a draft token; a draft vocabulary may be wider, and ids past the target's
    carry no target probability."""
    return float(probs[token]) if token < probs.shape[-1] else 0.0


def align_q(q: torch.Tensor, width: int) -> torch.Tensor:
    """The draft distribution over the target's ids: the vocabulary check lets the draft's logits be narrower
    (its missing ids have q = 0) or wider (mass on ids the target lacks only makes the draft rejected there)."""
    if q.shape[-1] >= width:
        return q[..., :width]
    return torch.nn.functional.pad(q, (0, width - q.shape[-1]))


def apply_mask(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """logits with the ids a grammar forbids at -inf: the softmax after it is p renormalised over the rest."""
    return logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))


def mask_q(q: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """The draft distribution given that its token is allowed: a drafted token the grammar forbids never reaches
    verification (the chain cuts the draft there, and the target samples that row from its own masked p), so
    the tokens verified were drawn from q conditioned on the allowed set, q * allowed / Z. Without dividing by
    Z, min(1, p/q) accepts too often and the residual misses mass: the output is no longer p. q: [V] aligned
    to the target's width (align_q)."""
    if allowed is None:
        return q
    q = q * allowed.to(q.dtype)
    z = q.sum()
    return q / z if float(z) > 0 else q


def sample_and_match(sampler: Sampler, logits: torch.Tensor, draft: list[int],
                     allowed: torch.Tensor | None = None, top: list[int] | None = None) -> Verdict:
    """logits: [k+1, V]; draft: k tokens; allowed: the grammar's masks per row (None: unconstrained); top: the
    rows' argmax if the caller has it (the round's event shows it: one pass over the rows, not two)."""
    assert logits.shape[0] == len(draft) + 1, "need one logits row per draft token plus the bonus row"
    if sampler.greedy and allowed is None and top is not None:
        return _greedy_match(logits, draft, top)
    logits = apply_mask(logits, allowed)
    if sampler.greedy:
        return _greedy_match(logits, draft)
    probs = sampler.probs(logits)  # [k+1, V]
    n_draws0 = sampler.n_draws
    tokens: list[int] = []
    p_target: list[float] = []
    for i in range(len(draft) + 1):
        tok = argmax_rows(probs[i])[0] if sampler.greedy else sampler.sample_probs(probs[i])
        tokens.append(tok)
        p_target.append(float(probs[i, tok]))
        if i == len(draft) or tok != draft[i]:
            break
    p_draft_rows = [p_of(probs[i], d) for i, d in enumerate(draft)]
    return Verdict(tokens=tokens, n_accepted=len(tokens) - 1, p_target=p_target, p_draft_rows=p_draft_rows,
                   n_draws=sampler.n_draws - n_draws0)


def _greedy_match(logits: torch.Tensor, draft: list[int], best: list[int] | None = None) -> Verdict:
    """sample_and_match at temperature 0, where p is one-hot at each row's argmax: one argmax over all rows
    instead of building the one-hot rows (a round's fixed cost, which a fast forward makes visible)."""
    if best is None:
        best = argmax_rows(logits)  # the first maximum, as the one-hot p would put it
    tokens: list[int] = []
    for i in range(len(draft) + 1):
        tokens.append(int(best[i]))
        if i == len(draft) or best[i] != draft[i]:
            break
    return Verdict(tokens=tokens, n_accepted=len(tokens) - 1, p_target=[1.0] * len(tokens),
                   p_draft_rows=[1.0 if d == best[i] else 0.0 for i, d in enumerate(draft)], n_draws=0)


def tree_match(sampler: Sampler, logits: torch.Tensor, tree, top: list[int] | None = None
               ) -> tuple[Verdict, list[int]]:
    """logits: [1 + len(tree), V], row 0 the root (id_last), row i + 1 node i; top: their argmax per row if the
    caller has it (the round's event shows it: one pass over the rows, not two). Returns the verdict and the
    kept path (node indices, root's child first)."""
    assert logits.shape[0] == len(tree) + 1, "need one logits row per tree node plus the root's"
    greedy = sampler.greedy
    best = (top if top is not None else argmax_rows(logits)) if greedy else None
    n_draws0 = sampler.n_draws
    tokens: list[int] = []
    p_target: list[float] = []
    path: list[int] = []
    node = -1
    while True:
        row = node + 1
        if greedy:
            tok, p = int(best[row]), 1.0
        else:
            probs = sampler.probs(logits[row:row + 1])[0]
            tok = sampler.sample_probs(probs)
            p = float(probs[tok])
        tokens.append(tok)
        p_target.append(p)
        child = tree.child(node, tok)
        if child is None:
            break
        path.append(child)
        node = child
    verdict = Verdict(tokens=tokens, n_accepted=len(path), p_target=p_target,
                      p_draft_rows=[1.0 if i in path else 0.0 for i in range(len(tree))],
                      n_draws=sampler.n_draws - n_draws0)
    return verdict, path


def rejection(sampler: Sampler, logits: torch.Tensor, draft: list[int], q: list[torch.Tensor],
              allowed: torch.Tensor | None = None, residual_shown: int = 0) -> Verdict:
    """Speculative sampling. logits: [k+1, V]; q: k distributions [V] the draft tokens were sampled from;
    allowed: the grammar's masks per row (None: unconstrained); residual_shown: after a rejection, how many of
    the residual's most likely tokens the verdict records (for the page; 0: none)."""
    assert logits.shape[0] == len(draft) + 1 and len(q) == len(draft)
    if sampler.greedy:
        # at temp 0, p and q are point masses: min(1, p/q) is 0 or 1, i.e. matching
        return sample_and_match(sampler, logits, draft, allowed)
    probs = sampler.probs(apply_mask(logits, allowed))
    n_draws0 = sampler.n_draws
    tokens: list[int] = []
    p_target: list[float] = []
    uniforms: list[float] = []
    shown: list[tuple[int, float]] = []
    for i, d in enumerate(draft):
        p_i = probs[i]
        q_i = align_q(q[i].to(probs.device, probs.dtype), p_i.shape[-1])  # the draft may run on another device
        if allowed is not None:
            q_i = mask_q(q_i, allowed[i])
        q_d = float(q_i[d]) if d < q_i.shape[-1] else 0.0
        p_d = p_of(p_i, d)
        # the uniform comes from the target sampler's own stream: independent of how the draft was drawn
        u = sampler.uniform()
        uniforms.append(u)
        # p_d > 0: a uniform of exactly 0 must not keep a token the target cannot emit (or does not even have)
        if q_d > 0 and p_d > 0 and u * q_d <= p_d:
            tokens.append(d)
            p_target.append(p_d)
            continue
        left = residual(p_i, q_i)
        tok = sampler.sample_probs(left)
        tokens.append(tok)
        p_target.append(float(p_i[tok]))
        if residual_shown:
            top = torch.topk(left / left.sum(), min(residual_shown, left.shape[-1]))
            shown = list(zip(top.indices.tolist(), top.values.tolist()))
        break
    else:
        tok = sampler.sample_probs(probs[len(draft)])
        tokens.append(tok)
        p_target.append(float(probs[len(draft), tok]))
    p_draft_rows = [p_of(probs[i], d) for i, d in enumerate(draft)]
    return Verdict(tokens=tokens, n_accepted=len(tokens) - 1, p_target=p_target, p_draft_rows=p_draft_rows,
                   n_draws=sampler.n_draws - n_draws0, uniforms=uniforms, residual_top=shown)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where to draw from after a rejection: max(0, p - q), normalised by the sampler. Drawing from p instead
    would give the draft's tokens a second chance and tilt the output towards q."""
    r = torch.clamp(p - q, min=0.0)
    return r if float(r.sum()) > 0.0 else p  # p == q where it matters: the residual is undefined, p is right


def synthetic(sampler: Sampler, logits: torch.Tensor, draft: list[int], p_accept: float | tuple[float, ...],
              gen: torch.Generator, allowed: torch.Tensor | None = None) -> Verdict:
    """Keep each draft token with probability `p_accept` whatever it is (a tuple: position i's own, the last for
    the positions past it), then one token of the target.

    Only for measuring how speed depends on acceptance (llama.cpp's synthetic acceptance): the text is not the
    target's. The coins come from `gen`, not the sampler, so the sampler still draws once per target token."""
    assert logits.shape[0] == len(draft) + 1
    coins = torch.rand(len(draft), generator=gen, device=gen.device).tolist()
    rates = p_accept if isinstance(p_accept, tuple) else (p_accept,)
    m = 0
    while m < len(draft) and coins[m] < rates[min(m, len(rates) - 1)]:
        m += 1
    probs = sampler.probs(apply_mask(logits, allowed))
    n_draws0 = sampler.n_draws
    tok = argmax_rows(probs[m])[0] if sampler.greedy else sampler.sample_probs(probs[m])
    p_target = [float(probs[i, d]) for i, d in enumerate(draft[:m])] + [float(probs[m, tok])]
    return Verdict(tokens=draft[:m] + [tok], n_accepted=m, p_target=p_target,
                   p_draft_rows=[float(probs[i, d]) for i, d in enumerate(draft)],
                   n_draws=sampler.n_draws - n_draws0)


def replay(sampler: Sampler, decided: list[int], n_draws: int) -> list[int]:
    """Advance a restored sampler past `decided` tokens without choosing anything: the checkpoint path.

    The first verification took `n_draws` uniforms from the stream; taking as many again leaves the sampler
    exactly where it was after that verification, so the next round draws what it would have drawn.
    """
    for _ in range(n_draws):
        sampler.uniform()
    return list(decided)
