"""The speculative round, for every generating slot at once: draft -> one batched forward -> verify -> rollback.

Each slot's sampled token and draft tokens go into one batch at contiguous positions; one forward verifies all
of them; each slot keeps its longest agreeing prefix plus one token of the target, then gives its rejected tail
back: `seq_rm(seq, p0 + m, -1)` where the memory can (PART, or RS within its reach), else the checkpoint taken
before drafting is restored and a replay round follows (FULL, or forced). This is the loop of llama.cpp's
`server_context::update_slots` (tools/server/server-context.cpp) around `common_speculative_draft`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Collection

from engine.memory import checkpoint
from engine.batch import Batch, OutputLimits
from engine.draft.allowance import Allowance
from engine.draft.base import DraftRequest
from engine.budget.draft_budget import DraftBudget, RoundTimes
from engine.draft.chain import DrafterChain
from engine.events import ErrorEvent, failure
from engine.memory.probe import FULL, RS, ProbeResult
from engine.round.event_builder import Emission, SlotRound
from engine.round.slot import Slot
from engine.draft.tree import sub_batch, tree_rows
from engine.round.chain_verify import Verifying, replay_round, verify_chain
from engine.round.tree_round import verify_tree


@dataclass
class RoundPlan:
    """What a round decided before its forward."""
    requests: dict[int, DraftRequest] = field(default_factory=dict)  # seq -> its drafting job (not for replays)
    ckpts: dict[int, checkpoint.Checkpoint] = field(default_factory=dict)  # seq -> state taken before drafting
    resting: dict[int, int] = field(default_factory=dict)  # seq -> rounds until it drafts again (DraftBudget.rest)
    vetoed: set[int] = field(default_factory=set)  # seqs the slot budget kept from drafting this round
    veto_why: str = ""  # the budget's reason for its veto
    failed: dict[int, ErrorEvent] = field(default_factory=dict)  # seq -> why its generation ends this round
    winners: dict[int, str | None] = field(default_factory=dict)  # seq -> the drafter whose draft is verified
    nodes: Any = None  # the budget's choice among the slots' tree nodes (NodeChoice; None: none this round)
    trees: dict[int, Any] = field(default_factory=dict)  # seq -> the DraftTree its forward holds (None: a chain)
    t_draft_ms: float = 0.0  # the round's drafting and budgeting, all slots together


@dataclass
class RoundBatch:
    """The round's one batch and whose rows are where."""
    batch: Batch
    rows: dict[int, list[int]] = field(default_factory=dict)  # seq -> its rows in the batch
    in_batch: list[Slot] = field(default_factory=list)  # the slots with rows, in slot order


