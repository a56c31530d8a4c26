"""The UI's pure pieces on hand-made RoundEvents and a fake tokenizer: no model, no browser."""

from __future__ import annotations

import queue
import re
import threading
import time
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import pytest

from engine.events import RoundEvent, WaitEvent
from engine.serve.scheduler import QueueFull
from engine.draft.stats import DrafterStats
from ui import charts
from ui.kvview import kv_html
from ui.render import compare_html, first_difference, legend_html, round_html, speed_line, transcript_html
from ui.run import RunRecord
from ui.settings import Settings, settings_from
from ui.timeline import step_html, timeline_html, timeline_row
from ui.tokens import Vocab, token_pieces, visible

WORDS = ["</s>", "Hello", " world", ",", " the", " cat", " sat", " dog", " ran", "\n", "<b>", " on", " mat", "."]
EOS = 0


class FakeTokenizer:
    """Words joined on decode, like a byte-level BPE; id 0 is a special end-of-sequence token."""

    all_special_ids = [EOS]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(WORDS[i] for i in ids if not (skip_special_tokens and i == EOS))

    def convert_ids_to_tokens(self, ids):
        return [WORDS[i].replace(" ", "\u0120") for i in ids]


class ByteTokenizer:
    """One token per UTF-8 byte: a lone byte of a multi-byte character decodes to U+FFFD."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids):
        return [f"<0x{i:02X}>" for i in ids]


@pytest.fixture
def vocab():
    return Vocab.of(FakeTokenizer())


def spec_event(**kw) -> RoundEvent:
    """Round 3: after ' the' (pos 10), ngram-simple drafted ' cat sat dog ran'; the target kept 2 and said ' on'."""
    base = dict(seq=0, round=3, kind="spec", drafter="ngram-simple", pos_sampled=10, p0=11, drafted=[5, 6, 7, 8],
                n_accepted=2, bonus=11, emitted=[5, 6, 11], p_target=[0.91, 0.8, 0.55],
                p_draft_rows=[0.91, 0.8, 0.1, 0.05], target_top=[5, 6, 11, 12], q_draft=[0.7, 0.6, 0.5, 0.4],
                rollback="seq_rm", rm_range=(13, 15), t_draft_ms=0.4, t_verify_ms=61.2, t_rollback_ms=0.03,
                batch_rows=5, n_cells_used=40, seq_cells=13)
    base.update(kw)
    return RoundEvent(**base)


def classes(html_text: str, cls: str) -> int:
    return len(re.findall(rf'class="tok {cls}[ "]', html_text))


# ---- tokens ------------------------------------------------------------------------------------------------

def test_pieces_keep_leading_spaces_and_whole_characters():
    assert token_pieces(FakeTokenizer(), [1], [2, 3]) == [" world", ","]
    euro = list("€".encode())  # three bytes: the first two decode to U+FFFD alone
    pieces = token_pieces(ByteTokenizer(), list(b"a "), euro + [ord("!")])
    assert pieces == ["", "", "€", "!"]


def test_visible_escapes_html_and_marks_newlines():
    assert visible("<b>") == "&lt;b&gt;"
    assert "&crarr;" in visible("\n") and visible("\n").endswith("\n")
    assert "\n" not in visible("\n", inline=True)
    assert "&middot;" in visible(" ", inline=True)


# ---- the answer -------------------------------------------------------------------------------------------

def test_round_marks_accepted_rejected_and_correction_in_proposal_order(vocab):
    out = round_html(spec_event(), vocab, context=[1, 4])
    assert classes(out, "tok-acc") == 2 and classes(out, "tok-rej") == 2 and classes(out, "tok-bonus") == 1
    order = [m.group(1) for m in re.finditer(r'class="tok (tok-\w+)', out)]
    assert order == ["tok-acc", "tok-acc", "tok-rej", "tok-rej", "tok-bonus"]  # rejected sit where proposed
    assert "rej-tag" in out and ">simple<" in out  # the drafter that proposed the rejected tokens
    assert "tok-fix" in out  # the target's token is a correction, not a bonus


def test_token_tooltip_has_position_drafter_p_and_q(vocab):
    out = round_html(spec_event(), vocab, context=[1, 4])
    first_rej, second_rej = re.findall(r'class="tok tok-rej" data-tip="([^"]*)"', out)
    assert "pos 13" in first_rej and "drafter ngram-simple" in first_rej
    assert "p 0.100" in first_rej and "q 0.500" in first_rej and "after a rejected" in second_rej
    bonus = re.findall(r'class="tok tok-bonus tok-fix" data-tip="([^"]*)"', out)[0]
    assert "pos 13" in bonus and "p 0.550" in bonus  # the correction takes the first rejected position


def test_token_tooltip_has_the_acceptance_probability_and_the_targets_entropy(vocab):
    out = round_html(spec_event(entropy=[0.5, 1.25, 3.0]), vocab, context=[1, 4])
    tips = re.findall(r'data-tip="([^"]*)"', out)
    accepted, first_rej = tips[0], tips[2]
    assert "min(1, p/q) 1.000" in accepted and "target entropy 0.50 bits" in accepted  # 0.91 / 0.7 capped at 1
    assert "min(1, p/q) 0.200" in first_rej and "entropy" not in first_rej  # 0.1 / 0.5; never emitted
    correction = re.findall(r'class="tok tok-bonus tok-fix" data-tip="([^"]*)"', out)[0]
    assert "target entropy 3.00 bits" in correction and "min(1" not in correction  # the target's own: no q
    assert "entropy" not in round_html(spec_event(), vocab, context=[1, 4])  # events without GenParams.explain


def test_full_accept_is_a_bonus_and_plain_rounds_are_target_tokens(vocab):
    full = round_html(spec_event(drafted=[5, 6], n_accepted=2, rm_range=None, emitted=[5, 6, 11]), vocab, [])
    assert classes(full, "tok-rej") == 0 and classes(full, "tok-bonus") == 1 and "tok-fix" not in full
    plain = round_html(RoundEvent(seq=0, round=4, kind="plain", drafter=None, pos_sampled=13, p0=14,
                                  bonus=12, emitted=[12], p_target=[0.4]), vocab, [])
    assert classes(plain, "tok-tgt") == 1 and classes(plain, "tok-bonus") == 0
    first = round_html(RoundEvent(seq=0, round=0, kind="prefill", drafter=None, pos_sampled=6, p0=7, bonus=1,
                                  emitted=[1]), vocab, [])
    assert "tok-first" in first


def test_stop_inside_accepted_run_hides_the_rest_and_specials_show_raw(vocab):
    cut = round_html(spec_event(emitted=[5], done=True, stop_reason="length"), vocab, [4])
    assert classes(cut, "tok-acc") == 1 and "tok-rej" not in cut and "tok-bonus" not in cut
    eos = round_html(spec_event(drafted=[], n_accepted=0, kind="plain", emitted=[EOS], rm_range=None), vocab, [])
    assert "tok-special" in eos and "&lt;/s&gt;" in eos


def test_html_in_tokens_is_escaped(vocab):
    out = round_html(spec_event(drafted=[10], n_accepted=1, emitted=[10, 9], rm_range=None), vocab, [])
    assert "&lt;b&gt;" in out and ">&lt;b&gt;<" in out


def test_rejected_drafts_shown_or_left_out_of_the_chat(vocab):
    run = RunRecord(vocab=vocab, prompt_ids=[1])
    run.add(spec_event())
    run.add(spec_event(round=4, p0=14, drafted=[13, EOS, 12], n_accepted=1, emitted=[13, 9], p_target=[0.9, 0.6],
                       done=True, stop_reason="length"))  # a rejected '</s>' must not end the cut early
    turns = [run.answer_html(live=False), run.answer_html(live=False)]
    shown, plain = transcript_html(turns), transcript_html(turns, show_rejected=False)
    assert classes(shown, "tok-rej") == 2 * 4 and "rej-tag" in shown
    assert classes(plain, "tok-rej") == 0 and "rej-tag" not in plain and "&lt;/s&gt;" not in plain
    for cls in ("tok-acc", "tok-bonus"):
        assert classes(plain, cls) == classes(shown, cls) > 0
    words = re.sub(r"<[^>]+>", "", plain)
    assert words.count(" cat sat on.") == 2  # the answer as the target wrote it
    assert words.count("stop: length") == 2  # each cut ends at its own run: both footers stay


def test_legend_names_every_mark():
    out = legend_html()
    for cls in ("tok-acc", "tok-forced", "tok-bonus", "tok-rej", "tok-tgt"):
        assert cls in out


def test_grammar_rounds_mark_their_accepted_tokens_as_forced(vocab):
    """Tokens the output format forced are kept for another reason than a good guess: their own mark, while
    the rest of the round (rejections, the target's token) reads as any round."""
    out = round_html(spec_event(drafter="grammar"), vocab, context=[1, 4])
    assert classes(out, "tok-forced") == 2 and classes(out, "tok-acc") == 0
    assert classes(out, "tok-rej") == 2 and classes(out, "tok-bonus") == 1 and ">grammar<" in out
    forced = re.findall(r'class="tok tok-forced" data-tip="([^"]*)"', out)
    assert all("drafter grammar" in tip for tip in forced)
    assert classes(round_html(spec_event(), vocab, context=[1, 4]), "tok-forced") == 0  # other drafters: accepted


# ---- timeline, step mode, cache -------------------------------------------------------------------------

def test_timeline_row_shows_rollback_range_and_timings(vocab):
    row = timeline_row(spec_event(), vocab, [1, 4])
    assert "seq_rm [13, 15)" in row and ">2/4<" in row and "61.2" in row and "ngram-simple" in row
    assert row.count("chip-acc") == 2 and row.count("chip-rej") == 2 and "chip-bonus" in row


def test_timeline_newest_first_and_capped():
    rows = [f"<tr><td>{i}</td></tr>" for i in range(250)]
    out = timeline_html(rows, max_rows=200)
    assert out.index("<td>249</td>") < out.index("<td>248</td>")
    assert "<td>49</td>" not in out and "50 earlier rounds" in out


def test_step_view_lists_the_batch_row_by_row(vocab):
    out = step_html(spec_event(), vocab, context=[1, 4], sampled=4)
    assert out.count("<tr>") == 1 + 5  # header + [sampled, d1..d4]
    assert "d1 accepted" in out and "d3 rejected" in out and "discarded" in out
    assert "seq_rm(seq 0, 13, -1)" in out and "[13, 15)" in out


def test_step_view_at_temperature_shows_p_q_the_uniform_and_the_residual(vocab):
    ev = spec_event(verify_mode="rejection", uniforms=[0.2, 0.5, 0.9], residual_top=[(11, 0.6), (12, 0.3), (13, 0.1)])
    out = step_html(ev, vocab, context=[1, 4], sampled=4)
    rows = re.findall(r"<tr><td>(.*?)</tr>", out.split('class="verify-rows"')[1].split("</table>")[0])
    assert len(rows) == 4  # d1..d4
    assert "0.100</td><td>0.500</td><td>0.200</td><td>0.900" in rows[2] and "d3 rejected" in rows[2]
    assert "d1 accepted" in rows[0] and "1.000" in rows[0] and "not judged" in rows[3]
    residual = out.split('class="residual"')[1]
    assert residual.count('class="res-bar') == 3 and 'res-bar res-drawn' in residual and "drawn: <b> on</b>" in residual
    assert "width:60.0%" in residual
    assert "min(1, p(d)/q(d))" in out  # the narration says how the verdicts came about
    assert 'class="residual"' not in step_html(spec_event(verify_mode="rejection", n_accepted=4, emitted=[5, 6, 7, 8, 9],
                                                          uniforms=[0.1] * 4), vocab, context=[1, 4], sampled=4)


def test_kv_strip_marks_sampled_kept_freed_and_next(vocab):
    cache = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 4, 5, 6]  # 13 cells: prompt of 8, answer, then the kept drafts
    out = kv_html(spec_event(), cache, prompt_len=8, vocab=vocab, n_ctx=64)
    assert out.count('class="kv kv-sampled"') == 1 and out.count('class="kv kv-acc"') == 2
    assert out.count('class="kv kv-freed"') == 2 and out.count('class="kv kv-next"') == 1
    assert "seq_rm [13, 15)" in out and "40/64" in out
    long = kv_html(spec_event(seq_cells=300, pos_sampled=297, p0=298, rm_range=(300, 302)), list(range(1, 14)) * 24,
                   prompt_len=100, vocab=vocab, window=20)
    assert "kv-fold" in long and long.count('class="kv kv-') < 40


