"""draft-dflash and draft-dspark: block drafters that propose a whole block in one forward (llama.cpp's
common_speculative_impl_draft_dflash, which serves both; the network is engine/draft/dflash_net.py).

Each confirmed position gets one context entry per draft layer, made from the target's features there: its
hidden states at the layers the checkpoint names, fused at once (g = hidden_norm(fc(features)), one vector of
the draft's width rather than several of the target's) and kept by position in `process()`, so that whatever
rollback path the target took, the confirmed positions hold the confirmed tokens' features. The entries live in a cell
cache (engine/memory/cells.py), rolled back with seq_rm to the confirmed tokens they still agree with and
caught up at `draft()`, as llama.cpp's draft context holds them. The block's own rows never enter the cache:
their keys and values are computed and read within the one forward (llama.cpp writes them and removes them
again with seq_rm after the draft).

A block is always the trained block_size rows, [id_last, mask * (block_size - 1)] at positions n .. n + B - 1
(z-lab's dflash_generate; llama.cpp sizes it by n_max, which the length policy varies round by round, and a
block's rows read one another). DFlash reads rows 1 .. B - 1 in place: row i proposes the token at n + i.
DSpark's anchor-first layout (`sample_from_anchor`) reads rows 0 .. B - 1, row i proposing the token after
its own position; its bonus-anchor layout reads rows 1 .. B - 1 as DFlash does. DSpark's Markov head conditions
each row on the token drafted before it, so its rows are chosen one after another from the one forward's
logits; where the target samples, the bias follows the sampled token (llama.cpp's in-graph chain follows the
argmax), so q is the distribution each token was drawn from and rejection sampling stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.batch import Batch
from engine.draft.features import FeatureLifecycle, FeatureRows
from engine.draft.base import Drafter, DraftRequest, DraftStreams, choose_draft
from engine.draft.dflash_net import DFlashNet
from engine.draft.lin_path import resolve
from engine.memory.cells import CellCache
from engine.prefix import common_prefix


@dataclass
class DFlashParams:
    # the checkpoint: a directory in the authors' layout or llama.cpp's GGUF (--draft PATH)
    weights: Path | None = None
    top_k: int = 10  # candidates kept in q when the target samples (llama.cpp's draft sampler keeps 10)
    # stop below this top probability (DSpark with a confidence head: below this confidence) when the request
    # leaves it to the drafter; llama.cpp's default 0: a block costs one forward whatever its length, and the
    # length policy cuts what does not pay
    p_min: float = 0.0
    n_ctx: int = 4096  # context entries per sequence (the engine's cache)
    n_seq_max: int = 4
    grow: int = 256  # positions added at a time to a sequence's feature store
    # the linears' arithmetic (engine/draft/lin_path.py): "auto" times the target's paths here at load
    dtype: str = "auto"


@dataclass
class BlockSeq(FeatureRows):
    """One sequence: the fused target features g per position ([cap, draft hidden]), and the confirmed tokens
    whose entries the cache holds."""

    tokens: list[int] = field(default_factory=list)


class DFlashDrafter(FeatureLifecycle, Drafter):
    name = "draft-dflash"
    kind = "dflash"  # the checkpoint kind this drafter runs (DFlashCheckpoint.kind)
    needs_model = True
    gives_q = True  # every row's distribution is over the target's vocabulary

    def __init__(self, target=None, params: DFlashParams | None = None):
        from engine.load.dflash import read_dflash

        if target is None:
            raise ValueError(f"{self.name} needs the target model (its hidden states, embeddings and LM head)")
        self.params = params or DFlashParams()
        if self.params.weights is None:
            raise ValueError(f"{self.name} needs a DFlash or DSpark checkpoint (--draft DIR or FILE.gguf)")
        ck = read_dflash(self.params.weights)
        if ck.kind != self.kind:
            other = "draft-dspark" if ck.kind == "dspark" else "draft-dflash"
            raise ValueError(f"{self.name}: {self.params.weights} is a {ck.kind} checkpoint "
                             f"({'with' if ck.kind == 'dspark' else 'without'} a Markov head): it drafts as {other}")
        self.net = DFlashNet(ck, *_tables(ck, target))
        # the block's rows and a round's catch-up of one or a few: the sizes its linears multiply
        self.lin_path = resolve(self.params.dtype, list(self.net.lin.values()), getattr(target, "dtype", "float32"),
                                (1, ck.block_size), self.name)
        self.ck = ck
        self.hidden_layers = ck.hidden_layers
        self.cache = CellCache(n_layers=ck.n_layers, n_kv_heads=ck.n_kv_heads, head_dim=ck.head_dim,
                               n_cells=self.params.n_seq_max * self.params.n_ctx, n_seq_max=self.params.n_seq_max)
        self.states: dict[int, BlockSeq] = {}
        self.streams = DraftStreams()

    def _state(self, seq: int) -> BlockSeq:
        if seq not in self.states:
            self.states[seq] = BlockSeq(torch.zeros(0, self.ck.hidden), torch.zeros(0, dtype=torch.long))
        return self.states[seq]

    def _cut(self, seq: int, n: int) -> None:
        """Keep the context entries of the first n positions of `seq`."""
        st = self._state(seq)
        if len(st.tokens) > n:
            self.cache.seq_rm(seq, n, -1)
            del st.tokens[n:]

    # ---- lifecycle (retune, seq_rm, seq_cp: FeatureLifecycle) ---------------------------------------------

    def begin(self, seq: int, prompt: list[int]) -> None:
        self.streams.restart(seq)  # entries that agree with the new prompt stay (checked at draft())

    def process(self, batch: Batch, result=None) -> None:
        if result is None or result.hidden is None:
            return
        seqs, pos, toks = (torch.tensor(x, dtype=torch.long) for x in (batch.seq, batch.pos, batch.tokens))
        with torch.inference_mode():
            feats = self.net.fuse(result.hidden_of(self.hidden_layers).float().cpu())  # the draft runs on the CPU
            for seq in seqs.unique().tolist():
                mine = seqs == seq
                st = self._state(seq)
                st.reserve(int(pos[mine].max()) + 1, self.params.grow)
                st.feats[pos[mine]] = feats[mine]  # a later row at a position overwrites
                st.feat_tok[pos[mine]] = toks[mine]

    # ---- the forward ------------------------------------------------------------------------------------

    def _catch_up(self, requests: list[DraftRequest]) -> None:
        """Context entries for every confirmed position before id_last, computed for all requests at once."""
        batch, feats = Batch(), []
        for r in requests:
            st = self._state(r.seq)
            keep = common_prefix(st.tokens, r.prompt)
            self._cut(r.seq, keep)
            if keep == len(r.prompt):
                continue
            st.reserve(len(r.prompt), self.params.grow)
            src = torch.arange(keep, len(r.prompt))
            # a position the target never forwarded with this token (none, in a plain run) gets g = 0, what zero
            # features fuse to
            known = st.feat_tok[src] == torch.tensor(r.prompt[keep:])
            feats.append(st.feats[src] * known[:, None])
            for p in range(keep, len(r.prompt)):
                batch.add(r.prompt[p], p, r.seq, False)
            st.tokens = list(r.prompt)
        if not len(batch):
            return
        self.cache.claim(batch)
        try:
            for i, (k, v) in enumerate(self.net.context_kv(torch.cat(feats), torch.tensor(batch.pos))):
                self.cache.update(k.transpose(0, 1)[None], v.transpose(0, 1)[None], i)
        except Exception:
            self.cache.rollback_claim()
            raise

    def _block_rows(self, requests: list[DraftRequest]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every request's block, side by side: tokens, positions and which context cell or row each reads."""
        b = self.ck.block_size
        tokens = torch.tensor([t for r in requests for t in [r.id_last] + [self.ck.mask_token_id] * (b - 1)])
        pos = torch.tensor([len(r.prompt) + i for r in requests for i in range(b)])
        seqs = torch.tensor([r.seq for r in requests for _ in range(b)])
        n_live = self.cache.n_live
        cell_pos = self.cache.cell_pos[:n_live]
        n_row = torch.tensor([len(r.prompt) for r in requests for _ in range(b)])  # each row's id_last position
        ctx = self.cache.cell_seq[:n_live][:, seqs].T & (cell_pos >= 0)[None] & (cell_pos[None] < n_row[:, None])
        own = seqs[:, None] == seqs[None]
        if self.ck.causal:
            own &= pos[None] <= pos[:, None]
        return tokens, pos, torch.cat([ctx, own], 1)

    def _choose(self, r: DraftRequest, logits: torch.Tensor):
        """(token, p of the top candidate, p of the token, q or None) from one row's logits [vocab]."""
        return choose_draft(r, logits, self.params.top_k, self.streams)

    def _first_row(self) -> int:
        return 1  # rows 1 .. B - 1 propose the masked positions in place

    def _read(self, r: DraftRequest, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """Fill r's result from its block's logits [B, vocab] (and final hidden states [B, hidden])."""
        for row in range(self._first_row(), self.ck.block_size):
            if len(r.result) >= r.draft_max:
                return
            tok, p_top, p_tok, q = self._choose(r, logits[row])
            if p_top < r.p_min_or(self.params.p_min):
                return
            r.take(tok, p_tok, q)

    @torch.inference_mode()
    def draft(self, requests: list[DraftRequest]) -> None:
        for r in requests:
            if not 0 <= r.seq < self.params.n_seq_max:
                raise ValueError(f"{self.name}'s cache holds {self.params.n_seq_max} sequences, got seq {r.seq}")
            r.result, r.result_p = [], []
            r.result_q = [] if r.want_q else None
        live = [r for r in requests if r.draft_max > 0]
        if not live:
            return
        self._catch_up(live)
        tokens, pos, visible = self._block_rows(live)
        n_live = self.cache.n_live
        ctx = [(k[0, :, :n_live], v[0, :, :n_live]) for k, v in zip(self.cache.k, self.cache.v)]
        hidden = self.net.block(tokens, pos, ctx, visible)
        logits = self.net.logits(hidden)
        b = self.ck.block_size
        for i, r in enumerate(live):
            self._read(r, logits[i * b:(i + 1) * b], hidden[i * b:(i + 1) * b])


class DSparkDrafter(DFlashDrafter):
    """DFlash's block with DSpark's Markov head (and confidence head, where the checkpoint has one)."""

    name = "draft-dspark"
    kind = "dspark"

    def _first_row(self) -> int:
        return 0 if self.ck.sample_from_anchor else 1

    def _read(self, r: DraftRequest, logits: torch.Tensor, hidden: torch.Tensor) -> None:
        """Row by row, each biased by the Markov head on the token before it: id_last, then each drafted token.
        With a confidence head p_min bounds the confidence (llama.cpp's draft-dspark); without one, the top
        probability, as draft-dflash's."""
        prev = r.id_last
        p_min = r.p_min_or(self.params.p_min)
        for row in range(self._first_row(), self.ck.block_size):
            if len(r.result) >= r.draft_max:
                return
            if self.ck.has_confidence and p_min > 0 and self.net.confidence(hidden[row], prev) < p_min:
                return
            tok, p_top, p_tok, q = self._choose(r, logits[row] + self.net.markov_bias(prev))
            if not self.ck.has_confidence and p_top < p_min:
                return
            r.take(tok, p_tok, q)
            prev = tok


def _tables(ck, target) -> tuple[torch.Tensor, object, int]:
    """(token table, LM head as a callable, target vocabulary): the checkpoint's own where it has them, else the
    target's; ValueError where the checkpoint does not fit the target."""
    cfg = target.model.config.get_text_config()
    vocab, width, n_layers = int(cfg.vocab_size), int(cfg.hidden_size), int(cfg.num_hidden_layers)
    where = "the DFlash checkpoint"
    if int(ck.tensors["fc"].shape[1]) != width * len(ck.hidden_layers):
        raise ValueError(f"{where} fuses {len(ck.hidden_layers)} features into {ck.tensors['fc'].shape[1]} inputs; "
                         f"this target's hidden states are {width} wide: it was trained for another target")
    bad = [i for i in ck.hidden_layers if not 0 < i < n_layers]
    if bad:
        raise ValueError(f"{where} reads the inputs of layers {bad}; this target has {n_layers} layers")
    table = target.model.get_input_embeddings().weight.detach()
    embed = ck.tensors.get("embed")
    if embed is None:
        embed = table
    own = ck.tensors.get("lm_head")
    module = target.model.get_output_embeddings()
    rows, head_width = (own.shape if own is not None else (vocab, module.in_features))
    if int(embed.shape[1]) != ck.hidden or int(head_width) != ck.hidden:
        raise ValueError(f"{where} is {ck.hidden} wide; the token table and LM head it reads are "
                         f"{embed.shape[1]} and {head_width}")
    if not 0 <= ck.mask_token_id < embed.shape[0]:
        raise ValueError(f"{where}: mask_token_id {ck.mask_token_id} is outside the token table ({embed.shape[0]})")
    if ck.d2t is not None and (len(ck.d2t) != rows or int(ck.d2t.max()) >= vocab or int(ck.d2t.min()) < 0):
        raise ValueError(f"{where}: d2t does not map its {rows} draft rows into the target's {vocab} ids")
    if "markov_w1" in ck.tensors and (ck.tensors["markov_w1"].shape[0] < vocab
                                      or ck.tensors["markov_w2"].shape[0] != rows):
        raise ValueError(f"{where}: the Markov head's tables do not match the vocabularies ({vocab}, {rows})")
    dtype, device = table.dtype, table.device  # the target's, wherever it runs; the draft runs on the CPU
    if own is not None:  # DFlashNet makes it a linear
        return embed, own, vocab
    return embed, lambda h: module(h.to(device=device, dtype=dtype)).float().cpu()[..., :vocab], vocab
