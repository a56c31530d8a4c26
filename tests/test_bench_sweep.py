"""Sweeps of `python -m engine.bench` on a tiny model: list arguments, the cross product, synthetic acceptance,
plain-only runs, the curves' arithmetic and the plots."""

import csv

import pytest
from PIL import Image

from engine.bench import cli, plot, png, stats
from engine.bench.rows import load_rows
from engine.bench.sweep import groups_of, parse_list


def run(tiny_dirs, bench_prompts, tmp_path, *extra):
    out = tmp_path / "traces.csv"
    code = cli.main(["--prompts", str(bench_prompts), "--out", str(out), "--target", str(tiny_dirs["target"]),
                     "--ignore-eos", *extra])
    return code, (load_rows(out) if out.exists() else [])


def test_parse_list_reads_commas_and_refuses_bad_values():
    assert parse_list("2, 4,8,4", "--n-max", int, 0) == [2, 4, 8]
    assert parse_list("0.5", "--synthetic-accept", float, 0.0, 1.0) == [0.5]
    with pytest.raises(ValueError, match="--n-max: 'x' is not an integer"):
        parse_list("2,x", "--n-max", int, 0)
    with pytest.raises(ValueError, match=r"in \[0.0, 1.0\]"):
        parse_list("1.5", "--synthetic-accept", float, 0.0, 1.0)


def test_groups_are_filled_up_to_the_concurrency():
    ps = [{"id": str(i)} for i in range(3)]
    groups = groups_of(ps, 2)
    assert [([p["id"] for p in own], [p["id"] for p in fill]) for own, fill in groups] == \
        [(["0", "1"], []), (["2"], ["0"])]


def test_sweep_runs_the_cross_product(tiny_dirs, bench_prompts, tmp_path, capsys):
    code, rows = run(tiny_dirs, bench_prompts, tmp_path, "--spec", "ngram-simple", "--max-new-tokens", "12",
                     "--n-max", "2,4", "--parallel", "1,2", "--ctx-len", "0,16", "--synthetic-accept", "0.5")
    assert code == 0
    # per (ctx, N) and prompt: plain + (chain + synthetic) at each of 2 n_max
    assert len(rows) == 2 * 2 * 2 * (1 + 2 * 2)
    configs = {(r["concurrency"], r["ctx_len"], r["n_max"], r["spec_types"]) for r in rows}
    for n in ("1", "2"):
        for ctx in ("0", "16"):
            assert (n, ctx, "0", "") in configs
            for k in ("2", "4"):
                assert (n, ctx, k, "ngram-simple") in configs and (n, ctx, k, "synthetic") in configs
    assert all(int(r["n_gen"]) == 12 for r in rows)
    synthetic = [r for r in rows if r["spec_types"] == "synthetic"]
    assert all(r["lossless_ok"] == "n/a" and r["synthetic_accept"] == "0.5" for r in synthetic)
    assert all(r["lossless_ok"] == "True" for r in rows if r["spec_types"] != "synthetic")
    assert all(float(r["tps_group"]) > 0 and float(r["tps_decode"]) > 0 for r in rows)
    out = capsys.readouterr().out
    assert "plain decoding, ctx 0: aggregate decode N=1" in out and "formula" in out


def test_synthetic_acceptance_is_realised_near_p(tiny_dirs, bench_prompts, tmp_path):
    code, rows = run(tiny_dirs, bench_prompts, tmp_path, "--spec", "none", "--max-new-tokens", "150", "--n-max", "4",
                     "--synthetic-accept", "0,0.3,0.8,1")
    assert code == 0
    for r in rows:
        if r["spec_types"] == "synthetic":
            p = float(r["synthetic_accept"])
            assert abs(float(r["accept_p"]) - p) < 0.12, r
            # the drafter always proposes k = n_max (adaptive off), so positions 1..4 all exist
            assert len(r["acc_rate_pos"].split(";")) == 4
    full = [r for r in rows if r["synthetic_accept"] == "1.0"]
    assert all(float(r["mean_acc_len"]) > 4.5 for r in full)  # 4 kept + 1 bonus, nearly every round


def test_synthetic_rates_per_position_are_a_run_of_their_own(tiny_dirs, bench_prompts, tmp_path, capsys):
    code, rows = run(tiny_dirs, bench_prompts, tmp_path, "--spec", "none", "--max-new-tokens", "60", "--n-max", "3",
                     "--synthetic-accept", "1/0,0.5")
    assert code == 0
    rates = [r for r in rows if r["synthetic_accept"] == "1.0/0.0"]
    assert rates and all(r["acc_rate_pos"].split(";")[:2] == ["1.000", "0.000"] for r in rates)
    assert any(r["synthetic_accept"] == "0.5" for r in rows)
    assert "synthetic 1.0/0.0" in capsys.readouterr().out


def test_plain_only_concurrency_sweep_with_plots(tiny_dirs, bench_prompts, tmp_path):
    code, rows = run(tiny_dirs, bench_prompts, tmp_path, "--spec", "none", "--max-new-tokens", "10",
                     "--parallel", "1,2", "--plots", str(tmp_path / "plots"))
    assert code == 0
    assert {r["spec_decode"] for r in rows} == {"off"} and len(rows) == 4
    scaling = stats.plain_scaling(rows)
    assert [n for n, _ in scaling[0]] == [1, 2] and all(t > 0 for _, t in scaling[0])
    assert (tmp_path / "plots" / "bench.html").is_file()
    for name in plot.FIGURES:
        with Image.open(tmp_path / "plots" / f"{name}.png") as im:
            assert im.format == "PNG" and im.size == (plot.PNG_WIDTH, plot.PNG_HEIGHT)


