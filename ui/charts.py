"""Statistics: acceptance per draft position, acceptance length, speed over rounds, llama.cpp's counter lines.

The charts are rebuilt from the events (the same DrafterStats arithmetic the engine uses), so they are pure and
need no lock on the engine; the counter lines come from the engine's own per-sequence DrafterStats, which also
hold calls and durations that events do not carry.
"""

from __future__ import annotations

import html

from engine import DrafterStats, plotstyle, stats_from_events

# green first: drafters keep the colours the UI has always shown
COLORS = [plotstyle.GREEN, plotstyle.BLUE, plotstyle.ORANGE, plotstyle.PURPLE, plotstyle.TEAL, plotstyle.MAGENTA]


def layout(title: str, xaxis: dict, yaxis: dict, height: int = 360, **extra) -> dict:
    """The shared style with the legend under the x axis (long drafter names must not cover the bars)."""
    return plotstyle.layout(title, xaxis, yaxis, title_y=0.97, height=height, margin=dict(l=60, r=20, t=40, b=100),
                       legend=dict(orientation="h", yanchor="top", y=-0.32, xanchor="left", x=0, font=dict(size=12)),
                       **extra)


def acceptance_figure(stats: dict[str, DrafterStats]) -> dict:
    """Bars: accepted / reached at each draft position (how far a drafter sees); markers: llama.cpp's
    #acc rate/pos (accepted at position i over all its verified drafts). A plotly figure as a dict."""
    data = []
    for i, (name, s) in enumerate(sorted(stats.items())):
        cond = s.acc_rate_pos_conditional()
        if not cond:
            continue
        color = COLORS[i % len(COLORS)]
        xs = list(range(1, len(cond) + 1))
        data.append(dict(type="bar", x=xs, y=cond, name=f"{name} (mean acc len {s.mean_acc_len:.2f})",
                         marker=dict(color=color), customdata=list(s.n_gen_tokens_per_pos),
                         hovertemplate="d%{x}: %{y:.0%} of %{customdata} drafts that reached it"
                                       "<extra>" + html.escape(name) + "</extra>"))
        rate = s.acc_rate_pos()
        data.append(dict(type="scatter", x=xs[: len(rate)], y=rate, mode="markers", name=f"{name}: #acc rate/pos",
                         marker=dict(color=color, symbol="diamond-open", size=11, line=dict(width=2, color=color)),
                         hovertemplate="d%{x}: %{y:.0%} of all verified drafts<extra>llama.cpp</extra>"))
    xaxis = plotstyle.axis("draft position", dtick=1, range=None if data else [0.5, 8.5])
    yaxis = plotstyle.axis("accepted", range=[0, 1.05], tickformat=".0%")
    empty = [] if data else [plotstyle.message("no verified drafts yet")]
    fig_layout = layout("Acceptance rate per draft position", xaxis, yaxis, barmode="group", bargap=0.25,
                        annotations=empty)
    return dict(data=data, layout=fig_layout)


def speed_series(rounds: list[int], emitted: list[int], seconds: list[float]) -> tuple[list[float], list[float]]:
    """Running tokens/s (tokens so far over time so far) and tokens per round, from per-round records."""
    total, running = 0, []
    for n, t in zip(emitted, seconds):
        total += n
        running.append(total / t if t > 0 else 0.0)
    return running, [float(n) for n in emitted]


