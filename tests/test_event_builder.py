"""A round's event is built in one place (engine/round/event_builder.py) from the records its round left, and
nobody writes to it afterwards."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from engine.budget.draft_budget import SlotNote
from engine.events import ErrorEvent, RoundEvent
from engine.round.event_builder import Decision, Emission, SlotRound, Timing, TreeShown, assemble, build

ROOT = Path(__file__).resolve().parents[1]
BUILDER = ROOT / "engine" / "round" / "event_builder.py"


def sources():
    for top in ("engine", "ui"):
        yield from sorted((ROOT / top).rglob("*.py"))


def calls_to(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)
            and (getattr(n.func, "id", None) == name or getattr(n.func, "attr", None) == name)]


def test_only_the_builder_constructs_a_round_event():
    makers = [p.relative_to(ROOT).as_posix() for p in sources() if calls_to(ast.parse(p.read_text()), "RoundEvent")]
    assert makers == ["engine/round/event_builder.py"]


def test_the_builder_sets_every_field_of_the_event():
    """A field added to RoundEvent and not to `build` would stay at its default in every event."""
    call, = calls_to(ast.parse(BUILDER.read_text()), "RoundEvent")
    assert {k.arg for k in call.keywords} == {f.name for f in dataclasses.fields(RoundEvent)}


def test_no_site_writes_to_an_event():
    """Nothing in the engine or the page assigns to an attribute of a name that holds an event."""
    writes = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                    if isinstance(el, ast.Attribute) and getattr(el.value, "id", "") in ("ev", "event"):
                        writes.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert writes == []


def test_an_event_is_final_once_made():
    ev = build(SlotRound(Decision(seq=0, round=1, kind="plain", drafter=None, pos_sampled=3, p0=4), Emission()))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.t_end = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.emitted = [1]


def test_the_records_and_the_step_end_make_the_event():
    tree = TreeShown(tokens=[5, 6, 7], parents=[-1, 0, -1], drafters=["a", "a", "b"], path=[0, 1])
    part = SlotRound(
        Decision(seq=2, round=4, kind="spec", drafter="a", pos_sampled=10, p0=11, drafted=[5, 6], n_accepted=2,
                bonus=9, p_target=[0.5, 0.25, 0.125], target_top=[5, 6, 9], verify_mode="tree", rollback="tree",
                rm_range=(13, 13), tree=tree),
        Emission(emitted=[5, 6, 9], text_delta="abc", done=True, stop_reason="eos", format_complete=True),
        Timing(t_draft_ms=1.0, t_verify_ms=2.0, t_forward_ms=1.5, t_rollback_ms=0.25, batch_rows=8),
        SlotNote(balance=1.5, budget_why="why", tree_offered=3, not_drafted=["x"]), n_seqs=2)
    error = ErrorEvent(seq=1, message="broke")
    ev, passed = assemble([part, error], t_end=7.0, n_cells_used=40, seq_cells=lambda seq: 10 * seq)
    assert passed is error
    assert (ev.seq, ev.round, ev.kind, ev.drafter, ev.pos_sampled, ev.p0) == (2, 4, "spec", "a", 10, 11)
    assert ev.accepted == [5, 6] and ev.rejected == [] and ev.bonus == 9 and ev.emitted == [5, 6, 9]
    assert (ev.tree_tokens, ev.tree_parents, ev.tree_drafters, ev.tree_path) == (
        [5, 6, 7], [-1, 0, -1], ["a", "a", "b"], [0, 1])
    assert (ev.t_draft_ms, ev.t_verify_ms, ev.t_forward_ms, ev.t_rollback_ms, ev.batch_rows) == (1.0, 2.0, 1.5,
                                                                                                  0.25, 8)
    assert (ev.text_delta, ev.done, ev.stop_reason, ev.format_complete) == ("abc", True, "eos", True)
    assert (ev.balance, ev.budget_why, ev.tree_offered, ev.not_drafted, ev.n_seqs) == (1.5, "why", 3, ["x"], 2)
    assert (ev.t_end, ev.n_cells_used, ev.seq_cells) == (7.0, 40, 20)


def test_a_bare_round_has_the_events_defaults():
    """A slot's end (Slot.end) has no timing and no budget note: its event reads as one made with defaults."""
    bare = build(SlotRound(Decision(seq=0, round=3, kind="plain", drafter=None, pos_sampled=5, p0=6),
                           Emission(done=True, stop_reason="stopped")))
    assert bare == RoundEvent(seq=0, round=3, kind="plain", drafter=None, pos_sampled=5, p0=6, done=True,
                              stop_reason="stopped")
