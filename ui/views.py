"""A session's state -> the value of every view on the page (HTML strings and plotly figures).

Views are named; ui.app maps names to components. Charts are the costly views (plotly JSON, a browser
redraw), so they are redrawn at most every 1.5 s while an answer streams, and always at its end.
"""

from __future__ import annotations

import html
import time

from ui import charts
from ui.conversation import forgotten_html
from ui.drafter_costs import drafter_costs_html
from ui.kvview import kv_html
from ui.render import notice_html, transcript_html, user_bubble
from ui.state import AppState, SessionState
from ui.timeline import step_html, timeline_html

TEXT_VIEWS = ("chat", "timeline", "kv", "step", "summary", "notice")
CHART_VIEWS = ("kpis", "acc_plot", "speed_plot", "counters")
PLOT_EVERY_S = 1.5
EMPTY_HINT = ("Ask something, or click an example. Each token of the answer is coloured by what speculative "
              "decoding did with it.")


def chat_view(session: SessionState) -> str:
    turns = [t for t in [forgotten_html(session)] if t] + session.turns_html
    if session.pending_user and session.run is not None:
        turns += [user_bubble(session.pending_user), session.run.answer_html(live=True)]
    return transcript_html(turns, EMPTY_HINT, session.show_rejected)


def summary_view(session: SessionState) -> str:
    run = session.run
    if run is None:
        return '<div class="summary muted">Speed and the lossless check appear here after an answer.</div>'
    return (f'<div class="summary"><div class="summary-line"><span class="summary-label">speculative</span> '
            f'{run.meta_html()}</div>{session.format_html}{session.compare_html}</div>')


def text_views(app: AppState, session: SessionState) -> dict[str, str]:
    run = session.run
    n_ctx = app.options.n_ctx
    if run is None:
        return {"chat": chat_view(session), "timeline": timeline_html([]), "kv": kv_html(None, [], 0, None),
                "step": step_html(None, None, [], None), "summary": summary_view(session),
                "notice": notice_html(*session.notice)}
    return {
        "chat": chat_view(session),
        "timeline": timeline_html(run.timeline_rows),
        "kv": kv_html(run.last, run.cache_ids(), len(run.prompt_ids), run.vocab, n_ctx),
        "step": step_html(run.last, run.vocab, run.context_last, run.sampled_last(),
                          app.runtime.roofline if app.runtime is not None else None),
        "summary": summary_view(session),
        "notice": notice_html(*session.notice),
    }


def chart_views(session: SessionState) -> dict[str, object]:
    run = session.run
    if run is None:
        return {"kpis": charts.kpi_html({}, 0, 0), "acc_plot": charts.plotly_figure(charts.acceptance_figure({})),
                "speed_plot": charts.plotly_figure(charts.speed_figure([], [], [])), "counters": counters_view({})}
    stats = run.stats()
    plain_tps = session.plain.tps if session.plain is not None and session.plain.done else None
    return {
        "kpis": charts.kpi_html(stats, run.n_decode, run.n_rounds),
        "acc_plot": charts.plotly_figure(charts.acceptance_figure(stats)),
        "speed_plot": charts.plotly_figure(charts.speed_figure(run.rounds, run.emitted, run.elapsed, plain_tps)),
        "counters": counters_view(counters(session), run.events),
    }


def counters_view(seq_stats: dict, events: list | None = None) -> str:
    """What each drafter cost and gained in this answer, then llama.cpp's statistics lines for its sequence,
    live while it generates."""
    costs = drafter_costs_html(seq_stats, events or [])
    return f'{costs}<pre class="counters">{html.escape(charts.counters_text(seq_stats))}</pre>'


def waiting_views(session: SessionState) -> dict[str, object]:
    """What changes while an answer waits in line for a slot: its place, in the notice. Forty sessions in line
    each hear every move of the line: drawing their whole page each time would hold up the answers that run."""
    return {"notice": notice_html(*session.notice)}


def all_views(app: AppState, session: SessionState, force_charts: bool = False) -> dict[str, object]:
    """Every view; the charts only when due (throttled while streaming, once more when a run ends), absent
    otherwise (the page keeps what it shows)."""
    views: dict[str, object] = text_views(app, session)
    now = time.perf_counter()
    run, plain = session.run, session.plain
    key = (id(run), run is not None and run.done, plain is not None and plain.done)
    streaming = run is not None and not run.done
    if run is not None and not run.events and not force_charts:
        return views  # waiting for its slot: nothing to chart yet (and many may wait at once)
    if force_charts or key != session.charts_key or (streaming and now >= session.plot_due):
        session.plot_due = now + PLOT_EVERY_S
        session.charts_key = key
        views.update(chart_views(session))
    return views


def counters(session: SessionState) -> dict:
    """The engine's counters for the shown run: the engine thread copies them after every round, so reading
    them never holds up a round."""
    active = session.active
    if active is not None and not active.finished and active.run is session.run:
        session.seq_stats = active.gen.stats
    return session.seq_stats
