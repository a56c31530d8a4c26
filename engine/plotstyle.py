"""The look of every plotly figure of the project: colours, font, axes, layout, the note of an empty figure.

The benchmark's plots (engine.bench.plot) and the UI's live charts (ui.charts) both build figures as plain dicts
(plotly's JSON) from these helpers, so the two sets of pictures keep one style. Pure: no plotly import.
"""

from __future__ import annotations

BLUE, ORANGE, GREEN, PURPLE = "#1f5fbf", "#b35900", "#1b7f3b", "#7a3db8"
TEAL, MAGENTA, OLIVE, RED = "#00838f", "#a0004f", "#5f6b00", "#c0392b"
COLORS = [BLUE, ORANGE, GREEN, PURPLE, TEAL, MAGENTA, OLIVE, RED]  # one per series, in this order
FONT = dict(family="Inter, Segoe UI, Helvetica, Arial, sans-serif", size=14, color="#1f2937")
GRID = "#e5e7eb"
RULE = "#9ca3af"  # axis lines and reference lines: quieter than any series


def axis(title: str, **extra) -> dict:
    return dict(title=dict(text=title), gridcolor=GRID, linecolor=RULE, zeroline=False, **extra)


def layout(title: str, xaxis: dict, yaxis: dict, title_y: float | None = None, **extra) -> dict:
    """Title top left, white plot, the shared font; `extra` (height, margin, legend, shapes...) overrides."""
    head = dict(text=title, x=0.01, font=dict(size=17))
    if title_y is not None:
        head["y"] = title_y
    base = dict(title=head, font=FONT, paper_bgcolor="white", plot_bgcolor="white", legend=dict(font=dict(size=12)),
                xaxis=xaxis, yaxis=yaxis)
    return {**base, **extra}


def message(text: str, size: int = 16) -> dict:
    """An annotation across the middle of the plot: says why a figure has no data."""
    return dict(text=text, showarrow=False, font=dict(size=size, color="#777"), xref="paper", yref="paper",
                x=0.5, y=0.5)
