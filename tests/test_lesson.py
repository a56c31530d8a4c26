"""The lesson's numbers: the speedup formula and its break-even acceptance, an answer's a, k and c read from
its rounds, the weights' bytes and the memory-bound floor, and the free-lunch view for the loaded model."""

from __future__ import annotations

import pytest
import torch

from engine.cost.roofline import Roofline, measure_bandwidth, weight_bytes
from engine.events import RoundEvent
from engine.serve.engine import Engine
from engine.bench.stats import formula
from ui.lesson import break_even, curve_figure, explain, explained_html, free_lunch_text
from ui.run import RunRecord


def test_the_formula_at_its_ends():
    assert formula(0.0, 4, 0.5) == pytest.approx(1 / 1.5)  # nothing kept: one token a dearer round
    assert formula(1.0, 4, 0.5) == pytest.approx(5 / 1.5)  # everything kept: k + 1 tokens a round
    assert formula(0.8, 4, 0.0) == pytest.approx((1 - 0.8 ** 5) / 0.2)


@pytest.mark.parametrize("k, c", [(1, 0.2), (4, 0.5), (8, 1.5), (16, 3.0)])
def test_break_even_is_where_the_formula_gives_one(k, c):
    a = break_even(k, c)
    assert 0 < a < 1 and formula(a, k, c) == pytest.approx(1.0, abs=1e-6)
    assert formula(a - 0.01, k, c) < 1 < formula(a + 0.01, k, c)
    assert break_even(4, 0.0) == 0.0 and break_even(2, 5.0) == 1.0  # free rounds always pay; dear ones never


def event(round_no, kind, drafted=(), m=0, emitted=(1,), t=0.0, **times) -> RoundEvent:
    return RoundEvent(seq=0, round=round_no, kind=kind, drafter="ngram-simple" if drafted else None, pos_sampled=0,
                      p0=1, drafted=list(drafted), n_accepted=m, emitted=list(emitted), t_end=t, **times)


def record(events) -> RunRecord:
    run = RunRecord(vocab=None, prompt_ids=[1, 2, 3], shown=False)
    for ev in events:
        run.add(ev)
    return run


def test_an_answer_is_explained_from_its_rounds():
    """Plain: 8 steps of 10 ms. Speculative: 4 rounds of 15 ms, drafts of 4 kept 4, 2, 0, 4 tokens."""
    plain = record([event(0, "prefill", t=1.0)] + [event(i, "plain", t=1.0 + 0.01 * i) for i in range(1, 9)])
    kept = [4, 2, 0, 4]
    spec = record([event(0, "prefill", t=2.0)] + [
        event(i + 1, "spec", drafted=[5] * 4, m=m, emitted=[5] * (m + 1), t=2.0 + 0.015 * (i + 1), t_draft_ms=1.0,
              t_forward_ms=12.0, t_rollback_ms=0.5) for i, m in enumerate(kept)])
    x = explain(spec, plain)
    assert x.alpha == pytest.approx(10 / 12)  # kept / (kept + the two rounds that met a rejection)
    assert x.per_pos == pytest.approx((0.75, 0.75, 0.5, 0.5))
    assert x.k == 4 and x.c == pytest.approx(0.5)
    assert x.measured == pytest.approx((14 / 0.06) / (8 / 0.08))
    assert x.predicted == pytest.approx(formula(10 / 12, 4, 0.5))
    assert x.break_even == pytest.approx(break_even(4, 0.5))
    assert x.split_ms == pytest.approx((1.0, 12.0, 0.5, 1.5))
    text = explained_html(x)
    assert "a = 0.83" in text and "c = 0.50" in text and "breaks even" in text and "pays" in text


def test_an_answer_without_drafts_says_it_could_not_pay():
    plain = record([event(0, "prefill", t=1.0)] + [event(i, "plain", t=1.0 + 0.01 * i) for i in range(1, 5)])
    assert explain(plain, plain) is None and "could not pay" in explained_html(None)


def test_weight_bytes_counts_what_a_forward_reads():
    emb, head = torch.nn.Embedding(100, 8), torch.nn.Linear(8, 100, bias=False)

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.mid, self.head = emb, torch.nn.Linear(8, 8), head

        def get_input_embeddings(self):
            return self.emb

        def get_output_embeddings(self):
            return self.head

    model = Tiny()
    assert weight_bytes(model) == (8 * 8 + 8 + 100 * 8) * 4  # the input table is read a row at a time
    head.weight = emb.weight  # tied: the head reads the table whole, once
    assert weight_bytes(model) == (8 * 8 + 8 + 100 * 8) * 4


