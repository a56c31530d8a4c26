"""The Benchmark tab: its pure render functions, and the live run through the app's scheduler next to a chat."""

import csv
from types import SimpleNamespace

import pytest

from engine.bench.live import LiveBenchError, LivePlan, run_live
from engine.bench.plot import FIGURES
from engine.params import GenParams
from engine.serve.scheduler import Scheduler
from engine.serve.engine import Engine
from ui import bench_tab


@pytest.fixture()
def scheduler(tiny_target):
    s = Scheduler(Engine(tiny_target, n_ctx=1024, n_seq_max=3, calibrate=False))
    yield s
    s.close()


def drain(gen) -> list:
    out = []
    while not out or not out[-1].done:
        out.append(gen.events.get(timeout=60))
    return out


def test_missing_or_foreign_csv_says_why(tmp_path):
    rows, note = bench_tab.read_traces(None)
    assert rows == [] and "bench_curves.sh" in note
    rows, note = bench_tab.read_traces(tmp_path / "nope.csv")
    assert rows == [] and "Cannot read nope.csv" in note
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    rows, note = bench_tab.read_traces(other)
    assert rows == [] and "no spec_decode column" in note


def test_tab_views_are_a_summary_and_every_figure():
    views = bench_tab.tab_views([], "nothing yet")
    assert len(views) == 1 + len(FIGURES)
    assert "nothing yet" in views[0] and all(isinstance(f, dict) and "data" in f for f in views[1:])


def test_shipped_traces_render():
    assert bench_tab.SHIPPED.is_file(), "assets/bench/traces.csv ships with the app"
    rows, note = bench_tab.read_traces(bench_tab.SHIPPED)
    views = bench_tab.tab_views(rows, note)
    assert rows and "aggregate decode" in views[0] and views[1]["data"]


def test_live_run_through_the_scheduler_leaves_a_chat_untouched(scheduler, tiny_target, tmp_path):
    chat = [1, 5, 6, 7, 8, 5, 6, 7]
    params = GenParams(max_new_tokens=300, ignore_eos=True)
    alone = [t for e in drain(scheduler.submit(chat, params)) for t in e.emitted]
    gen = scheduler.submit(chat, GenParams(max_new_tokens=300, ignore_eos=True))
    plan = LivePlan(concurrency=[1, 2], chain=["ngram-simple"], synthetic=[0.5], n_max=3, max_new_tokens=16)
    seen = []
    rows = run_live(scheduler, [1, 9, 10, 11, 9, 10], plan, tiny_target, lambda d, t, w: seen.append((d, t)))
    events = drain(gen)
    beside = [t for e in events for t in e.emitted]
    assert max(e.batch_rows for e in events[1:]) > 1  # some of its rounds ran in the benchmark's forwards
    assert beside == alone  # the chat shared forwards with the benchmark and is token-identical
    assert [r["concurrency"] for r in rows] == [1, 1, 1, 2, 2, 2]
    assert [r["spec_types"] for r in rows[:3]] == ["", "ngram-simple", "synthetic"]
    assert rows[1]["lossless_ok"] is True and rows[2]["lossless_ok"] == "n/a"
    assert all(r["n_gen"] == 16 for r in rows) and seen[0] == (0, 6)
    assert {r["dtype"] for r in rows} == {tiny_target.dtype} and rows[0]["dtype_reason"] == tiny_target.dtype_reason
    assert not scheduler.running and not scheduler.waiting  # every benchmark slot was freed
    path = bench_tab.write_traces(rows, tmp_path)
    with open(path) as f:
        assert len(list(csv.DictReader(f))) == 6


def test_live_run_refuses_more_slots_than_the_engine_has(scheduler, tiny_target):
    with pytest.raises(LiveBenchError, match="more slots"):
        run_live(scheduler, [1, 5, 6], LivePlan(concurrency=[8]), tiny_target)


def test_live_bench_without_a_model_says_so():
    rows, note, path = bench_tab.run_live_bench(SimpleNamespace(runtime=None), "hi")
    assert rows == [] and path is None and "No model" in note
