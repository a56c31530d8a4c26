"""The app's counters (engine/serve/metrics.py SpecCounters) count the answers people asked for: the runs that
only measure (a page answer's comparison, the Benchmark tab's synthetic acceptance, the Arena's oracle) are
counted apart, through the purpose their scheduler hears with every round."""

from types import SimpleNamespace

import pytest

from engine.bench.live import LivePlan, run_live
from engine.serve.engine import Engine
from engine.serve.metrics import SpecCounters, Totals
from engine.serve.scheduler import Scheduler
from ui import arena_tab
from ui.settings import Settings
from ui.state import AppState, Runtime, SessionState
from ui.tokens import Vocab


@pytest.fixture()
def app(tiny_target):
    state = AppState(runtime=None)
    engine = Engine(tiny_target, n_ctx=1024, n_seq_max=2, n_draft=8, calibrate=False)
    scheduler = Scheduler(engine, on_event=state.counters.observe)
    state.runtime = Runtime(target=tiny_target, draft=None, engine=engine, scheduler=scheduler,
                            vocab=Vocab.of(tiny_target.tokenizer))
    yield state
    scheduler.close()
    state.run_folders.remove_all()


def test_purposes_are_counted_apart_and_an_unknown_one_is_refused(app):
    c = SpecCounters()
    ev = SimpleNamespace(drafted=[1, 2], n_accepted=2, emitted=[1, 2, 3], kind="spec", batch_rows=3, seq=0,
                         t_end=1.0, done=False)
    c.observe(ev, False, "bench")
    assert c.snapshot() == Totals() and c.snapshot("bench").accepted_tokens == 2
    with pytest.raises(ValueError, match="purpose must be one of"):
        app.runtime.scheduler.submit([1, 5, 6], Settings().gen_params(), purpose="demo")


def test_a_comparison_counts_its_answer_once(app):
    from ui.session import converse

    session = SessionState()
    settings = Settings(types=["ngram-simple"], max_new_tokens=24, compare=True, tree_nodes=0)
    list(converse(app, session, "w5 w6 w7 w8 w5 w6 w7 w8 w5 w6", settings, manual=False))
    assert session.plain is not None and session.plain.done and "lossless" in session.compare_html
    chat, compare = app.counters.snapshot(), app.counters.snapshot("compare")
    assert chat.generation_tokens == len(session.run.ids) > 0  # the answer once, not three times
    assert chat.prompt_tokens == len(session.run.prompt_ids)
    assert compare.generation_tokens == 2 * len(session.run.ids)  # plain, then speculative again


def test_a_bench_run_leaves_the_chat_counters_unchanged(app, tiny_target):
    plan = LivePlan(concurrency=[1], chain=["ngram-simple"], synthetic=[0.9], n_max=3, max_new_tokens=16)
    run_live(app.runtime.scheduler, [1, 9, 10, 11, 9, 10], plan, tiny_target)
    bench = app.counters.snapshot("bench")
    assert app.counters.snapshot() == Totals()
    assert bench.generation_tokens == 3 * 16 and bench.accepted_tokens > 0  # synthetic coins kept drafts


def test_an_arena_run_leaves_the_chat_counters_unchanged(app):
    rows, note, _, _ = arena_tab.run_arena_tab(app, "w5 w6 w7 w8 w5 w6 w7", n_max=3, max_new_tokens=16)
    arena = app.counters.snapshot("arena")
    assert rows and rows[0]["drafter"] == "oracle"
    assert app.counters.snapshot() == Totals()
    assert arena.accepted_tokens > 0 and arena.generation_tokens >= len(rows)  # the oracle kept its drafts


def round_event(drafted, m, emitted) -> "RoundEvent":
    from engine.events import RoundEvent

    return RoundEvent(seq=0, round=1, kind="spec", drafter="oracle", pos_sampled=0, p0=1, drafted=list(drafted),
                      n_accepted=m, emitted=list(emitted))


def test_metrics_show_measurement_runs_apart():
    """/metrics keeps the chat's counters in vLLM's names and each measuring purpose under its own label."""
    from prometheus_client.parser import text_string_to_metric_families

    from ui.metrics import exposition, registry_for
    from ui.state import AppState

    app = AppState(runtime=None)
    app.counters.observe(round_event(drafted=[1, 2, 3], m=3, emitted=[1, 2, 3, 4]), purpose="arena")
    app.counters.observe(round_event(drafted=[1, 2], m=1, emitted=[1, 2]), purpose="chat")
    body, _ = exposition(registry_for(app))
    samples = {(s.name, s.labels.get("purpose")): s.value for f in text_string_to_metric_families(body.decode())
               for s in f.samples}
    assert samples[("spec_decode_num_accepted_tokens_total", None)] == 1
    assert samples[("generation_tokens_total", None)] == 2
    assert samples[("measurement_accepted_tokens_total", "arena")] == 3
    assert samples[("measurement_generation_tokens_total", "arena")] == 4
    assert samples[("measurement_generation_tokens_total", "compare")] == 0
