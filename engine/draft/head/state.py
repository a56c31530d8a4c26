"""The draft head's stores for one sequence: the target's features and the head's own KV entries, both indexed
by position, so a rollback of the target is a cut of these lists (engine/draft/head/drafter.py)."""

from __future__ import annotations

import torch


class HeadSeqState:
    """One sequence's stores: target features and head KV entries, both indexed by position."""

    def __init__(self, n_feat: int, n_kv: int, head_dim: int, first: int = 0, device: torch.device | str = "cpu"):
        # entries before `first` are kept (their positions stay aligned with the tokens) but never attended to:
        # EAGLE-3 has no entry for a sequence's first token, which no target hidden state precedes
        self.first = first
        self.device = torch.device(device)  # the head's: every store lives beside its weights
        self.feats = torch.zeros(0, n_feat, device=device)  # [cap, layers*hidden] target features
        # token of the row that wrote each feature (-1: none)
        self.feat_tok = torch.zeros(0, dtype=torch.long, device=device)
        # head keys (RoPE applied) and values per position, entries 0..len(kv_tokens)-1 in use: stores that
        # grow by doubling, written in place, as a round adds one to four entries to each
        self.k_store = torch.zeros(0, n_kv, head_dim, device=device)
        self.v_store = torch.zeros(0, n_kv, head_dim, device=device)
        self.kv_tokens: list[int] = []  # token of each head KV entry

    def write(self, pos: torch.Tensor, tokens: torch.Tensor, feats: torch.Tensor, grow: int) -> None:
        """Features [n, n_feat] of the rows at positions `pos` (distinct) that held `tokens`."""
        self.reserve(int(pos.max()) + 1, grow)
        self.feats[pos] = feats
        self.feat_tok[pos] = tokens

    def write_run(self, p0: int, tokens: list[int], feats: torch.Tensor, grow: int) -> None:
        """Features [n, n_feat] of the rows at positions p0 .. p0 + n - 1 that held `tokens`."""
        self.reserve(p0 + len(tokens), grow)
        self.feats[p0:p0 + len(tokens)] = feats
        self.feat_tok[p0:p0 + len(tokens)] = torch.tensor(tokens, dtype=torch.long, device=self.device)

    @property
    def k(self) -> torch.Tensor:
        return self.k_store[self._lo():len(self.kv_tokens)]

    @property
    def v(self) -> torch.Tensor:
        return self.v_store[self._lo():len(self.kv_tokens)]

    def _lo(self) -> int:
        """The first attended entry; all of them where there are no others (a query needs a key)."""
        return self.first if len(self.kv_tokens) > self.first else 0

    def put_kv(self, k: torch.Tensor, v: torch.Tensor, tokens: list[int]) -> None:
        """Append entries k, v [n, kv_heads, d] of `tokens`."""
        start, end = len(self.kv_tokens), len(self.kv_tokens) + len(tokens)
        if end > self.k_store.shape[0]:
            size = max(end, 2 * self.k_store.shape[0], 64)
            self.k_store = torch.cat([self.k_store[:start], torch.zeros(size - start, *k.shape[1:], device=self.device)])
            self.v_store = torch.cat([self.v_store[:start], torch.zeros(size - start, *v.shape[1:], device=self.device)])
        self.k_store[start:end] = k
        self.v_store[start:end] = v
        self.kv_tokens += tokens

    def reserve(self, n: int, grow: int) -> None:
        if n <= self.feats.shape[0]:
            return
        extra = max(n - self.feats.shape[0], grow)
        self.feats = torch.cat([self.feats, torch.zeros(extra, self.feats.shape[1], device=self.device)])
        self.feat_tok = torch.cat([self.feat_tok, torch.full((extra,), -1, dtype=torch.long, device=self.device)])
