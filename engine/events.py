"""What one round did, as plain data: the UI and the bench both consume these."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RoundEvent:
    """Made once, when every part of the round is known (engine/round/event_builder.py), and never written to
    after: whoever reads it sees what the round did."""

    seq: int  # sequence (slot) id
    round: int  # round index within this generation (0 = prefill)
    kind: str  # "prefill" | "plain" (no draft) | "spec" (draft verified) | "replay" (checkpoint replay)
    drafter: str | None  # the drafter whose draft was verified, None if no draft
    pos_sampled: int  # position of the token sampled last round, the first row of the batch
    p0: int  # position of the first draft token (pos_sampled + 1)
    drafted: list[int] = field(default_factory=list)  # d1..dk
    n_accepted: int = 0  # m: draft tokens kept
    bonus: int = -1  # the target's own token this round (correction after a rejection, or the bonus)
    emitted: list[int] = field(default_factory=list)  # tokens given to the user (accepted + bonus, cut at stop)
    p_target: list[float] = field(default_factory=list)  # target p of each emitted token
    p_draft_rows: list[float] = field(default_factory=list)  # target p of each drafted token (row i judges d_i+1)
    # the target's entropy in bits (softmax at temperature 1) at each emitted token's row; only with
    # GenParams.explain, else empty
    entropy: list[float] = field(default_factory=list)
    # rejection sampling (verify_mode "rejection"): the uniform u drawn for each judged draft token (kept where
    # u <= min(1, p/q)), and after a rejection, with GenParams.explain, the residual norm(max(0, p - q))'s top
    # tokens (id, probability) the correction was drawn from
    uniforms: list[float] = field(default_factory=list)
    residual_top: list[tuple[int, float]] = field(default_factory=list)
    target_top: list[int] = field(default_factory=list)  # the target's most likely token at each batch row
    q_draft: list[float] | None = None  # draft q of each drafted token, when the drafter has a distribution
    verify_mode: str = "match"  # "match" (sample-and-match, argmax at temp 0) | "rejection" | "synthetic" | "tree"
    # how the rejected cells left: "none" | "seq_rm" (a range cut, rm_range) | "tree" (the branches not taken,
    # freed cell by cell: rm_positions) | "checkpoint" (the state before drafting restored, the kept tokens replayed
    # next round: rm_range spans the whole batch)
    rollback: str = "none"
    rm_range: tuple[int, int] | None = None  # seq_rm: [p0 + m, p0 + k); checkpoint: [pos_sampled, p0 + k)
    rm_cells: int = 0  # cells of this sequence the rollback took out of the cache
    rm_positions: list[int] = field(default_factory=list)  # "tree": each freed node's position (siblings share)
    rs_undone: int = 0  # steps of recurrent state a seq_rm undid (a memory with RS layers); 0 elsewhere
    t_draft_ms: float = 0.0  # time in the drafters
    t_verify_ms: float = 0.0  # the target forward (shared with the other slots in the batch) + verification
    t_forward_ms: float = 0.0  # of t_verify_ms, the forward alone: the arena splits a round's cost with it
    t_rollback_ms: float = 0.0  # seq_rm or checkpoint restore + replay
    batch_rows: int = 0  # rows in the shared forward (all slots)
    n_seqs: int = 1  # sequences in the shared forward: more than 1 means other generations shared its cost
    n_cells_used: int = 0  # cells in use after the round, all sequences
    seq_cells: int = 0  # cells of this sequence after the round
    text_delta: str = ""  # new text for the user
    done: bool = False  # generation finished
    stop_reason: str | None = None  # "eos" | "length" | "context" | "stopped"
    t_end: float = 0.0  # time.perf_counter() when the round finished, for tokens/s measured at the source
    notes: list[str] = field(default_factory=list)  # what the user should know about the settings (prefill only)
    # a tree of drafts (verify_mode "tree"; engine/draft/tree.py): node i's token, parent (-1: after the sampled token)
    # and drafter, and the nodes the target kept; `drafted` then shows the kept path and the first branch below
    tree_tokens: list[int] = field(default_factory=list)
    tree_parents: list[int] = field(default_factory=list)
    tree_drafters: list[str] = field(default_factory=list)
    tree_path: list[int] = field(default_factory=list)
    # temperature > 0 with drafts drawn from q (engine/round/tree_rejection.py): each sampled draft tested, in order,
    # as (depth, token, drafter, p, q, accepted); accepted with probability min(1, p / q), p renormalised after
    # each rejection
    tree_tries: list[tuple[int, int, str, float, float, bool]] = field(default_factory=list)
    tree_offered: int = 0  # draft nodes the drafters offered this slot, before the round's budget
    budget_why: str = ""  # the round's budget over all slots (engine/budget/tree_budget.py), one line
    # why this slot drafted less this round, one reason each: a model drafter the gate left out ("name: why"),
    # a rest after refused drafts, the budget's veto; budget_why shows them too
    not_drafted: list[str] = field(default_factory=list)
    # a draft from a model of another vocabulary (draft-uni): its own tokens as text, and the target tokens that
    # text became (what was verified, before any cut); empty for every other drafter
    draft_pieces: list[str] = field(default_factory=list)
    target_pieces: list[str] = field(default_factory=list)
    # each drafter the chain asked this round, in relay order: (name, tokens or nodes offered, of those verified,
    # why not more: "no match", "nothing above p_min", "under n_min", "the length policy cut it", ...; "" if all)
    relay: list[tuple[str, int, int, str]] = field(default_factory=list)
    # tokens this generation got beyond what plain decoding would have given it in the same forward time, after
    # this round (SlotLedger.balance); None where no budget ran
    balance: float | None = None
    # the final event of a constrained answer: whether its emitted tokens are a whole output of the grammar, by
    # the slot's llguidance matcher (an answer cut by the token limit or Stop may not be); None elsewhere
    format_complete: bool | None = None

    @property
    def accepted(self) -> list[int]:
        return self.drafted[: self.n_accepted]

    @property
    def rejected(self) -> list[int]:
        return self.drafted[self.n_accepted:]


@dataclass
class ErrorEvent:
    """A generation the engine had to end on an exception; its slot is already released."""

    seq: int  # sequence (slot) id
    message: str  # one line for the user
    done: bool = True


def failure(seq: int, stage: str, error: Exception) -> ErrorEvent:
    """The ErrorEvent of a generation that raised during `stage` (drafting, verification, ...)."""
    return ErrorEvent(seq=seq, message=f"generation failed during {stage}: {type(error).__name__}: {error}")


@dataclass
class WaitEvent:
    """A request is waiting for a slot; sent again whenever its place in line changes."""

    position: int  # 1 = the next to get a slot; 0 = an idle step-mode generation gave its slot back
    done: bool = False