# ---- statistics and comparison --------------------------------------------------------------------------

def test_stats_from_events_follow_llama_cpp_counters():
    evs = [spec_event(), spec_event(drafted=[5, 6], n_accepted=2, emitted=[5, 6, 7]),
           spec_event(drafter="ngram-mod", drafted=[7], n_accepted=0, emitted=[8])]
    stats = charts.stats_from_events(evs)
    s = stats["ngram-simple"]
    assert (s.n_gen_drafts, s.n_gen_tokens, s.n_acc_tokens, s.n_acc_drafts) == (2, 6, 4, 2)
    assert s.acc_rate_pos_conditional() == [1.0, 1.0, 0.0, 0.0]
    assert s.acc_rate_pos() == [1.0, 1.0, 0.0, 0.0]
    assert s.mean_acc_len == pytest.approx(3.0)
    assert stats["ngram-mod"].mean_acc_len == 1.0


def test_acceptance_and_speed_figures():
    stats = charts.stats_from_events([spec_event()])
    fig = charts.acceptance_figure(stats)
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    assert len(bars) == 1 and bars[0]["y"] == [1.0, 1.0, 0.0, 0.0] and "mean acc len 3.00" in bars[0]["name"]
    assert [t["y"] for t in fig["data"] if t["type"] == "scatter"] == [[1.0, 1.0, 0.0, 0.0]]
    assert charts.acceptance_figure({})["layout"]["annotations"]  # "no verified drafts yet"
    running, per_round = charts.speed_series([1, 2, 3], [3, 1, 2], [0.1, 0.2, 0.3])
    assert running == pytest.approx([30.0, 20.0, 20.0]) and per_round == [3.0, 1.0, 2.0]
    speed = charts.speed_figure([1, 2], [3, 1], [0.1, 0.2], plain_tps=9.0)
    assert len(speed["data"]) == 2 and speed["layout"]["shapes"][0]["y0"] == 9.0
    figure = charts.plotly_figure(speed)  # what gr.Plot gets: a plotly Figure that serialises
    assert "so far" in figure.to_json() and figure.layout.shapes[0].y0 == 9.0
    line = charts.counters_text({"ngram-simple": DrafterStats("ngram-simple", n_call_accept=1, n_acc_tokens=2)})
    assert line.startswith("statistics") and "#mean acc len = 3.000" in line


