"""A slot's verdict in a round, for a chain of drafts and for a replay: the target's tokens against the draft,
the rejected tail given back, the drafters told, the slot advanced, and the round's records for its event
(event_builder.py).

The tail goes with `seq_rm(seq, p0 + m, -1)` where the memory can (PART, or RS within its reach), else the
checkpoint taken before drafting is restored and a replay round re-runs the decided tokens (FULL, or forced),
as llama.cpp's server does around `common_speculative_draft` (tools/server/server-context.cpp). A tree's
verdict is in tree_round.py; both take what they need of the round as a `Verifying`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from engine.draft.base import DraftRequest
from engine.draft.record import take_relay
from engine.memory import checkpoint
from engine.memory.probe import RS
from engine.round import verify
from engine.round.event_builder import Decision, Emission, SlotRound, Timing
from engine.round.slot import Slot
from engine.sampling import argmax_rows, entropy_bits


@dataclass
class Verifying:
    """What a slot's verification needs of its round, besides its own rows of logits."""
    ctx: object  # the target's context: seq_rm on its memory, its cell cache
    chain: object  # the DrafterChain: told the verdict while each drafter still holds its draft
    emit: Callable[[Slot, list[int]], Emission]  # gives kept tokens to the user (Slot.emit)
    probe_kind: str  # what rollback the memory supports (PART / RS / FULL), for the message when it refuses
    t_draft_ms: float  # this slot's share of the round's drafting time
    t_forward_ms: float  # the round's forward
    batch_rows: int  # rows in the round's batch

    def timing(self, t_verify_ms: float, t_rollback_ms: float) -> Timing:
        """A slot's timing: its own verification and rollback, with the round's shares."""
        return Timing(t_draft_ms=self.t_draft_ms, t_verify_ms=t_verify_ms, t_forward_ms=self.t_forward_ms,
                      t_rollback_ms=t_rollback_ms, batch_rows=self.batch_rows)


def verify_chain(v: Verifying, slot: Slot, r: DraftRequest, logits, ckpt, drafter: str | None) -> SlotRound:
    """Keep the longest agreeing prefix m of the draft plus the target's own token; give back the rest."""
    t1 = time.perf_counter()
    verdict, top, mode = judge(slot, r, logits)
    k, m = len(r.result), verdict.n_accepted
    if slot.grammar is not None:  # the matcher walked the whole draft: back to the kept part, then the bonus
        slot.grammar.rollback(k - m)
        slot.grammar.consume(verdict.tokens[-1])
    t_verify = v.t_forward_ms + (time.perf_counter() - t1) * 1e3
    # the drafters hear the verdict before any rollback, while each still holds the draft it made; the
    # checkpoint path leaves them as the range-removal path does (see checkpoint.py)
    if k > 0:
        v.chain.accept(slot.seq, m)
    t2 = time.perf_counter()
    p_sampled, p0 = len(slot.tokens), len(slot.tokens) + 1
    rollback, rm_range = give_back(v, slot, r.result, m, verdict, ckpt)
    t_rollback = (time.perf_counter() - t2) * 1e3
    if slot.replay is None:
        slot.tokens.append(slot.id_last)
        slot.tokens.extend(r.result[:m])
        slot.id_last = verdict.tokens[-1]
    decided = Decision(
        seq=slot.seq, round=slot.round, kind="spec" if k > 0 else "plain", drafter=drafter,
        pos_sampled=p_sampled, p0=p0, drafted=list(r.result), n_accepted=m, bonus=verdict.tokens[-1],
        p_target=verdict.p_target, p_draft_rows=verdict.p_draft_rows, q_draft=draft_probs(r),
        entropy=entropy_bits(logits[: m + 1]) if slot.params.explain else [],
        uniforms=verdict.uniforms, residual_top=verdict.residual_top,
        target_top=top, verify_mode=mode, rollback=rollback, rm_range=rm_range,
        rm_cells=rm_range[1] - rm_range[0] if rm_range else 0,
        rs_undone=k - m if rollback == "seq_rm" and v.probe_kind == RS else 0,
        relay=take_relay(v.chain.records.of(slot.seq), r, {drafter: k} if drafter and k else {},
                         tree=r.tree_max > 0))  # a tree the budget left empty is verified as a plain round
    pieces = r.report.retokenized
    if pieces is not None and k > 0:  # the draft through text of a drafter of another vocabulary
        decided.draft_pieces, decided.target_pieces = list(pieces.draft_pieces), list(pieces.target_pieces)
    slot.round += 1
    out = v.emit(slot, verdict.tokens)
    if slot.state == "done":
        slot.replay = None  # nothing follows: the decided tokens were all given out
    return SlotRound(decided, out, v.timing(t_verify, t_rollback))


