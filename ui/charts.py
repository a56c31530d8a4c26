"""Statistics: acceptance per draft position, acceptance length, speed over rounds, llama.cpp's counter lines.

The charts are rebuilt from the events (the same DrafterStats arithmetic the engine uses), so they are pure and
need no lock on the engine; the counter lines come from the engine's own per-sequence DrafterStats, which also
hold calls and durations that events do not carry.
"""

from __future__ import annotations

import html

from engine.stats import DrafterStats

COLORS = ["#1b7f3b", "#1f5fbf", "#b35900", "#7a3db8", "#00838f", "#a0004f"]
FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=14)


def stats_from_events(events) -> dict[str, DrafterStats]:
    """Per-drafter counters of the verified drafts among `events` (calls and durations stay zero)."""
    out: dict[str, DrafterStats] = {}
    for ev in events:
        if ev.kind != "spec" or not ev.drafter or not ev.drafted:
            continue
        s = out.setdefault(ev.drafter, DrafterStats(ev.drafter))
        s.on_draft(len(ev.drafted))
        s.on_accept(ev.n_accepted)
    return out


def _layout(fig, title: str, height: int = 300) -> None:
    fig.update_layout(title=dict(text=title, x=0.01, font=dict(size=16)), template="plotly_white", height=height,
                      margin=dict(l=55, r=20, t=45, b=45), font=FONT,
                      legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1))


def acceptance_figure(stats: dict[str, DrafterStats]):
    """Bars: accepted / reached at each draft position (how far a drafter sees); markers: llama.cpp's
    #acc rate/pos (accepted at position i over all its verified drafts)."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for i, (name, s) in enumerate(sorted(stats.items())):
        cond = s.acc_rate_pos_conditional()
        if not cond:
            continue
        color = COLORS[i % len(COLORS)]
        xs = list(range(1, len(cond) + 1))
        reached = s.n_gen_tokens_per_pos
        fig.add_bar(x=xs, y=cond, name=f"{name} (mean acc len {s.mean_acc_len:.2f})", marker_color=color,
                    customdata=reached, hovertemplate="d%{x}: %{y:.0%} of %{customdata} drafts that reached it"
                    "<extra>" + html.escape(name) + "</extra>")
        rate = s.acc_rate_pos()
        fig.add_scatter(x=xs[: len(rate)], y=rate, mode="markers", name=f"{name}: #acc rate/pos",
                        marker=dict(color=color, symbol="diamond-open", size=11, line=dict(width=2)),
                        hovertemplate="d%{x}: %{y:.0%} of all verified drafts<extra>llama.cpp</extra>")
    _layout(fig, "Acceptance rate per draft position")
    fig.update_layout(barmode="group", bargap=0.25)
    fig.update_xaxes(title_text="draft position", dtick=1)
    fig.update_yaxes(title_text="accepted", range=[0, 1.05], tickformat=".0%")
    if not fig.data:
        fig.add_annotation(text="no verified drafts yet", showarrow=False, font=dict(size=16, color="#777"),
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig


def speed_series(rounds: list[int], emitted: list[int], seconds: list[float]) -> tuple[list[float], list[float]]:
    """Running tokens/s (tokens so far over time so far) and tokens per round, from per-round records."""
    total, running = 0, []
    for n, t in zip(emitted, seconds):
        total += n
        running.append(total / t if t > 0 else 0.0)
    return running, [float(n) for n in emitted]


def speed_figure(rounds: list[int], emitted: list[int], seconds: list[float], plain_tps: float | None = None):
    """Tokens per round (bars) and running tokens/s (line); the plain run's tokens/s as a reference line."""
    import plotly.graph_objects as go

    running, per_round = speed_series(rounds, emitted, seconds)
    fig = go.Figure()
    fig.add_bar(x=rounds, y=per_round, name="tokens this round", marker_color="#9ec5f8", yaxis="y2",
                hovertemplate="round %{x}: %{y} token(s)<extra></extra>")
    fig.add_scatter(x=rounds, y=running, mode="lines", name="tokens/s so far", line=dict(color="#1f5fbf", width=3),
                    hovertemplate="round %{x}: %{y:.1f} tok/s<extra></extra>")
    if plain_tps:
        fig.add_hline(y=plain_tps, line=dict(color="#b35900", dash="dash", width=2),
                      annotation_text=f"plain {plain_tps:.1f} tok/s", annotation_position="bottom right")
    _layout(fig, "Speed over rounds")
    fig.update_layout(yaxis=dict(title="tokens/s", rangemode="tozero"),
                      yaxis2=dict(title="tokens/round", overlaying="y", side="right", rangemode="tozero",
                                  showgrid=False))
    fig.update_xaxes(title_text="round")
    return fig


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