def test_compare_badge_lossless_and_first_difference(vocab):
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1 and first_difference([1, 2], [1, 2, 3]) == 2
    ok = compare_html([1, 2, 3], [1, 2, 3], 40.0, 20.0, vocab)
    assert "lossless-ok" in ok and "2.00&times;" in ok
    bad = compare_html([1, 2, 3], [1, 5, 3], 10.0, 20.0, vocab)
    assert "lossless-diff" in bad and "token 1" in bad and "speedup-down" in bad
    assert "speed" in compare_html([1], [1], None, 20.0, vocab)
    # a model that did not pass its load check is never called lossless, identical runs or not
    unchecked = compare_html([1, 2, 3], [1, 2, 3], 40.0, 20.0, vocab, checked=False)
    assert "lossless" not in unchecked.replace("not called lossless", "") and "load check" in unchecked


def test_speed_line_reports_measured_tokens_per_second():
    line = speed_line(41, 40, 2.0, 10, "eos")
    assert line.startswith("41 tokens") and "<b>20.0 tok/s</b>" in line and "4.00 tokens/round" in line
    assert "stop: eos" in line


# ---- the run record: incremental and linear ------------------------------------------------------------

def make_round(i: int, pos: int) -> RoundEvent:
    if i == 0:
        return RoundEvent(seq=0, round=0, kind="prefill", drafter=None, pos_sampled=pos - 1, p0=pos, bonus=4,
                          emitted=[4], p_target=[1.0], batch_rows=pos)
    return spec_event(round=i, pos_sampled=pos, p0=pos + 1, rm_range=(pos + 3, pos + 5), seq_cells=pos + 3)


def test_run_record_renders_each_round_once_and_stays_linear(vocab, monkeypatch):
    import ui.run

    calls = []
    real = ui.run.round_html
    monkeypatch.setattr(ui.run, "round_html", lambda *a: calls.append(1) or real(*a))
    run = RunRecord(vocab=vocab, prompt_ids=[1, 2, 3])
    t0 = time.perf_counter()
    pos = 3
    for i in range(300):
        ev = make_round(i, pos)
        run.add(ev, t_recv=t0 + 0.05 * i)
        pos += len(ev.emitted)
        run.answer_html(live=True)  # what each streamed update costs
        timeline_html(run.timeline_rows)
    elapsed = time.perf_counter() - t0
    assert len(calls) == 300  # one render per round, never re-rendered
    assert elapsed < 3.0, f"300 rounds took {elapsed:.2f} s"
    assert run.n_decode == 299 * 3 and run.tps == pytest.approx(299 * 3 / (0.05 * 299))
    assert run.cache_ids()[:3] == [1, 2, 3] and len(run.cache_ids()) == run.last.seq_cells


# ---- settings and the session flow with a fake scheduler -------------------------------------------------

def test_settings_validation_messages():
    with pytest.raises(ValueError, match="n_min"):
        Settings(n_max=2, n_min=5).gen_params()
    controls = dict(types=["ngram-simple"], n_max=8.0, n_min=None, p_min=0.5, adaptive=True, temp=0.0, top_k=0,
                    top_p=1.0, min_p=0.0, seed=7.0, max_new_tokens=32.0, compare=True)
    s = settings_from(controls)
    assert s.n_max == 8 and s.n_min == 0 and s.seed == 7 and s.max_new_tokens == 32
    assert s.gen_params(speculative=False).spec.types == []
    assert s.p_min_own and s.gen_params().spec.p_min is None  # each model drafter's own p_min by default
    s = settings_from({**controls, "types": ["draft-head"], "rollback": "auto", "p_min_own": False})
    assert s.gen_params().spec.p_min == 0.5  # the slider's value once the box is off
    assert s.gen_params().grammar is None  # free text by default


def test_output_format_sets_the_grammar_and_leads_the_chain_with_its_drafter():
    from engine.serve.grammars import GrammarCache
    from ui.settings import EXAMPLE_SCHEMA

    s = settings_from(dict(types=["ngram-simple"], n_max=8.0, n_min=None, p_min=0.5, adaptive=True, temp=0.0,
                           top_k=0, top_p=1.0, min_p=0.0, seed=7.0, max_new_tokens=32.0, compare=True,
                           rollback="auto", p_min_own=True, output_format="json_schema", format_text=EXAMPLE_SCHEMA))
    spec, plain = s.gen_params(), s.gen_params(speculative=False)
    assert spec.grammar.kind == "json_schema" and spec.grammar.text == EXAMPLE_SCHEMA
    assert spec.spec.types == ["grammar", "ngram-simple"]
    assert plain.grammar == spec.grammar and plain.spec.types == []  # the baseline is constrained too
    assert Settings(types=[], output_format="json").gen_params().spec.types == []  # an empty chain stays plain
    assert Settings(types=["grammar", "ngram-simple"], output_format="json").chain(True) == ["grammar", "ngram-simple"]
    with pytest.raises(ValueError, match="JSON schema is not valid JSON"):
        Settings(output_format="json_schema", format_text="{oops").gen_params()
    # the text's own checks run here; llguidance's verdict comes from the compile at submit (a child process)
    bad = Settings(output_format="lark", format_text="start: nowhere").gen_params()
    with pytest.raises(ValueError, match="Lark"):
        GrammarCache(lambda: None).prepare(bad.grammar)