def test_the_curve_beside_its_floor():
    roof = Roofline(rows=(1, 2, 4, 8, 16), seconds=(0.010, 0.0105, 0.0108, 0.02, 0.04), weight_bytes=200_000_000,
                    bandwidth=25e9)
    assert roof.t_floor == pytest.approx(0.008) and roof.memory_share() == pytest.approx(0.8)
    assert roof.flat_up_to() == 4 and roof.ratio(8) == pytest.approx(2.0) and roof.ratio(5) == roof.ratio(4)
    text = free_lunch_text(roof)
    assert "up to K = 3" in text and "200 MB" in text and "25.0 GB/s" in text and "waits on memory" in text
    steep = Roofline(rows=(1, 2, 4), seconds=(0.01, 0.02, 0.04), weight_bytes=10_000_000, bandwidth=25e9)
    assert steep.flat_up_to() == 1 and "not free" in free_lunch_text(steep)
    figure = curve_figure(roof)
    assert [len(d["y"]) for d in figure["data"]] == [5, 2, 2] and figure["data"][2]["y"][0] == pytest.approx(8.0)
    assert measure_bandwidth(8 << 20, 2) > 1e8  # any machine copies faster than 100 MB/s


def test_the_runtime_measures_its_free_lunch(tiny_target):
    from ui.loader import make_runtime
    from ui.state import AppOptions

    runtime = make_runtime(tiny_target, None, AppOptions(n_ctx=512, parallel=1))
    try:
        roof = runtime.roofline
        assert roof.rows == tuple(runtime.engine.cost.sizes) and roof.rows[0] == 1 and len(roof.rows) > 4
        assert roof.weight_bytes > 0 and roof.bandwidth > 0
    finally:
        runtime.scheduler.close()


def test_a_round_is_told_in_the_lessons_order_in_two_languages():
    from ui.narration import narration_html

    roof = Roofline(rows=(1, 2, 4, 8), seconds=(0.01, 0.011, 0.013, 0.02), weight_bytes=1, bandwidth=1.0)
    ev = RoundEvent(seq=1, round=3, kind="spec", drafter="ngram-simple", pos_sampled=40, p0=41, drafted=[5, 6, 7],
                    n_accepted=1, emitted=[5, 9], rollback="seq_rm", rm_range=(42, 44))
    text = narration_html(ev, roof)
    order = ["Draft.", "Verify.", "Accept.", "Its own token.", "Cut the cache."]
    assert [text.index(w) for w in order] == sorted(text.index(w) for w in order)
    assert "copied from earlier text" in text and "1.30&times;" in text and "first 1 of them" in text
    assert "correction" in text and "seq_rm(seq 1, 42, -1)" in text and "[42, 44)" in text
    assert "中文" in text and "起草" in text and "裁剪缓存" in text
    plain = RoundEvent(seq=1, round=4, kind="plain", drafter=None, pos_sampled=44, p0=45, emitted=[3])
    assert "Plain step." in narration_html(plain, roof) and "Draft." not in narration_html(plain, roof)


def test_the_advisor_weighs_each_drafter_and_length():
    """A drafter kept at 0.9 a position on a machine where rows are nearly free: a long chain pays; the same
    acceptance where each row costs a whole forward: plain decoding."""
    from ui.advisor import advise, chain_tokens

    assert chain_tokens([0.5, 0.5], 2) == pytest.approx(1.75) and chain_tokens([0.5], 3) == pytest.approx(1.5)
    plain = record([event(0, "prefill", t=1.0)] + [event(i, "plain", t=1.0 + 0.01 * i) for i in range(1, 21)])
    spec = record([event(0, "prefill", t=2.0)] + [
        event(i + 1, "spec", drafted=[5] * 8, m=m, emitted=[5] * (m + 1), t=2.0 + 0.01 * (i + 1), t_draft_ms=0.2)
        for i, m in enumerate([8, 8, 7, 8, 3, 8, 8, 6, 8, 8])])
    flat = Roofline(rows=tuple(range(1, 17)), seconds=tuple(0.009 + 0.0001 * n for n in range(1, 17)),
                    weight_bytes=1, bandwidth=1.0)
    advice = advise(spec, plain, flat)
    assert advice.drafter == "ngram-simple" and advice.n_max >= 6 and advice.predicted > 3
    steep = Roofline(rows=tuple(range(1, 17)), seconds=tuple(0.01 * n for n in range(1, 17)), weight_bytes=1,
                     bandwidth=1.0)
    low = record([event(0, "prefill", t=2.0)] + [
        event(i + 1, "spec", drafted=[5] * 4, m=m, emitted=[5] * (m + 1), t=2.0 + 0.052 * (i + 1), t_draft_ms=2.0)
        for i, m in enumerate([0, 1, 0, 0, 2, 0])])
    assert advise(low, plain, steep).drafter is None  # nothing pays: plain decoding