class Round:
    """Runs rounds over the slots it is given; the engine (serve/engine.py) owns the slots and their lifecycle."""

    def __init__(self, ctx, chain: DrafterChain, budget: DraftBudget, probe: ProbeResult, limits: OutputLimits,
                 n_pos_max: int | None, eos: Collection[int], detokenize: Callable[[list[int]], str]):
        self.ctx = ctx  # the target's context: its memory (cell cache or own per-sequence cache) and forward
        self.chain = chain  # the drafters in relay order per sequence
        # the one budget over the slots' drafts: which slots and drafters draft, how far, which nodes go in, each
        # slot's balance (engine/budget/draft_budget.py)
        self.budget = budget
        self.probe = probe  # what rollback the memory supports (PART / RS / FULL)
        self.limits = limits  # logits rows per forward, in all and per sequence
        self.n_pos_max = n_pos_max  # a sequence's positions end here (the model's, or its share of the cache)
        self.eos = eos  # tokens that end a generation
        self.detokenize = detokenize  # token ids -> text, for what a slot gives out
        self.last_forward: tuple[int, float] | None = None  # (rows, seconds) of the latest round's forward

    def emit(self, slot: Slot, tokens: list[int]) -> Emission:
        return slot.emit(tokens, self.eos, self.detokenize)

    def _n_draft_max(self, slot: Slot, n_free: int) -> int:
        """llama-server's get_n_draft_max: fit the context (leave room) and the tokens still wanted."""
        n = min(slot.params.spec.n_max, slot.n_remaining - 1, n_free - 2, self.limits.per_seq - 1)
        if self.n_pos_max is not None:
            n = min(n, self.n_pos_max - len(slot.tokens) - 2)
        return max(0, n) if slot.params.spec.types else 0

    def run(self, slots: list[Slot]) -> list[SlotRound | ErrorEvent]:
        """One round for these generating slots, one record per slot for its event (event_builder.py): plan,
        draft, batch, forward, verify, settle."""
        n_cells_free = self.ctx.n_ctx - self.ctx.cache.n_used()
        plan = self._plan(slots, n_cells_free)
        t0 = time.perf_counter()
        self._draft_all(slots, plan)
        plan.t_draft_ms = (time.perf_counter() - t0) * 1e3
        rb, events = self._batch(slots, plan, n_cells_free)
        if not rb.rows:
            return events
        t_forward = time.perf_counter()
        try:
            res = self._forward(rb.batch, rb.in_batch)
        except Exception as e:  # it failed twice: these generations end, the engine serves the next round
            return events + [failure(s.seq, "the forward", e) for s in rb.in_batch]
        self.last_forward = (len(rb.batch), res.seconds)  # for the engine's thread count (engine/serve/threads.py)
        events += self._verify_all(slots, plan, rb, res)
        notes = self.budget.settle(plan, rb.batch, rb.in_batch, events, RoundTimes(t0, t_forward, res.seconds))
        for part in events:
            if isinstance(part, SlotRound):  # the slots in its forward, and what the budget says of its round
                part.n_seqs, part.note = len(rb.in_batch), notes[part.seq]
        return events

    def _plan(self, slots: list[Slot], n_cells_free: int) -> RoundPlan:
        """How far each slot may draft (cells and logits rows the slots before it left), who rests or is
        vetoed, the checkpoints, and each slot's drafting request."""
        plan = RoundPlan()
        self.budget.open_round(len(slots))
        sizes = self._sizes(slots, n_cells_free, plan.resting)
        grant = self.budget.allow(slots, sizes)
        plan.vetoed, plan.veto_why = set(grant.vetoed), grant.veto_why
        for slot in slots:
            if slot.replay is not None:
                continue  # a replay round re-runs decided tokens and drafts nothing
            n_max, tree_max = (0, 0) if slot.seq in plan.vetoed else sizes[slot.seq]
            if slot.params.spec.types and self._needs_checkpoint(slot, n_max):
                plan.ckpts[slot.seq] = checkpoint.take(slot, self.ctx.cache)
            plan.requests[slot.seq] = self._request(slot, n_max, tree_max, grant.allowances[slot.seq])
        return plan

    def _sizes(self, slots: list[Slot], n_cells_free: int, resting: dict[int, int]) -> dict[int, tuple[int, int]]:
        """seq -> (n_max, tree_max). All slots share one forward, so each draft is cut to the cells and logits
        rows the slots before it left (in slot order) once every slot has its one row, not to the round's total."""
        n_free = n_cells_free - len(slots)
        n_out_free = self.limits.total - len(slots)
        for slot in slots:
            if slot.replay is not None:
                n_free -= len(slot.replay.tokens) - 1
                n_out_free -= len(slot.replay.tokens) - 1
        sizes: dict[int, tuple[int, int]] = {}
        for slot in slots:
            if slot.replay is not None:
                continue
            n_max = max(0, min(self._n_draft_max(slot, n_free), n_out_free))
            tree_max = min(self._tree_max(slot), n_max)
            # alone, a slot's drafting costs only its own time, which the gate weighs for the draft head; beside
            # others, it delays them all
            wait = self.budget.rest(slot.seq) if tree_max > 0 and len(slots) > 1 else None
            if wait is not None:
                resting[slot.seq] = wait
                n_max = tree_max = 0
            sizes[slot.seq] = n_max, tree_max
            n_free -= n_max
            n_out_free -= n_max
        return sizes

    def _request(self, slot: Slot, n_max: int, tree_max: int, allowance: Allowance) -> DraftRequest:
        """The slot's drafting job: its own limits and what the budget allows it (the tree limits, the probe and
        a token's seconds the drafters read are the allowance's)."""
        spec = slot.params.spec
        return DraftRequest(
            seq=slot.seq, prompt=slot.tokens, id_last=slot.id_last, n_max=n_max, n_min=spec.n_min, p_min=spec.p_min,
            want_q=slot.params.sampling.temp > 0 and (tree_max == 0 or spec.tree_verify == "rejection"),
            grammar=slot.grammar.view() if slot.grammar is not None else None, tree_max=tree_max,
            tree_min_score=allowance.tree_min_score, model_tree_max=allowance.model_tree_max,
            probe=allowance.probe, token_seconds=allowance.token_seconds, allowance=allowance)

    def _draft_all(self, slots: list[Slot], plan: RoundPlan) -> None:
        """The drafters' proposals for every request, then the budget's choice of tree nodes over all slots."""
        plan.winners = self._draft(list(plan.requests.values()), plan.failed)
        plan.nodes, plan.trees = self.budget.choose_nodes(slots, plan.requests)
        for seq, r in plan.requests.items():
            if plan.trees.get(seq) is None and r.tree is not None and r.tree.sampled:
                # draws from q are tested from the root's row even where no node of theirs goes in: leaving
                # them out would depend on the budget's view of their values
                plan.trees[seq] = r.tree.keep([])

    def _batch(self, slots: list[Slot], plan: RoundPlan, n_cells_free: int) -> tuple[RoundBatch, list]:
        """`[sampled, d1..dk]` (a tree's nodes, or a replay's tokens) of every slot at contiguous positions in one
        batch; a slot that no longer fits the cells or the model's positions ends with "context"."""
        rb = RoundBatch(batch=Batch())
        for slot in slots:
            if slot.seq in plan.failed:
                continue
            p = len(slot.tokens)
            tree = plan.trees.get(slot.seq) if slot.replay is None else None
            toks = slot.replay.tokens if slot.replay is not None else [slot.id_last] + plan.requests[slot.seq].result
            n_rows = 1 + len(tree) if tree is not None else len(toks)
            depth = 1 + tree.max_depth() if tree is not None else len(toks)
            if n_rows > n_cells_free or (self.n_pos_max is not None and p + depth > self.n_pos_max):
                continue
            n_cells_free -= n_rows
            if tree is not None:
                rb.rows[slot.seq] = tree_rows(rb.batch, tree, slot.id_last, p, slot.seq)
            else:
                rb.rows[slot.seq] = [rb.batch.add(t, p + i, slot.seq, True) for i, t in enumerate(toks)]
        events: list[SlotRound | ErrorEvent] = list(plan.failed.values())
        events += [slot.end("context") for slot in slots if slot.seq not in rb.rows and slot.seq not in plan.failed]
        rb.in_batch = [s for s in slots if s.seq in rb.rows]
        return rb, events

    def _verify_all(self, slots: list[Slot], plan: RoundPlan, rb: RoundBatch, res) -> list[SlotRound | ErrorEvent]:
        """Each slot's verdict on its rows (a replay, a tree or a chain); a slot whose verification or rollback
        breaks ends alone. A tree's drafters then hear only the rows whose cells stayed."""
        v = Verifying(ctx=self.ctx, chain=self.chain, emit=self.emit, probe_kind=self.probe.kind,
                      t_draft_ms=plan.t_draft_ms / len(slots), t_forward_ms=res.seconds * 1e3,
                      batch_rows=len(rb.batch))
        out_index = {row: i for i, row in enumerate(rb.batch.output_rows())}
        events, kept_rows = [], []  # kept_rows: the rows whose cells stay
        for slot in rb.in_batch:
            rows, r = rb.rows[slot.seq], plan.requests.get(slot.seq)
            at = [out_index[i] for i in rows]
            # a slot's rows are consecutive: a view, where a copy of a tree's logits costs time every round
            contiguous = at == list(range(at[0], at[0] + len(at)))
            logits = res.logits[at[0]:at[0] + len(at)] if contiguous else res.logits[at]
            try:
                if slot.replay is not None:
                    events.append(replay_round(v, slot, logits))
                elif plan.trees.get(slot.seq) is not None:
                    cells = self.ctx.cache.last_cells[rows]
                    ev, kept = verify_tree(v, slot, r, plan.trees[slot.seq], logits, cells,
                                           plan.ckpts.get(slot.seq), plan.winners.get(slot.seq))
                    events.append(ev)
                    kept_rows += [rows[i] for i in kept]
                else:
                    kept_rows += rows
                    events.append(verify_chain(v, slot, r, logits, plan.ckpts.get(slot.seq),
                                               plan.winners.get(slot.seq)))
            except Exception as e:  # this slot's verification or rollback broke: only its generation ends
                events.append(failure(slot.seq, "verification", e))
        if rb.batch.has_tree():
            self.chain.process(*sub_batch(rb.batch, res, sorted(kept_rows)))
        return events

    def _draft(self, requests: list[DraftRequest], failed: dict[int, ErrorEvent]) -> dict[int, str | None]:
        """The chain drafts for every request at once; if that raises, each request drafts alone so the one at
        fault is found, ends its generation (in `failed`), and the others still get their drafts."""
        if not any(r.n_max > 0 for r in requests):
            return {}
        try:
            return self.chain.draft(requests)
        except Exception:
            pass
        winners: dict[int, str | None] = {}
        for r in requests:  # the relay clears what the failed pass left on each request
            try:
                winners.update(self.chain.draft([r]))
            except Exception as e:
                failed[r.seq] = failure(r.seq, "drafting", e)
        return winners

    def _forward(self, batch: Batch, slots: list[Slot]):
        """One forward; if it raises, the batch's cells are removed and it runs once more (a fault that passes,
        such as memory pressure, then costs one round's time instead of every generation in it)."""
        try:
            res = self.ctx.decode(batch)
        except Exception:
            for slot in slots:
                if not self.ctx.seq_rm(slot.seq, len(slot.tokens), -1):
                    raise  # a memory that cannot drop the batch's tail cannot run it again
            res = self.ctx.decode(batch)
        if not batch.has_tree():  # a tree's drafters hear the kept path after verification (run)
            self.chain.process(batch, res)
        return res

    def _needs_checkpoint(self, slot: Slot, n_max: int) -> bool:
        """llama.cpp's use_ckpt, decided before drafting: forced, FULL, or RS with a draft longer than it undoes."""
        if slot.params.spec.rollback == "checkpoint" or self.probe.kind == FULL:
            return True
        rs_limit = getattr(self.ctx.cache, "rs_limit", None)
        return self.probe.kind == RS and rs_limit is not None and n_max > rs_limit

    def _tree_max(self, slot: Slot) -> int:
        """Nodes a tree of drafts may have for this slot; 0 where trees are off (Slot.trees_off)."""
        if slot.params.spec.tree_nodes <= 0 or slot.trees_off(getattr(self.ctx, "supports_trees", False)):
            return 0
        return slot.params.spec.tree_nodes

