"""The engine's one draft budget: which sequences draft, which drafters draft for them and how far, which tree
nodes go into the forward, and what each round cost each slot against plain decoding.

It owns the parts that decide: the gate (gate.py: whether a model drafter's time pays for a slot in tree mode),
the length policy (policy.py: how far a chain of drafts is worth verifying), and the slots' shared budget over
their trees (slots.py, tree_budget.py, fair_share.py), and it feeds them what they learn from: the forward's
timings into the cost curve (engine/cost/curve.py), the verdicts, each round's cost. What it keeps about one
sequence lives in that sequence's record (engine/draft/record.py).

The round (engine/round/round.py) asks it before drafting (`open_round`, `rest`, `veto`, `decide`), after
drafting (`plan`), after the forward (`observe_forward`) and after the verdicts (`settle`, `close_round`); the relay
(engine/draft/chain.py) consults it at each drafter's turn (`ngrams_draft`, `model_drafts`, `best_k`, `choose`,
`path_scores`, `charge`) and credits it with each verdict (`credit`, `credit_tree`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.batch import Batch
from engine.budget.gate import DrafterGate, exclusive_gains
from engine.budget.policy import DraftLengthPolicy
from engine.budget.slots import SlotBudget
from engine.cost.curve import CostModel
from engine.draft.base import DraftRequest
from engine.draft.record import SeqRecords
from engine.draft.registry import NGRAMS, is_ngram
from engine.events import ErrorEvent


@dataclass
class SlotNote:
    """What the budget says of one slot's round, for its event (RoundEvent's fields of the same names)."""

    balance: float | None = None  # its balance against plain decoding after the round (None: not settled)
    budget_why: str = ""  # the round's budget over all slots, then why the slot drafted less, one line
    tree_offered: int = 0  # draft nodes its drafters offered, before the budget
    not_drafted: list[str] = field(default_factory=list)  # why it drafted less, one reason each
    # a draft from a model of another vocabulary: its own tokens as text, and the target tokens that text became
    draft_pieces: list[str] = field(default_factory=list)
    target_pieces: list[str] = field(default_factory=list)


class DraftBudget:
    def __init__(self, cost: CostModel, pool: dict | None = None, records: SeqRecords | None = None,
                 fair: bool = True):
        # seq -> what the relay, gate, length policy and budget keep about it (engine/draft/record.py)
        self.records = records if records is not None else SeqRecords()
        self.pool = pool if pool is not None else {}  # name -> drafter: which of them need a model
        self.policy = DraftLengthPolicy(cost, records=self.records)  # the cost curve is its `cost`
        self.gate = DrafterGate(records=self.records)
        self.slots = SlotBudget(self, self.records)  # the slots' one budget over their trees
        self.state = self.slots.state  # its balances, refusals and rests
        # fair: no slot's answer may come slower than plain decoding would give it; False: the batch's goodput
        # alone chooses the draft rows (tree_budget.py)
        self.state.fair = fair

    # ---- the relay's questions (engine/draft/chain.py) ------------------------------------------------------

    def budgeted(self, seq: int) -> bool:
        """Whether the budget cuts this sequence's drafts (SpecParams.adaptive)."""
        return self.records.of(seq).adaptive

    def ngrams_draft(self, r: DraftRequest) -> bool:
        """Tree mode under the length policy: whether the slot's n-gram drafters draft this round, weighed as one
        drafter (gate.py). Each is cheap, but all of them together are a noticeable share of a one-row forward of
        the embedded model read from its Q4_1 blocks (docs/measured.md#xeon-speculation-by-prompt-set): on open
        text, where their nodes are seldom kept, that was a round's cost for nothing. Weighed one by one, two that
        find the same continuation would each have no gain of its own and both stop."""
        if r.tree_max == 0 or not self.budgeted(r.seq) or r.probe:
            return True
        record = self.records.of(r.seq)
        if not any(is_ngram(name) for name in record.types):
            return True
        if self.gate.pays(r.seq, NGRAMS, cheap=True):
            return True
        record.skipped.append(self.gate.why(r.seq, NGRAMS))
        return False

    def model_drafts(self, r: DraftRequest, name: str) -> bool:
        """Tree mode under the length policy: whether the model drafter `name` drafts for this request (gate.py).
        A chain's relay already leaves it the rounds the drafters before it could not fill; without the policy
        every drafter drafts what it can."""
        if r.tree_max == 0 or not self.budgeted(r.seq):
            return True
        if r.probe:
            self.records.of(r.seq).skipped.append(f"{name}: the slot rests; the n-gram drafters probe")
            return False
        first = [score for score, parent in zip(r.tree.scores, r.tree.parents) if parent < 0] if r.tree else []
        if self.gate.pays(r.seq, name, p_covered=sum(first)):
            return True
        self.records.of(r.seq).skipped.append(self.gate.why(r.seq, name))
        return False

    def best_k(self, seq: int, name: str, k_offered: int) -> int:
        """The draft length that pays best, for a network that drafts token by token (policy.py)."""
        return self.policy.best_k(seq, name, k_offered)

    def choose(self, seq: int, name: str, k_offered: int) -> int:
        """How many of a chain's k_offered draft tokens to verify (policy.py; 0 = none, a probe now and then)."""
        return self.policy.choose(seq, name, k_offered)

    def path_scores(self, seq: int, name: str, k: int) -> list[float]:
        """The chance that each position of a k-token chain from this drafter is reached: its acceptance rates
        per position (the length policy's estimates) multiplied along the chain."""
        out, run = [], 1.0
        for a in self.policy.position_rates(seq, name, k)[:k]:
            run *= a
            out.append(run)
        return out

    def charge(self, seq: int, name: str, seconds: float) -> None:
        """A drafter's drafting time for this slot this round, until the round's gain is known (gate.py)."""
        self.gate.note_cost(seq, name, seconds)

    def credit(self, seq: int, name: str, k: int, n_accepted: int) -> None:
        """A k-token draft of `name` had its first n_accepted kept: the length policy learns from it."""
        if self.budgeted(seq):
            self.policy.update(seq, name, k, n_accepted)

    def credit_tree(self, seq: int, tree, n_kept: int, credit: dict[str, tuple[int, int]],
                    models: list[str]) -> None:
        """Tree mode: each model drafter (`models`, in relay order) gains the kept tokens only it proposed and is
        charged the rows its nodes took; the n-gram drafters are weighed as one. credit: DraftTree.credit's."""
        gains = exclusive_gains(credit, n_kept)
        for name in models:
            self.gate.note_rows(seq, name, sum(1 for d in tree.drafters if d == name))
            self.gate.note_gain(seq, name, gains.get(name, 0))
        if any(is_ngram(name) for name in self.records.of(seq).types):  # the n-gram drafters as one
            # credited in the relay's order, whether or not a model drafter also found it: judged by what only
            # they found, they stopped on passages the head also read (docs/history.md#speculation-by-prompt-set);
            # the head's gain stays what it adds beyond them
            ngrams = max((m for name, (_, m) in credit.items() if is_ngram(name)), default=0)
            self.gate.note_rows(seq, NGRAMS, sum(1 for d in tree.drafters if is_ngram(d)))
            self.gate.note_gain(seq, NGRAMS, min(ngrams, n_kept))

    # ---- the round's questions (engine/round/round.py) ------------------------------------------------------

    def begin(self, seq: int) -> None:
        """A new generation in the slot: measured against plain decoding from here (SlotBudget.begin)."""
        self.slots.begin(seq)

    def open_round(self, n_slots: int) -> None:
        self.state.next_round()
        self.gate.crowd = n_slots

    def rest(self, seq: int) -> int | None:
        """Beside other slots: the rounds until a resting slot drafts again (None: it drafts this round)."""
        if not self.budgeted(seq) or not self.state.rests(seq):
            return None
        return self.state.rest(seq)

    def veto(self, slots: list, sizes: dict[int, tuple[int, int]]) -> tuple[set[int], str]:
        return self.slots.veto(slots, sizes)

    def decide(self, r: DraftRequest, n_slots: int) -> DraftRequest:
        """The budget's part of a drafting request: the least score a model drafter's tree node needs, the nodes
        a model drafter may add beside other slots, whether the slot probes, what a token is worth in seconds."""
        budgeted = self.budgeted(r.seq)
        r.tree_min_score = self.state.threshold if budgeted else 0.0
        r.model_tree_max = (min(r.tree_max, 1 + self.records.of(r.seq).model_nodes)
                            if n_slots > 1 and budgeted and r.tree_max > 0 else 0)
        r.probe = r.seq in self.state.waking
        r.token_seconds = (self.gate.seconds_per_token or 0.0) if budgeted else 0.0
        return r

    def plan(self, slots: list, requests: dict[int, DraftRequest]):
        """The nodes of every slot's tree that go into the forward (SlotBudget.plan; None: no budget ran)."""
        return self.slots.plan(slots, requests)

    def observe_forward(self, n_rows: int, seconds: float, budget) -> None:
        """The forward's time into the cost curve, and what a draft row cost this round for the gate: the share
        of the forward beyond the base rows, per row."""
        self.policy.cost.observe(n_rows, seconds)
        curve_ratio = (budget.cost.c(n_rows) / budget.cost.c(budget.n_base)
                       if budget is not None and budget.cost is not None else 1.0)
        n_draft_rows = n_rows - budget.n_base if budget is not None else 0
        self.gate.row_seconds = seconds * (1 - 1 / curve_ratio) / n_draft_rows if n_draft_rows > 0 else 0.0

    def observe_cost(self, budget, batch: Batch, in_batch: list, forward: float, after: float) -> None:
        """What the round's draft rows cost against what the budget's curve said (CostModel.step_fit): the
        forward beyond a forward of its base rows, and the work after the forward beyond a plain round's."""
        cost, n_rows, n_slots = self.policy.cost, len(batch), len(in_batch)
        if n_rows == n_slots:  # one row a slot: a plain round
            cost.observe_after_plain(after / n_slots)
            return
        if budget is None or budget.cost is None or n_rows <= budget.n_base:
            return
        extra = forward - cost.base_seconds(budget.n_base)
        plain_after = cost.after_plain_seconds()
        if plain_after is not None:  # unknown, the work after the forward is left out rather than guessed
            extra += max(0.0, after - n_slots * plain_after)
        cost.observe_step(budget.cost.step_seconds(n_rows), extra)

    def settle(self, plan, in_batch: list, events: list, whole: float) -> dict[int, SlotNote]:
        """After the round's verdicts: charge each slot's balance with the round's cost, say why it drafted less,
        and let leaving slots go from the budget. plan: the round's RoundPlan; events: each slot's round as its
        records (engine/round/event_builder.py SlotRound) or its ErrorEvent; whole: the round's time so far.
        Returns seq -> what its event shows of the budget."""
        budget, ratios = plan.budget, {}  # ratios: ghosts beside a slot -> the round's cost in plain rounds
        drafted = budget is not None or any(r.tree_max > 0 and r.n_max > 0 and self.budgeted(r.seq)
                                            for r in plan.requests.values())
        notes: dict[int, SlotNote] = {}
        for ev in events:
            if isinstance(ev, ErrorEvent):  # its generation has ended
                continue
            record, note = self.records.of(ev.seq), notes.setdefault(ev.seq, SlotNote())
            ghosts = self.slots.ghosts_of(ev.seq)
            if drafted or ghosts:
                if ghosts not in ratios:
                    ratios[ghosts] = self.slots.cost_ratio(budget, in_batch, whole, ghosts)
                self.state.settle(ev.seq, len(ev.emitted), ratios[ghosts])
                note.balance = record.balance
            if budget is not None and ev.seq in plan.requests:  # a replay slot drafted nothing
                self._note_budget(ev, plan, note)
            self._note_skipped(ev.seq, plan, note)
            if record.retokenized is not None and ev.kind == "spec":
                note.draft_pieces = list(record.retokenized.draft_pieces)
                note.target_pieces = list(record.retokenized.target_pieces)
        self.slots.next_round()
        for slot in in_batch:
            if slot.state == "done":
                self.slots.leave(slot.seq, [s.seq for s in in_batch])
        return notes

    def close_round(self, plan, batch: Batch, in_batch: list, events: list, t_start: float, t_forward: float,
                    forward: float) -> None:
        """What the round's draft rows cost (`observe_cost`) and its time per token for the gate. t_start and
        t_forward: time.perf_counter() when the round and its forward began; forward: the forward's seconds."""
        self.observe_cost(plan.budget, batch, in_batch, forward, time.perf_counter() - t_forward - forward)
        n_emitted = sum(len(ev.emitted) for ev in events if not isinstance(ev, ErrorEvent))
        self.gate.note_round(time.perf_counter() - t_start, n_emitted)

    def _note_budget(self, ev, plan, note: SlotNote) -> None:
        budget, r = plan.budget, plan.requests[ev.seq]
        note.budget_why = budget.why
        note.tree_offered = budget.offered.get(ev.seq, 0)
        if ev.seq in budget.kept and ev.verify_mode == "tree" and r.tree is not None:
            self.state.correction.observe(ev.seq, r.tree, ev.tree_path, budget.factors[ev.seq])

    def _note_skipped(self, seq: int, plan, note: SlotNote) -> None:
        """Why a slot drafted less this round: model drafters that do not pay for it (gate.py), a rest after
        refused drafts, or the budget's veto."""
        record = self.records.of(seq)
        skipped = record.skipped
        if seq in plan.resting:
            skipped = [f"its drafts were refused {record.refused - 1} rounds in a row: "
                       f"it rests, and drafts a probe in {plan.resting[seq]} round(s)"]
        elif seq in plan.vetoed:
            skipped = [plan.veto_why]
        if skipped:
            note.not_drafted = list(skipped)
            parts = ([note.budget_why] if note.budget_why else []) + ["not drafted: " + s for s in skipped]
            note.budget_why = "; ".join(parts)
