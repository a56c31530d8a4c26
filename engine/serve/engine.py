"""Slots: several chats in one memory, like llama-server's n_parallel slots, and the engine that runs them.

A slot is one sequence, with its own sampler, drafter state and statistics. Slots join (`start`) and leave
(`stop`, `release`) between rounds; each `step()` prefills the slots that just arrived and runs one speculative
round (engine/round/round.py) for all generating slots together. A prompt prefix already in the memory is
kept: the slot's own previous turn, or a prefix another slot holds (a shared system prompt, stored once with
`seq_cp`).
"""

from __future__ import annotations

import copy
import time
from dataclasses import replace
from types import MappingProxyType
from typing import Iterator, Mapping

import torch

from engine.batch import output_limits
from engine.draft.base import Drafter
from engine.draft.chain import DrafterChain
from engine.draft.registry import default_params, parse_types
from engine.draft.stats import DrafterStats
from engine.events import ErrorEvent, RoundEvent
from engine.grammar import Grammar
from engine.load.errors import ModelLoadError
from engine.load.models import LoadedModel
from engine.params import GenParams
from engine.cost.calibrate import calibrate as time_forwards
from engine.cost.curve import CostModel
from engine.budget.draft_budget import DraftBudget
from engine.memory.probe import ProbeResult, probe_context
from engine.memory.self_check import SelfCheck, self_check
from engine.round.event_builder import SlotRound, assemble
from engine.round.round import Round
from engine.round.slot import Slot
from engine.serve.config import EngineConfig
from engine.serve.drafters import DrafterContext, build_drafter, vocab_mismatch
from engine.serve.grammars import grammar_tokenizer_of
from engine.serve.placement import Placement
from engine.serve.prefill import N_BATCH, Prefiller
from engine.serve.requests import check_prompt, make_context, setting_notes
from engine.serve.threads import ThreadGovernor
from engine.sampling import Sampler