@pytest.mark.parametrize("extra,why", [
    (["--n-max", "2,x"], "--n-max"),
    (["--parallel", "1,0"], "--parallel"),
    (["--synthetic-accept", "0.5,1.5"], "--synthetic-accept"),
    (["--ctx-len", "0,-5"], "--ctx-len"),
    (["--max-new-tokens", "2000"], "positions"),  # the tiny model has 1024
])
def test_bad_sweep_arguments_exit_2_with_one_line(tiny_dirs, bench_prompts, tmp_path, capsys, extra, why):
    code, _ = run(tiny_dirs, bench_prompts, tmp_path, *extra)
    assert code == 2
    # one line of reason (a model load before it may draw its own progress bar on stderr)
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and why in errors[0]


def test_formula():
    assert stats.formula(0.0, 4, 0.0) == pytest.approx(1.0)
    assert stats.formula(0.5, 1, 0.0) == pytest.approx(1.5)
    assert stats.formula(1.0, 4, 1.5) == pytest.approx(2.0)
    assert stats.formula(0.999999, 4, 1.5) == pytest.approx(2.0, rel=1e-4)


SMALL = [
    dict(prompt_id="a", spec_decode="off", spec_types="", n_max=0, concurrency=1, ctx_len=0, tps_group=10,
         speedup_decode=1, accept_p=0, verify_cost_c=0, acc_rate_pos="", synthetic_accept=""),
    dict(prompt_id="a", spec_decode="off", spec_types="", n_max=0, concurrency=4, ctx_len=0, tps_group=30,
         speedup_decode=1, accept_p=0, verify_cost_c=0, acc_rate_pos="", synthetic_accept=""),
    dict(prompt_id="a", spec_decode="on", spec_types="ngram-simple", n_max=8, concurrency=1, ctx_len=0,
         tps_group=20, speedup_decode=2.0, accept_p=0.7, verify_cost_c=0.5, acc_rate_pos="0.8;0.6",
         synthetic_accept="", n_drafted=10),
    dict(prompt_id="a", spec_decode="on", spec_types="ngram-simple", n_max=8, concurrency=4, ctx_len=0,
         tps_group=36, speedup_decode=1.2, accept_p=0.7, verify_cost_c=1.0, acc_rate_pos="0.8;0.6",
         synthetic_accept="", n_drafted=10),
    dict(prompt_id="a", spec_decode="on", spec_types="synthetic", n_max=4, concurrency=1, ctx_len=0,
         tps_group=15, speedup_decode=1.3, accept_p=0.5, verify_cost_c=0.4, acc_rate_pos="0.5;0.25;0.12;0.06",
         synthetic_accept=0.5, n_drafted=40),
]


def test_plots_build_from_a_small_csv(tmp_path):
    path = tmp_path / "small.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list({k: 0 for r in SMALL for k in r}))
        w.writeheader()
        w.writerows(SMALL)
    rows = load_rows(path)
    figs = plot.figures(rows)
    assert list(figs) == plot.FIGURES
    conc = figs["speedup_concurrency"]["data"]
    assert len(conc) == 1 and conc[0]["x"] == [1, 4] and conc[0]["y"] == pytest.approx([2.0, 1.2])
    acc = figs["speedup_acceptance"]["data"]
    curve = next(t for t in acc if t["name"].startswith("formula"))
    assert curve["y"][0] == pytest.approx(1 / 1.4) and "c=0.40" in curve["name"]
    assert any(t["name"].startswith("real drafters") for t in acc)
    assert len(figs["acceptance_position"]["data"]) == 2
    drawn = png.draw(figs["speedup_concurrency"], plot.PNG_WIDTH, plot.PNG_HEIGHT).axes[0]
    assert list(drawn.lines[0].get_xdata()) == [1, 4] and list(drawn.lines[0].get_ydata()) == pytest.approx([2, 1.2])
    assert list(drawn.lines[1].get_ydata()) == [1, 1]  # the break-even rule
    drawn = png.draw(figs["speedup_acceptance"], plot.PNG_WIDTH, plot.PNG_HEIGHT)
    assert [t.get_text() for t in drawn.legends[0].get_texts()] == [t["name"] for t in acc]
    code = plot.main([str(path), "--out", str(tmp_path / "plots"), "--no-png"])
    assert code == 0 and not list((tmp_path / "plots").glob("*.png"))
    page = (tmp_path / "plots" / "bench.html").read_text()
    assert all(f'id="{name}"' in page for name in plot.FIGURES)
    assert "<script src=" not in page and "plotly.js v" in page  # plotly.js inline: the page opens offline


def test_empty_rows_give_figures_that_say_so():
    figs = plot.figures([])
    for fig in figs.values():
        assert fig["data"] == [] and fig["layout"]["annotations"]


def test_a_shared_forward_summary_shows_each_prompts_own_speed_and_the_slowest(capsys):
    from engine.bench.cli import print_summary

    def row(pid, on, group, own):
        return dict(prompt_id=pid, spec_decode="on" if on else "off", spec_types="ngram-simple" if on else "",
                    n_max=8 if on else 0, concurrency=2, ctx_len=0, n_gen=96, tps=10.0, speedup=group,
                    speedup_decode=own, mean_acc_len=1.5, draft_accept_rate=0.5, verify_cost_c=0.1,
                    lossless_ok=True, prompt_kind="open", synthetic_accept="", dtype="float32")

    print_summary([row("copy", False, 1.0, 1.0), row("open", False, 1.0, 1.0),
                   row("copy", True, 1.3, 1.9), row("open", True, 1.3, 0.97)])
    out = capsys.readouterr().out
    assert " own " in out.splitlines()[0]
    assert "1.900" in out and "0.970" in out  # the group's 1.3 hides that one prompt came slower
    assert "slowest prompt under ngram-simple: open at 0.970x" in out