def test_format_box_fills_an_example_and_keeps_the_users_text():
    from ui.settings import EXAMPLE_SCHEMA, FORMAT_EXAMPLES, format_box

    assert format_box("json_schema", "") == {"__type__": "update", "value": EXAMPLE_SCHEMA, "visible": True}
    assert format_box("regex", EXAMPLE_SCHEMA)["value"] == FORMAT_EXAMPLES["regex"]  # an example is replaced
    assert format_box("regex", "[a-z]+")["value"] == "[a-z]+"  # the user's own is not
    assert format_box("free", "")["visible"] is False and format_box("json", "")["visible"] is False


def test_answers_are_checked_against_their_format():
    import json

    from ui.formatcheck import check_answer, format_html, schema_violations
    from ui.settings import EXAMPLE_SCHEMA

    schema = json.loads(EXAMPLE_SCHEMA)
    assert check_answer('{"name": "Ada", "age": 36, "city": "London"}', "json_schema", EXAMPLE_SCHEMA) == \
        (True, "valid JSON, follows the schema")
    ok, why = check_answer('{"name": "Ada", "age": "36"}', "json_schema", EXAMPLE_SCHEMA)
    assert not ok and "missing 'city'" in why and "+1 more" in why  # and age is a string
    ints = {"type": "object", "properties": {"a": {"items": {"type": "integer"}}}}
    assert schema_violations({"a": [1, True]}, ints) == ["$.a[1]: expected integer, got bool"]  # true: no integer
    assert schema_violations("Sunday", {"enum": ["Monday"]}) == ["$: 'Sunday' is not one of ['Monday']"]
    assert schema_violations({"x": 1}, schema) == ["$: missing 'name'", "$: missing 'age'", "$: missing 'city'",
                                                   "$: unexpected key 'x'"]
    assert check_answer("[1, 2]", "json", "")[0] and not check_answer('{"a": ', "json", "")[0]
    assert check_answer("yes", "regex", "yes|no", complete=True) == (True, "matches the regex")
    # the verdict on a pattern is the grammar's: a pattern Python's re backtracks on for hours costs nothing here
    hostile = "([a-z]+ ?)+\\."
    t0 = time.perf_counter()
    assert check_answer("a" * 40 + " aaaa bbbb" * 3, "regex", hostile, complete=False) == \
        (False, "does not (yet) match the regex")
    assert time.perf_counter() - t0 < 0.1
    assert check_answer("x", "lark", "start: /x/", complete=None)[0]
    # nesting deeper than Python's recursion: a verdict, not a RecursionError
    deep = {"type": "array", "items": {}}
    for _ in range(3000):
        deep = {"type": "array", "items": deep}
    assert schema_violations([[[1]]], deep) == ["$[0][0][0]: expected array, got int"]
    assert check_answer("[" * 5000 + "]" * 5000, "json", "", complete=True) == \
        (True, "JSON nested too deep to check here")
    cut = format_html('{"name": "Ad', "json_schema", EXAMPLE_SCHEMA, "length")
    assert "format-bad" in cut and "not valid JSON" in cut and "the answer was cut: stop length" in cut


@dataclass
class FakeChain:
    seq_stats: dict = field(default_factory=dict)


@dataclass
class FakeEngine:
    chain: FakeChain = field(default_factory=FakeChain)
    stopped: set = field(default_factory=set)
    probe: object = field(default_factory=lambda: SimpleNamespace(kind="PART", reason="range removal works"))
    load_check: object = field(default_factory=lambda: SimpleNamespace(
        passed=True, lossless_shown=True, detail="engine = transformers' forward"))
    ctx: object = field(default_factory=lambda: SimpleNamespace(
        n_seq_max=1, n_ctx=64, describe_forward=lambda: "lean forward (layers in one C call)"))

    def stop(self, seq):
        self.stopped.add(seq)


class FakeScheduler:
    """Plays back prepared events: the speculative answer first, then the plain one. Generations are named
    by id, as the real scheduler names them."""

    def __init__(self, scripts, busy=False):
        self.scripts, self.busy, self.engine, self.closed = list(scripts), busy, FakeEngine(), False
        self.cancelled, self.submitted, self.stopped = [], [], set()

    def close(self):
        self.closed = True

    def submit(self, prompt, params, manual=False, purpose="chat"):
        if self.busy:
            raise QueueFull("all 1 slots are busy and 64 requests are waiting (the queue holds 64)")
        params.validate()
        self.submitted.append(params)
        # the comparison's unseen speculative run, when no script is left for it, replays the answer's
        replay = [ev for ev in getattr(self, "first", []) if not isinstance(ev, WaitEvent)]
        self.held = list(self.scripts.pop(0) if self.scripts else replay)
        self.first = getattr(self, "first", self.held)
        self.gen = SimpleNamespace(id=len(self.submitted), events=queue.Queue(), manual=manual,
                                   stats={"ngram-simple": DrafterStats("ngram-simple")})
        if not manual:
            for ev in self.held:
                self.gen.events.put(ev)
        return self.gen

    def step(self, gen_id):
        """Step mode: release the next prepared event, or the stop event once a stop was asked for."""
        if gen_id in self.stopped:
            ev = RoundEvent(seq=0, round=9, kind="plain", drafter=None, pos_sampled=9, p0=10, done=True,
                            stop_reason="stopped")
        else:
            ev = self.held.pop(0)
        self.gen.events.put(ev)
        return 1

    def stop(self, gen_id):
        self.stopped.add(gen_id)
        if self.gen.manual:
            self.step(gen_id)

    def cancel(self, gen_id):
        self.cancelled.append(gen_id)

    def call(self, fn):
        return fn(self.engine)


