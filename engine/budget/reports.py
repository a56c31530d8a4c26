"""What the draft budget learns from a round after the fact: the relay's report of each request after drafting,
and the verdicts after verification.

The relay (engine/draft/chain.py) drafts from the allowance the budget filled before drafting and writes down
what it did (engine/draft/allowance.py, `DraftReport`): whom it asked, what each cost, what each offered to the
length policy's cut, how covered each network's turn was. Here that report becomes the estimates' updates the
relay used to make itself in the middle of drafting, in the same order: the gate's decisions made for real (the
allowance held their outcome for both cases), each drafter's time charged to the slot, the length policy's
suppression counts and the rates it read. The verdicts then credit the length policy (every drafter that had
a draft verified) and, in tree mode, the gate (what each drafter alone put on the kept path); the round's
timings what its draft rows cost against the curve.
"""

from __future__ import annotations

from engine.batch import Batch
from engine.budget.accounts import SeqAccount
from engine.budget.gate import DrafterGate, exclusive_gains
from engine.budget.policy import DraftLengthPolicy
from engine.cost.curve import CostModel
from engine.draft.base import DraftRequest
from engine.draft.registry import NGRAMS, is_ngram

RESTS = "the slot rests; the n-gram drafters probe"  # why a resting slot's networks did not draft


def learn_from_draft(gate: DrafterGate, policy: DraftLengthPolicy, account: SeqAccount, r: DraftRequest,
                     cut_from: dict[str, int]) -> None:
    """One request's report into the length policy and the gate. cut_from: drafter -> the length a network's
    cut read of its rates when the allowance was made (kept now, where it was asked)."""
    report = r.report
    for name, length in cut_from.items():
        if name in report.asked:
            policy.position_rates(r.seq, name, length)
    if account.adaptive:
        for name, k in report.offered.items():
            policy.choose(r.seq, name, k)
    for name, k in report.scored.items():
        policy.position_rates(r.seq, name, k)
    if r.tree_max == 0 or not account.adaptive:
        return
    for name, p_covered in report.p_covered.items():
        if r.probe:
            account.skipped.append(f"{name}: {RESTS}")
        elif gate.pays(r.seq, name, p_covered=p_covered):
            gate.note_cost(r.seq, name, report.seconds.get(name, 0.0))
        else:
            account.skipped.append(gate.why(r.seq, name))
    ngram_seconds = [report.seconds[name] for name in report.asked if is_ngram(name)]
    if ngram_seconds:  # the n-gram drafters are weighed as one
        gate.note_cost(r.seq, NGRAMS, sum(ngram_seconds))


def credit_verdict(gate: DrafterGate, policy: DraftLengthPolicy, account: SeqAccount, decision, tree) -> None:
    """A drafted round's verdict (its Decision, engine/round/event_builder.py): a chain's drafter, or each
    drafter of a tree, into the length policy; a tree (the DraftTree its forward held) into the gate."""
    seq = decision.seq
    if decision.verify_mode != "tree":
        if account.adaptive and decision.drafter is not None:
            policy.update(seq, decision.drafter, len(decision.drafted), decision.n_accepted)
        return
    path = decision.tree.path
    credit = tree.credit(path)
    credit_tree(gate, account, seq, tree, len(path), credit)
    if account.adaptive:
        for name, (k, m) in credit.items():
            policy.update(seq, name, k, m)


def credit_tree(gate: DrafterGate, account: SeqAccount, seq: int, tree, n_kept: int,
                credit: dict[str, tuple[int, int]]) -> None:
    """Tree mode: each model drafter (in relay order) gains the kept tokens only it proposed and is charged the
    rows its nodes took; the n-gram drafters are weighed as one. credit: DraftTree.credit's."""
    gains = exclusive_gains(credit, n_kept)
    for name in account.models:
        gate.note_rows(seq, name, sum(1 for d in tree.drafters if d == name))
        gate.note_gain(seq, name, gains.get(name, 0))
    if any(is_ngram(name) for name in account.types):
        # credited in the relay's order, whether or not a model drafter also found it: judged by what only
        # they found, they stopped on passages the head also read (docs/history.md#speculation-by-prompt-set);
        # the head's gain stays what it adds beyond them
        ngrams = max((m for name, (_, m) in credit.items() if is_ngram(name)), default=0)
        gate.note_rows(seq, NGRAMS, sum(1 for d in tree.drafters if is_ngram(d)))
        gate.note_gain(seq, NGRAMS, min(ngrams, n_kept))


def observe_cost(cost: CostModel, nodes, batch: Batch, in_batch: list, forward: float, after: float) -> None:
    """What the round's draft rows cost against what the node choice's curve said (CostModel.step_fit): the
    forward beyond a forward of its base rows, and the work after the forward beyond a plain round's. nodes:
    the round's NodeChoice (None: none); forward, after: the forward's seconds and the work after it."""
    n_rows, n_slots = len(batch), len(in_batch)
    if n_rows == n_slots:  # one row a slot: a plain round
        cost.observe_after_plain(after / n_slots)
        return
    if nodes is None or nodes.cost is None or n_rows <= nodes.n_base:
        return
    extra = forward - cost.base_seconds(nodes.n_base)
    plain_after = cost.after_plain_seconds()
    if plain_after is not None:  # unknown, the work after the forward is left out rather than guessed
        extra += max(0.0, after - n_slots * plain_after)
    cost.observe_step(nodes.cost.step_seconds(n_rows), extra)
