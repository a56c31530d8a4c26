"""The round's one budget applied to its slots: which slots draft, which of their tree nodes go into the
forward (engine/budget/tree_budget.py), and what the round cost each slot against plain decoding.

Before drafting, slots whose every node the fair budget would refuse do not draft (`veto`). After drafting,
`choose_nodes` hands the slots' trees to the node choice and keeps what it chose. After the forward each
drafted round is charged to every slot's balance at its measured cost (`cost_ratio`), against a plain round that still holds
the slots that left ahead of plain decoding (`leave`). The slots are the round's (engine/round/slot.py): what is
read of them is their seq, tokens, replay and n_remaining.
"""

from __future__ import annotations

from typing import Collection

from engine.budget.tree_budget import NodeChoice, SlotLedger, choose_nodes
from engine.draft.base import DraftRequest
from engine.budget.accounts import Accounts
from engine.budget.fair_share import leaves_first


class SlotTrees:
    def __init__(self, policy, gate, records: Accounts | None = None):
        self.policy = policy  # the length policy (policy.py): its cost curve prices a round's rows
        self.gate = gate  # the drafters' gate (gate.py): told when a slot's drafts won no node
        # balances, refusals and rests of every slot, in their accounts (engine/budget/accounts.py)
        self.state = SlotLedger(records=records if records is not None else Accounts())
        # (rounds, seqs): a slot that finished ahead of plain decoding by `rounds` plain rounds, which plain
        # decoding would still run beside the slots `seqs` it left: their balances are measured against a plain
        # round with it (SlotTrees.cost_ratio). What a copying slot's early exit gives the slots beside it,
        # counted when it happens: credited when the copying slot gained its tokens, it went also to slots whose
        # answers ended before it would have left (four copy answers, three ended by their end-of-text token)
        self.ghosts: list[tuple[int, frozenset[int]]] = []

    def veto(self, slots: list, sizes: dict[int, tuple[int, int]]) -> tuple[set[int], str]:
        """The adaptive tree slots that need not draft this round, and why: beside a slot that drafts nothing this
        round (it rests, replays, or has no room), whose balance cannot pay for one row and which no drafting
        slot will leave before (one that may pay it for its rows), the fair budget keeps no node of anyone's
        tree and no probe (engine/budget/fair_share.py, `fair_take`, `others_afford`), so their drafting would only
        delay the round (docs/history.md#what-the-budgets-rules-answer)."""
        state = self.state
        if len(slots) < 2 or not state.fair:
            return set(), ""
        trees = {seq for seq, (_, tree_max) in sizes.items() if tree_max > 0 and self._adaptive(seq)}
        bare = [s.seq for s in slots if s.seq not in trees]
        if not trees or not bare:
            return set(), ""
        n_base = base_rows(slots)
        cost = self._cost(slots, trees, n_base)
        tau = cost.c(n_base + 1) / cost.c(n_base) - 1.0  # what one draft row costs every slot, in tokens
        if tau <= 1e-12:
            return set(), ""
        # a slot that drafts may leave before the bare one and pay it for its rows (fair_share.leaves_first)
        paid = leaves_first({s.seq: s.n_remaining for s in slots}, [s.seq for s in slots]) \
            if cost.seq_share() > 0 else {}
        poor = [seq for seq in bare if state.balance_of(seq) < tau and not set(paid.get(seq, [])) & trees]
        if not poor:
            return set(), ""
        seq = min(poor, key=state.balance_of)
        return trees, (f"slot {seq} drafts nothing this round and stands at {state.balance_of(seq):+.2f} "
                       f"tokens against plain decoding, less than one draft row costs it ({tau:.3f}): every node "
                       f"would be refused")

    def choose_nodes(self, slots: list, requests: dict[int, DraftRequest],
                     forward: dict | None = None) -> NodeChoice | None:
        """Trees of adaptive slots share one node choice (engine/budget/tree_budget.py); others keep theirs.
        forward: filled with seq -> the tree that goes into the forward, None or with nodes (an empty one is a
        plain round); the requests keep the relay's trees as they were drafted."""
        forward = {} if forward is None else forward
        for r in requests.values():
            forward[r.seq] = r.tree if r.tree is not None and len(r.tree) else None
            if forward[r.seq] is None and r.seq in self.state.waking:
                self.state.rest(r.seq)  # a probe round that found nothing: the slot rests on
            elif forward[r.seq] is None and r.tree_max > 0 and len(slots) > 1 and self._adaptive(r.seq):
                # drafted for nothing: beside other slots it counts as a refused round, so a slot whose drafters
                # find nothing rests too, instead of drafting every round (four open answers otherwise paid
                # for n-gram lookups that found nothing in every round of a whole answer)
                self.state.records.of(r.seq).refused += 1
        trees = {seq: tree for seq, tree in forward.items() if tree is not None and self._adaptive(seq)}
        if not trees:
            return None
        n_base = base_rows(slots)
        n_base += sum(len(tree) for seq, tree in forward.items() if tree is not None and seq not in trees)
        bare = [s.seq for s in slots if s.seq not in trees]
        out = choose_nodes(trees, n_base, self._cost(slots, trees, n_base), self.state, bare,
                          {s.seq: s.n_remaining for s in slots})
        for seq, tree in trees.items():
            account = self.state.records.of(seq)
            account.model_nodes = sum(tree.drafters[v] in account.models for v in out.kept[seq])
            forward[seq] = tree.keep(out.kept[seq]) if out.kept[seq] else None
            if forward[seq] is None:
                self.gate.nothing_kept(seq)
        return out

    def _adaptive(self, seq: int) -> bool:
        """Whether the budget cuts this sequence's drafts (SpecParams.adaptive)."""
        return self.state.records.of(seq).adaptive

    def _cost(self, slots: list, trees: Collection[int], n_base: int):
        """The cost curve for a forward of n_base rows plus the drafts of the slots in `trees`: draft rows read
        their slot's cells, so slots with shorter contexts than the calibration's add cheaper rows."""
        cells = sum(len(s.tokens) for s in slots if s.seq in trees) / len(trees)
        return self.policy.cost.for_cells(n_base, cells)

    def cost_ratio(self, budget, in_batch: list, whole: float, ghosts: int = 0) -> float:
        """A drafted round's cost in plain rounds of its base rows, what each slot's balance is charged: `whole`,
        the round's time from its drafting to its events, over a plain round's. That is the forward of the base
        rows as timed in service, or calibrated until 3 were (CostModel.base_seconds), and each slot's work
        after a plain forward (CostModel.after_plain) once 3 plain rounds timed it (none before: a dearer
        charge, not a kinder one); with `ghosts` more slots in that plain round where slots beside this one left
        ahead of plain decoding (`leave`).

        The clock, not the curve: the curve moves between runs and leaves out the walk, the bookkeeping and
        drafting refused, so balances charged by it stood above plain decoding while the slots ran below it
        (docs/history.md#what-the-budgets-rules-answer)."""
        n_base = budget.n_base if budget is not None else base_rows(in_batch)
        cost = self.policy.cost
        after = cost.after_plain_seconds() or 0.0
        return whole / (cost.base_seconds(n_base + ghosts) + (len(in_batch) + ghosts) * after)

    def leave(self, seq: int, beside: list[int]) -> None:
        """A slot whose generation ended, `beside` the slots of its last forward: ahead of plain decoding by its
        balance, it would still be in a plain batch for that many rounds, each costing the slots beside it
        their share of a dearer forward (`ghosts`)."""
        lead = int(round(max(0.0, self.state.balance_of(seq))))
        others = frozenset(beside) - {seq}
        if lead > 0 and others:
            self.ghosts.append((lead, others))

    def begin(self, seq: int) -> None:
        """A new generation in the slot: it never shared a forward with the slots that left before it."""
        self.state.begin(seq)
        self.ghosts = [(n, beside - {seq}) for n, beside in self.ghosts if beside - {seq}]

    def ghosts_of(self, seq: int) -> int:
        """Slots that left ahead of plain decoding and would still share a plain forward with this one."""
        return sum(seq in beside for _, beside in self.ghosts)

    def next_round(self) -> None:
        self.ghosts = [(n - 1, beside) for n, beside in self.ghosts if n > 1]


def base_rows(slots: list) -> int:
    """Rows the forward has without drafts: each slot's sampled token, or the tokens its replay re-runs."""
    return sum(len(s.replay.tokens) if s.replay is not None else 1 for s in slots)
