"""The target's features by position, as a drafter that reads the target's hidden states keeps them for one
sequence (draft-head, draft-mtp, the block drafters): a store per position and the token of the row that wrote
each, so a rollback is a cut and a prompt prefix shared with seq_cp is copied, not forwarded again."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FeatureRows:
    """One sequence's features: feats[p] was written by the row at position p, which held token feat_tok[p]."""

    feats: torch.Tensor  # [cap, width] a feature vector per position
    feat_tok: torch.Tensor  # [cap] the token of the row that wrote it (-1: none)

    def reserve(self, n: int, grow: int) -> None:
        """Room for positions 0 .. n - 1, growing by at least `grow` rows at a time."""
        if n <= self.feats.shape[0]:
            return
        extra = max(n - self.feats.shape[0], grow)
        self.feats = torch.cat([self.feats, self.feats.new_zeros(extra, self.feats.shape[1])])
        self.feat_tok = torch.cat([self.feat_tok, self.feat_tok.new_full((extra,), -1)])


def copy_prefix(dst, src, n: int, grow: int) -> None:
    """dst's features at positions 0 .. n - 1 from src's (both with feats, feat_tok and reserve): the prefix the
    two sequences share after seq_cp, which is never forwarded for dst."""
    with torch.inference_mode():  # the stores hold the forward's inference tensors
        dst.reserve(n, grow)
        m = min(n, src.feats.shape[0])
        dst.feats[:m] = src.feats[:m]
        dst.feat_tok[:m] = src.feat_tok[:m]


class FeatureLifecycle:
    """The part of the drafter lifecycle that drafters keeping FeatureRows per sequence share (draft-mtp, the
    block drafters). A drafter using it has `states` (seq -> its rows), `_state(seq)`, `_cut(seq, n)` (keep the
    first n positions' entries), `streams` (DraftStreams) and `params.grow`. Features stay past seq_rm: a
    parked slot's cells may serve its next prompt, whose prefix is then not forwarded again."""

    def retune(self, seq: int, temp: float, seed: int) -> None:
        self.streams.retune(seq, temp, seed)

    def seq_rm(self, seq: int) -> None:
        self._cut(seq, 0)
        self.streams.forget(seq)

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        if src in self.states and n > 0:
            copy_prefix(self._state(dst), self._state(src), n, self.params.grow)
