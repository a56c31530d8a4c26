"""The round's one budget applied to its slots: which slots draft, which of their tree nodes go into the
forward (engine/budget.py), and what the round cost each slot against plain decoding.

Before drafting, slots whose every node the fair budget would refuse do not draft (`veto`). After drafting,
`plan` hands the slots' trees to the budget and keeps what it chose. After the forward each drafted round is
charged to every slot's balance at its measured cost (`cost_ratio`), and a slot that gained tokens credits the
slots it will leave behind (`credit_leavers`).
"""

from __future__ import annotations

from typing import Collection

from engine.budget import Budget, BudgetState, leaves_first, plan as budget_plan
from engine.drafters.base import DraftRequest
from engine.drafters.chain import DrafterChain
from engine.events import RoundEvent
from engine.slot import Slot


class SlotBudget:
    def __init__(self, chain: DrafterChain):
        self.chain = chain  # its length policy's cost curve, its drafters (which need a model), its gate
        self.state = BudgetState()  # balances, refusals and rests of every slot

    def veto(self, slots: list[Slot], sizes: dict[int, tuple[int, int]]) -> tuple[set[int], str]:
        """The budgeted tree slots that need not draft this round, and why: beside a slot that drafts nothing this
        round (it rests, replays, or has no room), whose balance cannot pay for one row and which no drafting
        slot will leave before (one that may pay it for its rows), the fair budget keeps no node of anyone's
        tree and no probe (engine/budget.py, `_fair_take`, `_others_afford`), so their drafting would only
        delay the round. Four answers of which two copy and two write freely spent 0.7 ms a round drafting for
        nodes refused this way."""
        state, policy = self.state, self.chain.policy
        if len(slots) < 2 or policy is None or not state.fair:
            return set(), ""
        trees = {seq for seq, (_, tree_max) in sizes.items() if tree_max > 0 and self.chain.uses_policy(seq)}
        bare = [s.seq for s in slots if s.seq not in trees]
        if not trees or not bare:
            return set(), ""
        n_base = base_rows(slots)
        cost = self._cost(slots, trees, n_base)
        tau = cost.c(n_base + 1) / cost.c(n_base) - 1.0  # what one draft row costs every slot, in tokens
        if tau <= 1e-12:
            return set(), ""
        # a slot that drafts may leave before the bare one and pay it for its rows (budget.leaves_first)
        paid = leaves_first({s.seq: s.n_remaining for s in slots}, [s.seq for s in slots]) \
            if cost.seq_share() > 0 else {}
        poor = [seq for seq in bare if state.balance.get(seq, 0.0) < tau and not set(paid.get(seq, [])) & trees]
        if not poor:
            return set(), ""
        seq = min(poor, key=lambda k: state.balance.get(k, 0.0))
        return trees, (f"slot {seq} drafts nothing this round and stands at {state.balance.get(seq, 0.0):+.2f} "
                       f"tokens against plain decoding, less than one draft row costs it ({tau:.3f}): every node "
                       f"would be refused")

    def plan(self, slots: list[Slot], requests: dict[int, DraftRequest]) -> Budget | None:
        """Trees of slots under the length policy share one budget (engine/budget.py); others keep theirs.
        Afterwards a request's tree is None or has nodes: an empty one is a plain round."""
        for r in requests.values():
            if r.tree is not None and not len(r.tree):
                r.tree = None
            if r.tree is None and r.seq in self.state.waking:
                self.state.rest(r.seq)  # a probe round that found nothing: the slot rests on
            elif r.tree is None and r.tree_max > 0 and len(slots) > 1 and self.chain.uses_policy(r.seq):
                # drafted for nothing: beside other slots it counts as a refused round, so a slot whose drafters
                # find nothing rests too, instead of drafting every round (four open answers spent 1.3 ms a
                # round on n-gram lookups that found nothing, for a whole answer)
                self.state.refused[r.seq] = self.state.refused.get(r.seq, 0) + 1
        trees = {seq: r.tree for seq, r in requests.items() if r.tree is not None and self.chain.uses_policy(seq)}
        if self.chain.policy is None or not trees:
            return None
        n_base = base_rows(slots)
        n_base += sum(len(r.tree) for seq, r in requests.items() if r.tree is not None and seq not in trees)
        bare = [s.seq for s in slots if s.seq not in trees]
        out = budget_plan(trees, n_base, self._cost(slots, trees, n_base), self.state, bare,
                          {s.seq: s.n_remaining for s in slots})
        models = {name for name, impl in self.chain.pool.items() if impl.needs_model}
        for seq, tree in trees.items():
            self.state.model_nodes[seq] = sum(tree.drafters[v] in models for v in out.kept[seq])
            requests[seq].tree = tree.keep(out.kept[seq]) if out.kept[seq] else None
            if requests[seq].tree is None:
                self.chain.gate.nothing_kept(seq)
        return out

    def _cost(self, slots: list[Slot], trees: Collection[int], n_base: int):
        """The cost curve for a forward of n_base rows plus the drafts of the slots in `trees`: draft rows read
        their slot's cells, so slots with shorter contexts than the calibration's add cheaper rows."""
        cells = sum(len(s.tokens) for s in slots if s.seq in trees) / len(trees)
        return self.chain.policy.cost.for_cells(n_base, cells)

    def cost_ratio(self, budget, in_batch: list[Slot], curve_ratio: float, seconds: float) -> float:
        """A drafted round's cost in plain forwards of its base rows, what each slot's balance is charged: its
        forward and drafting time over the average forward of that many rows, where the engine has timed
        enough of those (plain rounds beside the drafted ones), else the cost curve's ratio. The curve comes
        from a calibration that moves by 10% between runs on a shared machine: one that put 6 rows at 1.05x of
        4 let four open slots verify trees whose rounds took 1.37x, and balances charged by the curve never
        showed it; nor did they show drafting time spent on nodes the budget then refused."""
        n_base = budget.n_base if budget is not None else base_rows(in_batch)
        cost = self.chain.policy.cost
        avg, n_seen = cost.seen.get(n_base, (0.0, 0))
        return seconds / avg if n_seen >= cost.min_seen and avg > 0 else curve_ratio

    def credit_leavers(self, events, left: dict[int, int], share: float) -> None:
        """Each token a slot gained beyond plain decoding's one is a forward earlier that it leaves the batch, and
        every slot that wants more tokens than it runs that forward without it: `share` of a forward (its row and
        what a sequence costs beyond one, RoundCost.seq_share) goes to their balances. What the budget counted
        on when it let the leaving slot's rows in (budget.py, `_fair_take`)."""
        gained = {ev.seq: len(ev.emitted) - 1 for ev in events if isinstance(ev, RoundEvent) and ev.seq in left}
        if share <= 0 or not any(gained.values()):
            return
        balance = self.state.balance
        before = leaves_first(left, list(gained))
        for seq in gained:
            early = sum(gained[k] for k in before[seq])
            if early > 0:
                balance[seq] = balance.get(seq, 0.0) + share * early


def base_rows(slots: list[Slot]) -> int:
    """Rows the forward has without drafts: each slot's sampled token, or the tokens its replay re-runs."""
    return sum(len(s.replay.tokens) if s.replay is not None else 1 for s in slots)
