"""A round's event, built once: the plain records a slot's round leaves behind, and the one place that makes a
RoundEvent of them.

Verification (chain_verify.py, tree_round.py), the prefill (engine/serve/prefill.py) and a slot's end
(slot.py) each return a `SlotRound`: their `Decision`, their `Timing` and the `Emission` that Slot.emit gave
out. The round adds the budget's `SlotNote`; the engine's step (engine/serve/engine.py) then calls `assemble`
once every part is known (the cells after the step, its end time), so an event is complete when it is made
and nobody writes to it afterwards (RoundEvent is frozen).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from engine.budget.draft_budget import SlotNote
from engine.events import ErrorEvent, RoundEvent


@dataclass
class TreeShown:
    """A verified tree of drafts (engine/draft/tree.py): node i's token, parent (-1: after the sampled token)
    and drafter, and the nodes the target kept."""
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    drafters: list[str] = field(default_factory=list)
    path: list[int] = field(default_factory=list)
    tries: list = field(default_factory=list)  # SiblingTry of each sampled draft tested (tree_rejection.py)


@dataclass
class Decision:
    """What a slot's round decided, before any token was given out (RoundEvent's fields of the same names)."""
    seq: int
    round: int
    kind: str  # "prefill" | "plain" | "spec" | "replay"
    drafter: str | None
    pos_sampled: int
    p0: int
    drafted: list[int] = field(default_factory=list)
    n_accepted: int = 0
    bonus: int = -1
    p_target: list[float] = field(default_factory=list)
    p_draft_rows: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)
    uniforms: list[float] = field(default_factory=list)
    residual_top: list[tuple[int, float]] = field(default_factory=list)
    target_top: list[int] = field(default_factory=list)
    q_draft: list[float] | None = None
    verify_mode: str = "match"
    rollback: str = "none"
    rm_range: tuple[int, int] | None = None
    rm_cells: int = 0
    rm_positions: list[int] = field(default_factory=list)
    rs_undone: int = 0
    relay: list[tuple[str, int, int, str]] = field(default_factory=list)
    tree: TreeShown | None = None  # verify_mode "tree" only
    # a draft from a model of another vocabulary: its own tokens as text, and the target tokens that text became
    draft_pieces: list[str] = field(default_factory=list)
    target_pieces: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # the slot's notes on its settings (prefill only)


@dataclass
class Timing:
    """Where a slot's round spent its time, in milliseconds, and the rows of the forward it shared."""
    t_draft_ms: float = 0.0
    t_verify_ms: float = 0.0
    t_forward_ms: float = 0.0
    t_rollback_ms: float = 0.0
    batch_rows: int = 0


@dataclass
class Emission:
    """What Slot.emit gave the user: the tokens after the cut at a stop, their text, and whether it ended."""
    emitted: list[int] = field(default_factory=list)
    text_delta: str = ""
    done: bool = False
    stop_reason: str | None = None
    format_complete: bool | None = None  # the grammar's verdict on the whole answer, at its end


@dataclass
class SlotRound:
    """One slot's round as records, until the step that ran it is over and its event is assembled."""
    decision: Decision
    emission: Emission
    timing: Timing = field(default_factory=Timing)
    note: SlotNote = field(default_factory=SlotNote)  # what the budget says of it (engine/budget/draft_budget.py)
    n_seqs: int = 1  # sequences in the shared forward

    # what the budget reads of a slot's round before its event exists (DraftBudget.settle)
    @property
    def seq(self) -> int:
        return self.decision.seq

    @property
    def kind(self) -> str:
        return self.decision.kind

    @property
    def verify_mode(self) -> str:
        return self.decision.verify_mode

    @property
    def tree_path(self) -> list[int]:
        return self.decision.tree.path if self.decision.tree is not None else []

    @property
    def emitted(self) -> list[int]:
        return self.emission.emitted


def build(part: SlotRound, t_end: float = 0.0, n_cells_used: int = 0, seq_cells: int = 0) -> RoundEvent:
    """The one constructor of a RoundEvent: every field from the slot's records and the step's end."""
    v, tm, out, note = part.decision, part.timing, part.emission, part.note
    tree = v.tree if v.tree is not None else TreeShown()
    return RoundEvent(
        seq=v.seq, round=v.round, kind=v.kind, drafter=v.drafter, pos_sampled=v.pos_sampled, p0=v.p0,
        drafted=v.drafted, n_accepted=v.n_accepted, bonus=v.bonus, emitted=out.emitted, p_target=v.p_target,
        p_draft_rows=v.p_draft_rows, entropy=v.entropy, uniforms=v.uniforms,
        residual_top=v.residual_top, target_top=v.target_top, q_draft=v.q_draft, verify_mode=v.verify_mode,
        rollback=v.rollback, rm_range=v.rm_range, t_draft_ms=tm.t_draft_ms, t_verify_ms=tm.t_verify_ms,
        t_forward_ms=tm.t_forward_ms, t_rollback_ms=tm.t_rollback_ms, batch_rows=tm.batch_rows,
        n_seqs=part.n_seqs, n_cells_used=n_cells_used, seq_cells=seq_cells, text_delta=out.text_delta,
        done=out.done, stop_reason=out.stop_reason, t_end=t_end, notes=v.notes, tree_tokens=tree.tokens,
        tree_parents=tree.parents, tree_drafters=tree.drafters, tree_path=tree.path,
        tree_tries=[(t.depth, t.token, t.drafter, t.p, t.q, t.accepted) for t in tree.tries],
        tree_offered=note.tree_offered, budget_why=note.budget_why, not_drafted=note.not_drafted,
        draft_pieces=v.draft_pieces, target_pieces=v.target_pieces, balance=note.balance,
        format_complete=out.format_complete, rm_cells=v.rm_cells, rm_positions=v.rm_positions,
        rs_undone=v.rs_undone, relay=v.relay)


def assemble(parts: list[SlotRound | ErrorEvent], t_end: float, n_cells_used: int,
             seq_cells: Callable[[int], int]) -> list[RoundEvent | ErrorEvent]:
    """A step's events, in order: each slot's round built with the step's end time and the cells after it
    (seq_cells: a sequence's cells); an ErrorEvent passes as it is."""
    return [build(p, t_end, n_cells_used, seq_cells(p.seq)) if isinstance(p, SlotRound) else p for p in parts]
