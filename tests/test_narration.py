"""The lesson on every round, told from what the engine's own events record: how the rejected cells left (a
seq_rm range, a tree's cells one by one, a checkpoint restore and replay), the relay of drafters with what each
had, and the narration of every round kind in English and Chinese; then the docs' claims about step mode held
against the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from engine.draft.record import RelayStep, why_short
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams
from engine.serve.engine import Engine
from test_engine import PROMPTS, SMALL_NGRAMS
from ui.kvview import kv_html
from ui.narration import narration_html
from ui.timeline import step_html, timeline_row
from ui.tokens import Vocab

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine(tiny_target, tiny_draft):
    return Engine(tiny_target, draft=tiny_draft, n_ctx=512, n_seq_max=1, drafter_params=SMALL_NGRAMS,
                  calibrate=False)


@pytest.fixture(scope="module")
def vocab(tiny_target):
    return Vocab.of(tiny_target.tokenizer)


def run(engine, types, n=6, tree_nodes=0, rollback="auto", temp=0.0, seed=0):
    params = GenParams(max_new_tokens=n, ignore_eos=True, sampling=SamplerParams(temp=temp, seed=seed),
                       spec=SpecParams(types=list(types), n_max=4, adaptive=False, p_min=0.0,
                                       tree_nodes=tree_nodes, rollback=rollback))
    return list(engine.generate(PROMPTS[0], params))


@pytest.fixture(scope="module")
def chain_events(engine):
    return run(engine, ["ngram-simple", "draft-simple"])


def first(events, **want):
    """The first event whose fields hold `want` (a callable value is a test of the field)."""
    for ev in events:
        if all(v(getattr(ev, k)) if callable(v) else getattr(ev, k) == v for k, v in want.items()):
            return ev
    raise AssertionError(f"no round with {want} in {[(e.kind, e.rollback, e.n_accepted) for e in events]}")


def chinese(html_text: str) -> str:
    return html_text.split("<summary>中文 (Chinese)</summary>", 1)[1]


def test_a_chain_round_with_a_rejection_says_seq_rm_with_its_range(chain_events, vocab):
    ev = first(chain_events, rollback="seq_rm")
    a, b = ev.rm_range
    assert (a, b) == (ev.p0 + ev.n_accepted, ev.p0 + len(ev.drafted)) and ev.rm_cells == b - a and not ev.rm_positions
    told = narration_html(ev, None)
    assert f"seq_rm(seq {ev.seq}, {a}, -1)" in told and f"[{a}, {b})" in told and "cell by cell" not in told
    assert f"[{a}, {b})" in chinese(told) and "区间删除" in chinese(told)
    strip = kv_html(ev, list(range(ev.seq_cells)), len(PROMPTS[0]), vocab)
    assert f"seq_rm [{a}, {b})" in strip and strip.count('class="kv kv-freed"') == b - a
    assert f"seq_rm [{a}, {b})" in timeline_row(ev, vocab, [])


def test_a_tree_round_says_its_cells_left_one_by_one_in_both_languages(engine, vocab):
    ev = first(run(engine, ["ngram-simple", "draft-simple"], tree_nodes=8), rollback="tree")
    n_nodes, freed = len(ev.tree_tokens), len(ev.tree_tokens) - ev.n_accepted
    assert ev.rm_cells == freed == len(ev.rm_positions) > 0
    assert all(ev.p0 <= p < ev.p0 + n_nodes for p in ev.rm_positions)
    told = narration_html(ev, None)
    assert f"one tree of {n_nodes} node(s)" in told and f"The {freed} node(s) off the path" in told
    assert "cell by cell" in told and "seq_rm(" not in told
    assert f"{n_nodes} 个节点的树" in chinese(told) and f"不在路径上的 {freed} 个节点逐个单元格释放" in chinese(told)
    step = step_html(ev, vocab, [], None)
    assert "This round in the lesson's order" in step and "Draft a tree." in step  # routed through the narration
    strip = kv_html(ev, list(range(ev.seq_cells)), len(PROMPTS[0]), vocab).split('class="kv-legend"')[0]
    assert "seq_rm" not in strip and f"{freed} branch cell(s) freed one by one" in strip
    assert f"{1 + n_nodes} cells" in strip and strip.count('class="kv kv-freed"') == freed


def test_a_tree_round_at_08_tells_the_sibling_tried_after_a_rejection(engine):
    """Trees at temperature 0.8: draft-simple's chain drawn from q is tested by rejection sampling
    (engine/round/tree_rejection.py); a rejection is told with p, q and min(1, p/q), in both languages."""
    events = [ev for seed in range(8) for ev in run(engine, ["ngram-simple", "draft-simple"], n=12, tree_nodes=8,
                                                     temp=0.8, seed=seed)]
    tried = [ev for ev in events if ev.verify_mode == "tree" and ev.tree_tries]
    assert tried, "no tree round tested a sampled draft"
    ev = first(tried, tree_tries=lambda t: any(not ok for *_, ok in t))
    depth, tok, drafter, p, q, _ = next(t for t in ev.tree_tries if not t[-1])
    assert drafter == "draft-simple" and 0 < q <= 1 and 0 <= p < q  # rejected: p(d)/q(d) < 1 is its only chance
    told = narration_html(ev, None)
    assert f"at depth {depth}, #{tok} from draft-simple: p {p:.3f}, q {q:.3f}" in told and "rejected" in told
    assert f"深度 {depth} 处 draft-simple 的 #{tok}" in chinese(told) and "拒绝" in chinese(told)
    # a sibling's acceptance moves the walk: every accepted try at depth d is the path's token there
    for ev in tried:
        kept = [ev.tree_tokens[n] for n in ev.tree_path] + [ev.bonus]
        assert all(kept[d] == tok for d, tok, _, _, _, ok in ev.tree_tries if ok)


def test_a_checkpoint_round_says_restore_and_replay(engine, vocab):
    events = run(engine, ["draft-simple"], rollback="checkpoint")
    ev = first(events, rollback="checkpoint", kind="spec")
    assert ev.rm_cells == 1 + len(ev.drafted) and ev.rm_range == (ev.pos_sampled, ev.p0 + len(ev.drafted))
    told = narration_html(ev, None)
    assert "state saved before drafting is restored" in told and "replays" in told and "seq_rm(" not in told
    assert "恢复起草前保存的状态" in chinese(told) and "重放" in chinese(told)
    assert "restore + replay" in timeline_row(ev, vocab, []) and "seq_rm" not in timeline_row(ev, vocab, [])
    assert "restore" in kv_html(ev, list(range(ev.seq_cells)), len(PROMPTS[0]), vocab)
    replay = events[events.index(ev) + 1]
    assert replay.kind == "replay" and "<b>Replay.</b>" in narration_html(replay, None)
    assert "<b>重放。</b>" in chinese(narration_html(replay, None))


def test_an_empty_relay_says_which_drafters_had_nothing(engine, vocab):
    ev = first(run(engine, ["ngram-simple", "ngram-map-k"]), kind="plain", relay=bool)
    assert ev.relay == [("ngram-simple", 0, 0, "no match"), ("ngram-map-k", 0, 0, "no match")]
    told = narration_html(ev, None)
    assert "ngram-simple: nothing (no match); ngram-map-k: nothing (no match)" in told
    assert "Nobody had a draft" in told and "drafted by" not in step_html(ev, vocab, [], None)
    assert "ngram-simple:没有草稿(没有匹配)" in chinese(told)
    assert "ngram-simple 0 (no match) → ngram-map-k 0 (no match)" in timeline_row(ev, vocab, [])


def test_the_relay_names_the_winner_after_those_that_had_nothing(chain_events):
    ev = first(chain_events, kind="spec")
    assert ev.relay[0] == ("ngram-simple", 0, 0, "no match") and ev.relay[-1][:3] == ("draft-simple", 4, 4)
    assert "The draft verified is draft-simple's." in narration_html(ev, None)


def test_a_draft_the_budget_dropped_names_no_verified_draft():
    from engine.events import RoundEvent

    dropped = RoundEvent(seq=0, round=2, kind="plain", drafter="ngram-simple", pos_sampled=5, p0=6, emitted=[3],
                         relay=[("ngram-simple", 3, 0, "the rest were in the tree already, or the node limit or "
                                                      "budget left them out")])
    told = narration_html(dropped, None)
    assert "ngram-simple: proposed 3" in told and "verified is" not in told and "Plain step." in told


def test_the_relay_says_what_cut_an_offer():
    step = RelayStep("ngram-mod", offered=6, allowed=6, n_max=6, n_min=2, limit="", source="ngram")
    assert why_short(step, 0, tree=False) == "the length policy cut it"
    assert why_short(step, 6, tree=False) == ""
    assert why_short(RelayStep("ngram-mod", 1, 1, 6, 2, "", "ngram"), 0, tree=False) == "under n_min"
    assert why_short(RelayStep("ngram-mod", 3, 3, 6, 0, "", "ngram"), 3, tree=False) == "the match ended"
    assert why_short(RelayStep("draft-head", 3, 3, 6, 0, "", "model"), 3, tree=False) == "stopped under p_min"
    assert why_short(RelayStep("draft-head", 0, 0, 6, 0, "", "model"), 0, tree=False) == "nothing above p_min"
    assert why_short(RelayStep("ngram-mod", 9, 6, 6, 0, "n_max", "ngram"), 6, tree=False) == "cut at n_max"
    forbidden = RelayStep("draft-head", 4, 0, 6, 0, "grammar", "model")
    assert why_short(forbidden, 0, tree=False) == "the grammar forbids its first token"


def emitted_literals(tree: ast.AST, field: str) -> set[str]:
    """The string values the engine's code gives `field` where a round's Decision is built: keywords of the
    Decision(...) calls, tuple assignments `field, ... = "x", ...`, and give_back's `return "x", ...`."""
    found: set[str] = set()

    def strings(node) -> set[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.IfExp):
            return strings(node.body) | strings(node.orelse)
        return set()

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Decision":
            found |= {s for kw in node.keywords if kw.arg == field for s in strings(kw.value)}
        if (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Tuple)
                and isinstance(node.value, ast.Tuple) and getattr(node.targets[0].elts[0], "id", "") == field):
            found |= strings(node.value.elts[0])
        if field == "rollback" and isinstance(node, ast.FunctionDef) and node.name == "give_back":
            found |= {s for r in ast.walk(node) if isinstance(r, ast.Return) and isinstance(r.value, ast.Tuple)
                      for s in strings(r.value.elts[0])}
    return found