@dataclass
class FakeTarget:
    name: str = "fake"
    n_params: int = 1_000_000
    device: str = "cpu"
    dtype: str = "bfloat16"
    dtype_reason: str = "auto: bfloat16 (avx512_bf16; a forward 40.1 ms in bfloat16, 70.3 ms in float32)"

    def encode_chat(self, messages):
        return [1, 2, 3]

    def decode(self, ids):
        return FakeTokenizer().decode(ids, skip_special_tokens=True)


def fake_app(scripts, busy=False):
    from ui.state import AppState, Runtime

    sched = FakeScheduler(scripts, busy)
    rt = Runtime(target=FakeTarget(), draft=None, engine=sched.engine, scheduler=sched, vocab=Vocab.of(FakeTokenizer()))
    return AppState(runtime=rt)


def answer(done_kind="eos"):
    last = spec_event(round=2, pos_sampled=4, p0=5, emitted=[5, 6, EOS], done=True, stop_reason=done_kind,
                      rm_range=(7, 9), seq_cells=7)
    return [make_round(0, 3), last]


def test_converse_streams_then_compares_and_keeps_history():
    from ui.session import converse
    from ui.state import SessionState
    from ui.views import all_views

    app, session = fake_app([answer(), answer()]), SessionState()
    drawn = []  # (the run had events, the plain run had ended, the charts were drawn) at each refresh
    for _ in converse(app, session, "hi", Settings(max_new_tokens=8), manual=False):
        has_events = session.run is not None and bool(session.run.events)
        plain_done = session.plain is not None and session.plain.done
        drawn.append((has_events, plain_done, "acc_plot" in all_views(app, session)))
    assert not any(d for e, _, d in drawn if not e)  # nothing to chart before the first round
    assert next(d for e, _, d in drawn if e)  # the first round at once
    assert any(d for _, p, d in drawn if p)  # redrawn when the comparison ends
    assert not all(d for _, _, d in drawn)  # throttled
    views = all_views(app, session, force_charts=True)
    assert "lossless-ok" in session.compare_html
    assert [p.spec.types for p in app.runtime.scheduler.submitted][1] == []  # the baseline is plain decoding
    assert app.runtime.scheduler.cancelled == [] and not session.busy  # both runs were read to the end
    assert session.history[-1]["role"] == "assistant" and session.history[-1]["content"].startswith(" the")
    assert "tok-acc" in views["chat"] and "statistics" in views["counters"]
    # the comparison's timed runs keep ids and times only: no round of theirs is rendered beside the engine
    assert session.run.answer_parts and session.plain.ids and not session.plain.answer_parts


def test_a_timed_comparison_run_is_read_in_gathered_batches():
    """The web thread takes a timed run's rounds a few at a time (COMPARE_GATHER_S), not woken by each."""
    from ui.session import read_events

    events = queue.Queue()
    rounds = answer()
    events.put(rounds[0])
    active = SimpleNamespace(gen=SimpleNamespace(events=events))
    late = threading.Timer(0.05, events.put, args=(rounds[1],))
    late.start()
    assert read_events(active, 1.0) == [rounds[0]]  # a shown run takes what is there at once
    late.join()
    assert read_events(active, 1.0) == [rounds[1]]
    events.put(rounds[0])
    late = threading.Timer(0.05, events.put, args=(rounds[1],))
    late.start()
    assert read_events(active, 1.0, gather_s=0.2) == rounds  # a timed run waits for the next round too


def test_bad_input_and_busy_slots_are_user_errors():
    from ui.session import UserError, converse
    from ui.state import SessionState

    app = fake_app([answer()])
    with pytest.raises(UserError, match="empty"):
        next(converse(app, SessionState(), "   ", Settings(), manual=False))
    with pytest.raises(UserError, match="n_min"):
        next(converse(app, SessionState(), "hi", Settings(n_max=1, n_min=3), manual=False))
    busy = fake_app([answer()], busy=True)
    with pytest.raises(UserError, match="busy") as e:
        next(converse(busy, SessionState(), "hi", Settings(), manual=False))
    assert e.value.level == "error"


def test_a_bad_schema_starts_nothing_and_a_finished_answer_is_checked():
    from ui.session import UserError, converse
    from ui.state import SessionState
    from ui.views import all_views

    app = fake_app([answer()])
    with pytest.raises(UserError, match="Invalid settings: the JSON schema is not valid JSON"):
        next(converse(app, SessionState(), "hi", Settings(output_format="json_schema", format_text="{"), manual=False))
    assert app.runtime.scheduler.submitted == []  # nothing was started
    session = SessionState()
    list(converse(app, session, "hi", Settings(max_new_tokens=8, output_format="json", compare=False), manual=False))
    assert app.runtime.scheduler.submitted[0].grammar.kind == "json"
    assert "format-bad" in session.format_html and "not valid JSON" in session.format_html  # ' the cat sat...'
    assert "format-check" in all_views(app, session)["summary"]


def test_step_mode_runs_one_round_per_click_and_stop_ends_the_turn():
    from ui.session import converse, step_turn, stop_turn
    from ui.state import SessionState
    from ui.views import all_views

    script = [make_round(0, 3), spec_event(round=1, pos_sampled=3, p0=4, rm_range=(6, 8), seq_cells=6)]
    app, session = fake_app([script]), SessionState()
    list(converse(app, session, "hi", Settings(), manual=True))
    assert session.busy and session.run.ids == [] and "Step" in session.notice[0]
    step_turn(app, session)
    assert session.run.ids == [4] and "prefill" in all_views(app, session)["step"]
    step_turn(app, session)
    assert "d1 accepted" in all_views(app, session)["step"]
    stop_turn(app, session)
    assert not session.busy and session.run.stop_reason == "stopped" and len(session.history) == 2
    assert "step mode" in session.turns_html[-1]


def test_stop_leaves_a_streaming_answer_to_its_own_updates_and_shows_a_step_mode_one_ended():
    import gradio as gr

    from ui import handlers
    from ui.session import converse
    from ui.state import SessionState

    # the views the Stop click could send are made before the engine delivers the stop: arriving after the
    # stream's last update they would show the stopped answer unfinished, so nothing is sent
    app, session = fake_app([answer(), answer()]), SessionState()
    turn = converse(app, session, "hi", Settings(), manual=False)
    next(turn)  # the answer streams
    assert all(out == gr.skip() for out in handlers.stop(app, session))
    assert app.runtime.scheduler.stopped == {1}
    list(turn)
    assert not session.busy and "stop: " in session.turns_html[-1]
    # a step-mode answer ends in the click itself: its views go out
    app, session = fake_app([[make_round(0, 3)]]), SessionState()
    list(converse(app, session, "hi", Settings(), manual=True))
    shown = "".join(out for out in handlers.stop(app, session) if isinstance(out, str))
    assert "stop: stopped" in shown and not session.busy


