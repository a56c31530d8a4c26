"""A figure dict drawn as a PNG file by matplotlib (its Agg canvas: no display, no browser).

The project's figures are plotly's JSON as plain dicts (engine/plotstyle.py); the page and bench.html draw them
with plotly.js, and this module draws the very same dicts as PNG, so a picture holds what the page shows, in
its colours and its font (the first family of plotstyle.FONT installed here, else matplotlib's DejaVu Sans).
It reads the part of plotly's schema those figures use: scatter traces (lines, markers, both; dash, width,
hollow markers), bars (vertical or horizontal, a colour per bar, a value beside each), line shapes, paper
annotations, log axes, tick values and texts, ranges, percent ticks. Anything else is refused, not dropped.
matplotlib is imported on the first picture only.
"""

from __future__ import annotations

import math
from pathlib import Path

from engine.plotstyle import FONT, GRID, RULE

DPI = 100  # plotly sizes are pixels, matplotlib's points: a pixel is 72 / DPI points
DASHES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-."}
FALLBACK_FONT = "DejaVu Sans"  # ships inside matplotlib
# fontconfig's metric-compatible stand-ins, which a browser draws where the page names these
STAND_INS = {"Arial": "Liberation Sans", "Helvetica": "Liberation Sans"}
AXIS_TITLE_PX = round(FONT["size"] * 1.14)  # plotly's axis titles: a little above the base font
PAD_PX = 10  # around the whole picture


def pt(px: float) -> float:
    return px * 72 / DPI


def colour(value: str | None, default: str = FONT["color"]):
    """'#rrggbb' as is; plotly's 'rgba(r,g,b,a)' as matplotlib's (r, g, b, a) in 0..1."""
    value = value or default
    if value.startswith("rgba(") or value.startswith("rgb("):
        parts = [float(p) for p in value[value.index("(") + 1:-1].split(",")]
        rgb = [p / 255 for p in parts[:3]]
        return (*rgb, parts[3] if len(parts) > 3 else 1.0)
    return value


def font_families() -> list[str]:
    """The families of the page's font (or their stand-ins) that are installed, in its order, then matplotlib's."""
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    found = []
    for name in (f.strip() for f in FONT["family"].split(",")):
        name = name if name in installed else STAND_INS.get(name, name)
        if name in installed and name not in found:
            found.append(name)
    return found + [FALLBACK_FONT]


def rc() -> dict:
    ink = FONT["color"]
    return {"font.family": "sans-serif", "font.sans-serif": font_families(), "font.size": pt(FONT["size"]),
            "text.color": ink, "axes.labelcolor": ink, "xtick.color": ink, "ytick.color": ink,
            "axes.spines.top": False, "axes.spines.right": False, "axes.axisbelow": True}


def _values(seq) -> list[float]:
    return [math.nan if v is None else v for v in seq]


def draw_scatter(ax, trace: dict) -> None:
    mode = trace.get("mode", "lines+markers")
    line, marker = trace.get("line", {}), trace.get("marker", {})
    edge = marker.get("line", {})
    face = colour(marker.get("color") or line.get("color"))
    ax.plot(trace["x"], _values(trace["y"]), label=trace.get("name"),
            linestyle=DASHES[line.get("dash", "solid")] if "lines" in mode else "none",
            color=colour(line.get("color") or marker.get("color")), linewidth=pt(line.get("width", 2)),
            marker="o" if "markers" in mode else None, markersize=pt(marker.get("size", 6)),
            markerfacecolor=face, markeredgecolor=colour(edge.get("color")) if edge else face,
            markeredgewidth=pt(edge.get("width", 0)) if edge else 0)


def draw_bars(ax, traces: list[dict]) -> None:
    """Bars of every trace side by side (plotly's barmode 'group'), each bar its colour and text."""
    slot = 0.8 / len(traces)
    for i, trace in enumerate(traces):
        horizontal = trace.get("orientation") == "h"
        where, length = (trace["y"], trace["x"]) if horizontal else (trace["x"], trace["y"])
        categorical = any(isinstance(w, str) for w in where)
        places = list(range(len(where))) if categorical else list(where)
        places = [p + (i - (len(traces) - 1) / 2) * slot for p in places]
        colours = trace.get("marker", {}).get("color")
        colours = [colour(c) for c in colours] if isinstance(colours, list) else colour(colours)
        put = ax.barh if horizontal else ax.bar
        bars = put(places, [0 if v is None else v for v in length], slot, color=colours, label=trace.get("name"))
        if trace.get("text"):
            ax.bar_label(bars, labels=trace["text"], padding=pt(6))
            ax.margins(**{"x" if horizontal else "y": 0.1})  # room for the longest bar's value
        if categorical:
            (ax.set_yticks if horizontal else ax.set_xticks)(range(len(where)), where)


