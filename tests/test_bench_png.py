"""Figure dicts drawn as PNG by matplotlib (engine/bench/png.py): the lines, bars, axes and notes the dict holds
are the ones drawn, in the page's colours and font, at the size asked."""

import pytest
from PIL import Image

from engine import plotstyle
from engine.bench import png

LINE = dict(type="scatter", mode="lines+markers", name="ctx 0", x=[1, 2, 4], y=[1.5, None, 2.5],
            line=dict(color=plotstyle.BLUE, width=3, dash="dash"), marker=dict(size=9))
HOLLOW = dict(type="scatter", mode="markers", name="real", x=[0.2], y=[0.8],
              marker=dict(size=8, color="rgba(0,0,0,0)", line=dict(color="#6b7280", width=1.5)))
FIGURE = dict(data=[LINE, HOLLOW], layout=plotstyle.layout(
    "A title", plotstyle.axis("slots", type="log", tickvals=[1, 2, 4], ticktext=["1", "2", "4"]),
    plotstyle.axis("kept", range=[0, 1.05], tickformat=".0%"),
    shapes=[dict(type="line", xref="paper", x0=0, x1=1, yref="y", y0=1, y1=1, line=dict(color=plotstyle.RULE))]))


def rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def test_a_line_figure_draws_its_points_style_axes_and_legend():
    fig = png.draw(FIGURE, 980, 420)
    ax = fig.axes[0]
    line, hollow, rule = ax.lines
    assert list(line.get_xdata()) == [1, 2, 4] and line.get_ydata()[0] == 1.5 and line.get_ydata()[2] == 2.5
    assert line.get_color() == plotstyle.BLUE and line.get_linestyle() == "--" and line.get_marker() == "o"
    assert hollow.get_linestyle() == "None" and hollow.get_markerfacecolor() == (0, 0, 0, 0)
    assert list(rule.get_ydata()) == [1, 1] and rule.get_color() == plotstyle.RULE
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    assert ax.get_ylim() == (0, 1.05) and ax.yaxis.get_major_formatter().format_pct(0.5, 1) == "50%"
    assert ax.get_xlabel() == "slots" and ax.get_ylabel() == "kept" and fig.get_suptitle() == "A title"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["ctx 0", "real"]


def test_bars_keep_their_order_colours_and_values():
    bars = dict(type="bar", orientation="h", x=[4.5, 2.0], y=["1. oracle", "2. chain"],
                marker=dict(color=[plotstyle.RULE, plotstyle.GREEN]), text=["4.50", "2.00"])
    fig = png.draw(dict(data=[bars], layout=plotstyle.layout("t", plotstyle.axis("x"),
                                                             plotstyle.axis("", autorange="reversed"))), 720, 200)
    ax = fig.axes[0]
    assert [p.get_width() for p in ax.patches] == [4.5, 2.0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1. oracle", "2. chain"] and ax.yaxis_inverted()
    assert [t.get_text() for t in ax.texts] == ["4.50", "2.00"]
    assert ax.patches[1].get_facecolor()[:3] == pytest.approx([c / 255 for c in rgb(plotstyle.GREEN)])


def test_the_png_has_the_size_asked_and_the_series_colour(tmp_path):
    path = png.write_png(FIGURE, tmp_path / "sub" / "f.png", 640, 300)
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (640, 300)
        colours = {c for _, c in im.convert("RGB").getcolors(640 * 300)}
    assert rgb(plotstyle.BLUE) in colours and (255, 255, 255) in colours


def test_the_page_font_or_its_stand_in_is_used():
    from matplotlib import font_manager

    families = png.font_families()
    installed = {f.name for f in font_manager.fontManager.ttflist}
    assert families[-1] == png.FALLBACK_FONT and set(families) <= installed | {png.FALLBACK_FONT}
    label = png.draw(FIGURE, 400, 300).axes[0].xaxis.label
    assert label.get_fontfamily() == ["sans-serif"] and label.get_fontsize() == pytest.approx(png.pt(16))


def test_an_empty_figure_shows_its_note():
    fig = png.draw(dict(data=[], layout=plotstyle.layout("t", plotstyle.axis("x"), plotstyle.axis("y"),
                                                         annotations=[plotstyle.message("no rows")])), 400, 300)
    assert [t.get_text() for t in fig.axes[0].texts] == ["no rows"] and not fig.legends


@pytest.mark.parametrize("figure,why", [
    (dict(data=[dict(type="pie", values=[1])], layout={}), "pie"),
    (dict(data=[], layout=dict(shapes=[dict(type="rect", xref="x", x0=0, x1=1, y0=0, y1=1)])), "horizontal"),
    (dict(data=[], layout=dict(annotations=[dict(text="n", xref="x", yref="y", x=1, y=1)])), "paper"),
])
def test_what_it_cannot_draw_is_refused_not_dropped(figure, why):
    with pytest.raises(ValueError, match=why):
        png.draw(figure, 400, 300)
