"""The drafter arena: the oracle's ceiling, every contender lossless, the leaderboard's CSV and PNG, the CLI and the
page's tab handler, on tiny models."""

import csv
from types import SimpleNamespace

import pytest
from PIL import Image

from engine.bench import arena
from engine.bench.contest import ArenaParams, engine_runner, run_arena
from engine.bench import png
from engine.bench.leaderboard import (COLUMNS, N_POSITIONS, PNG_WIDTH, leaderboard, png_height,
                                      tokens_per_forward_figure, write_csv, write_png)
from engine.draft.base import DraftRequest
from engine.draft.oracle import OracleDrafter
from engine.plotstyle import GREEN
from engine.serve.engine import Engine
from engine.serve.scheduler import Scheduler
from ui import arena_tab
from ui.run_folders import RunFolders

N_MAX = 4
PROMPTS = [[1, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [1, 9, 10, 11, 12, 13, 9, 10, 11]]


@pytest.fixture(scope="module")
def result(tiny_target, tiny_draft):
    engine = Engine(tiny_target, draft=tiny_draft, n_ctx=1024, n_seq_max=1, n_draft=N_MAX, calibrate=False)
    params = ArenaParams(n_max=N_MAX, max_new_tokens=40, ignore_eos=True)
    return run_arena(engine_runner(engine), PROMPTS, tiny_target, tiny_draft, params)


@pytest.fixture(scope="module")
def rows(result):
    return leaderboard(result)


def test_the_oracle_ranks_first_with_every_draft_kept(rows, result):
    top = rows[0]
    assert top["drafter"] == "oracle" and top["rank"] == 1
    assert top["accept_rate"] == 1.0
    assert [top[f"acc_pos_{i}"] for i in range(1, N_MAX + 1)] == [1.0] * N_MAX
    # every round emits a whole draft and the bonus, but the last, which the token limit may cut
    assert N_MAX + 0.5 <= top["tokens_per_forward"] <= N_MAX + 1
    oracle = next(e for e in result.entries if e.contender.kind == "oracle")
    for run in oracle.runs:
        rounds = [e for e in run.events if e.kind != "prefill"]
        assert all(len(e.emitted) == N_MAX + 1 for e in rounds[:-1])


def test_every_contender_is_lossless_and_listed(rows, result):
    names = [r["drafter"] for r in rows]
    assert {"plain", "chain", "oracle", "ngram-simple", "ngram-mod", "ngram-cache", "draft-simple"} <= set(names)
    assert all(r["lossless"] == "True" for r in rows), [(r["drafter"], r["lossless"]) for r in rows]
    assert next(r for r in rows if r["drafter"] == "plain")["tokens_per_forward"] == 1.0
    # the tiny target has no head of its own, and free text has no format to force
    assert any(s.startswith("draft-head:") for s in result.skipped)
    assert any(s.startswith("grammar:") for s in result.skipped)
    tpf = [r["tokens_per_forward"] for r in rows[1:]]
    assert tpf == sorted(tpf, reverse=True)


def test_a_round_cost_split_adds_up(rows):
    for r in rows:
        assert r["forward_ms"] > 0 and r["draft_ms"] >= 0 and r["other_ms"] >= 0
        assert r["draft_ms"] + r["forward_ms"] + r["other_ms"] == pytest.approx(r["round_ms"], abs=0.01) \
            or r["draft_ms"] + r["forward_ms"] > r["round_ms"]


def test_csv_has_the_columns(rows, tmp_path):
    path = write_csv(rows, tmp_path / "arena.csv")
    with path.open() as f:
        back = list(csv.DictReader(f))
    assert list(back[0]) == COLUMNS and len(back) == len(rows)
    assert {f"acc_pos_{i}" for i in range(1, N_POSITIONS + 1)} <= set(COLUMNS)


def test_png_is_a_bar_per_contender_in_rank_order(rows, tmp_path):
    with Image.open(write_png(rows, tmp_path / "arena.png")) as im:
        assert im.format == "PNG" and im.size == (PNG_WIDTH, png_height(len(rows)))
        colours = {c for _, c in im.convert("RGB").getcolors(im.width * im.height)}
    assert tuple(int(GREEN[i:i + 2], 16) for i in (1, 3, 5)) in colours  # the chain's bar
    ax = png.draw(tokens_per_forward_figure(rows), PNG_WIDTH, png_height(len(rows))).axes[0]
    assert [p.get_width() for p in ax.patches] == [r["tokens_per_forward"] for r in rows]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{r['rank']}. {r['drafter']}" for r in rows]
    assert [t.get_text() for t in ax.texts] == [f"{r['tokens_per_forward']:.2f}" for r in rows]
    assert ax.yaxis_inverted()  # rank 1 on top


def test_the_oracle_proposes_nothing_off_its_reference():
    oracle = OracleDrafter()
    oracle.expect(0, [1, 2, 3, 4, 5, 6, 7])
    on = DraftRequest(seq=0, prompt=[1, 2], id_last=3, n_max=2, n_min=0, p_min=None)
    off = DraftRequest(seq=0, prompt=[1, 2], id_last=9, n_max=2, n_min=0, p_min=None)
    oracle.draft([on, off])
    assert on.result == [4, 5] and off.result == []
    oracle.seq_rm(0)
    again = DraftRequest(seq=0, prompt=[1, 2], id_last=3, n_max=2, n_min=0, p_min=None)
    oracle.draft([again])
    assert again.result == []


def test_the_command_line_writes_the_leaderboard(tiny_dirs, bench_prompts, tmp_path, capsys):
    out, png_file = tmp_path / "a.csv", tmp_path / "a.png"
    rc = arena.main(["--prompts", str(bench_prompts), "--target", str(tiny_dirs["target"]), "--n-max", "3",
                     "--max-new-tokens", "16", "--dtype", "float32", "--out", str(out), "--png", str(png_file)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "oracle" in printed and "skipped draft-simple" in printed
    lines = out.read_text().splitlines()
    assert lines[0].split(",") == COLUMNS
    with Image.open(png_file) as im:
        assert im.format == "PNG" and im.size == (PNG_WIDTH, png_height(len(lines) - 1))
    assert arena.main(["--prompts", str(bench_prompts), "--n-max", "0"]) == 2


def test_the_tab_handler_ranks_every_contender(tiny_target):
    scheduler = Scheduler(Engine(tiny_target, n_ctx=1024, n_seq_max=2, n_draft=8, calibrate=False))
    try:
        app = SimpleNamespace(runtime=SimpleNamespace(target=tiny_target, draft=None, engine=scheduler.engine,
                                                      scheduler=scheduler), run_folders=RunFolders())
        rows, note, csv_path, png_path = arena_tab.run_arena_tab(app, "w5 w6 w7 w8 w5 w6 w7", n_max=3,
                                                                 max_new_tokens=16)
    finally:
        scheduler.close()
    names = [r["drafter"] for r in rows]
    assert names[0] == "oracle" and {"plain", "chain", "ngram-simple", "ngram-map-k"} <= set(names)
    assert "draft-simple" in note and csv_path.is_file()
    with Image.open(png_path) as im:
        assert im.format == "PNG" and im.size == (PNG_WIDTH, png_height(len(rows)))
    table = arena_tab.table(rows)
    assert len(table) == len(rows) and all(len(line) == len(arena_tab.HEADERS) for line in table)
    assert all(r["lossless"] == "True" for r in rows)
    app.run_folders.remove_all()


def test_the_tab_without_a_model_says_so():
    rows, note, csv_path, png_path = arena_tab.run_arena_tab(SimpleNamespace(runtime=None), "hi")
    assert rows == [] and "No model" in note and csv_path is None and png_path is None
