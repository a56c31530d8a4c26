"""The speculative round, for every generating slot at once: draft -> one batched forward -> verify -> rollback.

Each slot's sampled token and draft tokens go into one batch at contiguous positions; one forward verifies all
of them; each slot keeps its longest agreeing prefix plus one token of the target, then gives its rejected tail
back: `seq_rm(seq, p0 + m, -1)` where the memory can (PART, or RS within its reach), else the checkpoint taken
before drafting is restored and a replay round follows (FULL, or forced). This is the loop of llama.cpp's
`server_context::update_slots` (tools/server/server-context.cpp) around `common_speculative_draft`.
"""

from __future__ import annotations

import time
from typing import Callable, Collection

from engine.memory import checkpoint
from engine.round import verify
from engine.batch import Batch, OutputLimits
from engine.draft.base import DraftRequest
from engine.draft.chain import DrafterChain
from engine.events import ErrorEvent, RoundEvent, failure
from engine.memory.probe import FULL, RS, ProbeResult
from engine.sampling import argmax_rows
from engine.round.slot import Slot
from engine.round.slot_budget import SlotBudget
from engine.draft.tree import sub_batch, tree_rows
from engine.round.tree_round import verify_tree


class Round:
    """Runs rounds over the slots it is given; the engine (slots.py) owns the slots and their lifecycle."""

    def __init__(self, ctx, chain: DrafterChain, probe: ProbeResult, limits: OutputLimits, n_pos_max: int | None,
                 eos: Collection[int], detokenize: Callable[[list[int]], str]):
        self.ctx = ctx  # the target's context: its memory (cell cache or own per-sequence cache) and forward
        self.chain = chain  # the drafters in relay order per sequence; its length policy sizes the drafts
        self.probe = probe  # what rollback the memory supports (PART / RS / FULL)
        self.limits = limits  # logits rows per forward, in all and per sequence
        self.n_pos_max = n_pos_max  # the model's last position + 1, or None where it has no such limit
        self.eos = eos  # tokens that end a generation
        self.detokenize = detokenize  # token ids -> text, for what a slot gives out
        # the one budget over the slots' trees: which slots draft, which nodes go in, each slot's balance
        self.slot_budget = SlotBudget(chain)
        self.budget_state = self.slot_budget.state
        self.last_forward: tuple[int, float] | None = None  # (rows, seconds) of the latest round's forward

    def emit(self, slot: Slot, tokens: list[int], ev: RoundEvent) -> RoundEvent:
        return slot.emit(tokens, ev, self.eos, self.detokenize)

    def _n_draft_max(self, slot: Slot, n_free: int) -> int:
        """llama-server's get_n_draft_max: fit the context (leave room) and the tokens still wanted."""
        n = min(slot.params.spec.n_max, slot.n_remaining - 1, n_free - 2, self.limits.per_seq - 1)
        if self.n_pos_max is not None:
            n = min(n, self.n_pos_max - len(slot.tokens) - 2)
        return max(0, n) if slot.params.spec.types else 0

    def run(self, slots: list[Slot]) -> list[RoundEvent]:
        """One round for these generating slots: one event per slot."""
        n_cells_free = self.ctx.n_ctx - self.ctx.cache.n_used()
        requests: dict[int, DraftRequest] = {}
        ckpts: dict[int, checkpoint.Checkpoint] = {}
        resting: dict[int, int] = {}  # seq -> rounds until it drafts again (BudgetState.rests)
        self.budget_state.next_round()
        self.chain.gate.crowd = len(slots)
        # cells and logits rows left for drafts once every slot has its one row: all slots share one forward, so
        # each draft is cut to what the slots before it left (in slot order), not to the round's total
        n_free = n_cells_free - len(slots)
        n_out_free = self.limits.total - len(slots)
        for slot in slots:
            if slot.replay is not None:
                n_free -= len(slot.replay.tokens) - 1
                n_out_free -= len(slot.replay.tokens) - 1
        sizes: dict[int, tuple[int, int]] = {}  # seq -> (n_max, tree_max)
        for slot in slots:
            if slot.replay is not None:
                continue  # a replay round re-runs decided tokens and drafts nothing
            n_max = max(0, min(self._n_draft_max(slot, n_free), n_out_free))
            tree_max = min(self._tree_max(slot), n_max)
            # alone, a slot's drafting costs only its own time, which the gate weighs for the draft head; beside
            # others, it delays them all
            if tree_max > 0 and len(slots) > 1 and self.chain.uses_policy(slot.seq) and \
                    self.budget_state.rests(slot.seq):
                resting[slot.seq] = self.budget_state.rest(slot.seq)
                n_max = tree_max = 0
            sizes[slot.seq] = n_max, tree_max
            n_free -= n_max
            n_out_free -= n_max
        vetoed, veto_why = self.slot_budget.veto(slots, sizes)
        for slot in slots:
            if slot.replay is not None:
                continue
            n_max, tree_max = (0, 0) if slot.seq in vetoed else sizes[slot.seq]
            budgeted = self.chain.uses_policy(slot.seq)
            if slot.params.spec.types and self._needs_checkpoint(slot, n_max):
                ckpts[slot.seq] = checkpoint.take(slot, self.ctx.cache)
            requests[slot.seq] = DraftRequest(
                seq=slot.seq, prompt=slot.tokens, id_last=slot.id_last, n_max=n_max,
                n_min=slot.params.spec.n_min, p_min=slot.params.spec.p_min,
                want_q=slot.params.sampling.temp > 0 and tree_max == 0,
                grammar=slot.grammar.view() if slot.grammar is not None else None, tree_max=tree_max,
                tree_min_score=self.budget_state.threshold if budgeted else 0.0,
                model_tree_max=(min(tree_max, 1 + self.budget_state.model_nodes.get(slot.seq, 0))
                                if len(slots) > 1 and budgeted and tree_max > 0 else 0),
                probe=slot.seq in self.budget_state.waking,
                token_seconds=(self.chain.gate.seconds_per_token or 0.0) if budgeted else 0.0)
        t0 = time.perf_counter()
        failed: dict[int, ErrorEvent] = {}  # seq -> why its generation ends this round
        winners = self._draft(list(requests.values()), failed)
        budget = self.slot_budget.plan(slots, requests)
        t_draft = (time.perf_counter() - t0) * 1e3
        batch = Batch()
        rows: dict[int, list[int]] = {}
        for slot in slots:
            if slot.seq in failed:
                continue
            p = len(slot.tokens)
            tree = requests[slot.seq].tree if slot.replay is None else None
            toks = slot.replay.tokens if slot.replay is not None else [slot.id_last] + requests[slot.seq].result
            n_rows = 1 + len(tree) if tree is not None else len(toks)
            depth = 1 + tree.max_depth() if tree is not None else len(toks)
            if n_rows > n_cells_free or (self.n_pos_max is not None and p + depth > self.n_pos_max):
                continue
            n_cells_free -= n_rows
            if tree is not None:
                rows[slot.seq] = tree_rows(batch, tree, slot.id_last, p, slot.seq)
            else:
                rows[slot.seq] = [batch.add(t, p + i, slot.seq, True) for i, t in enumerate(toks)]
        events: list[RoundEvent | ErrorEvent] = list(failed.values())
        for slot in slots:
            if slot.seq not in rows and slot.seq not in failed:
                events.append(slot.end("context"))
        if not rows:
            return events
        in_batch = [s for s in slots if s.seq in rows]
        t_forward = time.perf_counter()
        try:
            res = self._forward(batch, in_batch)
        except Exception as e:  # it failed twice: these generations end, the engine serves the next round
            return events + [failure(s.seq, "the forward", e) for s in in_batch]
        if self.chain.policy is not None:
            self.chain.policy.cost.observe(len(batch), res.seconds)
        self.last_forward = (len(batch), res.seconds)  # for the engine's thread count (engine/serve/threads.py)
        # the forward's cost in plain forwards by the cost curve, and what a draft row cost this round (the
        # drafters' gate, gate.py): the share of the forward beyond the base rows, per row
        curve_ratio = (budget.cost.c(len(batch)) / budget.cost.c(budget.n_base)
                       if budget is not None and budget.cost is not None else 1.0)
        n_draft_rows = len(batch) - budget.n_base if budget is not None else 0
        self.chain.gate.row_seconds = res.seconds * (1 - 1 / curve_ratio) / n_draft_rows if n_draft_rows > 0 else 0.0
        drafted = budget is not None or any(r.tree_max > 0 and r.n_max > 0 and self.chain.uses_policy(r.seq)
                                            for r in requests.values())
        out_index = {row: i for i, row in enumerate(batch.output_rows())}
        kept_rows: list[int] = []  # the rows whose cells stay: a tree's drafters hear only its kept path
        for slot in in_batch:
            at = [out_index[i] for i in rows[slot.seq]]
            # a slot's rows are consecutive: a view, where a copy of a tree's logits took 0.1 ms a slot
            contiguous = at == list(range(at[0], at[0] + len(at)))
            logits = res.logits[at[0]:at[0] + len(at)] if contiguous else res.logits[at]
            try:
                if slot.replay is not None:
                    events.append(self._replay_round(slot, logits, res.seconds * 1e3, len(batch)))
                    continue
                if requests[slot.seq].tree is not None:
                    cells = self.ctx.cache.last_cells[rows[slot.seq]]
                    ev, kept = verify_tree(self, slot, requests[slot.seq], logits, cells, ckpts.get(slot.seq),
                                           winners.get(slot.seq), t_draft / len(slots), res.seconds * 1e3,
                                           len(batch))
                    events.append(ev)
                    kept_rows += [rows[slot.seq][i] for i in kept]
                    continue
                kept_rows += rows[slot.seq]
                events.append(self._verify_slot(slot, requests[slot.seq], logits, ckpts.get(slot.seq),
                                                winners.get(slot.seq), t_draft / len(slots), res.seconds * 1e3,
                                                len(batch)))
            except Exception as e:  # this slot's verification or rollback broke: only its generation ends
                events.append(failure(slot.seq, "verification", e))
        if batch.has_tree():
            self.chain.process(*sub_batch(batch, res, sorted(kept_rows)))
        whole = time.perf_counter() - t0
        ratios: dict[int, float] = {}  # ghosts beside a slot -> the round's cost in plain rounds
        n_emitted = 0
        for ev in events:
            if isinstance(ev, RoundEvent):
                ev.n_seqs = len(in_batch)
                n_emitted += len(ev.emitted)
                ghosts = self.slot_budget.ghosts_of(ev.seq)
                if drafted or ghosts:
                    if ghosts not in ratios:
                        ratios[ghosts] = self.slot_budget.cost_ratio(budget, in_batch, whole, ghosts)
                    self.budget_state.settle(ev.seq, len(ev.emitted), ratios[ghosts])
                    ev.balance = self.budget_state.balance[ev.seq]
                if budget is not None and ev.seq in requests:  # a replay slot drafted nothing
                    ev.budget_why = budget.why
                    ev.tree_offered = budget.offered.get(ev.seq, 0)
                    if ev.seq in budget.kept and ev.verify_mode == "tree" and requests[ev.seq].tree is not None:
                        self.budget_state.correction.observe(ev.seq, requests[ev.seq].tree, ev.tree_path,
                                                            budget.factors[ev.seq])
                skipped = self.chain.skipped.get(ev.seq)  # model drafters that do not pay for this slot (gate.py)
                if ev.seq in resting:
                    skipped = [f"its drafts were refused {self.budget_state.refused[ev.seq] - 1} rounds in a row: "
                               f"it rests, and drafts a probe in {resting[ev.seq]} round(s)"]
                elif ev.seq in vetoed:
                    skipped = [veto_why]
                if skipped:
                    parts = ([ev.budget_why] if ev.budget_why else []) + ["not drafted: " + s for s in skipped]
                    ev.budget_why = "; ".join(parts)
        self.slot_budget.next_round()
        for slot in in_batch:
            if slot.state == "done":
                self.slot_budget.leave(slot.seq, [s.seq for s in in_batch])
        self._observe_cost(budget, batch, in_batch, res.seconds, time.perf_counter() - t_forward - res.seconds)
        self.chain.gate.note_round(time.perf_counter() - t0, n_emitted)
        return events

    def _observe_cost(self, budget, batch: Batch, in_batch: list[Slot], forward: float, after: float) -> None:
        """What the round's draft rows cost against what the budget's curve said (CostModel.step_fit): the
        forward beyond a forward of its base rows, and the work after the forward beyond a plain round's."""
        if self.chain.policy is None:
            return
        cost = self.chain.policy.cost
        if len(batch) == len(in_batch):  # one row a slot: a plain round
            cost.observe_after_plain(after / len(in_batch))
            return
        if budget is None or budget.cost is None or len(batch) <= budget.n_base:
            return
        extra = forward - cost.base_seconds(budget.n_base)
        plain_after = cost.after_plain_seconds()
        if plain_after is not None:  # unknown, the work after the forward is left out rather than guessed
            extra += max(0.0, after - len(in_batch) * plain_after)
        cost.observe_step(budget.cost.step_seconds(len(batch)), extra)

    def _draft(self, requests: list[DraftRequest], failed: dict[int, ErrorEvent]) -> dict[int, str | None]:
        """The chain drafts for every request at once; if that raises, each request drafts alone so the one at
        fault is found, ends its generation (in `failed`), and the others still get their drafts."""
        if not any(r.n_max > 0 for r in requests):
            return {}
        n_max = {r.seq: r.n_max for r in requests}  # the length policy may shorten them while drafting
        try:
            return self.chain.draft(requests)
        except Exception:
            pass
        winners: dict[int, str | None] = {}
        for r in requests:
            try:
                winners.update(self.chain.draft([fresh(r, n_max[r.seq])]))
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

    def _verify_slot(self, slot: Slot, r: DraftRequest, logits, ckpt, drafter: str | None, t_draft: float,
                     t_forward: float, batch_rows: int) -> RoundEvent:
        t1 = time.perf_counter()
        use_rejection = r.result_q is not None and slot.params.sampling.temp > 0 and len(r.result) > 0
        top = argmax_rows(logits)  # the target's own choice per row: the walk at temperature 0, the event
        # row i is masked by the grammar after the draft tokens before it: the matcher walks the whole draft
        # here, and after the verdict gives back the k - m tokens not kept and takes the target's own token
        allowed = slot.grammar.masks_along(r.result, logits.shape[-1]) if slot.grammar is not None else None
        if slot.coins is not None:
            verdict = verify.synthetic(slot.sampler, logits, r.result, slot.params.spec.synthetic_accept, slot.coins,
                                       allowed)
        elif use_rejection:
            verdict = verify.rejection(slot.sampler, logits, r.result, r.result_q, allowed)
        else:
            verdict = verify.sample_and_match(slot.sampler, logits, r.result, allowed, top)
        k, m = len(r.result), verdict.n_accepted
        if slot.grammar is not None:
            slot.grammar.rollback(k - m)
            slot.grammar.consume(verdict.tokens[-1])
        t_verify = t_forward + (time.perf_counter() - t1) * 1e3
        # the drafters hear the verdict before any rollback, while each still holds the draft it made; the
        # checkpoint path leaves them as the range-removal path does (see checkpoint.py)
        if k > 0:
            self.chain.accept(slot.seq, m)
        t2 = time.perf_counter()
        p_sampled = len(slot.tokens)
        p0 = p_sampled + 1
        rollback, rm_range = "none", None
        # the tail goes with seq_rm where the memory can (PART, or RS within its reach), else via the checkpoint
        forced = slot.params.spec.rollback == "checkpoint"
        if m < k and not forced and self.ctx.seq_rm(slot.seq, p0 + m, -1):
            rollback, rm_range = "seq_rm", (p0 + m, p0 + k)
        elif m < k and ckpt is not None:
            # FULL path: back to the checkpoint, the whole batch leaves the cache, a replay round follows
            restore_s = checkpoint.restore(slot, self.ctx.cache, ckpt)
            slot.replay = checkpoint.Replay(tokens=[slot.id_last] + r.result[:m] + [verdict.tokens[-1]],
                                            n_draws=verdict.n_draws, cost_ms=(ckpt.seconds + restore_s) * 1e3)
            rollback, rm_range = "checkpoint", (p_sampled, p0 + k)
        elif m < k:
            raise RuntimeError(f"the memory refused to remove [{p0 + m}, {p0 + k}) of sequence {slot.seq} "
                               f"and no checkpoint was taken (probe said {self.probe.kind})")
        t_rollback = (time.perf_counter() - t2) * 1e3
        if slot.replay is None:
            slot.tokens.append(slot.id_last)
            slot.tokens.extend(r.result[:m])
            slot.id_last = verdict.tokens[-1]
        q_draft = None
        if r.result_q is not None and k > 0:
            q_draft = [float(q[d]) for q, d in zip(r.result_q, r.result)]
        elif r.result_p is not None and k > 0:
            q_draft = list(r.result_p)
        ev = RoundEvent(
            seq=slot.seq, round=slot.round, kind="spec" if k > 0 else "plain", drafter=drafter,
            pos_sampled=p_sampled, p0=p0, drafted=list(r.result), n_accepted=m, bonus=verdict.tokens[-1],
            p_target=verdict.p_target, p_draft_rows=verdict.p_draft_rows, q_draft=q_draft,
            target_top=top,
            verify_mode="synthetic" if slot.coins is not None else "rejection" if use_rejection else "match",
            rollback=rollback, rm_range=rm_range,
            t_draft_ms=t_draft, t_verify_ms=t_verify, t_rollback_ms=t_rollback, batch_rows=batch_rows,
        )
        slot.round += 1
        ev = self.emit(slot, verdict.tokens, ev)
        if slot.state == "done":
            slot.replay = None  # nothing follows: the decided tokens were all given out
        return ev

    def _tree_max(self, slot: Slot) -> int:
        """Nodes a tree of drafts may have for this slot; 0 where trees are off or not possible (a memory with no
        tree mask, a grammar, whose masks follow one path, or synthetic acceptance, which draws per chain)."""
        if slot.params.spec.tree_nodes <= 0 or not getattr(self.ctx, "supports_trees", False):
            return 0
        return 0 if slot.grammar is not None or slot.coins is not None else slot.params.spec.tree_nodes

    def _replay_round(self, slot: Slot, logits, t_forward: float, batch_rows: int) -> RoundEvent:
        """Re-run the decided tokens: the sampler re-draws what the verification drew, then picks one new token."""
        replay = slot.replay
        t1 = time.perf_counter()
        verify.replay(slot.sampler, replay.tokens[1:], replay.n_draws)
        row = logits[-1]
        if slot.grammar is not None:
            # the restore put the grammar back after id_last: it takes the decided tokens again, as the first
            # pass did, before it masks the one new token
            slot.grammar.consume_all(replay.tokens[1:])
            row = slot.grammar.mask(row)
        tok = slot.sampler.sample(row)
        p = float(slot.sampler.probs(row)[tok])
        if slot.grammar is not None:
            slot.grammar.consume(tok)
        p_sampled = len(slot.tokens)
        slot.tokens.extend(replay.tokens)  # every row of the replay batch is now in the cache
        slot.id_last = tok
        slot.replay = None
        ev = RoundEvent(seq=slot.seq, round=slot.round, kind="replay", drafter=None, pos_sampled=p_sampled,
                        p0=p_sampled + 1, bonus=tok, p_target=[p], rollback="checkpoint",
                        t_verify_ms=t_forward + (time.perf_counter() - t1) * 1e3, t_rollback_ms=replay.cost_ms,
                        batch_rows=batch_rows, target_top=argmax_rows(logits))
        slot.round += 1
        return self.emit(slot, [tok], ev)


def fresh(r: DraftRequest, n_max: int) -> DraftRequest:
    """The request as it was before a failed drafting pass touched it."""
    r.n_max, r.drafting, r.result, r.result_q, r.result_p = n_max, True, [], None, None
    return r
