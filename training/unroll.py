"""EAGLE-3's training-time test (Li et al., "EAGLE-3: Scaling up Inference Acceleration of Large Language Models
via Training-Time Test", arXiv:2503.01840): run the head on whole sequences the way it drafts, step after step.

Step 1 at every position t reads the target's fused feature of t-1 and token t, attending causally to step-1
entries (these are exactly the entries the head's KV cache holds when it drafts: positions fed by the target).
Step j > 1 at base t stands for draft position j: it reads the head's own feature from step j-1 and token t+j-1,
at position t+j-1, and attends to the step-1 entries up to t plus its own chain's entries of steps 2..j at that
base. That is the attention pattern of drafting after position t, so deeper draft positions are trained on the
head's own (imperfect) features, not only on the target's.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from engine.draft.head.net import DraftHead


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2)  # [B, T, heads, d] -> [B, heads, T, d]


def unroll(head: DraftHead, feats: torch.Tensor, tokens: torch.Tensor, n_steps: int,
           dropout: float = 0.0, gen: torch.Generator | None = None) -> list[torch.Tensor]:
    """feats [B, T, layers*H] (target hidden states at each position), tokens [B, T].

    `dropout` (training only, drawn from `gen`) drops fused target features. Returns n_steps logits tensors
    [B, T, draft_vocab]; entry (b, t) of step j predicts the target's next token
    after position t + j - 1."""
    b, t_len = tokens.shape
    pos = torch.arange(t_len, device=tokens.device).expand(b, t_len)
    fused = head.fuse(feats)
    feat = torch.cat([torch.zeros_like(fused[:, :1]), fused[:, :-1]], dim=1)  # h(t-1) at t; none at 0
    if dropout > 0:
        # a few hundred answers of training data: without it the head memorises them
        keep = torch.rand(feat.shape, generator=gen) >= dropout
        feat = feat * keep / (1.0 - dropout)
    scale = 1.0 / math.sqrt(head.cfg.head_dim)
    causal = torch.ones(t_len, t_len, dtype=torch.bool, device=tokens.device).tril()
    out = []
    k1 = v1 = None
    chain_k: list[torch.Tensor] = []  # step-j keys at each base (expanded to all heads), j >= 2
    chain_v: list[torch.Tensor] = []
    for j in range(n_steps):
        shift = j
        tok_j = torch.cat([tokens[:, shift:], tokens.new_zeros(b, shift)], dim=1) if shift else tokens
        q, k, v = head.qkv(feat, tok_j, pos + shift)
        k, v = head.expand_kv(k), head.expand_kv(v)
        if j == 0:
            k1, v1 = _heads_first(k), _heads_first(v)
            attn = F.scaled_dot_product_attention(_heads_first(q), k1, v1, attn_mask=causal)
            attn = attn.transpose(1, 2)
        else:
            chain_k.append(k)
            chain_v.append(v)
            qh = _heads_first(q)
            s1 = (qh @ k1.transpose(-1, -2)) * scale  # [B, heads, T, T]
            s1 = s1.masked_fill(~causal, float("-inf"))
            diag = torch.stack([(q * ck).sum(-1) for ck in chain_k], dim=-1) * scale  # [B, T, heads, j]
            diag = diag.transpose(1, 2)  # [B, heads, T, j]
            p = torch.softmax(torch.cat([s1, diag], dim=-1), dim=-1)
            attn = p[..., :t_len] @ v1  # [B, heads, T, d]
            pv = torch.stack(chain_v, dim=-2)  # [B, T, heads, j, d]
            attn = attn + (p[..., t_len:].transpose(1, 2).unsqueeze(-1) * pv).sum(-2).transpose(1, 2)
            attn = attn.transpose(1, 2)
        g = head.finish(feat, attn.reshape(b, t_len, -1))
        out.append(head.logits(g))
        feat = g
    return out


def step_loss(logits: torch.Tensor, top_ids: torch.Tensor, top_p: torch.Tensor, t2d: torch.Tensor,
              valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft cross-entropy against the target's top-K distribution (mass outside the draft vocab is dropped),
    and top-1 agreement with the target. Returns (loss sum, correct count, valid count)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    d_ids = t2d[top_ids.long()]  # [B, T, K], -1 outside the draft vocab
    in_vocab = d_ids >= 0
    picked = logp.gather(-1, d_ids.clamp(min=0))
    w = top_p.float() * in_vocab * valid.unsqueeze(-1)
    loss = -(picked * w).sum()
    best = logits.argmax(-1)
    correct = ((best == d_ids[..., 0]) & in_vocab[..., 0] & valid).sum()
    return loss, correct, valid.sum()
