"""The "Same distribution?" tab (ui/samedist_tab.py): the comparison through the app's scheduler on a tiny
model, counted against the visitor's share, its bars and its words; settings that cannot be compared say why."""

from types import SimpleNamespace

import pytest

from engine.serve.engine import Engine
from engine.serve.scheduler import Scheduler
from ui import samedist_tab
from ui.tokens import Vocab
from ui.visitors import ClientLimits


@pytest.fixture()
def app(tiny_target):
    scheduler = Scheduler(Engine(tiny_target, n_ctx=1024, n_seq_max=4, calibrate=False))
    runtime = SimpleNamespace(target=tiny_target, engine=scheduler.engine, scheduler=scheduler,
                              vocab=Vocab.of(tiny_target.tokenizer))
    yield SimpleNamespace(runtime=runtime, limits=ClientLimits(max_each=1))
    scheduler.close()


SAMPLED = {"types": ["ngram-simple", "draft-simple"], "temp": 1.0, "tree_nodes": 0, "p_min_own": False,
           "p_min": 0.0, "adaptive": False, "n_max": 3}


def test_the_check_runs_through_the_scheduler_and_shows_both_sides(app, monkeypatch):
    # the tiny engine has no draft model: ngram-simple drafts on the tiny prompt's repeats
    values = {**SAMPLED, "types": ["ngram-simple"]}
    ticks = []
    report, words = samedist_tab.run_check(app, "v1", values, "w5 w6 w7 w5 w6 w7 w5 w6", 40,
                                           lambda done, total: ticks.append((done, total)))
    assert report is not None and sum(report.spec.values()) == sum(report.plain.values()) == 40
    assert ticks[-1] == (80, 80) and "degrees of freedom" in words and "Temperature 1" in words
    fig = samedist_tab.figure(report, app.runtime.vocab)
    assert [bar["name"] for bar in fig["data"]] == ["speculative (40)", "plain (40)"]
    assert abs(sum(fig["data"][0]["y"]) - 1) < 1e-9 and abs(sum(fig["data"][1]["y"]) - 1) < 1e-9
    assert app.limits.held.get("v1", 0) == 0  # the visitor's share is given back


def test_settings_that_cannot_be_compared_say_why(app):
    for values, why in (({**SAMPLED, "temp": 0.0}, "temperature above 0"), ({**SAMPLED, "types": []}, "No drafter")):
        report, words = samedist_tab.run_check(app, "v1", values, "hi", 40)
        assert report is None and why in words
    app.limits.take("v2")
    report, words = samedist_tab.run_check(app, "v2", {**SAMPLED, "types": ["ngram-simple"]}, "hi", 40)
    assert report is None and "Please wait" in words
    report, words = samedist_tab.run_check(SimpleNamespace(runtime=None), "v1", SAMPLED, "hi", 40)
    assert report is None and "No model is loaded" in words