def test_an_answer_is_compared_explained_advised_and_the_advice_run(tiny_target):
    """Through the real engine: a copying answer's comparison carries its explanation and the advice, and
    Try the advice runs the prompt again with the advised chain and reports prediction against result."""
    from engine.serve.engine import Engine
    from engine.serve.scheduler import Scheduler
    from test_engine import SMALL_NGRAMS
    from ui.loader import measure_roofline
    from ui.session import UserError, advice_turn, converse
    from ui.settings import Settings
    from ui.state import AppOptions, AppState, Runtime, SessionState
    from ui.tokens import Vocab

    app = AppState(runtime=None, options=AppOptions(n_ctx=512, parallel=1))
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=1, drafter_params=SMALL_NGRAMS)
    app.runtime = Runtime(target=tiny_target, draft=None, engine=engine, vocab=Vocab.of(tiny_target.tokenizer),
                          scheduler=Scheduler(engine, on_event=app.counters.observe),
                          roofline=measure_roofline(tiny_target, engine))
    try:
        session = SessionState()
        with pytest.raises(UserError, match="No advice"):
            list(advice_turn(app, session, Settings()))
        settings = Settings(types=["ngram-simple", "ngram-map-k"], max_new_tokens=40, compare=True, tree_nodes=0,
                            adaptive=False)
        copy = "w10 w11 w12 w13 w10 w11 w12 w13 w10 w11"  # the tiny model's answer repeats: the n-grams draft
        list(converse(app, session, copy, settings, manual=False))
        assert "Why " in session.compare_html and "breaks even" in session.compare_html
        assert "Advice here" in session.compare_html and session.advice is not None
        assert session.advice.drafter in settings.types and session.advice.predicted > 1  # a copying answer
        list(advice_turn(app, session, settings))
        assert "measured against" in session.compare_html and not session.busy
    finally:
        app.runtime.scheduler.close()


def test_presets_set_llama_cpp_chains_fastest_and_plain():
    from ui.presets import preset

    chain = ["ngram-simple", "draft-head", "ngram-mod"]
    lcpp = preset("llama.cpp", chain, {}, ngram_mod_match=8)
    assert lcpp.types == ["ngram-simple", "ngram-mod", "draft-head"]  # n-grams first, then model drafters
    assert (lcpp.n_max, lcpp.n_min, lcpp.p_min, lcpp.adaptive, lcpp.tree_nodes) == (16, 0, 0.75, False, 0)
    assert any("under 16" in n for n in lcpp.notes)
    assert not any("under 16" in n for n in preset("llama.cpp", chain, {}, ngram_mod_match=24).notes)
    fast = preset("fastest here", chain, {"draft-head": "costs more than it keeps"})
    assert fast.types == ["ngram-simple", "ngram-mod"] and "draft-head left out" in fast.notes[0]
    assert preset("plain", chain, {}).types == [] and preset("playground", chain, {}).types == chain
    with pytest.raises(ValueError, match="preset must be"):
        preset("turbo", chain, {})