def speed_figure(rounds: list[int], emitted: list[int], seconds: list[float], plain_tps: float | None = None) -> dict:
    """Tokens per round (bars) and running tokens/s (line); the plain run's tokens/s as a reference line."""
    running, per_round = speed_series(rounds, emitted, seconds)
    data = [dict(type="bar", x=list(rounds), y=per_round, name="tokens this round", marker=dict(color="#9ec5f8"),
                 yaxis="y2", hovertemplate="round %{x}: %{y} token(s)<extra></extra>"),
            dict(type="scatter", x=list(rounds), y=running, mode="lines", name="tokens/s so far",
                 line=dict(color=plotstyle.BLUE, width=3), hovertemplate="round %{x}: %{y:.1f} tok/s<extra></extra>")]
    shapes, notes = [], []
    if plain_tps:
        shapes.append(dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=plain_tps, y1=plain_tps,
                           line=dict(color=plotstyle.ORANGE, dash="dash", width=2)))
        notes.append(dict(text=f"plain {plain_tps:.1f} tok/s", showarrow=False, xref="paper", x=1, xanchor="right",
                          yref="y", y=plain_tps, yanchor="bottom", font=dict(color=plotstyle.ORANGE, size=13)))
    empty = not rounds
    yaxis = plotstyle.axis("tokens/s", rangemode="tozero", range=[0, 10] if empty else None)
    yaxis2 = plotstyle.axis("tokens/round", overlaying="y", side="right", rangemode="tozero", showgrid=False)
    fig_layout = layout("Speed over rounds", plotstyle.axis("round", range=[0, 10] if empty else None), yaxis,
                        yaxis2=yaxis2, shapes=shapes, annotations=notes)
    return dict(data=data, layout=fig_layout)


def arena_figure(rows: list[dict], n_positions: int) -> dict:
    """The arena's acceptance per draft position: one group of bars per position, one bar per contender that
    drafted (kept / drafts that reached the position), in the leaderboard's order."""
    data = []
    for i, row in enumerate(r for r in rows if r.get("kind") != "plain"):
        ys = [row.get(f"acc_pos_{p}") for p in range(1, n_positions + 1)]
        if all(y in ("", None) for y in ys):
            continue
        name = f"{row['drafter']} ({float(row['tokens_per_forward'] or 0):.2f} tok/fwd)"
        colour = plotstyle.RULE if row.get("kind") == "oracle" else COLORS[i % len(COLORS)]
        data.append(dict(type="bar", name=name, x=list(range(1, n_positions + 1)),
                         y=[None if y in ("", None) else float(y) for y in ys], marker=dict(color=colour),
                         hovertemplate="d%{x}: %{y:.0%}<extra>" + html.escape(str(row["drafter"])) + "</extra>"))
    xaxis = plotstyle.axis("draft position", dtick=1, range=[0.5, n_positions + 0.5])
    yaxis = plotstyle.axis("kept / drafts that reached it", range=[0, 1.05], tickformat=".0%")
    empty = [] if data else [plotstyle.message("press Run the arena")]
    return dict(data=data, layout=layout("Acceptance per draft position, by drafter", xaxis, yaxis, height=420,
                                         barmode="group", bargap=0.2, annotations=empty))


def plotly_figure(fig: dict):
    """The dict as a plotly Figure for gr.Plot. Validation is skipped: it walks every chart in pure Python,
    holding the GIL the engine's round loop needs, and these dicts are built here from known keys."""
    import plotly.graph_objects as go

    return go.Figure(fig, _validate=False)


def kpi_html(stats: dict[str, DrafterStats], n_tokens: int, n_rounds: int) -> str:
    """Per drafter: drafts, tokens accepted / drafted, mean acceptance length; and tokens per round overall."""
    cells = []
    for name, s in sorted(stats.items()):
        cells.append(f'<div class="kpi"><div class="kpi-name">{html.escape(name)}</div>'
                     f'<div class="kpi-big">{s.mean_acc_len:.2f}</div><div class="kpi-sub">mean acc len</div>'
                     f'<div class="kpi-sub">{s.n_acc_tokens}/{s.n_gen_tokens} tokens accepted '
                     f'({s.acc_rate:.0%}) in {s.n_gen_drafts} drafts</div></div>')
    per_round = n_tokens / n_rounds if n_rounds else 0.0
    cells.append(f'<div class="kpi"><div class="kpi-name">all rounds</div><div class="kpi-big">{per_round:.2f}</div>'
                 f'<div class="kpi-sub">tokens per round</div><div class="kpi-sub">{n_tokens} tokens, '
                 f'{n_rounds} rounds</div></div>')
    return f'<div class="kpis">{"".join(cells)}</div>'


def counters_text(seq_stats: dict[str, DrafterStats] | None) -> str:
    """The engine's counters for this sequence, one llama.cpp statistics line per drafter."""
    if not seq_stats:
        return "(no drafter ran for this answer)"
    return "\n".join(s.format() for s in seq_stats.values())
