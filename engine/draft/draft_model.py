"""draft-simple: a separate, smaller HF model with the same vocabulary and its own cell cache.

As in llama.cpp, every sequence has its own top-k 10 sampler seeded `seed ^ 0x85ebca6b` (so the draft's
stream differs from the target's), drafting stops when the top draft probability falls below p_min, and all
sequences that are still drafting advance together in one batch per step.

Where ours differs: llama.cpp mirrors every target batch into the draft context with process() after
removing its own draft tokens. Here the draft cache keeps the tokens it drafted and, at the next draft(),
catches up: it keeps the longest prefix that agrees with the confirmed tokens, removes the rest with seq_rm,
and forwards only what is missing (usually the token sampled last round). Each token enters the draft cache
once, and the cache cannot drift from the target whatever rollback path the target took.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.batch import Batch
from engine.memory.context import ModelContext
from engine.draft.base import Drafter, DraftRequest, DraftStreams, top_k_q
from engine.prefix import common_prefix
from engine.memory.probe import PART, probe_context
from engine.sampling import argmax_rows


@dataclass
class DraftModelParams:
    top_k: int = 10  # candidates kept by the draft sampler (llama.cpp's default)
    p_min: float = 0.75  # stop drafting below this top probability, when the request leaves it to the drafter
    n_ctx: int = 4096  # cells of the draft cache
    n_seq_max: int = 4  # sequences the draft cache holds
    # the target's vocabulary size: a wider draft head never proposes ids the target cannot embed (q is then
    # defined over the target's ids, so rejection sampling stays exact); None = the draft's own width
    n_vocab: int | None = None


class DraftModelDrafter(Drafter):
    name = "draft-simple"
    needs_model = True
    gives_q = True  # the same vocabulary: its q is over the target's ids

    def __init__(self, model=None, params: DraftModelParams | None = None):
        if model is None:
            raise ValueError("draft-simple needs a draft model (--draft)")
        self.params = params or DraftModelParams()
        try:
            self.ctx = ModelContext(model, n_ctx=self.params.n_ctx, n_seq_max=self.params.n_seq_max)
        except (AttributeError, TypeError, ValueError) as e:
            raise ValueError(f"this model cannot be a draft model: it does not fit the cell cache ({e})") from e
        # llama.cpp probes the draft context too: drafting rewinds the draft cache every round, so it must cut tails
        self.probe = probe_context(self.ctx)
        if self.probe.kind != PART:
            raise ValueError(f"this model cannot be a draft model (rollback {self.probe.kind}): {self.probe.reason}")
        self.cached: dict[int, list[int]] = {}  # seq -> tokens in the draft cache, in position order
        self.streams = DraftStreams()  # per-seq temperature, seed and random stream

    def retune(self, seq: int, temp: float, seed: int) -> None:
        self.streams.retune(seq, temp, seed)

    def begin(self, seq: int, prompt: list[int]) -> None:
        self.ctx.seq_rm(seq, -1, -1)
        self.cached[seq] = []
        self.streams.restart(seq)

    def seq_rm(self, seq: int) -> None:
        self.ctx.seq_rm(seq, -1, -1)
        self.cached.pop(seq, None)
        self.streams.forget(seq)

    def _catch_up(self, batch: Batch, r: DraftRequest) -> None:
        """Add to `batch` what the draft cache lacks of r's confirmed tokens; the last row outputs."""
        confirmed = r.prompt + [r.id_last]
        cached = self.cached.setdefault(r.seq, [])
        n = common_prefix(confirmed, cached, limit=len(confirmed) - 1)  # id_last always goes in: its logits give d1
        if n < len(cached):
            self.ctx.seq_rm(r.seq, n, -1)
            del cached[n:]
        for i in range(n, len(confirmed)):
            batch.add(confirmed[i], i, r.seq, i == len(confirmed) - 1)
            cached.append(confirmed[i])

    def _q(self, logits: torch.Tensor, temp: float) -> torch.Tensor:
        """The draft distribution over the whole vocabulary, zero outside the top k."""
        if self.params.n_vocab is not None:
            logits = logits[: self.params.n_vocab]
        probs, ids = top_k_q(logits, self.params.top_k, temp)
        q = torch.zeros_like(logits, dtype=torch.float32)
        q.scatter_(-1, ids, probs)
        return q

    def draft(self, requests: list[DraftRequest]) -> None:
        for r in requests:
            if r.seq >= self.params.n_seq_max:
                raise ValueError(f"draft cache holds {self.params.n_seq_max} sequences, got seq {r.seq}")
        batch = Batch()
        for r in requests:
            self._catch_up(batch, r)
            r.result, r.result_p = [], []
            r.result_q = [] if r.want_q else None
        live = list(requests)
        while live and len(batch) > 0:
            logits = self.ctx.decode(batch).logits  # one row per live request, in order
            batch = Batch()
            still = []
            for row, r in enumerate(live):
                q = self._q(logits[row], self.streams.temp(r.seq) if r.want_q else 0.0)
                p_top, tok = float(q.max()), argmax_rows(q)[0]
                if r.want_q:
                    tok = int(torch.multinomial(q, 1, generator=self.streams.generator(r.seq, q.device)))
                if p_top < r.p_min_or(self.params.p_min):
                    continue
                r.take(tok, float(q[tok]), q)
                if len(r.result) >= r.draft_max:
                    continue
                pos = len(self.cached[r.seq])
                batch.add(tok, pos, r.seq, True)
                self.cached[r.seq].append(tok)
                still.append(r)
            live = still