def test_the_load_probe_leaves_out_a_drafter_that_cannot_pay(tiny_target, tiny_draft):
    """The target drafting for itself keeps every draft: where each row costs a whole forward even that cannot
    pay, where rows are free it stays; another draft model is left out with the reason."""
    from ui.presets import probe_model_drafters

    engine = Engine(tiny_target, tiny_target, n_ctx=512, n_seq_max=1, calibrate=False)
    steep = Roofline(rows=tuple(range(1, 17)), seconds=tuple(1.0 * n for n in range(1, 17)), weight_bytes=1,
                     bandwidth=1.0)
    prompt = [15, 16, 17, 18, 15, 16, 17, 18, 15, 16]
    # p_min 0: the tiny models' flat distributions would stop every draft at a draft model's own 0.75
    assert "draft-simple" in probe_model_drafters(engine, prompt, ["ngram-simple", "draft-simple"], steep, 0.0)
    free = Roofline(rows=tuple(range(1, 17)), seconds=(1e3,) * 16, weight_bytes=1, bandwidth=1.0)
    assert probe_model_drafters(engine, prompt, ["ngram-simple", "draft-simple"], free, 0.0) == {}
    other = Engine(tiny_target, tiny_draft, n_ctx=512, n_seq_max=1, calibrate=False)
    assert "at best" in probe_model_drafters(other, prompt, ["draft-simple"], steep, 0.0)["draft-simple"]


def test_presets_draft_in_trees_only_where_the_probe_timed_them_faster(tiny_target):
    """Trees only at TREE_MARGIN over the chain, a tie to the chain; the playground and fastest-here presets and
    the page's slider follow the choice, with the measured why in the preset's note."""
    from types import SimpleNamespace

    from ui.presets import TREE_MARGIN, choose_trees, preset, probe_trees
    from ui.settings import default_tree_nodes

    assert choose_trees(16, 100.0, 100.0 * TREE_MARGIN).nodes == 16
    slower = choose_trees(16, 100.0, 100.0)
    assert slower.nodes == 0 and slower.why.startswith("chains: 100 tok/s in trees of 16 nodes against 100")
    chain = ["ngram-simple", "draft-head"]
    for name in ("playground", "fastest here"):
        p = preset(name, chain, {}, trees=slower)
        assert p.tree_nodes == 0 and slower.why in p.notes
        assert preset(name, chain, {}, trees=choose_trees(16, 1.0, 2.0)).tree_nodes == 16
    assert preset("playground", chain, {}).tree_nodes == 16  # unmeasured: Settings' default
    assert default_tree_nodes(SimpleNamespace(trees=slower)) == 0 and default_tree_nodes(None) == 16
    engine = Engine(tiny_target, n_ctx=512, n_seq_max=1, calibrate=False)
    measured = probe_trees(engine, tiny_target, ["ngram-simple", "ngram-map-k"], nodes=8)
    assert measured.chain_tps > 0 and measured.tree_tps > 0 and measured.nodes in (0, 8)
    assert measured.nodes == choose_trees(8, measured.chain_tps, measured.tree_tps).nodes
    assert probe_trees(engine, tiny_target, []).nodes == 0  # nothing drafts: nothing to time


def test_the_advice_is_anchored_to_the_answers_own_rounds():
    """Rounds that took twice what the load's curve says make every predicted cost twice as dear."""
    from ui.advisor import anchor

    roof = Roofline(rows=(1, 2, 4, 8), seconds=(0.01, 0.01, 0.01, 0.02), weight_bytes=1, bandwidth=1.0)
    spec = record([event(0, "prefill", t=2.0)] + [
        event(i + 1, "spec", drafted=[5] * 3, m=3, emitted=[5] * 4, t=2.0 + 0.024 * (i + 1), t_draft_ms=2.0)
        for i in range(5)])
    assert anchor(spec, roof, beside_ms=0.0) == pytest.approx(2.0)  # 24 ms measured, 10 + 2 ms modelled


def test_the_default_chain_leaves_out_what_cannot_pay_here(tiny_target):
    """The page and the API start without the model drafters the load's probe left out; the playground preset
    and the arena keep every drafter the models allow."""
    from types import SimpleNamespace

    from ui.settings import default_chain, full_chain

    runtime = SimpleNamespace(target=tiny_target, draft=tiny_target, engine=SimpleNamespace(draft_type="draft-simple"),
                              left_out={"draft-simple": "its call costs more than it keeps"})
    assert "draft-simple" in full_chain(runtime)
    assert default_chain(runtime) == [t for t in full_chain(runtime) if t != "draft-simple"]
    runtime.left_out = {}
    assert default_chain(runtime) == full_chain(runtime)
