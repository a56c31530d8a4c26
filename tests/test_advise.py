"""The advisor outside the page: its arithmetic on runs of the bench (a drafter that drafts in only some rounds
is weighed by that share) and `python -m engine.bench.advise` on tiny models."""

import csv

import pytest

from engine.bench import advise as advise_cli
from engine.bench.advice import advise, coverage, decode_seconds
from engine.bench.advise import Timed
from engine.cost.roofline import Roofline
from engine.events import RoundEvent

FLAT = Roofline(rows=tuple(range(1, 17)), seconds=tuple(0.009 + 0.0001 * n for n in range(1, 17)),
                weight_bytes=1, bandwidth=1.0)


def event(round_no, kind, drafted=(), m=0, t=0.0, t_draft_ms=0.0) -> RoundEvent:
    return RoundEvent(seq=0, round=round_no, kind=kind, drafter="ngram-simple" if drafted else None, pos_sampled=0,
                      p0=1, drafted=list(drafted), n_accepted=m, emitted=[5] * (m + 1), t_end=t,
                      t_draft_ms=t_draft_ms)


def timed(events) -> Timed:
    return Timed([t for ev in events for t in ev.emitted], events, decode_seconds(events))


def test_decode_time_runs_from_the_prefill_round_to_the_last():
    events = [event(0, "prefill", t=1.0), event(1, "plain", t=1.25), event(2, "plain", t=1.5)]
    assert decode_seconds(events) == pytest.approx(0.5)
    assert decode_seconds(events[:1]) == 0.0


def test_a_drafter_that_drafts_in_half_the_rounds_is_predicted_half_its_gain():
    """The same drafts kept 8 of 8, once in every round and once in every other round (the rest plain): the
    second prediction is what its rounds give, f tokens(k) + (1 - f) over f cost(k) + (1 - f)."""
    plain = timed([event(0, "prefill", t=1.0)] + [event(i, "plain", t=1.0 + 0.01 * i) for i in range(1, 41)])
    every = [event(0, "prefill", t=2.0)] + [event(i, "spec", drafted=[5] * 8, m=8, t=2.0 + 0.0102 * i)
                                          for i in range(1, 11)]
    half = [event(0, "prefill", t=2.0)] + [
        event(i, "spec", drafted=[5] * 8, m=8, t=2.0 + 0.0101 * i) if i % 2 else event(i, "plain", t=2.0 + 0.0101 * i)
        for i in range(1, 21)]
    full, partial = advise(timed(every), plain, FLAT), advise(timed(half), plain, FLAT)
    assert coverage(every, "ngram-simple") == 1.0 and coverage(half, "ngram-simple") == 0.5
    assert full.predicted > 7 and partial.drafter == "ngram-simple"
    assert partial.predicted == pytest.approx((0.5 * 9 + 0.5) / (0.5 * full.predicted ** -1 * 9 + 0.5), rel=0.1)
    assert "50% of rounds" in partial.why


def test_the_command_line_advises_each_prompt_and_tries_it(tiny_dirs, bench_prompts, tmp_path, capsys):
    out = tmp_path / "advice.csv"
    rc = advise_cli.main(["--prompts", str(bench_prompts), "--target", str(tiny_dirs["target"]), "--n-max", "4",
                          "--max-new-tokens", "24", "--dtype", "float32", "--chain", "ngram-simple,ngram-map-k",
                          "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    rows = list(csv.DictReader(out.open()))
    assert [r["id"] for r in rows] == ["loop", "chat"] and all(r["lossless"] == "True" for r in rows)
    assert all(float(r["predicted"]) >= 1.0 and float(r["measured"]) > 0 for r in rows)
    assert "the prediction held within 15% on" in printed
    assert advise_cli.main(["--prompts", str(bench_prompts), "--n-max", "0"]) == 2
