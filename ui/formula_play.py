"""The formula to play with: speedup = (1 - a^(k+1)) / ((1 - a)(c + 1)) against acceptance a, for a draft length k
and a round's extra cost c chosen on sliders, with the last answer's own point, break-even, and the rules of thumb
beside the numbers they speak of.

a: the chance each draft token is kept given the ones before it were; k: draft tokens a round; c: a speculative
round's time over a plain step's, minus one (ui/lesson.py `explain` measures all three on an answer). Three
conclusions follow from the formula: as a -> 1 the speedup tends to (k + 1) / (c + 1), so the cost c, hidden in the
lesson's "verify K ~= generate 1", caps it; below break-even speculation is slower than plain decoding; and each
further draft token adds only a^k tokens a round, so long drafts stop paying. `figure` and `text` are pure
(numbers in, a figure and HTML out); `build` puts them on sliders in the page's lesson tab.
"""

from __future__ import annotations

from engine import plotstyle
from engine import speedup_formula as formula
from ui.charts import layout, plotly_figure
from ui.lesson import break_even

ALPHA_OFF = 0.3  # rule of thumb: acceptance that stays below this, turn speculation off
K_SWEET = (4, 8)  # rule of thumb: draft lengths that usually pay best
HIT_LOW = 0.5  # rule of thumb: drafted tokens kept (llama.cpp's #acc tokens / #gen tokens) below this, change drafter
N_POINTS = 101


def hit_rate(a: float, k: int) -> float:
    """Draft tokens kept over drafted, llama.cpp's #acc tokens / #gen tokens: (a - a^(k+1)) / ((1 - a) k)."""
    if a >= 1.0:
        return 1.0
    return (a - a ** (k + 1)) / ((1.0 - a) * k)


def figure(a: float, k: int, c: float, point=None) -> dict:
    """Speedup against acceptance for k and c (and k = 1, 2, 4, 8, 16 faintly), 1x, break-even, the slider's a, and
    the answer's measured point (ui/lesson.py Explained) where there is one."""
    xs = [i / (N_POINTS - 1) for i in range(N_POINTS)]
    data = []
    for kk in (1, 2, 4, 8, 16):
        if kk != k:
            data.append(dict(type="scatter", mode="lines", x=xs, y=[formula(x, kk, c) for x in xs], name=f"k = {kk}",
                             line=dict(color=plotstyle.RULE, width=1), opacity=0.5,
                             hovertemplate=f"k={kk}, a=%{{x:.2f}}: %{{y:.2f}}x<extra></extra>"))
    data.append(dict(type="scatter", mode="lines", x=xs, y=[formula(x, k, c) for x in xs], name=f"k = {k}, c = {c:.2f}",
                     line=dict(color=plotstyle.BLUE, width=3), hovertemplate="a=%{x:.2f}: %{y:.2f}x<extra></extra>"))
    data.append(dict(type="scatter", mode="markers", x=[a], y=[formula(a, k, c)], name=f"a = {a:.2f}",
                     marker=dict(color=plotstyle.BLUE, size=11)))
    if point is not None:
        data.append(dict(type="scatter", mode="markers", x=[point.alpha], y=[point.measured],
                         name=f"your last answer: a {point.alpha:.2f}, measured {point.measured:.2f}x",
                         marker=dict(color=plotstyle.ORANGE, size=13, symbol="diamond")))
    a_even = break_even(k, c)
    shapes = [dict(type="line", x0=0, x1=1, y0=1, y1=1, line=dict(color=plotstyle.RULE, dash="dash")),
              dict(type="line", x0=a_even, x1=a_even, y0=0, y1=1, line=dict(color=plotstyle.ORANGE, dash="dot"))]
    notes = [dict(x=a_even, y=1, text=f"break-even a = {a_even:.2f}", showarrow=True, ax=40, ay=-30)]
    top = max(formula(1.0, kk, c) for kk in (1, 2, 4, 8, 16, k))
    return dict(data=data, layout=layout("Speedup against acceptance", plotstyle.axis("acceptance a", range=[0, 1]),
                                         plotstyle.axis("speedup over plain decoding", range=[0, top * 1.05]),
                                         shapes=shapes, annotations=notes))