def test_failed_loads_keep_the_models_that_were_loaded(monkeypatch):
    import ui.loader
    from engine.load.models import ModelLoadError, VocabMismatchError
    from ui.loader import load_models
    from ui.session import UserError

    app = fake_app([])
    before = app.runtime

    def loader(name):
        if name == "missing/model":
            raise ModelLoadError("cannot load model 'missing/model': not in the local cache")
        return FakeTarget(name=name)

    def no_vocab_match(target, draft, options, on_event=None):
        raise VocabMismatchError("vocab types differ: target BPE, draft WordLevel")

    app.loader = loader
    with pytest.raises(UserError, match="Load failed: cannot load model 'missing/model'"):
        load_models(app, "missing/model", "")
    monkeypatch.setattr(ui.loader, "make_runtime", no_vocab_match)
    with pytest.raises(UserError, match="cannot draft for this target: vocab types differ") as e:
        load_models(app, "fake", "other-vocab")
    assert e.value.level == "error" and app.runtime is before and not before.scheduler.closed
    status = load_models(app, "fake", "none")
    assert "Already loaded" in status
    assert "bfloat16: auto: bfloat16 (avx512_bf16" in status and "lean forward (layers in one C call)" in status


def test_default_chain_ends_with_the_head_only_for_the_model_it_was_trained_for(embedded, tiny_target):
    from engine.draft.registry import NGRAM_CHAIN
    from ui.settings import default_types

    assert default_types(embedded) == NGRAM_CHAIN + ["draft-head"]
    assert default_types(tiny_target) == NGRAM_CHAIN
    assert default_types(None) == NGRAM_CHAIN and default_types(FakeTarget()) == NGRAM_CHAIN


def test_loading_another_target_takes_the_head_out_of_the_chain_and_back(monkeypatch, embedded, tiny_target):
    import ui.loader
    from engine.draft.registry import NGRAM_CHAIN
    from ui.handlers import load
    from ui.state import Runtime

    def runtime_for(target, draft, options, on_event=None):
        sched = FakeScheduler([])
        return Runtime(target=target, draft=None, engine=sched.engine, scheduler=sched,
                       vocab=Vocab.of(FakeTokenizer()))

    app = fake_app([])
    app.loader = {"tiny": tiny_target, "embedded": embedded}.get
    monkeypatch.setattr(ui.loader, "make_runtime", runtime_for)
    monkeypatch.setattr(tiny_target, "name", "tiny", raising=False)
    status, types = load(app, "tiny", "", NGRAM_CHAIN + ["draft-head"])
    assert types == NGRAM_CHAIN and "draft-head left the chain" in status
    status, types = load(app, "embedded", "", ["ngram-mod"])
    assert types == ["ngram-mod", "draft-head"] and "draft-head joined the chain" in status
    from engine.forward.prepack import linear_paths

    assert f"linears: {linear_paths(embedded.model)}" in status  # which kernels this CPU runs, counted
    paths = linear_paths(embedded.model)  # e.g. "our q4_1 kernel 210, our q8_0 kernel 1": all 211 packed
    assert sum(int(part.rsplit(" ", 1)[1]) for part in paths.split(", ")) == 211, paths
    # the same model again changes nothing: a user who took the head out keeps it out
    status, types = load(app, "embedded", "", ["ngram-mod"])
    assert types == ["ngram-mod"] and "Already loaded" in status and "joined" not in status


# ---- a shared engine: waiting in line, notes, speedups under load, a shared demo -------------------------


def test_a_request_in_line_says_where_it_waits_then_streams(monkeypatch):
    from ui.session import converse
    from ui.state import SessionState

    monkeypatch.setattr("ui.session.WAIT_REFRESH_S", 0.0)
    app, session = fake_app([[WaitEvent(position=3), WaitEvent(position=1)] + answer(), answer()]), SessionState()
    notices = [session.notice[0] for _ in converse(app, session, "hi", Settings(max_new_tokens=8), manual=False)]
    assert any("3rd in line" in n for n in notices) and any("1st in line" in n for n in notices)
    assert session.run.ids and session.run.done and "in line" not in session.notice[0]


def test_moves_of_the_line_are_shown_at_most_once_a_second():
    """Forty sessions in line each hear every move: the first place is shown at once, the moves after it no
    more often than WAIT_REFRESH_S, and the answer then streams as usual."""
    from ui.session import WAIT_REFRESH_S, converse
    from ui.state import SessionState

    line = [WaitEvent(position=p) for p in range(40, 0, -1)]
    app, session = fake_app([line + answer(), answer()]), SessionState()
    t0 = time.perf_counter()
    notices = [session.notice[0] for _ in converse(app, session, "hi", Settings(max_new_tokens=8), manual=False)]
    shown = [n for n in notices if "in line" in n]
    assert shown[0].startswith("40th in line") or "40th in line" in shown[0]
    assert len(shown) <= 1 + (time.perf_counter() - t0) / WAIT_REFRESH_S
    assert session.run.ids and session.run.done


def test_the_comparison_waiting_in_line_says_it_is_the_comparison():
    from ui.session import converse
    from ui.state import SessionState

    app, session = fake_app([answer(), [WaitEvent(position=2)] + answer()]), SessionState()
    notices = [session.notice[0] for _ in converse(app, session, "hi", Settings(max_new_tokens=8), manual=False)]
    waits = [n for n in notices if "2nd in line" in n]
    assert waits and all("comparison" in n and "answer starts" not in n for n in waits)


def test_the_prefill_notes_of_the_engine_reach_the_page():
    from ui.session import converse
    from ui.state import SessionState

    note = "n_max 32 is above this engine's draft capacity of 16: drafts are capped at 16"
    first, last = answer()
    first = replace(first, notes=[note])
    app, session = fake_app([[first, last], answer()]), SessionState()
    notices = [session.notice for _ in converse(app, session, "hi", Settings(max_new_tokens=8), manual=False)]
    assert (note, "warn") in notices


def test_a_speedup_taken_under_load_says_so(vocab):
    from ui.compare import load_note

    alone, crowded = RunRecord(vocab=vocab, prompt_ids=[1]), RunRecord(vocab=vocab, prompt_ids=[1])
    for run, n_seqs in ((alone, 1), (crowded, 3)):
        run.add(make_round(0, 3))
        for i in range(1, 4):
            run.add(spec_event(round=i, pos_sampled=3 + i, p0=4 + i, n_seqs=n_seqs))
    assert load_note(alone, alone) == ""
    note = load_note(alone, crowded)
    assert "under load" in note and "3 of 3 plain steps" in note
    page = compare_html([5, 6], [5, 6], 30.0, 10.0, vocab, load=note)
    assert "speedup-load" in page and "under load" in page and "speedup-up" not in page
    assert "speedup-up" in compare_html([5, 6], [5, 6], 30.0, 10.0, vocab)


