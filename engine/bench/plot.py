"""The speedup curves from traces.csv rows, as plotly figures, an HTML page and PNG files.

    python -m engine.bench.plot traces.csv [more.csv ...] --out DIR [--merged all.csv] [--no-png]

Figures are plain dicts (plotly's JSON), built by pure functions of the rows, so the UI's Benchmark tab shows
the very same pictures and tests need no browser. The HTML page carries plotly.js inline: it opens with no
network. The PNGs are the same dicts drawn by matplotlib (engine.bench.png).
"""

from __future__ import annotations

import argparse
import csv
import html
import sys
from pathlib import Path

from engine.bench.png import write_png
from engine.bench.rows import load_rows
from engine.bench.stats import (acceptance_by_position, concurrency_curves, config_c, formula, is_chain, num,
                                plain_scaling, short_name, speedup_of, synthetic_points)
from engine.plotstyle import COLORS, RULE, axis, message
from engine.plotstyle import layout as base_layout

DASHES = ["solid", "dash", "dot", "dashdot"]
PNG_WIDTH, PNG_HEIGHT = 980, 420  # pixels, the page's figure height
FIGURES = ["speedup_concurrency", "speedup_acceptance", "acceptance_position", "plain_scaling"]


def _layout(title: str, xaxis: dict, yaxis: dict, empty: str | None = None, **extra) -> dict:
    """The shared style on a page of figures; `empty` says why a figure has no data."""
    return base_layout(title, xaxis, yaxis, height=420, margin=dict(l=60, r=20, t=50, b=60),
                       annotations=[message(empty, size=15)] if empty else [], **extra)


def _break_even() -> dict:
    """speedup = 1: below it speculation costs time."""
    return dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=1, y1=1,
                line=dict(color=RULE, dash="dash", width=1.5))


def speedup_concurrency_figure(rows: list[dict]) -> dict:
    """Decode speedup of the real drafters against concurrency, one line per context length (and draft cap)."""
    curves = concurrency_curves(rows)
    many_k = len({k for _, _, k in curves}) > 1
    many_names = len({name for name, _, _ in curves}) > 1
    ctxs = sorted({ctx for _, ctx, _ in curves})
    data = []
    for i, ((name, ctx, k), pts) in enumerate(curves.items()):
        label = f"ctx {ctx}" + (f", k<={k}" if many_k else "") + (f", {short_name(name)}" if many_names else "")
        data.append(dict(type="scatter", mode="lines+markers", name=label, x=[n for n, _, _ in pts],
                         y=[s for _, s, _ in pts], customdata=[n_p for _, _, n_p in pts],
                         line=dict(color=COLORS[ctxs.index(ctx) % len(COLORS)], width=3,
                                   dash=DASHES[sorted({kk for _, _, kk in curves}).index(k) % len(DASHES)]),
                         marker=dict(size=9),
                         hovertemplate=f"{html.escape(label)}<br>N=%{{x}}: %{{y:.2f}}x "
                                       "(geomean of %{customdata} prompts)<extra></extra>"))
    xs = sorted({n for pts in curves.values() for n, _, _ in pts})
    xaxis = axis("concurrency (slots in one batched forward)", type="log", tickvals=xs or [1, 2, 4],
                  ticktext=[str(x) for x in xs or [1, 2, 4]])
    layout = _layout("Speculation's decode speedup against concurrency", xaxis,
                     axis("speedup (spec tok/s ÷ plain tok/s)", rangemode="tozero"),
                     None if data else "no speculative rows with real drafters", shapes=[_break_even()])
    return dict(data=data, layout=layout)