def judge(slot: Slot, r: DraftRequest, logits):
    """(verdict, the target's top token per row, the mode's name): synthetic acceptance, rejection sampling
    where the drafter gave q at temperature > 0, else sample-and-match."""
    use_rejection = r.result_q is not None and slot.params.sampling.temp > 0 and len(r.result) > 0
    top = argmax_rows(logits)  # the target's own choice per row: the walk at temperature 0, the event
    # row i is masked by the grammar after the draft tokens before it: the matcher walks the whole draft here
    if slot.grammar is not None and slot.sampler.greedy and slot.coins is None and not use_rejection:
        best = slot.grammar.greedy_along(r.result, logits, top)  # masks only where a row's argmax is forbidden
        return verify.sample_and_match(slot.sampler, logits, r.result, None, best), top, "match"
    allowed = (slot.grammar.masks_along(r.result, logits.shape[-1], logits.device) if slot.grammar is not None
               else None)
    if slot.coins is not None:
        accept = slot.params.spec.synthetic_accept
        return verify.synthetic(slot.sampler, logits, r.result, accept, slot.coins, allowed), top, "synthetic"
    if use_rejection:
        shown = verify.RESIDUAL_SHOWN if slot.params.explain else 0
        return verify.rejection(slot.sampler, logits, r.result, r.result_q, allowed, shown), top, "rejection"
    return verify.sample_and_match(slot.sampler, logits, r.result, allowed, top), top, "match"


def give_back(v: Verifying, slot: Slot, draft: list[int], m: int, verdict, ckpt) -> tuple[str, tuple | None]:
    """The rejected tail leaves the memory: (how, the positions [p0, p1) it held)."""
    k, p_sampled = len(draft), len(slot.tokens)
    p0 = p_sampled + 1
    if m == k:
        return "none", None
    forced = slot.params.spec.rollback == "checkpoint"
    if not forced and v.ctx.seq_rm(slot.seq, p0 + m, -1):
        return "seq_rm", (p0 + m, p0 + k)
    if ckpt is not None:  # FULL path: back to the checkpoint, the whole batch leaves the cache, a replay follows
        restore_s = checkpoint.restore(slot, v.ctx.cache, ckpt)
        slot.replay = checkpoint.Replay(tokens=[slot.id_last] + draft[:m] + [verdict.tokens[-1]],
                                        n_draws=verdict.n_draws, cost_ms=(ckpt.seconds + restore_s) * 1e3)
        return "checkpoint", (p_sampled, p0 + k)
    raise RuntimeError(f"the memory refused to remove [{p0 + m}, {p0 + k}) of sequence {slot.seq} "
                       f"and no checkpoint was taken (probe decided {v.probe_kind})")


def draft_probs(r: DraftRequest) -> list[float] | None:
    """The drafter's probability of each token it drafted, for the event (None where it gave none)."""
    if r.result_q is not None and r.result:
        return [float(q[d]) for q, d in zip(r.result_q, r.result)]
    if r.result_p is not None and r.result:
        return list(r.result_p)
    return None


def replay_round(v: Verifying, slot: Slot, logits) -> SlotRound:
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
    decided = Decision(seq=slot.seq, round=slot.round, kind="replay", drafter=None, pos_sampled=p_sampled,
                   p0=p_sampled + 1, bonus=tok, p_target=[p], rollback="checkpoint", target_top=argmax_rows(logits))
    timing = Timing(t_verify_ms=v.t_forward_ms + (time.perf_counter() - t1) * 1e3, t_forward_ms=v.t_forward_ms,
                    t_rollback_ms=replay.cost_ms, batch_rows=v.batch_rows)  # a replay drafts nothing
    slot.round += 1
    return SlotRound(decided, v.emit(slot, [tok]), timing)