def test_a_shared_demo_refuses_model_loads_from_the_page(monkeypatch):
    import ui.loader
    from ui.loader import load_models
    from ui.session import UserError

    app = fake_app([])
    built_on = []

    def runtime_for(target, draft, options, on_event=None):
        built_on.append(target.name)
        return fake_app([]).runtime

    monkeypatch.setattr(ui.loader, "make_runtime", runtime_for)
    app.options.allow_model_load = False
    app.loader = lambda name: FakeTarget(name=name)
    with pytest.raises(UserError, match="--allow-model-load"):
        load_models(app, "other", "")
    assert built_on == []
    app.options.allow_model_load = True
    old = app.runtime
    assert "Loaded" in load_models(app, "other", "")
    assert built_on == ["other"] and old.scheduler.closed, "built through the old engine's queue, then closed"


def test_a_step_mode_answer_is_checked_against_its_output_format_when_it_ends():
    from ui.session import converse, step_turn
    from ui.state import SessionState

    script = [make_round(0, 3), spec_event(round=1, pos_sampled=3, p0=4, emitted=[5, 6, EOS], done=True,
                                           stop_reason="eos", rm_range=(7, 9), seq_cells=7)]
    app, session = fake_app([script]), SessionState()
    list(converse(app, session, "hi", Settings(output_format="json"), manual=True))
    step_turn(app, session)
    assert session.format_html == ""  # not finished yet
    step_turn(app, session)
    assert not session.busy and "JSON" in session.format_html


def tree_event(**kw) -> RoundEvent:
    """Round 4 after ' the': a tree ' cat'->(' sat'->' on', ' ran'), ' dog'; the target took ' cat sat' and said
    ' mat'."""
    base = dict(seq=0, round=4, kind="spec", drafter="ngram-simple", pos_sampled=10, p0=11, drafted=[5, 6, 11],
                n_accepted=2, bonus=12, emitted=[5, 6, 12], p_target=[1.0, 1.0, 1.0], target_top=[5, 6, 12, 4, 4, 4],
                verify_mode="tree", rollback="tree", rm_range=(13, 14), rm_cells=3, rm_positions=[11, 12, 13],
                tree_tokens=[5, 6, 11, 8, 7],
                tree_parents=[-1, 0, 1, 0, -1], tree_drafters=["ngram-simple", "ngram-simple", "ngram-simple",
                                                              "draft-head", "draft-head"],
                tree_path=[0, 1], tree_offered=9,
                budget_why="5 of 9 draft nodes: 3.10 expected tokens for a forward of 6 rows (1.08x one row)")
    base.update(kw)
    return RoundEvent(**base)


def test_a_tree_round_draws_the_path_the_branches_and_the_budget(vocab):
    from ui.treeview import tree_html

    out = tree_html(tree_event(), vocab, context=[1, 4])
    assert out.count("chip-acc") == 2 and out.count("chip-rej") == 3 and out.count("<s>") == 3
    assert out.count("<li>") == 5 and "draft-head" in out and "kept in the cache at position 12" in out
    assert "5 of 9 draft nodes" in out and "5 of the 9 nodes" in out and "against plain decoding" not in out
    assert "stands +2.4 tokens against plain decoding" in tree_html(tree_event(balance=2.38), vocab, context=[1, 4])
    row = timeline_row(tree_event(), vocab, context=[1, 4])
    assert "(tree: 5 nodes)" in row and "2/5" in row and "branches freed by cell; path kept [11, 13)" in row
    none_kept = timeline_row(tree_event(n_accepted=0, emitted=[9], rm_range=(11, 14), tree_path=[]), vocab, [1, 4])
    assert "no node kept" in none_kept
    step = step_html(tree_event(), vocab, context=[1, 4], sampled=4)
    assert "5 draft nodes from draft-head, ngram-simple" in step and "freed one by one" in step


def test_one_session_has_one_turn_at_a_time_even_between_its_two_runs():
    """A second message (an example click, a second API call) while the answer or its comparison runs, or in
    the moment between them when no generation is active, is refused; after the turn it is taken."""
    from ui.session import UserError, converse
    from ui.state import SessionState

    app, session = fake_app([answer(), answer(), answer(), answer()]), SessionState()
    turn = converse(app, session, "hi", Settings(max_new_tokens=8), manual=False)
    steps = 0
    for _ in turn:
        steps += 1
        with pytest.raises(UserError, match="still generating"):
            next(converse(app, session, "again", Settings(), manual=False))
    assert steps > 2 and not session.busy
    assert len(app.runtime.scheduler.submitted) == 3  # the answer and its comparison's two runs, nothing else
    list(converse(app, session, "again", Settings(max_new_tokens=8), manual=False))
    assert len(app.runtime.scheduler.submitted) == 6


def test_a_run_cut_by_the_full_cache_is_judged_on_the_tokens_both_runs_have():
    from ui.render import compare_html

    vocab = Vocab.of(FakeTokenizer())
    cut = compare_html([4, 5, 6], [4, 5, 6, 7, 8], 30.0, 20.0, vocab, cut="speculative")
    assert "lossless-ok" in cut and "first 3 tokens" in cut and "cache other chats share was full" in cut
    assert "lossless-diff" in compare_html([4, 5, 9], [4, 5, 6, 7], 30.0, 20.0, vocab, cut="plain")
    assert "lossless-diff" in compare_html([4, 5, 6], [4, 5, 6, 7], 30.0, 20.0, vocab)


