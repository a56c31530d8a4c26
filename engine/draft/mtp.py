"""draft-mtp: the target's own multi-token-prediction layers (DeepSeek-V3's "NextN") as a drafter.

MTP layer k at position p reads the token at p and the representation of p - 1 one depth lower: the target's
final hidden state for k = 0, layer k - 1's output for k > 0 (DeepSeek-V3 report, section 2.2; transformers'
MtpModel.forward): g_k[p] = layer_k(token[p], g_{k-1}[p - 1]), g_{-1} = the target's hidden states, and the
shared LM head on g_k[n + k] proposes the token at n + k + 1, n being id_last's position. A model with several
layers drafts one token per layer (llama.cpp's chain_heads, transformers' assisted generation); a model with
one reuses it: each step feeds its own output and draft token back (llama.cpp's single-head mode).

Each layer keeps its KV in its own cell cache (engine/memory/cells.py), an entry per confirmed position from
k + 1 on. At `draft()` the layers catch up: the entries that still agree with the confirmed tokens stay,
the rest go with seq_rm, the missing positions are computed layer by layer from the target's features
(stored by position in `process()`, so whatever rollback path the target took the confirmed positions hold the
confirmed tokens' features), and the draft rows are removed again once the draft is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.batch import Batch
from engine.draft.base import Drafter, DraftRequest, DraftStreams, choose_draft
from engine.draft.features import FeatureLifecycle, FeatureRows
from engine.draft.lin_path import resolve
from engine.memory.cells import CellCache
from engine.prefix import common_prefix


@dataclass
class MtpParams:
    top_k: int = 10  # candidates kept in q when the target samples (llama.cpp's MTP sampler keeps 10)
    # stop drafting below this top probability when the request leaves it to the drafter: draft-head's value
    p_min: float = 0.3
    n_ctx: int = 4096  # cells of each layer's cache (the engine's)
    n_seq_max: int = 4
    grow: int = 256  # positions added at a time to a sequence's feature store
    # the layers' linears' arithmetic (engine/draft/lin_path.py): "auto" times the target's paths here at load
    dtype: str = "auto"


@dataclass
class MtpSeq(FeatureRows):
    """One sequence: the target's final hidden state by position (feats, [cap, hidden]), each layer's outputs by
    position, and the confirmed tokens whose entries the layers hold (every position but 0; layer k from k + 1
    on)."""

    outs: list[torch.Tensor] = field(default_factory=list)  # per layer, [cap, hidden] its output per position
    tokens: list[int] = field(default_factory=list)

    def reserve(self, n: int, grow: int) -> None:
        cap = self.feats.shape[0]
        super().reserve(n, grow)
        extra = self.feats.shape[0] - cap
        if extra:
            self.outs = [torch.cat([o, o.new_zeros(extra, o.shape[1])]) for o in self.outs]


class MtpDrafter(FeatureLifecycle, Drafter):
    name = "draft-mtp"
    needs_model = True
    gives_q = True  # the target's own head: q is over the target's vocabulary

    def __init__(self, target=None, params: MtpParams | None = None):
        from engine.load.mtp import load_mtp

        if target is None:
            raise ValueError("draft-mtp needs the target model (its MTP layers and hidden states)")
        self.params = params or MtpParams()
        self.net = load_mtp(target)
        # the layers' own linears (not the shared LM head: the target's, already in its path); a catch-up of
        # one or a few rows, and chained layers' draft rows
        linears = [m for m in self.net.layers.modules() if type(m) is torch.nn.Linear]
        self.lin_path = resolve(self.params.dtype, linears, getattr(target, "dtype", "float32"), (1, 4), self.name)
        cfg = self.net.config
        self.n_mtp = self.net.num_mtp_layers
        self.hidden = int(cfg.hidden_size)
        self.vocab = int(target.model.config.get_text_config().vocab_size)
        self.hidden_layers = (int(target.model.config.get_text_config().num_hidden_layers),)  # the final norm's
        self.dtype = target.model.get_input_embeddings().weight.dtype
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        # layer k's block writes cache layer k (its layer_idx). A prompt prefix the target's cells share between
        # sequences is held once per sequence here, so each may hold a whole context, and its draft rows
        self.caches = [CellCache(n_layers=k + 1, n_kv_heads=n_kv, head_dim=head_dim,
                                 n_cells=self.params.n_seq_max * (self.params.n_ctx + 64),
                                 n_seq_max=self.params.n_seq_max, dtype=self.dtype)
                       for k in range(self.n_mtp)]
        self.states: dict[int, MtpSeq] = {}
        self.streams = DraftStreams()

    def _state(self, seq: int) -> MtpSeq:
        if seq not in self.states:
            z = torch.zeros(0, self.hidden, dtype=self.dtype)
            self.states[seq] = MtpSeq(z, torch.zeros(0, dtype=torch.long), [z.clone() for _ in range(self.n_mtp)])
        return self.states[seq]

    def _cut(self, seq: int, n: int) -> None:
        """Keep the layers' entries of the first n positions of `seq`."""
        st = self._state(seq)
        if len(st.tokens) > n:
            for cache in self.caches:
                cache.seq_rm(seq, n, -1)
            del st.tokens[n:]

    # ---- lifecycle (retune, seq_rm, seq_cp: FeatureLifecycle) ---------------------------------------------

    def begin(self, seq: int, prompt: list[int]) -> None:
        self._cut(seq, 0)  # features stay: a reused prompt prefix is not forwarded again
        self.streams.restart(seq)

    def process(self, batch: Batch, result=None) -> None:
        if result is None or result.hidden is None:
            return
        feats = result.hidden_of(self.hidden_layers)
        seqs, pos, toks = (torch.tensor(x, dtype=torch.long) for x in (batch.seq, batch.pos, batch.tokens))
        with torch.inference_mode():
            for seq in seqs.unique().tolist():
                mine = seqs == seq
                st = self._state(seq)
                st.reserve(int(pos[mine].max()) + 1, self.params.grow)
                st.feats[pos[mine]] = feats[mine].to(self.dtype)  # a later row at a position overwrites
                st.feat_tok[pos[mine]] = toks[mine]

    # ---- the layers -------------------------------------------------------------------------------------

    def _layer(self, k: int, batch: Batch, prev: torch.Tensor) -> torch.Tensor:
        """MTP layer k over the batch's rows (token, position), each with `prev` [rows, hidden], the
        representation of the position before; its entries go into layer k's cells. Returns g_k [rows, hidden]."""
        net, cache = self.net, self.caches[k]
        mask = cache.prepare(batch)
        try:
            ids = torch.tensor([batch.tokens])
            pos = torch.tensor([batch.pos])
            emb = net.embed_tokens(ids)
            rope = {"layer_type": net.config.layer_types[k]} if net.has_per_layer_rope else {}
            out = net.layers[k](emb, prev[None].to(emb.dtype), position_embeddings=net.rotary_emb(emb, pos, **rope),
                                attention_mask=mask, position_ids=pos, cache=cache)
        except Exception:
            cache.rollback_claim()
            raise
        if net.use_shared_post_norm:
            out = net.shared_post_norm(out)
        return out[0]

    def _logits(self, g: torch.Tensor) -> torch.Tensor:
        return self.net.shared_head(g)[..., : self.vocab].float()

    def _catch_up(self, requests: list[DraftRequest]) -> torch.Tensor:
        """Every layer's entries up to id_last's position n; returns g_0[n] of each request [requests, hidden]."""
        wanted = []
        for r in requests:
            confirmed = r.prompt + [r.id_last]
            st = self._state(r.seq)
            self._cut(r.seq, common_prefix(st.tokens, confirmed))
            st.reserve(len(confirmed) + 1, self.params.grow)
            wanted.append((r.seq, confirmed, max(len(st.tokens), 1)))  # from this position on, all is missing
        for k in range(self.n_mtp):
            batch, prev = Batch(), []
            for seq, confirmed, first in wanted:
                st = self._state(seq)
                span = range(max(first, k + 1), len(confirmed))
                for p in span:
                    batch.add(confirmed[p], p, seq, False)
                if not span:
                    continue
                if k > 0:
                    prev.append(st.outs[k - 1][span.start - 1:span.stop - 1])
                    continue
                src = torch.arange(span.start - 1, span.stop - 1)
                # a position the target never forwarded with this token (none, in a plain run) counts as zero
                known = st.feat_tok[src] == torch.tensor(confirmed[span.start - 1:span.stop - 1])
                prev.append(st.feats[src] * known[:, None].to(self.dtype))
            if len(batch):
                g = self._layer(k, batch, torch.cat(prev))
                row = 0
                for seq, confirmed, first in wanted:
                    span = range(max(first, k + 1), len(confirmed))
                    self._state(seq).outs[k][span.start:span.stop] = g[row:row + len(span)]
                    row += len(span)
        for seq, confirmed, _ in wanted:
            self._state(seq).tokens = list(confirmed)
        return torch.stack([self._state(seq).outs[0][len(confirmed) - 1] for seq, confirmed, _ in wanted])

    def _choose(self, r: DraftRequest, logits: torch.Tensor):
        """(token, p of the top candidate, p of the token, q or None) from the layer's logits [vocab]."""
        return choose_draft(r, logits, self.params.top_k, self.streams)

    @torch.inference_mode()
    def draft(self, requests: list[DraftRequest]) -> None:
        for r in requests:
            if r.seq >= self.params.n_seq_max:
                raise ValueError(f"draft-mtp's caches hold {self.params.n_seq_max} sequences, got seq {r.seq}")
            r.result, r.result_p = [], []
            r.result_q = [] if r.want_q else None
        live = [r for r in requests if r.prompt]  # position 0 has no entry: nothing precedes the first token
        if not live:
            return
        g = self._catch_up(live)
        chain = self.n_mtp > 1
        n_pos = {r.seq: len(r.prompt) for r in live}  # id_last's position
        last = {r.seq: g[i:i + 1] for i, r in enumerate(live)}  # what the shared head reads next
        lower = {r.seq: g[:0] for r in live}  # chain: the layer below's outputs at the draft positions so far
        step = 0
        while live:
            logits = self._logits(torch.cat([last[r.seq] for r in live]))
            still = []
            for i, r in enumerate(live):
                tok, p_top, p_tok, q = self._choose(r, logits[i])
                if p_top < r.p_min_or(self.params.p_min):
                    continue
                r.take(tok, p_tok, q)
                # layer k reads layer k - 1 at id_last's position, which it has from position k on
                deeper = not chain or (step + 1 < self.n_mtp and step + 1 <= n_pos[r.seq])
                if len(r.result) < r.draft_max and deeper:
                    still.append(r)
            live, step = still, step + 1
            if not live:
                break
            k = step if chain else 0
            batch, prev = Batch(), []
            for r in live:  # chain: layer k over all k draft rows; one layer: its newest row only
                n = n_pos[r.seq]
                if chain:
                    for j, tok in enumerate(r.result):
                        batch.add(tok, n + 1 + j, r.seq, False)
                    prev.append(torch.cat([self._state(r.seq).outs[k - 1][n:n + 1], lower[r.seq]]))
                else:
                    batch.add(r.result[-1], n + len(r.result), r.seq, False)
                    prev.append(last[r.seq])
            out = self._layer(k, batch, torch.cat(prev))
            row = 0
            for r in live:
                m = len(r.result) if chain else 1
                lower[r.seq], last[r.seq] = out[row:row + m], out[row + m - 1:row + m]
                row += m
        for r in requests:  # the draft rows leave the layers' cells
            if r.seq in n_pos:
                for cache in self.caches:
                    cache.seq_rm(r.seq, n_pos[r.seq] + 1, -1)