class Engine:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, config: EngineConfig | None = None,
                 **settings):
        """config: the engine's settings (engine/serve/config.py); or given one by one as its fields (settings)."""
        config = config if config is not None else EngineConfig(**settings)
        config.check()
        self.config = config
        # why the draft model's vocabulary is not the target's (None: it is, or there is no draft model): such a
        # model drafts through text, as draft-uni, where draft-simple would propose ids the target reads otherwise
        self.draft_mismatch: str | None = vocab_mismatch(target, draft)
        self.target = target
        self.draft_model = draft
        self._build_memory(config)
        self.threads = ThreadGovernor(n_max=config.threads or torch.get_num_threads(), fixed=config.threads is not None)
        self._use_threads()
        timed = config.calibrate and self.probe.can_speculate
        self.cost = self.calibrate() if timed else CostModel()
        self.threads.fixed = self.threads.fixed or not timed
        self._calibrated = copy.deepcopy(self.cost)  # the curve before service observes forwards (forget_learning)
        self.eos = target.eos_ids()
        self._grammar_tokenizer = None  # llguidance's view of the target's tokenizer, built at the first grammar
        self._build_drafting(config)
        self._build_serving()

    def _build_serving(self) -> None:
        """No slot, and the collaborators that run rounds and prefills over the relay and the budget."""
        self.slots: dict[int, Slot] = {}
        self.parked: dict[int, Slot] = {}  # seq -> a parked slot whose cells the sequence still holds
        self.placement = Placement(self.ctx, self.chain, self._holder, lambda: list(self.slots.values()))
        self.round = Round(self.ctx, self.chain, self.budget, self.probe, self.limits, self.n_pos_max, self.eos,
                           self.target.decode)
        self.prefiller = Prefiller(self.ctx, self.chain, self.round.emit)

    def _build_memory(self, config: EngineConfig) -> None:
        """The target's context and its limits, the rollback probe and the load check."""
        # logits rows reserved per forward: every slot's sampled token and its longest draft
        self.limits = output_limits(N_BATCH, config.n_seq_max, config.n_draft)
        self.ctx = make_context(self.target.model, n_ctx=config.n_ctx, n_seq_max=config.n_seq_max,
                                n_outputs_max=self.limits.total, n_rs=config.n_rs)
        n_pos_model = int(getattr(self.target.model.config, "max_position_embeddings", 0) or 0) or None
        # a sequence ends with "context" at its share of the cache as at the model's last position
        limits = [n for n in (n_pos_model, config.n_ctx_seq) if n is not None]
        self.n_pos_max = min(limits) if limits else None
        self.probe: ProbeResult = probe_context(self.ctx)
        try:  # the engine's forward against transformers' own, past the smallest window (engine/memory/self_check.py)
            self.load_check: SelfCheck = self_check(self.ctx, self.probe)
        except ValueError as e:
            raise ModelLoadError(f"model '{self.target.name}' failed its load check: {e}") from None

    def _build_drafting(self, config: EngineConfig) -> None:
        """The drafters' relay (which owns the drafters) and the draft budget."""
        # type name -> its params dataclass; ours by default (engine/draft/registry.py), overridable per type; read-only
        self.drafter_params = MappingProxyType({**default_params(), **config.drafter_params})
        self.drafter_context = DrafterContext(self.target, self.draft_model, self.draft_mismatch, self.ctx.n_ctx,
                                              self.ctx.n_seq_max, self.ctx.n_vocab, self.drafter_params)
        self.chain = DrafterChain({})
        # which drafters draft for which slot and how far, which tree nodes go in (engine/budget/draft_budget.py)
        self.budget = DraftBudget(self.cost, fair=config.fair)

    @property
    def pool(self) -> Mapping[str, Drafter]:
        """The drafters built so far, by type name (the relay's)."""
        return MappingProxyType(self.chain.pool)

    def _holder(self, seq: int) -> Slot | None:
        """The slot whose tokens `seq`'s cells hold: its generating or finished slot, else the one parked there."""
        return self.slots.get(seq) or self.parked.get(seq)

    # ---- set-up ----------------------------------------------------------------------------------------------

    def _use_threads(self) -> None:
        """Forwards on the governor's count: OpenMP's count is per calling thread, so it is set by the thread
        that runs the rounds (the scheduler's), each step."""
        if torch.get_num_threads() != self.threads.n_threads:
            torch.set_num_threads(self.threads.n_threads)

    def _govern_threads(self) -> None:
        forward, self.round.last_forward = self.round.last_forward, None
        if forward is not None:
            rows, seconds = forward
            if self.threads.observe(seconds, self.cost.quiet(rows), time.monotonic()) is not None:
                self._use_threads()

    def calibrate(self, passes: int = 7) -> CostModel:
        """Time the forwards the length policy and the round's budget read (engine/cost/calibrate.py)."""
        return time_forwards(self.ctx, self.limits, self.probe, passes)

    def forget_learning(self) -> None:
        """Back to what a fresh engine knows, without loading or calibrating again: an empty cache, the calibrated
        cost curve and thread count, no drafter built, nothing the budget or the relay learnt from answers.
        Tests share one engine per model this way and each still starts from a known state."""
        for seq in range(self.ctx.n_seq_max):
            self.release(seq)
        self.cost = copy.deepcopy(self._calibrated)
        self.threads = ThreadGovernor(n_max=self.threads.n_max, fixed=self.threads.fixed)
        self._use_threads()
        self._build_drafting(self.config)  # drafters learn across answers too (the head's step costs)
        self._build_serving()

    def grammar_tokenizer(self):
        """The target's tokenizer for grammar matchers (slow to build, so once per engine). Its end of
        sequence is the engine's: a complete grammar allows exactly the tokens that end the answer."""
        if self._grammar_tokenizer is None:
            self._grammar_tokenizer = grammar_tokenizer_of(self.target.tokenizer, sorted(self.eos))
        return self._grammar_tokenizer

    def drafter(self, name: str) -> Drafter:
        if name not in self.chain.pool:
            self.chain.add(name, build_drafter(self.drafter_context, name))
            wanted = set(self.ctx.hidden_layers) | set(self.pool[name].hidden_layers)
            self.ctx.hidden_layers = tuple(sorted(wanted))
        return self.pool[name]

    def drafter_params_of(self, name: str):
        """The parameters the drafter type `name` is built with here (None: none given, nor a default of ours)."""
        return self.drafter_params.get(name)

    def drafter_stats(self, seq: int) -> dict[str, DrafterStats] | None:
        """A copy of the sequence's drafter counters (name -> DrafterStats; None: it never began): the relay
        keeps counting into its own."""
        stats = self.chain.seq_stats.get(seq)
        return copy.deepcopy(stats) if stats is not None else None

    @property
    def draft_type(self) -> str | None:
        """The drafter a loaded draft model drafts through: draft-simple, draft-uni (another vocabulary), or None."""
        return None if self.draft_model is None else "draft-uni" if self.draft_mismatch is not None else "draft-simple"

    @property
    def supports_trees(self) -> bool:  # whether the target's memory keeps a tree's branches (a cell cache does)
        return bool(getattr(self.ctx, "supports_trees", False))

    # ---- slots -------------------------------------------------------------------------------------------

    def free_seq(self) -> int:
        for seq in range(self.ctx.n_seq_max):
            if seq not in self.slots:
                return seq
        for seq in range(self.ctx.n_seq_max):
            if self.slots[seq].state == "done":
                return seq
        raise RuntimeError(f"all {self.ctx.n_seq_max} slots are busy")

    @property
    def prompt_limit(self) -> int:
        """The most tokens a prompt and its answer may hold together: the cache, and the model's positions."""
        return self.ctx.n_ctx if self.n_pos_max is None else min(self.ctx.n_ctx, self.n_pos_max)

    def check(self, prompt: list[int], params: GenParams) -> GenParams:
        """Refuse a request that could never run, with the reason (ValueError). Returns the parameters as the
        engine runs them (the drafter chain parsed), a copy: the caller's stay as they were."""
        params.validate()
        params = replace(params, spec=replace(params.spec, types=parse_types(params.spec.types)))
        check_prompt(prompt, self.ctx.n_vocab, self.prompt_limit)
        if params.grammar is not None:
            params.grammar.validate(self.grammar_tokenizer())
        if params.spec.types and not self.probe.can_speculate:
            raise ValueError(f"speculation is off for this model: {self.probe.reason}")
        for name in params.spec.types:
            self.drafter(name)
        return params

    def affinity(self, tokens: list[int], seq: int, salt: str | None = None) -> tuple[int, int, float]:
        """How well `seq` suits a new generation salted `salt` (smallest first): engine/serve/placement.py."""
        return self.placement.affinity(tokens, seq, salt)

    def fits(self, tokens: list[int], seq: int, salt: str | None = None) -> bool:
        """Whether the cache has room to place `tokens` (a prompt, or a parked slot's) in `seq` now, reusing only
        cells of generations salted `salt`."""
        return self.placement.fits(tokens, seq, salt)

    def start(self, prompt: list[int], params: GenParams, seq: int | None = None) -> Slot:
        """Start a generation in a free slot. Raises ValueError on bad input; nothing changes then."""
        return self.admit(prompt, self.check(prompt, params), seq)

    def admit(self, prompt: list[int], params: GenParams, seq: int | None = None) -> Slot:
        """Start a request that `check` passed, with the parameters it returned, in a free slot (or `seq`)."""
        seq = self.free_seq() if seq is None else seq
        if not 0 <= seq < self.ctx.n_seq_max:
            raise ValueError(f"slot {seq} out of range [0, {self.ctx.n_seq_max})")
        old = self.slots.get(seq)
        if old is not None and old.state != "done":
            raise ValueError(f"slot {seq} is busy")
        # the prompt's last token is always forwarded again: its logits give the first answer token
        kept = self.placement.place(prompt, seq, len(prompt) - 1, params.cache_salt)
        self.parked.pop(seq, None)  # whatever was parked in seq lost its cells
        slot = Slot(seq=seq, params=params, sampler=Sampler(params.sampling), prompt=list(prompt),
                    tokens=list(prompt[:kept]))
        if params.grammar is not None:
            slot.grammar = Grammar.start(params.grammar, self.grammar_tokenizer())
        if params.spec.types:
            slot.n_max_effective = min(params.spec.n_max, self.limits.per_seq - 1)
        no_q = [name for name in params.spec.types if self.drafter(name).needs_model and not self.drafter(name).gives_q]
        slot.notes += setting_notes(params, self.limits.per_seq - 1,
                                    slot.trees_off(self.supports_trees), no_q)
        if params.spec.synthetic_accept is not None:
            # a stream per slot: the sampler's seed and the slot, so concurrent slots toss independent coins
            coin_seed = params.sampling.seed ^ 0x5BD1E995 ^ (seq * 0x9E3779B1)
            slot.coins = torch.Generator(device="cpu").manual_seed(coin_seed & 0xFFFFFFFF)
        self.slots[seq] = slot
        self._begin(seq, slot, answer=True)
        return slot

    def _begin(self, seq: int, slot: Slot, answer: bool, confirmed: list[int] | None = None) -> None:
        """The sequence's drafters and its budget begin on its tokens (the prompt, or a resumed slot's
        `confirmed`); answer: a new generation (False: a parked one that resumes)."""
        spec = slot.params.spec
        models = [name for name in spec.types if self.pool[name].needs_model]
        self.budget.begin(seq, spec.types, spec.adaptive, models, answer=answer)
        self.chain.begin(seq, slot.prompt if confirmed is None else confirmed, spec.types)
        for name in spec.types:  # model drafters sample at the slot's temperature, from its seed
            self.pool[name].retune(seq, slot.params.sampling.temp, slot.params.sampling.seed)
            self.pool[name].expect(seq, spec.reference)

    def stop(self, seq: int) -> None:
        """Ask a slot to stop; it ends at the next round boundary, its cells stay for reuse."""
        if seq in self.slots:
            self.slots[seq].stop_requested = True

    def park(self, seq: int) -> Slot:
        """Take a generating slot out of the engine (an idle step-mode session) so another can use `seq`. Its
        cells stay until someone needs them; `resume` puts it back, in any free sequence."""
        slot = self.slots.pop(seq)
        self.parked[seq] = slot
        return slot

    def resume(self, slot: Slot, seq: int) -> None:
        """Put a parked slot back in `seq`. Tokens the cache no longer holds for it are forwarded again at the
        next step (no token is sampled there: the slot's sampler goes on where it stopped)."""
        if seq in self.slots and self.slots[seq].state != "done":
            raise ValueError(f"slot {seq} is busy")
        if self.parked.get(seq) is slot and self.ctx.cache.seq_cells(seq).numel() == len(slot.tokens):
            del self.parked[seq]  # nobody took its cells: it carries on as if it had never left
        else:
            old = [other for other, parked in self.parked.items() if parked is slot]
            for other in old:
                del self.parked[other]
            confirmed = list(slot.tokens)
            # may copy its prefix from its old cells
            kept = self.placement.place(confirmed, seq, len(confirmed), slot.params.cache_salt)
            self.parked.pop(seq, None)  # whatever was parked in seq lost its cells
            slot.tokens, slot.refill = confirmed[:kept], confirmed[kept:]
            for other in old:  # then they belong to nobody: freed, not left for a later start to find
                if other != seq and other not in self.slots:
                    self.release(other)
            self._begin(seq, slot, answer=False, confirmed=confirmed)
        slot.seq = seq
        self.slots[seq] = slot

    def release(self, seq: int) -> None:
        """Forget a slot and free its cells."""
        self.slots.pop(seq, None)
        self.parked.pop(seq, None)
        self.chain.seq_rm(seq)  # the drafters' own caches
        self.chain.records.release(seq)
        self.budget.release(seq)  # all the budget kept about the sequence
        self.ctx.seq_rm(seq, -1, -1)

    def active(self, only: set[int] | None = None) -> list[Slot]:
        return [s for s in self.slots.values() if s.state != "done" and (only is None or s.seq in only)]

    # ---- the round --------------------------------------------------------------------------------------

    def step(self, only: set[int] | None = None, whole_prefill: bool = False) -> list[RoundEvent | ErrorEvent]:
        """One round for every active slot (or those in `only`); returns one event per slot that ran. A slot
        whose prefill or round raised ends with an ErrorEvent and is released; the others go on.

        A prompt is prefilled one chunk a step (engine/serve/prefill.py), so the other slots' rounds run between
        its chunks; whole_prefill: all of it in this step (step mode, where each step is a click)."""
        events: list[SlotRound | ErrorEvent] = []
        self._use_threads()
        for slot in self.active(only):
            if slot.stop_requested:
                if slot.replay is not None and slot.grammar is not None:
                    # stopped between a checkpoint restore and its replay: the user was given the decided
                    # tokens, so the grammar takes them as the replay would have
                    slot.grammar.consume_all(slot.replay.tokens[1:])
                events.append(slot.end("stopped"))
        active = self.active(only)
        beside = any(s.state == "generating" for s in active)
        prefill_events, prefilled = self.prefiller.step(active, beside, whole_prefill)
        events += prefill_events
        # a slot prefilled in this step drafts from the next one on: round 0 stands alone, as in step mode
        generating = [s for s in self.active(only) if s.state == "generating" and s.seq not in prefilled]
        if generating:
            idle = [seq for seq, s in self.slots.items() if s.state == "done"] + list(self.parked)
            self.placement.make_room(generating, self.limits.per_seq, idle, self.release)
            events.extend(self.round.run(generating))
            self._govern_threads()
        for ev in events:
            if isinstance(ev, ErrorEvent):
                self.release(ev.seq)
        # every part of each slot's round is known now: its event is made, once (engine/round/event_builder.py)
        return assemble(events, time.perf_counter(), self.ctx.cache.n_used(), lambda seq: len(self.slots[seq].tokens))

    def generate(self, prompt: list[int], params: GenParams, seq: int | None = None) -> Iterator[RoundEvent]:
        """Run one slot to completion, yielding each round's event (other slots advance too)."""
        slot = self.start(prompt, params, seq=seq)
        ended = False  # an ErrorEvent ends the answer with its slot released, its state left as it was
        while slot.state != "done" and not ended:
            for ev in self.step():
                if ev.seq == slot.seq:
                    ended = ended or isinstance(ev, ErrorEvent)
                    yield ev
