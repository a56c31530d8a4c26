"""Slots: several chats in one memory, like llama-server's n_parallel slots, and the engine that runs them.

A slot is one sequence, with its own sampler, drafter state and statistics. Slots join (`start`) and leave
(`stop`, `release`) between rounds; each `step()` prefills the slots that just arrived and runs one speculative
round (rounds.py) for all generating slots together. A prompt prefix already in the memory is kept: the slot's
own previous turn, or a prefix another slot holds (a shared system prompt, stored once with `seq_cp`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from engine.batch import Batch, output_limits
from engine.context import ModelContext
from engine.drafters.base import Drafter
from engine.drafters.chain import DrafterChain, default_params, make_drafter, parse_types
from engine.events import RoundEvent
from engine.models import LoadedModel, check_vocab_compatible
from engine.params import GenParams
from engine.policy import CostModel, DraftLengthPolicy
from engine.probe import ProbeResult, probe_context
from engine.rounds import RoundLoop
from engine.stateful import StatefulContext, has_own_state
from engine.sampling import Sampler
from engine import checkpoint

N_BATCH = 512  # rows per forward: prompt chunks during prefill, and the cap on logits rows of a verification
MIN_CELLS_PER_SLOT = 64  # a cache smaller than this per slot could not hold a useful chat in every slot


@dataclass
class Slot:
    seq: int  # sequence id in the shared cache
    params: GenParams
    sampler: Sampler  # the target's sampler, with its own stream
    prompt: list[int]  # prompt tokens
    tokens: list[int] = field(default_factory=list)  # tokens in the target cache, in position order
    generated: list[int] = field(default_factory=list)  # tokens emitted to the user
    id_last: int = -1  # sampled last round, not yet in the cache
    state: str = "prefill"  # "prefill" | "generating" | "done"
    round: int = 0  # rounds run (prefill is round 0)
    text: str = ""  # detokenised text given out so far
    stop_reason: str | None = None
    stop_requested: bool = False
    replay: "checkpoint.Replay | None" = None  # decided tokens to re-run after a checkpoint restore
    coins: torch.Generator | None = None  # synthetic acceptance's own stream (None unless it is on)

    @property
    def n_remaining(self) -> int:
        return self.params.max_new_tokens - len(self.generated)


def make_context(model, n_ctx: int, n_seq_max: int, n_outputs_max: int, n_rs: int = 0):
    """The cell cache for attention models; the model's own per-sequence cache where layers keep a state."""
    if has_own_state(model):
        return StatefulContext(model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_outputs_max=n_outputs_max, n_rs=n_rs)
    return ModelContext(model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_outputs_max=n_outputs_max)


def common_prefix(cached: list[int], prompt: list[int]) -> int:
    """Length of the cached prefix a new prompt can keep (llama-server's cache_prompt). The prompt's last token
    is always forwarded again, because its logits are needed."""
    n = 0
    limit = min(len(cached), len(prompt) - 1)
    while n < limit and cached[n] == prompt[n]:
        n += 1
    return n


