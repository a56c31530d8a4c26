"""The lesson with this machine's numbers: how true "verify K ~= generate 1" is here, and why an answer's
speculation paid or did not.

Pure functions from measured numbers to HTML and plotly figures: the forward's cost against its rows beside the
weights' memory-bound floor (engine/cost/roofline.py), and for an answer compared with plain decoding, its
acceptance a, its round's cost ratio c, the formula's speedup (1 - a^(k+1)) / ((1 - a)(c + 1)) beside the
measured one, the acceptance at which speculation breaks even for this c, and where the round's time went.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import plotstyle
from engine import speedup_formula as formula
from ui.charts import layout


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def curve_figure(roof) -> dict:
    """A forward's time against its rows on this machine (log-2 axis), the weights' floor under it."""
    if roof is None or not roof.rows:
        return dict(data=[], layout=layout("Forward time by rows", plotstyle.axis("rows"), plotstyle.axis("ms"),
                                           annotations=[plotstyle.message("not measured")]))
    ms = [s * 1e3 for s in roof.seconds]
    data = [dict(type="scatter", mode="lines+markers", x=list(roof.rows), y=ms, name="forward of n rows (measured)",
                 line=dict(color=plotstyle.BLUE), hovertemplate="%{x} rows: %{y:.1f} ms<extra></extra>"),
            dict(type="scatter", mode="lines", x=[roof.rows[0], roof.rows[-1]], y=[ms[0], ms[0]],
                 name="one row's time: rows for free", line=dict(color=plotstyle.GREEN, dash="dot"))]
    if roof.t_floor > 0:
        floor = roof.t_floor * 1e3
        data.append(dict(type="scatter", mode="lines", x=[roof.rows[0], roof.rows[-1]], y=[floor, floor],
                         name=f"weights / bandwidth: {roof.weight_bytes / 1e6:.0f} MB at "
                              f"{roof.bandwidth / 1e9:.1f} GB/s", line=dict(color=plotstyle.RULE, dash="dash")))
    xaxis = plotstyle.axis("rows in the forward (draft tokens verified + 1)", type="log", dtick=0.30103,
                           tickvals=list(roof.rows))
    yaxis = plotstyle.axis("ms per forward", rangemode="tozero")
    return dict(data=data, layout=layout("The free lunch here: a forward's time by its rows", xaxis, yaxis))


def free_lunch_text(roof) -> str:
    """One paragraph: how far extra rows are free here, and why (memory-bound or not)."""
    if roof is None or not roof.rows:
        return "The forward's cost by rows was not measured for this model (a model that cannot speculate)."
    flat = roof.flat_up_to()
    pairs = ", ".join(f"{n} rows {roof.ratio(n):.2f}&times;" for n in (2, 4, 8, 16, 64) if n in roof.rows)
    verdict = (f"Verifying K draft tokens costs about one forward (within 10%) up to K = {flat - 1}"
               if flat > 1 else "Every extra row costs more than a tenth of a one-row forward: verifying is not free")
    why = ("the rows ride along with the weights' read: the forward waits on memory, as the lesson says"
           if flat >= 4 else
           "each row adds arithmetic the cores cannot hide behind that read: beyond a row or two the forward waits "
           "on compute, so drafts must be accepted more often to pay than the lesson's K ~= 1 suggests")
    return (f"<p><b>{verdict}</b> on this machine. A forward of {pairs} a forward of one row "
            f"({_ms(roof.seconds[0])}). The weights ({roof.weight_bytes / 1e6:.0f} MB) stream from memory in "
            f"{_ms(roof.t_floor)} at the {roof.bandwidth / 1e9:.1f} GB/s measured at load, "
            f"{roof.memory_share():.0%} of the one-row forward; {why}. On a GPU a forward is that floor, flat to "
            f"dozens of rows.</p>")


def prefill_decode_line(run) -> str:
    """Prefill against decode tokens/s of one answer: many rows per forward against one token per forward."""
    prefill = next((ev for ev in getattr(run, "events", []) if ev.kind == "prefill"), None)
    if prefill is None or not prefill.batch_rows or prefill.t_verify_ms <= 0 or not run.tps:
        return ""
    rate = prefill.batch_rows * 1e3 / prefill.t_verify_ms
    return (f"prefill {rate:.0f} tok/s ({prefill.batch_rows} prompt tokens, {prefill.t_verify_ms:.0f} ms) against "
            f"decode {run.tps:.1f} tok/s: a forward takes many rows almost as cheaply as one, and decoding uses "
            f"one row a forward unless drafts fill the others")


@dataclass(frozen=True)
class Explained:
    alpha: float  # realised acceptance: kept / (kept + first rejections)
    per_pos: tuple[float, ...]  # kept / reached at draft positions 1, 2, ...
    k: float  # draft tokens a drafted round verified, on average
    c: float  # a speculative round's time over a plain step's, minus one
    predicted: float  # the formula's speedup for alpha, k, c
    measured: float  # tokens/s speculative over plain
    break_even: float  # the acceptance at which the formula gives 1 for this k and c
    split_ms: tuple[float, float, float, float]  # per round: drafting, forward, rollback, the rest


def break_even(k: float, c: float) -> float:
    """The acceptance a at which formula(a, k, c) = 1 (bisection; 0 when even a = 0 pays, 1 when none does)."""
    if formula(0.0, k, c) >= 1:
        return 0.0
    if formula(1.0, k, c) < 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if formula(mid, k, c) < 1 else (lo, mid)
    return hi


def explain(spec, plain) -> Explained | None:
    """The numbers behind a comparison's speedup, from the two runs' events; None without drafted rounds."""
    rounds = [ev for ev in spec.events if ev.kind != "prefill" and ev.emitted]
    drafted = [ev for ev in rounds if ev.drafted]
    steps = [ev for ev in plain.events if ev.kind != "prefill" and ev.emitted]
    if not drafted or not steps or not spec.tps or not plain.tps:
        return None
    kept = sum(ev.n_accepted for ev in drafted)
    refused = sum(ev.n_accepted < len(ev.drafted) for ev in drafted)
    alpha = kept / (kept + refused) if kept + refused else 0.0
    depth = max(len(ev.drafted) for ev in drafted)
    reached = [sum(len(ev.drafted) > i for ev in drafted) for i in range(depth)]
    per_pos = tuple(sum(ev.n_accepted > i for ev in drafted) / n for i, n in enumerate(reached) if n)
    k = sum(len(ev.drafted) for ev in drafted) / len(drafted)
    step_s = plain.decode_seconds / len(steps)
    round_s = spec.decode_seconds / len(rounds)
    c = max(0.0, round_s / step_s - 1) if step_s > 0 else 0.0
    n = len(rounds)
    draft, forward = sum(ev.t_draft_ms for ev in rounds) / n, sum(ev.t_forward_ms for ev in rounds) / n
    rollback = sum(ev.t_rollback_ms for ev in rounds) / n
    rest = max(0.0, round_s * 1e3 - draft - forward - rollback)
    return Explained(alpha=alpha, per_pos=per_pos, k=k, c=c, predicted=formula(alpha, k, c),
                     measured=spec.tps / plain.tps, break_even=break_even(k, c),
                     split_ms=(draft, forward, rollback, rest))


def explained_html(x: Explained | None) -> str:
    """The explanation under a comparison's verdict."""
    if x is None:
        return ('<div class="lesson muted">No round drafted anything, so speculation could not pay: plain '
                'decoding with a drafter\'s look-up on top.</div>')
    pos = " ".join(f"d{i + 1} {a:.0%}" for i, a in enumerate(x.per_pos[:8]))
    pays = "pays" if x.alpha > x.break_even else "cannot pay"
    draft, forward, rollback, rest = x.split_ms
    return (f'<div class="lesson"><b>Why {x.measured:.2f}&times;:</b> acceptance a = {x.alpha:.2f} ({pos}), '
            f"{x.k:.1f} draft tokens a round; a round cost {x.c + 1:.2f} plain steps (c = {x.c:.2f}). "
            f"The formula (1 - a<sup>k+1</sup>) / ((1 - a)(c + 1)) gives <b>{x.predicted:.2f}&times;</b>, "
            f"measured {x.measured:.2f}&times;. At this c speculation breaks even at a = {x.break_even:.2f}: "
            f"this answer's a {pays}. A round's time: drafting {draft:.1f} ms, forward {forward:.1f} ms, "
            f"rollback {rollback:.1f} ms, the rest (sampling, verification, events) {rest:.1f} ms.</div>")


def lesson_line(text: str) -> str:
    return f'<div class="lesson muted">{text}</div>' if text else ""