def test_the_docs_claim_every_stepped_round_is_told_and_the_code_tells_every_kind():
    docs = (ROOT / "docs" / "ui.md").read_text()
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"every round stepped through is told in the lesson's order", docs)
    assert "tells each round in the lesson's order" in readme
    sources = [ROOT / "engine" / "round" / name for name in ("chain_verify.py", "tree_round.py", "slot.py")]
    sources.append(ROOT / "engine" / "serve" / "prefill.py")
    trees = [ast.parse(p.read_text()) for p in sources]
    kinds = set().union(*(emitted_literals(t, "kind") for t in trees))
    rollbacks = set().union(*(emitted_literals(t, "rollback") for t in trees))
    assert kinds == {"prefill", "plain", "spec", "replay"}
    assert rollbacks == {"none", "seq_rm", "tree", "checkpoint"}
    # each kind the engine emits is named in the event's own comment, and is told
    comment = re.search(r"kind: str\s+#(.*)", (ROOT / "engine" / "events.py").read_text()).group(1)
    assert all(f'"{k}"' in comment for k in kinds)
    from engine.events import RoundEvent

    for kind in kinds:
        ev = RoundEvent(seq=0, round=1, kind=kind, drafter=None, pos_sampled=5, p0=6, emitted=[3])
        assert "<ol><li>" in narration_html(ev, None) and "中文" in narration_html(ev, None), kind
    # each rollback word has its own sentence, and only a range cut says seq_rm
    said = {}
    for rollback in rollbacks:
        ev = RoundEvent(seq=0, round=1, kind="spec", drafter="ngram-simple", pos_sampled=5, p0=6, drafted=[7, 8],
                        n_accepted=1 if rollback != "none" else 2, emitted=[7, 9], rollback=rollback,
                        rm_range=(7, 8) if rollback == "seq_rm" else (5, 8) if rollback == "checkpoint" else None,
                        rm_cells=1, verify_mode="tree" if rollback == "tree" else "match",
                        tree_tokens=[7, 8] if rollback == "tree" else [], tree_parents=[-1, 0] if rollback == "tree"
                        else [], tree_drafters=["ngram-simple"] * 2 if rollback == "tree" else [],
                        tree_path=[0] if rollback == "tree" else [])
        said[rollback] = re.search(r"<b>Cut the cache.</b>(.*?)</li>", narration_html(ev, None)).group(1)
    assert len(set(said.values())) == len(said)
    assert [r for r, text in said.items() if "seq_rm(" in text] == ["seq_rm"]