class Engine(RoundLoop):
    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, n_ctx: int = 4096,
                 n_seq_max: int = 4, calibrate: bool = True, drafter_params: dict | None = None,
                 n_draft: int = 16, n_rs: int = 0):
        if draft is not None:
            check_vocab_compatible(target, draft)
        if n_seq_max < 1:
            raise ValueError(f"need at least one slot, got {n_seq_max}")
        if n_ctx < n_seq_max * MIN_CELLS_PER_SLOT:
            raise ValueError(f"a cache of {n_ctx} cells cannot hold {n_seq_max} slots (at least "
                             f"{MIN_CELLS_PER_SLOT} cells each): raise n_ctx to {n_seq_max * MIN_CELLS_PER_SLOT} "
                             f"or use fewer slots")
        self.target = target
        self.draft_model = draft
        # logits rows reserved per forward: every slot's sampled token and its longest draft
        self.limits = output_limits(N_BATCH, n_seq_max, n_draft)
        # n_rs: on a recurrent model, the tail (in tokens) that reversible state undoes without a checkpoint
        self.ctx = make_context(target.model, n_ctx=n_ctx, n_seq_max=n_seq_max, n_outputs_max=self.limits.total,
                                n_rs=n_rs)
        self.n_pos_max = int(getattr(target.model.config, "max_position_embeddings", 0) or 0) or None
        self.probe: ProbeResult = probe_context(self.ctx)
        self.cost = self.calibrate() if calibrate and self.probe.can_speculate else CostModel()
        self.policy = DraftLengthPolicy(self.cost)
        # type name -> its params dataclass; ours by default (see chain.default_params), overridable per type
        self.drafter_params = {**default_params(), **(drafter_params or {})}
        self.pool: dict[str, Drafter] = {}
        self.chain = DrafterChain(self.pool, self.policy)
        self.slots: dict[int, Slot] = {}
        self.eos = target.eos_ids()

    # ---- set-up ----------------------------------------------------------------------------------------------

    def calibrate(self, sizes=(1, 2, 3, 4, 6, 8, 12, 16), reps: int = 3) -> CostModel:
        """Time forwards of n rows after a short prefix: the c(n) of the length policy."""
        sizes = [n for n in sizes if n <= self.limits.total] or [1]
        seq = 0
        batch = Batch()
        for i in range(32):
            batch.add((i + 10) % self.ctx.n_vocab, i, seq, False)
        batch.output[-1] = True
        self.ctx.decode(batch)
        saved = self.ctx.cache.state_save(seq)
        seconds = []
        for n in sizes:
            runs = []
            for _ in range(reps + 1):
                b = Batch()
                for i in range(n):
                    b.add((100 + i) % self.ctx.n_vocab, 32 + i, seq, True)
                runs.append(self.ctx.decode(b).seconds)
                self.ctx.cache.state_restore(seq, saved, 32)
            seconds.append(sorted(runs[1:])[len(runs[1:]) // 2])
        self.ctx.seq_rm(seq, -1, -1)
        for i in range(1, len(seconds)):  # noise must not make a bigger batch look cheaper
            seconds[i] = max(seconds[i], seconds[i - 1])
        return CostModel(sizes=list(sizes), seconds=seconds)

    def drafter(self, name: str) -> Drafter:
        if name not in self.pool:
            kwargs = {}
            if name == "draft-simple":
                if self.draft_model is None:
                    raise ValueError("draft-simple needs a draft model: load one first")
                from engine.drafters.draft_model import DraftModelParams
                kwargs = dict(model=self.draft_model.model,
                              params=DraftModelParams(n_ctx=self.ctx.n_ctx, n_seq_max=self.ctx.n_seq_max))
            elif name == "draft-head":
                from engine.drafters.draft_head import DraftHeadParams
                # the head reads the target's embeddings and hidden states
                kwargs = dict(target=self.target, params=self.drafter_params.get(name) or DraftHeadParams())
            elif name in self.drafter_params:
                kwargs = dict(params=self.drafter_params[name])
            self.pool[name] = make_drafter(name, **kwargs)
            wanted = set(self.ctx.hidden_layers) | set(self.pool[name].hidden_layers)
            self.ctx.hidden_layers = tuple(sorted(wanted))
        return self.pool[name]

    # ---- slots -------------------------------------------------------------------------------------------

    def free_seq(self) -> int:
        for seq in range(self.ctx.n_seq_max):
            if seq not in self.slots:
                return seq
        for seq in range(self.ctx.n_seq_max):
            if self.slots[seq].state == "done":
                return seq
        raise RuntimeError(f"all {self.ctx.n_seq_max} slots are busy")

    def start(self, prompt: list[int], params: GenParams, seq: int | None = None) -> Slot:
        """Queue a generation. Raises ValueError on bad input; nothing changes then."""
        params.validate()
        params.spec.types = parse_types(params.spec.types)
        if not prompt:
            raise ValueError("empty prompt")
        limit = self.ctx.n_ctx if self.n_pos_max is None else min(self.ctx.n_ctx, self.n_pos_max)
        if len(prompt) + 1 > limit:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {limit} tokens")
        if params.spec.types and not self.probe.can_speculate:
            raise ValueError(f"speculation is off for this model: {self.probe.reason}")
        for name in params.spec.types:
            self.drafter(name)
        seq = self.free_seq() if seq is None else seq
        if not 0 <= seq < self.ctx.n_seq_max:
            raise ValueError(f"slot {seq} out of range [0, {self.ctx.n_seq_max})")
        old = self.slots.get(seq)
        if old is not None and old.state != "done":
            raise ValueError(f"slot {seq} is busy")
        n_own = common_prefix(old.tokens, prompt) if old is not None else 0
        src, n_shared = self._shared_prefix(seq, prompt) if self.ctx.cache.can_share else (-1, 0)
        n_owned = self.ctx.cache.seq_cells(seq).numel()
        n_need = len(prompt) + 1 - max(n_own, n_shared)
        n_free = self.ctx.n_ctx - self.ctx.cache.n_used() + n_owned
        if n_need > n_free:
            raise ValueError(f"the cache is full: this prompt needs {n_need} more cells, {n_free} are free "
                             f"(other slots hold the rest); wait for a slot to finish or raise n_ctx")
        if n_shared > n_own:
            # a prefix another slot already holds (a shared system prompt): store it once, for both sequences
            self.ctx.seq_rm(seq, -1, -1)
            self.ctx.cache.seq_cp(src, seq, 0, n_shared)
            kept = n_shared
        elif self.ctx.seq_rm(seq, n_own, -1):
            kept = n_own
        else:  # a recurrent memory cannot go back to the shared prefix: start the sequence over
            self.ctx.seq_rm(seq, -1, -1)
            kept = 0
        self.chain.seq_rm(seq)
        if n_shared > n_own:
            self.chain.seq_cp(src, seq, n_shared)
        slot = Slot(seq=seq, params=params, sampler=Sampler(params.sampling), prompt=list(prompt),
                    tokens=list(prompt[:kept]))
        if params.spec.synthetic_accept is not None:
            # a stream per slot: the sampler's seed and the slot, so concurrent slots toss independent coins
            coin_seed = params.sampling.seed ^ 0x5BD1E995 ^ (seq * 0x9E3779B1)
            slot.coins = torch.Generator().manual_seed(coin_seed & 0xFFFFFFFF)
        self.slots[seq] = slot
        self.chain.begin(seq, slot.prompt, params.spec.types, adaptive=params.spec.adaptive)
        for name in params.spec.types:  # model drafters sample at the slot's temperature, from its seed
            self.pool[name].retune(seq, params.sampling.temp, params.sampling.seed)
        return slot

    def _shared_prefix(self, seq: int, prompt: list[int]) -> tuple[int, int]:
        """The other slot whose cached tokens share the longest prefix with `prompt`: (its seq, the length)."""
        best = (-1, 0)
        for other in self.slots.values():
            if other.seq != seq and other.replay is None:
                n = common_prefix(other.tokens, prompt)
                if n > best[1]:
                    best = (other.seq, n)
        return best

    def stop(self, seq: int) -> None:
        """Ask a slot to stop; it ends at the next round boundary, its cells stay for reuse."""
        if seq in self.slots:
            self.slots[seq].stop_requested = True

    def release(self, seq: int) -> None:
        """Forget a slot and free its cells."""
        self.slots.pop(seq, None)
        self.chain.seq_rm(seq)
        self.ctx.seq_rm(seq, -1, -1)

    def active(self, only: set[int] | None = None) -> list[Slot]:
        return [s for s in self.slots.values() if s.state != "done" and (only is None or s.seq in only)]

    # ---- the round --------------------------------------------------------------------------------------

    def step(self, only: set[int] | None = None) -> list[RoundEvent]:
        """One round for every active slot (or those in `only`); returns one event per slot that ran."""
        events = []
        for slot in self.active(only):
            if slot.stop_requested:
                events.append(self._finish(slot, "stopped", RoundEvent(seq=slot.seq, round=slot.round,
                              kind="plain", drafter=None, pos_sampled=len(slot.tokens), p0=len(slot.tokens) + 1)))
        prefilled = set()
        for slot in [s for s in self.active(only) if s.state == "prefill"]:
            events.append(self._prefill(slot))
            prefilled.add(slot.seq)
        # a slot prefilled in this step drafts from the next one on: round 0 stands alone, as in step mode
        generating = [s for s in self.active(only) if s.state == "generating" and s.seq not in prefilled]
        if generating:
            events.extend(self._spec_round(generating))
        now = time.perf_counter()
        for ev in events:
            ev.t_end = now
        return events

    def _prefill(self, slot: Slot) -> RoundEvent:
        t0 = time.perf_counter()
        todo = slot.prompt[len(slot.tokens):]
        logits = None
        for start in range(0, len(todo), N_BATCH):
            batch = Batch()
            chunk = todo[start:start + N_BATCH]
            for i, tok in enumerate(chunk):
                batch.add(tok, len(slot.tokens) + i, slot.seq, start + i == len(todo) - 1)
            res = self.ctx.decode(batch)
            self.chain.process(batch, res)
            logits = res.logits
            slot.tokens.extend(chunk)
        tok = slot.sampler.sample(logits[-1])
        p = float(slot.sampler.probs(logits[-1])[tok])
        slot.id_last = tok
        slot.state = "generating"
        ev = RoundEvent(seq=slot.seq, round=0, kind="prefill", drafter=None, pos_sampled=len(slot.tokens) - 1,
                        p0=len(slot.tokens), bonus=tok, p_target=[p], batch_rows=len(todo),
                        t_verify_ms=(time.perf_counter() - t0) * 1e3)
        slot.round = 1
        return self._emit(slot, [tok], ev)

    def _emit(self, slot: Slot, tokens: list[int], ev: RoundEvent) -> RoundEvent:
        """Give tokens to the user, cut at end-of-sequence or the token limit; fill text and cache figures."""
        out = []
        reason = None
        for tok in tokens:
            out.append(tok)
            if tok in self.eos and not slot.params.ignore_eos:
                reason = "eos"
                break
            if len(slot.generated) + len(out) >= slot.params.max_new_tokens:
                reason = "length"
                break
        slot.generated.extend(out)
        ev.emitted = out
        text = self.target.decode(slot.generated)
        stable = text.rstrip("\ufffd") if reason is None else text  # hold back a half-decoded character
        if stable.startswith(slot.text):
            ev.text_delta = stable[len(slot.text):]
            slot.text = stable
        if reason is not None:
            self._finish(slot, reason, ev)
        ev.n_cells_used = self.ctx.cache.n_used()
        ev.seq_cells = len(slot.tokens)
        return ev

    def _finish(self, slot: Slot, reason: str, ev: RoundEvent) -> RoundEvent:
        slot.state = "done"
        slot.stop_reason = reason
        ev.done = True
        ev.stop_reason = reason
        return ev

    # ---- convenience ------------------------------------------------------------------------------------

    def generate(self, prompt: list[int], params: GenParams, seq: int | None = None) -> Iterator[RoundEvent]:
        """Run one slot to completion, yielding each round's event (other slots advance too)."""
        slot = self.start(prompt, params, seq=seq)
        while slot.state != "done":
            for ev in self.step():
                if ev.seq == slot.seq:
                    yield ev