def speedup_acceptance_figure(rows: list[dict], n_curve: int = 60) -> dict:
    """Synthetic-acceptance points against engine.bench.stats.formula drawn with each configuration's measured c;
    the real drafters' rows as hollow markers (their k varies round to round, so no single curve is theirs)."""
    points = synthetic_points(rows)
    cs = config_c(points)
    data = []
    for i, ((k, n, ctx), c) in enumerate(sorted(cs.items())):
        color = COLORS[i % len(COLORS)]
        label = f"k={k}, N={n}, ctx {ctx}"
        pts = [p for p in points if (p.n_max, p.concurrency, p.ctx_len) == (k, n, ctx)]
        data.append(dict(type="scatter", mode="markers", name=f"measured, {label}", x=[p.alpha for p in pts],
                         y=[p.speedup for p in pts], customdata=[[p.p, p.c] for p in pts],
                         marker=dict(size=11, color=color),
                         hovertemplate="P=%{customdata[0]}: realised alpha %{x:.2f}, %{y:.2f}x "
                                       "(c %{customdata[1]:.2f})<extra></extra>"))
        alphas = [j / n_curve for j in range(n_curve + 1)]
        data.append(dict(type="scatter", mode="lines", name=f"formula, {label}, c={c:.2f}", x=alphas,
                         y=[formula(a, k, c) for a in alphas], line=dict(color=color, width=2, dash="dot"),
                         hoverinfo="skip"))
    chain = [r for r in rows if is_chain(r) and num(r.get("n_drafted")) > 0]
    if chain:
        data.append(dict(type="scatter", mode="markers", name="real drafters (adaptive k), one per prompt",
                         x=[num(r.get("accept_p")) for r in chain], y=[speedup_of(r) for r in chain],
                         text=[f"{r['prompt_id']} N={r['concurrency']} ctx {r['ctx_len']}" for r in chain],
                         marker=dict(size=8, color="rgba(0,0,0,0)", line=dict(color="#6b7280", width=1.5)),
                         hovertemplate="%{text}: alpha %{x:.2f}, %{y:.2f}x<extra></extra>"))
    layout = _layout("Speedup against acceptance: measured points and (1-a^(k+1)) / ((1-a)(c+1))",
                     axis("acceptance alpha (realised: kept / (kept + first rejections))", range=[0, 1.02]),
                     axis("decode speedup", rangemode="tozero"),
                     None if data else "no synthetic-acceptance rows (run with --synthetic-accept)",
                     shapes=[_break_even()])
    return dict(data=data, layout=layout)


def acceptance_position_figure(rows: list[dict]) -> dict:
    """Mean acceptance at each draft position (kept / drafts that reached it), one line per configuration."""
    data = []
    for i, (label, rates) in enumerate(sorted(acceptance_by_position(rows).items())):
        data.append(dict(type="scatter", mode="lines+markers", name=label, x=list(range(1, len(rates) + 1)),
                         y=rates, line=dict(color=COLORS[i % len(COLORS)], width=2.5),
                         hovertemplate=f"{html.escape(label)}<br>d%{{x}}: %{{y:.0%}}<extra></extra>"))
    layout = _layout("Acceptance by draft position", axis("draft position", dtick=1),
                     axis("kept / drafts that reached it", range=[0, 1.05], tickformat=".0%"),
                     None if data else "no speculative rows")
    return dict(data=data, layout=layout)


def plain_scaling_figure(rows: list[dict]) -> dict:
    """Aggregate decode tokens/s of N plain slots, against perfect scaling from one slot."""
    data = []
    for i, (ctx, pts) in enumerate(plain_scaling(rows).items()):
        color = COLORS[i % len(COLORS)]
        data.append(dict(type="scatter", mode="lines+markers", name=f"plain, ctx {ctx}", x=[n for n, _ in pts],
                         y=[t for _, t in pts], line=dict(color=color, width=3), marker=dict(size=9),
                         hovertemplate="N=%{x}: %{y:.1f} tok/s<extra></extra>"))
        one = dict(pts).get(1)
        if one:
            data.append(dict(type="scatter", mode="lines", name=f"N x one slot, ctx {ctx}", x=[n for n, _ in pts],
                             y=[n * one for n, _ in pts], line=dict(color=color, width=1, dash="dot"),
                             hoverinfo="skip"))
    layout = _layout("Plain decoding: aggregate tokens/s of N slots", axis("concurrency (slots)", dtick=1),
                     axis("aggregate decode tokens/s", rangemode="tozero"),
                     None if data else "no plain rows with group speeds")
    return dict(data=data, layout=layout)


