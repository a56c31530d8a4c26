"""The DFlash / DSpark draft network's equations (z-lab/dflash dflash/model.py; llama.cpp src/models/dflash.cpp).

Context: the target features of a confirmed position p (the chosen layers' hidden states side by side) are fused
once, g = hidden_norm(fc(features)), and every layer keeps k_norm(W_k g) roped at p and W_v g as that position's
key and value: no query, no MLP, nothing per token. Block: the rows [id_last, mask, ..., mask] at positions
n .. n + B - 1 (n: id_last's) run through Qwen3 decoder layers whose queries, keys and values come from the
rows' own embeddings, attending to the context entries and to every row of their block (not causally, unless
the checkpoint says so); the final norm and the LM head give a distribution per row. DSpark adds to row i's
logits the low-rank Markov bias W2 W1[prev_i], prev_i the token before the position row i proposes, and
optionally a confidence sigmoid(w_c . [h_i; W1[prev_i]] + b_c) that the draft goes on being accepted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.load.dflash import DFlashCheckpoint


class DFlashNet:
    """The checkpoint's weights (float32) with the token table and LM head it reads, the target's where it
    carries none (the head as a callable: the target's may be a packed linear, engine/forward/prepack.py);
    `vocab`: the target's vocabulary, over which every row's logits are given."""

    def __init__(self, ck: DFlashCheckpoint, embed: torch.Tensor, lm_head, vocab: int):
        self.ck = ck
        self.w = ck.tensors
        self.embed = embed  # [vocab rows, hidden], any dtype: rows are cast when read
        self.vocab = vocab
        half = torch.arange(0, ck.head_dim, 2, dtype=torch.float32) / ck.head_dim
        self.inv_freq = 1.0 / (ck.rope_theta ** half)
        # the dense weights as linears (engine/draft/lin_path.py may run them packed, in bfloat16 or int8); per
        # layer the block's q, k, v in one and the MLP's gate and up in another: fewer calls a block
        w = self.w
        self.lin = {"fc": _linear(w["fc"])}
        for i in range(ck.n_layers):
            p = f"layers.{i}."
            self.lin.update({p + "qkv": _linear(torch.cat([w[p + n] for n in "qkv"])), p + "k": _linear(w[p + "k"]),
                             p + "v": _linear(w[p + "v"]), p + "o": _linear(w[p + "o"]),
                             p + "gate_up": _linear(torch.cat([w[p + "gate"], w[p + "up"]])),
                             p + "down": _linear(w[p + "down"])})
        if isinstance(lm_head, torch.Tensor):  # the checkpoint's own LM head
            self.lin["lm_head"] = lm_head = _linear(lm_head)
        self.lm_head = lm_head  # [R, hidden] -> [R, draft vocab]

    # ---- pieces ----------------------------------------------------------------------------------------------

    def rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.ck.rms_eps))

    def angles(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [T, 1, head_dim] at positions pos [T], each half of the head the same."""
        angles = pos.float()[:, None] * self.inv_freq[None]
        return tuple(torch.cat([f(angles)] * 2, -1)[:, None] for f in (torch.cos, torch.sin))

    def rope(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x [T, heads, head_dim] rotated by `angles`, rotate-half (NeoX) pairing."""
        cos, sin = cos_sin
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], -1) * sin

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        return x.view(x.shape[0], n, self.ck.head_dim)

    # ---- context entries -------------------------------------------------------------------------------------

    def fuse(self, feats: torch.Tensor) -> torch.Tensor:
        """g [T, hidden] = hidden_norm(fc(features)) of target features [T, n_features * target hidden]."""
        return self.rms(self.lin["fc"](feats.float()), self.w["hidden_norm"])

    def context_kv(self, g: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K [T, kv heads, head_dim] roped, V [T, kv heads, head_dim]) of context rows whose fused
        features are g [T, hidden] (`fuse`) at positions pos [T]."""
        w, ck = self.w, self.ck
        cos_sin, out = self.angles(pos), []
        for i in range(ck.n_layers):
            k = self.rms(self._heads(self.lin[f"layers.{i}.k"](g), ck.n_kv_heads), w[f"layers.{i}.k_norm"])
            out.append((self.rope(k, cos_sin), self._heads(self.lin[f"layers.{i}.v"](g), ck.n_kv_heads)))
        return out

    # ---- the block -------------------------------------------------------------------------------------------

    def _attend(self, i: int, x: torch.Tensor, cos_sin, ctx, visible: torch.Tensor) -> torch.Tensor:
        """Layer i's attention of the block rows x [R, hidden] over the context entries ctx (K, V [kv heads,
        L, head_dim]) and the block's own rows; visible [R, L + R] says which each row reads."""
        w, ck = self.w, self.ck
        n_q, n_kv = ck.n_heads * ck.head_dim, ck.n_kv_heads * ck.head_dim
        q, k, v = self.lin[f"layers.{i}.qkv"](x).split([n_q, n_kv, n_kv], -1)
        q = self.rope(self.rms(self._heads(q, ck.n_heads), w[f"layers.{i}.q_norm"]), cos_sin)
        k = self.rope(self.rms(self._heads(k, ck.n_kv_heads), w[f"layers.{i}.k_norm"]), cos_sin)
        keys = torch.cat([ctx[0], k.transpose(0, 1)], 1)  # [kv heads, L + R, head_dim]
        values = torch.cat([ctx[1], self._heads(v, ck.n_kv_heads).transpose(0, 1)], 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), keys, values, attn_mask=visible[None],
                                             enable_gqa=ck.n_heads != ck.n_kv_heads)
        return self.lin[f"layers.{i}.o"](out.transpose(0, 1).reshape(x.shape[0], -1))

    def block(self, tokens: torch.Tensor, pos: torch.Tensor, ctx: list, visible: torch.Tensor) -> torch.Tensor:
        """The final-normed hidden states [R, hidden] of block rows tokens [R] at pos [R]; ctx: per layer the
        context entries (K, V [kv heads, L, head_dim]) the rows may read, visible [R, L + R] (bool)."""
        w, cos_sin = self.w, self.angles(pos)
        x = self.embed[tokens.to(self.embed.device)].float().cpu()
        for i in range(self.ck.n_layers):
            x = x + self._attend(i, self.rms(x, w[f"layers.{i}.attn_norm"]), cos_sin, ctx[i], visible)
            gate, up = self.lin[f"layers.{i}.gate_up"](self.rms(x, w[f"layers.{i}.ffn_norm"])).chunk(2, -1)
            x = x + self.lin[f"layers.{i}.down"](F.silu(gate) * up)
        return self.rms(x, w["norm"])

    # ---- heads -----------------------------------------------------------------------------------------------

    def _to_target(self, draft_rows: torch.Tensor, fill: float) -> torch.Tensor:
        """[..., draft vocab] -> [..., target vocab]: through d2t where the draft has a reduced vocabulary."""
        if self.ck.d2t is None:
            return draft_rows[..., : self.vocab]
        out = draft_rows.new_full((*draft_rows.shape[:-1], self.vocab), fill)
        out[..., self.ck.d2t] = draft_rows
        return out

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[R, target vocab] float32; -inf on the ids a reduced draft vocabulary lacks."""
        return self._to_target(self.lm_head(h).float(), float("-inf"))

    def markov_bias(self, prev: int) -> torch.Tensor:
        """DSpark's bias [target vocab] for the position after token `prev`: W2 W1[prev]."""
        return self._to_target(self.w["markov_w2"] @ self.w["markov_w1"][prev], 0.0)

    def confidence(self, h: torch.Tensor, prev: int) -> float:
        """DSpark's confidence head on a row's final-normed hidden state h [hidden] after token `prev`."""
        feat = torch.cat([h.float(), self.w["markov_w1"][prev]])
        z = self.w["conf_proj"][0] @ feat + (self.w["conf_bias"][0] if "conf_bias" in self.w else 0.0)
        return float(torch.sigmoid(z))


def _linear(weight: torch.Tensor) -> nn.Linear:
    """A frozen bias-free linear holding `weight` [out, in] as float32."""
    module = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="cpu")
    module.weight = nn.Parameter(weight.float().contiguous(), requires_grad=False)
    return module.eval()