def text(a: float, k: int, c: float, point=None) -> str:
    """The numbers at the sliders' setting, each beside the rule of thumb it checks."""
    s = formula(a, k, c)
    a_even = break_even(k, c)
    tokens = s * (c + 1)
    cap = (k + 1) / (c + 1)
    last = a ** k
    hit = hit_rate(a, k)
    mine = ""
    if point is not None:
        mine = (f"<li>Your last answer: a = {point.alpha:.2f}, k = {point.k:.1f}, c = {point.c:.2f}; the formula "
                f"gives {point.predicted:.2f}&times;, measured {point.measured:.2f}&times; (the diamond).</li>")
    verdict = "faster than" if s > 1 else "slower than" if s < 1 else "as fast as"
    return (f'<div class="lesson"><p><b>{s:.2f}&times;</b> at a = {a:.2f}, k = {k}, c = {c:.2f}: {tokens:.2f} '
            f"tokens a round for a round that costs {c + 1:.2f} plain steps, {verdict} plain decoding.</p><ul>"
            f"<li><b>a &rarr; 1:</b> the speedup tends to (k + 1) / (c + 1) = {cap:.2f}&times;. The round's extra "
            f"cost c is the lesson's hidden term: at c = {c:.2f} even perfect drafts give no more.</li>"
            f"<li><b>Break-even at a = {a_even:.2f}</b> for this k and c. Rule of thumb: an acceptance that stays "
            f"below about {ALPHA_OFF} means speculation is doing harm; turn it off "
            f"({'this a is below it' if a < ALPHA_OFF else 'this a is above it'}).</li>"
            f"<li><b>Diminishing k:</b> the k-th draft token adds a<sup>k</sup> = {last:.3f} tokens a round. Rule "
            f"of thumb: k of {K_SWEET[0]} to {K_SWEET[1]} usually pays best "
            f"({'k is inside it' if K_SWEET[0] <= k <= K_SWEET[1] else 'k is outside it'}); beyond, later "
            f"positions derail and cost rows.</li>"
            f"<li><b>Kept / drafted = {hit:.2f}</b> (llama.cpp's #acc tokens / #gen tokens). Rule of thumb: below "
            f"{HIT_LOW} the drafts are poor: change the drafter or lower k"
            f"{' (here it is below)' if hit < HIT_LOW else ''}.</li>{mine}</ul></div>")


def build(session) -> None:
    """The sliders, the figure and the words, inside the lesson tab; session: the page's gr.State."""
    import gradio as gr

    a0, k0, c0 = 0.6, 4, 0.3
    gr.Markdown("**The formula to play with:** speedup = (1 - a<sup>k+1</sup>) / ((1 - a)(c + 1)).")
    with gr.Row():
        a = gr.Slider(0, 1, value=a0, step=0.01, label="acceptance a", elem_id="formula-a")
        k = gr.Slider(1, 16, value=k0, step=1, label="draft length k", elem_id="formula-k")
        c = gr.Slider(0, 3, value=c0, step=0.01, label="a round's extra cost c", elem_id="formula-c")
        mine = gr.Button("My last answer's a, k, c", elem_id="formula-mine", scale=0, min_width=160)
    plot = gr.Plot(plotly_figure(figure(a0, k0, c0)), show_label=False, elem_id="formula-plot")
    words = gr.HTML(text(a0, k0, c0), elem_id="formula-text")

    def redraw(s, a_value, k_value, c_value):
        point = s.explained if s is not None else None
        k_int = max(1, int(round(k_value)))
        return (plotly_figure(figure(a_value, k_int, c_value, point)),
                text(a_value, k_int, c_value, point))

    def take_mine(s):
        x = s.explained if s is not None else None
        if x is None:
            gr.Info("Send a message first: its comparison with plain decoding measures a, k and c.")
            return gr.skip(), gr.skip(), gr.skip()
        return round(x.alpha, 2), max(1, min(16, round(x.k))), round(min(x.c, 3.0), 2)

    for slider in (a, k, c):
        slider.release(redraw, [session, a, k, c], [plot, words], show_progress="hidden")
    mine.click(take_mine, session, [a, k, c], show_progress="hidden").then(
        redraw, [session, a, k, c], [plot, words], show_progress="hidden")