def test_a_conversation_longer_than_the_context_drops_its_oldest_turns_and_says_so():
    from ui.conversation import fit_conversation
    from ui.session import converse
    from ui.state import SessionState
    from ui.views import chat_view

    session = SessionState(history=[{"role": "user", "content": "a " * 30}, {"role": "assistant", "content": "b"},
                                    {"role": "user", "content": "c " * 5}, {"role": "assistant", "content": "d"}])

    def encode(messages):  # a token per word, two per message of framing
        return [0] * sum(2 + len(m["content"].split()) for m in messages)

    ids, dropped = fit_conversation(encode, session, "new question", room=8, limit=40)
    assert dropped == 1 and len(ids) == 2 + 5 + 2 + 1 + 2 + 2
    assert fit_conversation(encode, session, "new", room=8, limit=None)[1] == 0
    assert fit_conversation(encode, session, "x " * 50, room=8, limit=40)[1] == 2  # the message itself stays

    app = fake_app([answer(), answer()])
    app.runtime.engine.prompt_limit = 3 + 8  # the fake target encodes any conversation as 3 tokens
    long_chat = SessionState(history=list(session.history), turns_html=["<p>a</p>", "<p>b</p>", "<p>c</p>", "<p>d</p>"])
    list(converse(app, long_chat, "hi", Settings(max_new_tokens=9), manual=False))
    assert "2 oldest turns are left out" in long_chat.notice[0] and long_chat.notice[1] == "warn"
    # the turns left out are gone from the stored conversation and its page, which says so
    assert [m["content"] for m in long_chat.history if m["role"] == "user"] == ["hi"]
    assert len(long_chat.turns_html) == 2 and "<p>a</p>" not in chat_view(long_chat)
    assert long_chat.forgotten_turns == 2 and "2 earlier turns no longer fit the context" in chat_view(long_chat)


def test_fitting_a_long_conversation_takes_a_logarithmic_number_of_encodings():
    """600 turns of which the last few dozen fit: found with a handful of encodings of the conversation, not one
    per dropped turn, and the same prompt as dropping one turn at a time gives."""
    from ui.conversation import fit_conversation
    from ui.state import SessionState

    history = [{"role": r, "content": f"{r} {i} " + "w " * (i % 7)} for i in range(600) for r in ("user", "assistant")]
    message = [{"role": "user", "content": "new question"}]
    calls = []

    def encode(messages):
        calls.append(len(messages))
        return [0] * sum(2 + len(m["content"].split()) for m in messages)

    limit, room = 520, 16
    ids, dropped = fit_conversation(encode, SessionState(history=history), "new question", room=room, limit=limit)
    n_calls = len(calls)
    one_by_one = next(k for k in range(601) if len(encode(history[2 * k:] + message)) + room <= limit)
    assert 500 < dropped == one_by_one and ids == encode(history[2 * dropped:] + message)
    assert n_calls <= 2 + 10, f"{n_calls} encodings for 600 turns"


def timed_answer(seconds: float) -> list:
    """answer()'s events stamped by the engine `seconds` apart: its decode speed is 3 tokens / seconds."""
    return [replace(ev, t_end=100.0 + i * seconds) for i, ev in enumerate(answer())]


def test_the_speedup_is_timed_on_runs_the_page_does_not_draw():
    """The streamed answer was slow (the page took the cores); the ratio comes from the plain run and an unseen
    speculative run, both timed while the page shows progress only, and the page says how it was taken."""
    from ui.session import converse
    from ui.state import SessionState

    app, session = fake_app([timed_answer(2.0), timed_answer(0.5), timed_answer(0.25)]), SessionState()
    list(converse(app, session, "hi", Settings(max_new_tokens=8), manual=False))
    types = [bool(p.spec.types) for p in app.runtime.scheduler.submitted]
    assert types == [True, False, True]  # the answer, plain decoding, the answer again unseen
    assert "2.00&times;" in session.compare_html  # 12 tok/s unseen against 6 plain, not 1.5 streamed
    assert "both runs timed with the page idle" in session.compare_html and "1.5 tok/s" in session.compare_html
    assert "lossless-ok" in session.compare_html


def test_each_drafter_shows_what_it_cost_and_gained_and_why_it_sat_out():
    """From the llama.cpp counters and the answer's events: drafting ms per round, the rounds it won and their
    tokens per forward, the rounds drafted without it and the gate's latest reason."""
    from ui.drafter_costs import drafter_costs, drafter_costs_html

    head, ngram = DrafterStats("draft-head"), DrafterStats("ngram-simple")
    head.n_call_draft, head.t_draft_us = 4, 10_000.0
    ngram.n_call_draft, ngram.t_draft_us = 10, 1_000.0
    why = "draft-head: 0.10 tokens only it found when the others guess little x 9.0 ms a token vs 2.5 ms drafting"
    events = [spec_event(drafter="ngram-simple", emitted=[5, 6, 11]), spec_event(drafter="ngram-simple", emitted=[7]),
              spec_event(drafter="draft-head", emitted=[5, 6]),
              spec_event(drafter=None, kind="plain", emitted=[9], not_drafted=[why])]
    rows = {r.name: r for r in drafter_costs({"ngram-simple": ngram, "draft-head": head}, events)}
    assert rows["ngram-simple"].rounds_won == 2 and rows["ngram-simple"].tokens_per_forward == 2.0
    assert rows["ngram-simple"].ms_per_round == pytest.approx(0.1) and rows["ngram-simple"].rounds_out == 0
    assert rows["draft-head"].ms_per_round == pytest.approx(2.5) and rows["draft-head"].tokens_per_forward == 2.0
    assert rows["draft-head"].rounds_out == 1 and rows["draft-head"].why_out == why
    page = drafter_costs_html({"ngram-simple": ngram, "draft-head": head}, events)
    assert "9.0 ms a token" in page and page.count("<tr>") == 3


def test_a_streaming_update_resends_the_html_it_leaves_instead_of_skipping_it():
    import gradio as gr

    from ui import handlers
    from ui.session import converse
    from ui.state import SessionState
    from ui.views import all_views, waiting_views

    # a gr.skip() makes Gradio build a component and its config per output; in a stream, the same HTML
    # again costs a string compare (the stream's diff) and shows the same page
    app, session = fake_app([answer()]), SessionState()
    turn = converse(app, session, "hi", Settings(), manual=False)
    next(turn)
    first = handlers.pack(all_views(app, session, force_charts=True), session)
    session.notice = ("3rd in line", "info")
    update = dict(zip(handlers.VIEWS, handlers.pack(waiting_views(session), session, stream=True)))
    assert "3rd in line" in update["notice"]
    for name, before in zip(handlers.VIEWS, first):
        if name in ("acc_plot", "speed_plot"):
            assert update[name] == gr.skip()  # a plot sent again is redrawn
        elif name != "notice":
            assert isinstance(before, str) and update[name] == before
    # what another event drew is what the stream repeats: the rejected-drafts toggle stays as clicked
    hidden = handlers.show_rejected(session, False)
    assert dict(zip(handlers.VIEWS, handlers.pack({}, session, stream=True)))["chat"] == hidden
    # outside a stream nothing is re-sent (a whole page of HTML would go over the wire)
    assert all(out == gr.skip() for out in handlers.pack({}, session))
    list(turn)
