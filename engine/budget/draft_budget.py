"""The engine's one draft budget: which sequences draft, which drafters draft for them and how far, which tree
nodes go into the forward, and what each round cost each slot against plain decoding.

It owns the parts that decide: the gate (gate.py: whether a model drafter's time pays for a slot in tree mode),
the length policy (policy.py: how far a chain of drafts is worth verifying), and the slots' shared budget over
their trees (slots.py, tree_budget.py, fair_share.py), and it feeds them what they learn from: the forward's
timings into the cost curve (engine/cost/curve.py), the verdicts, each round's cost. What it keeps about one
sequence lives in that sequence's account (accounts.py).

Only the round and the engine talk to it, and the relay reads its answers as data. The engine `begin`s and
`release`s each sequence. The round opens each round (`open_round`, `rest`), then one call fills a frozen
allowance per request (`allow`, engine/draft/allowance.py) that the relay reads while drafting; after drafting
`plan` reads what the relay reported and chooses the tree nodes; after the verdicts `settle` takes the round's
records and timings and updates every estimate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.batch import Batch
from engine.budget.accounts import Accounts, SeqAccount
from engine.budget.gate import DrafterGate
from engine.budget.policy import DraftLengthPolicy
from engine.budget.reports import credit_verdict, learn_from_draft, observe_cost
from engine.budget.slots import SlotTrees
from engine.cost.curve import CostModel
from engine.draft.allowance import Allowance, DrafterAllowance
from engine.draft.base import DraftRequest
from engine.draft.registry import NGRAMS, is_ngram
from engine.events import ErrorEvent


@dataclass
class SlotNote:
    """What the budget says of one slot's round, for its event (RoundEvent's fields of the same names)."""

    balance: float | None = None  # its balance against plain decoding after the round (None: not settled)
    budget_why: str = ""  # the round's budget over all slots, then why the slot drafted less, one line
    tree_offered: int = 0  # draft nodes its drafters offered, before the budget
    not_drafted: list[str] = field(default_factory=list)  # why it drafted less, one reason each


@dataclass(frozen=True)
class Grant:
    """The budget's answer before drafting: each slot's allowance, and the slots it keeps from drafting."""

    allowances: dict[int, Allowance]  # seq -> what its request may draft (the vetoed: computed with no room)
    vetoed: frozenset[int] = frozenset()  # seqs the slots' budget keeps from drafting this round
    veto_why: str = ""  # the reason for the veto


@dataclass(frozen=True)
class RoundTimes:
    """When the round ran, for the cost curve and the gate (time.perf_counter() values and seconds)."""

    t_start: float  # the round began (before drafting)
    t_forward: float  # its forward began
    forward: float  # the forward's seconds


class DraftBudget:
    def __init__(self, cost: CostModel, fair: bool = True):
        self.records = Accounts()  # seq -> what the gate, length policy and slots' budget keep about it
        self.policy = DraftLengthPolicy(cost, records=self.records)  # the cost curve is its `cost`
        self.gate = DrafterGate(records=self.records)
        self.slots = SlotTrees(self.policy, self.gate, self.records)  # the slots' one budget over their trees
        self.state = self.slots.state  # its balances, refusals and rests
        # fair: no slot's answer may come slower than plain decoding would give it; False: the batch's goodput
        # alone chooses the draft rows (tree_budget.py)
        self.state.fair = fair
        # seq -> drafter -> the length a network's cut read of its rates this round (kept at `plan`)
        self._cut_from: dict[int, dict[str, int]] = {}

    # ---- the engine's calls (engine/serve/engine.py) -----------------------------------------------------------

    def begin(self, seq: int, types: list[str], adaptive: bool, models: list[str], answer: bool = True) -> None:
        """A sequence placed anew drafts with `types` (`models`: those that run a network): what its drafters
        taught the gate and the length policy is void. answer: a new generation, measured against plain
        decoding from here (False: a parked answer that resumes)."""
        account = self.records.of(seq)
        account.forget_drafting()
        account.types, account.adaptive, account.models = list(types), adaptive, list(models)
        if answer:
            self.slots.begin(seq)

    def release(self, seq: int) -> None:
        """The sequence is gone: all the budget kept about it goes."""
        self.records.release(seq)

    # ---- the round's calls (engine/round/round.py) -------------------------------------------------------------

    def open_round(self, n_slots: int) -> None:
        self.state.next_round()
        self.gate.crowd = n_slots

    def rest(self, seq: int) -> int | None:
        """Beside other slots: the rounds until a resting slot drafts again (None: it drafts this round)."""
        if not self._adaptive(seq) or not self.state.rests(seq):
            return None
        return self.state.rest(seq)

    def allow(self, slots: list, sizes: dict[int, tuple[int, int]]) -> Grant:
        """Before drafting, every answer the relay needs, per slot: the slots kept from drafting (the veto), then
        each slot's allowance for its (n_max, tree_max) in `sizes` (those of the vetoed count as 0)."""
        vetoed, why = self.slots.veto(slots, sizes)
        allowances = {}
        self._cut_from = {}
        for seq, (n_max, tree_max) in sizes.items():
            n_max, tree_max = (0, 0) if seq in vetoed else (n_max, tree_max)
            allowances[seq] = self._allowance(seq, n_max, tree_max, len(slots))
        return Grant(allowances, frozenset(vetoed), why)

    def choose_nodes(self, slots: list, requests: dict[int, DraftRequest]) -> tuple:
        """After drafting: what each drafter cost and offered (the relay's reports) into the gate and the
        length policy, then the nodes of every slot's tree that go into the forward. Returns (the node plan over
        the slots' trees, None where no budget ran; seq -> the tree its forward holds, None: a chain)."""
        for r in requests.values():
            learn_from_draft(self.gate, self.policy, self.records.of(r.seq), r, self._cut_from.get(r.seq, {}))
        forward: dict = {}
        return self.slots.choose_nodes(slots, requests, forward), forward

    def settle(self, plan, batch: Batch, in_batch: list, events: list, times: RoundTimes) -> dict[int, SlotNote]:
        """After the round's verdicts: the forward's time into the cost curve, each verdict into the length
        policy and the gate, each slot's balance charged with the round's cost, and why it drafted less; leaving
        slots go from the budget. plan: the round's RoundPlan; events: each slot's round as its records
        (engine/round/event_builder.py SlotRound: its Decision and Timing) or its ErrorEvent. Returns seq ->
        what its event shows of the budget."""
        self._observe_forward(len(batch), times.forward, plan.nodes)
        for ev in events:
            if not isinstance(ev, ErrorEvent) and ev.kind == "spec" and ev.seq in plan.requests:
                credit_verdict(self.gate, self.policy, self.records.of(ev.seq), ev.decision, plan.trees.get(ev.seq))
        notes = self._settle_balances(plan, in_batch, events, time.perf_counter() - times.t_start)
        observe_cost(self.policy.cost, plan.nodes, batch, in_batch, times.forward,
                     time.perf_counter() - times.t_forward - times.forward)
        n_emitted = sum(len(ev.emitted) for ev in events if not isinstance(ev, ErrorEvent))
        self.gate.note_round(time.perf_counter() - times.t_start, n_emitted)
        return notes

    # ---- before drafting -----------------------------------------------------------------------------------------

    def _adaptive(self, seq: int) -> bool:
        """Whether the budget cuts this sequence's drafts (SpecParams.adaptive)."""
        return self.records.of(seq).adaptive

    def _allowance(self, seq: int, n_max: int, tree_max: int, n_slots: int) -> Allowance:
        """One request's allowance: the tree limits, the probe, a token's seconds, and each drafter's part."""
        account, adaptive = self.records.of(seq), self._adaptive(seq)
        account.skipped = []
        probe = seq in self.state.waking
        gated = tree_max > 0 and adaptive and not probe and n_max > 0
        ngrams = not gated or self._ngrams_draft(seq, account)
        parts, n = {}, n_max
        for name in account.types:
            if is_ngram(name) and not ngrams:
                parts[name] = DrafterAllowance(n_max=n, drafts=False, drafts_covered=False)
                continue
            scores = self._path_scores(seq, name, n) if tree_max > 0 else ()
            if name in account.models and tree_max > 0:
                parts[name] = self._model_part(seq, name, n, scores, gated, probe and adaptive)
                continue
            if name in account.models and adaptive and n > 0:  # a network drafts no further than pays; those
                self._cut_from.setdefault(seq, {})[name] = n  # after it, as far as it was allowed
                n = max(1, self.policy.best_k(seq, name, n))
            cuts = self.policy.cuts(seq, name, n) if adaptive and tree_max == 0 else ()
            parts[name] = DrafterAllowance(n_max=n, cuts=cuts, scores=scores)
        return Allowance(
            drafters=parts, covered_at=self.gate.params.covered_at,
            tree_min_score=self.state.threshold if adaptive else 0.0,
            model_tree_max=min(tree_max, 1 + account.model_nodes) if n_slots > 1 and adaptive and tree_max > 0 else 0,
            probe=probe, token_seconds=(self.gate.seconds_per_token or 0.0) if adaptive else 0.0)

    def _ngrams_draft(self, seq: int, account: SeqAccount) -> bool:
        """Tree mode, adaptive: whether the slot's n-gram drafters draft this round, weighed as one
        drafter (gate.py): together they are a noticeable share of a one-row forward, spent for nothing on open
        text (docs/measured.md#xeon-speculation-by-prompt-set); weighed one by one, two that find the same
        continuation would each have no gain of its own and both stop."""
        if not any(is_ngram(name) for name in account.types):
            return True
        if self.gate.pays(seq, NGRAMS, cheap=True):
            return True
        account.skipped.append(self.gate.why(seq, NGRAMS))
        return False

    def _model_part(self, seq: int, name: str, n: int, scores: tuple, gated: bool, resting: bool) -> DrafterAllowance:
        """Tree mode: whether the model drafter `name` drafts, for a round the drafters before it cover or not
        (gate.py); the relay learns which when its turn comes. A resting slot's probe leaves networks out."""
        if resting:
            return DrafterAllowance(n_max=n, scores=scores, drafts=False, drafts_covered=False)
        if not gated:
            return DrafterAllowance(n_max=n, scores=scores)
        self.gate.settle_pending(seq, name)
        return DrafterAllowance(n_max=n, scores=scores, drafts=self.gate.would_pay(seq, name, False),
                                drafts_covered=self.gate.would_pay(seq, name, True))

    def _path_scores(self, seq: int, name: str, k: int) -> tuple[float, ...]:
        """The chance that each position of a k-token chain from this drafter is reached: its acceptance rates
        per position (the length policy's estimates) multiplied along the chain."""
        out, run = [], 1.0
        for a in self.policy.rates_view(seq, name, k)[:k]:
            run *= a
            out.append(run)
        return tuple(out)

    # ---- after the verdicts ---------------------------------------------------------------------------------------

    def _observe_forward(self, n_rows: int, seconds: float, nodes) -> None:
        """The forward's time into the cost curve, and what a draft row cost this round for the gate: the share
        of the forward beyond the base rows, per row."""
        self.policy.cost.observe(n_rows, seconds)
        curve_ratio = (nodes.cost.c(n_rows) / nodes.cost.c(nodes.n_base)
                       if nodes is not None and nodes.cost is not None else 1.0)
        n_draft_rows = n_rows - nodes.n_base if nodes is not None else 0
        self.gate.row_seconds = seconds * (1 - 1 / curve_ratio) / n_draft_rows if n_draft_rows > 0 else 0.0

    def _settle_balances(self, plan, in_batch: list, events: list, whole: float) -> dict[int, SlotNote]:
        """Charge each slot's balance with the round's cost (whole: the round's time so far), say why it drafted
        less, and let leaving slots go from the slots' trees."""
        nodes, ratios = plan.nodes, {}  # ratios: ghosts beside a slot -> the round's cost in plain rounds
        drafted = nodes is not None or any(r.tree_max > 0 and r.n_max > 0 and self._adaptive(r.seq)
                                            for r in plan.requests.values())
        notes: dict[int, SlotNote] = {}
        for ev in events:
            if isinstance(ev, ErrorEvent):  # its generation has ended
                continue
            account, note = self.records.of(ev.seq), notes.setdefault(ev.seq, SlotNote())
            ghosts = self.slots.ghosts_of(ev.seq)
            if drafted or ghosts:
                if ghosts not in ratios:
                    ratios[ghosts] = self.slots.cost_ratio(nodes, in_batch, whole, ghosts)
                self.state.settle(ev.seq, len(ev.emitted), ratios[ghosts])
                note.balance = account.balance
            if nodes is not None and ev.seq in plan.requests:  # a replay slot drafted nothing
                self._note_budget(ev, plan, note)
            self._note_skipped(ev.seq, plan, note)
        self.slots.next_round()
        for slot in in_batch:
            if slot.state == "done":
                self.slots.leave(slot.seq, [s.seq for s in in_batch])
        return notes

    def _note_budget(self, ev, plan, note: SlotNote) -> None:
        nodes, tree = plan.nodes, plan.trees.get(ev.seq)
        note.budget_why = nodes.why
        note.tree_offered = nodes.offered.get(ev.seq, 0)
        if ev.seq in nodes.kept and ev.verify_mode == "tree" and tree is not None:
            self.state.correction.observe(ev.seq, tree, ev.tree_path, nodes.factors[ev.seq])

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