def draw_axis(ax, which: str, spec: dict) -> None:
    """One axis as plotly's layout describes it (the scale before the ticks, the range last)."""
    from matplotlib.ticker import MultipleLocator, NullLocator, PercentFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    set_lim = ax.set_xlim if which == "x" else ax.set_ylim
    axis.set_label_text(spec.get("title", {}).get("text", ""), fontsize=pt(AXIS_TITLE_PX))
    axis.labelpad = pt(10)
    if spec.get("type") == "log":
        (ax.set_xscale if which == "x" else ax.set_yscale)("log")
        axis.set_minor_locator(NullLocator())
    if "tickvals" in spec:
        axis.set_ticks(spec["tickvals"], spec.get("ticktext", [str(v) for v in spec["tickvals"]]))
    elif "dtick" in spec:
        axis.set_major_locator(MultipleLocator(spec["dtick"]))
    if spec.get("tickformat") == ".0%":
        axis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    if spec.get("range"):
        set_lim(*spec["range"])
    elif spec.get("rangemode") == "tozero":
        set_lim(0, None)
    if spec.get("autorange") == "reversed":
        axis.set_inverted(True)
    if spec.get("showgrid", True):
        axis.grid(True, color=spec.get("gridcolor", GRID), linewidth=pt(1))
    ax.spines["bottom" if which == "x" else "left"].set_color(spec.get("linecolor", RULE))


def draw_shape(ax, shape: dict) -> None:
    """A horizontal line across the plot (x in paper units, y in data): the only shape the figures draw."""
    if shape.get("type") != "line" or shape.get("xref") != "paper" or shape.get("y0") != shape.get("y1"):
        raise ValueError(f"png: shape {shape} is not a horizontal line across the plot")
    line = shape.get("line", {})
    ax.axhline(shape["y0"], shape["x0"], shape["x1"], color=colour(line.get("color")),
               linestyle=DASHES[line.get("dash", "solid")], linewidth=pt(line.get("width", 1)))


def draw_annotation(ax, note: dict) -> None:
    font = note.get("font", {})
    if note.get("xref") != "paper" or note.get("yref") != "paper":
        raise ValueError(f"png: annotation {note.get('text')!r} is not placed in paper units")
    ax.text(note["x"], note["y"], note["text"], transform=ax.transAxes, ha="center", va="center",
            color=colour(font.get("color")), fontsize=pt(font.get("size", FONT["size"])))


def draw(figure: dict, width: int, height: int):
    """The figure as a matplotlib Figure of width x height pixels, built in the page's font and colours."""
    import matplotlib

    with matplotlib.rc_context(rc()):
        return _build(figure, width, height)


def _build(figure: dict, width: int, height: int):
    from matplotlib.figure import Figure

    kinds = {t.get("type", "scatter") for t in figure["data"]}
    if kinds - {"scatter", "bar"}:
        raise ValueError(f"png: trace types {sorted(kinds - {'scatter', 'bar'})} are not drawn")
    lay = figure.get("layout", {})
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained",
                 facecolor=lay.get("paper_bgcolor", "white"))
    fig.get_layout_engine().set(w_pad=PAD_PX / DPI, h_pad=PAD_PX / DPI)  # inches
    ax = fig.add_subplot(facecolor=lay.get("plot_bgcolor", "white"))
    title = lay.get("title", {})
    fig.suptitle(title.get("text", ""), x=title.get("x", 0.01), ha="left",
                 fontsize=pt(title.get("font", {}).get("size", FONT["size"] + 3)))
    for trace in figure["data"]:
        if trace.get("type", "scatter") == "scatter":
            draw_scatter(ax, trace)
    bars = [t for t in figure["data"] if t.get("type") == "bar"]
    if bars:
        draw_bars(ax, bars)
    for shape in lay.get("shapes", []):
        draw_shape(ax, shape)
    draw_axis(ax, "x", lay.get("xaxis", {}))
    draw_axis(ax, "y", lay.get("yaxis", {}))
    for note in lay.get("annotations", []):
        draw_annotation(ax, note)
    if sum(1 for t in figure["data"] if t.get("name")) > 1 and lay.get("showlegend", True):
        fig.legend(loc="outside right upper", frameon=False,
                   fontsize=pt(lay.get("legend", {}).get("font", {}).get("size", FONT["size"])))
    return fig


def write_png(figure: dict, path: str | Path, width: int, height: int) -> Path:
    """The figure as a width x height PNG at `path` (its folder made if missing)."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = draw(figure, width, height)
    with matplotlib.rc_context(rc()):  # ticks are made as the canvas draws: they read the settings then
        FigureCanvasAgg(fig).print_png(str(path))
    return path