def lossless_rows(rows: list[dict]) -> list[dict]:
    """The rows a figure may draw: all but those whose lossless check failed (a wrong answer's speed is no speedup);
    rows with no token check ("n/a": rejection sampling, synthetic acceptance, other implementations) stay."""
    return [r for r in rows if str(r.get("lossless_ok")) != "False"]


def figures(rows: list[dict]) -> dict[str, dict]:
    """Every figure of the page, by file stem (FIGURES order), drawn from the rows that passed the lossless check."""
    rows = lossless_rows(rows)
    return {"speedup_concurrency": speedup_concurrency_figure(rows),
            "speedup_acceptance": speedup_acceptance_figure(rows),
            "acceptance_position": acceptance_position_figure(rows), "plain_scaling": plain_scaling_figure(rows)}


def page_html(figs: dict[str, dict], title: str = "Speculative decoding: speedup curves") -> str:
    """One self-contained page: plotly.js inline once, then every figure in its own div."""
    import plotly.graph_objects as go
    import plotly.io as pio

    parts = []
    for i, (name, fig) in enumerate(figs.items()):
        parts.append(pio.to_html(go.Figure(fig), include_plotlyjs=i == 0, full_html=False, div_id=name,
                                 config={"displaylogo": False}))
    body = "\n".join(f'<section style="max-width:980px;margin:0 auto 24px">{p}</section>' for p in parts)
    return (f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title></head>'
            f'<body style="font-family:sans-serif;background:#fafafa"><h2 style="text-align:center">'
            f'{html.escape(title)}</h2>{body}</body></html>')


def write_pngs(figs: dict[str, dict], out: Path) -> list[str]:
    """Each figure as out/<name>.png; returns one line per file written."""
    return [f"wrote {write_png(fig, out / f'{name}.png', PNG_WIDTH, PNG_HEIGHT)}" for name, fig in figs.items()]


def write_plots(rows: list[dict], out_dir: str | Path, png: bool = True) -> list[str]:
    """bench.html (+ one PNG per figure) in out_dir; returns one line per thing written or skipped."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    figs = figures(rows)
    page = out / "bench.html"
    page.write_text(page_html(figs))
    lines = [f"wrote {page} ({len(figs)} figures, plotly.js inline)"]
    failed = len(rows) - len(lossless_rows(rows))
    if failed:
        lines.append(f"left out {failed} rows whose lossless check failed")
    if png:
        lines += write_pngs(figs, out)
    return lines


def merge(paths: list[str], out: str | None) -> list[dict]:
    """Rows of every file, in order; written to `out` (columns of the first file, then any new ones) if given."""
    rows, columns = [], []
    for path in paths:
        part = load_rows(path)
        rows += part
        for row in part[:1]:
            columns += [c for c in row if c not in columns]
    if out:
        with open(out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, restval="")
            w.writeheader()
            w.writerows(rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.plot", description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+", help="traces.csv file(s) written by python -m engine.bench")
    ap.add_argument("--out", default="bench-plots", help="directory for bench.html and the PNGs")
    ap.add_argument("--merged", default=None, help="also write the rows of every file into this one CSV")
    ap.add_argument("--no-png", action="store_true")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    try:
        rows = merge(args.traces, args.merged)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        print(f"error: cannot read traces: {e}", file=sys.stderr)
        return 2
    if args.merged:
        print(f"wrote {len(rows)} rows to {args.merged}")
    for line in write_plots(rows, args.out, png=not args.no_png):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
