"""What each button does, as plain functions of (app state, session state, control values) -> page updates.

ui.app binds them to components; here they return a tuple of view values in VIEWS order plus the message
box, with gr.skip() for what stays as it is. Bad input becomes a toast and a message box, never an exception.
"""

from __future__ import annotations

import html

import gradio as gr

from ui.loader import load_models
from ui.render import notice_html
from ui.session import UserError, advice_turn, converse, step_turn, stop_turn
from ui.presets import preset
from ui.settings import DRAFT_MODEL_TYPE, chain_for_target, full_chain, settings_from, with_draft_type
from ui.state import AppState, SessionState
from ui.visitors import ShareExceeded
from ui.views import CHART_VIEWS, TEXT_VIEWS, all_views, chat_view, waiting_views

VIEWS = TEXT_VIEWS + CHART_VIEWS
HTML_CHARTS = ("kpis", "counters")  # the chart views that are HTML, not plots
CLEARED = ("history", "turns_html", "pending_user", "run", "plain", "compare_html", "compare_base", "advice",
           "format_html", "notice", "seq_stats", "charts_key", "dropped_turns", "forgotten_turns")


def pack(views: dict, s: SessionState, msg_value: str | None = None, stream: bool = False) -> tuple:
    """Views in output order, then the message box; a view not given is left as the page shows it. The HTML
    sent is remembered in `s.shown`. A streaming update (`stream`) sends each HTML view it leaves as it is as
    that HTML, which Gradio's diff of the stream turns into nothing on the wire, instead of a gr.skip(): a skip
    costs the web server a new component and its config per output, and forty sessions in line each skipping
    ten outputs held up the answers that stream. Plots are still skipped: a plot sent again is redrawn."""
    tail = gr.skip() if msg_value is None else msg_value
    out = []
    for name in VIEWS:
        value = views.get(name, gr.skip())
        if isinstance(value, str):
            s.shown[name] = value
        elif stream and name in TEXT_VIEWS + HTML_CHARTS:
            value = s.shown.get(name, "")
        out.append(value)
    return tuple(out) + (tail,)


def warn(app: AppState, s: SessionState, e: UserError) -> tuple:
    gr.Warning(str(e))
    s.notice = (str(e), e.level)
    return pack(all_views(app, s), s)


def send(app: AppState, s: SessionState, text: str, stepping: bool, values: dict) -> object:
    """Stream a chat turn; the message box empties once the turn is accepted. values: the controls' values by
    Settings field name."""
    settings = settings_from(values)
    first = True
    try:
        for _ in converse(app, s, text, settings, bool(stepping)):
            in_line = not first and s.run is not None and not s.run.events and s.busy
            views = waiting_views(s) if in_line else all_views(app, s)
            yield pack(views, s, "" if first else None, stream=True)
            first = False
    except UserError as e:
        yield warn(app, s, e)


def remote_send(app: AppState, page, s: SessionState, text: str, values: dict) -> object:
    """Stream a chat turn from the --remote server (ui/remote_page.py); the message box empties at once. The
    turn counts against the visitor's share as a local one does: the server is shared too."""
    from ui.remote_page import remote_turn

    first = True
    try:
        with app.limits.holding(s.visitor):
            for views in remote_turn(page, s, text, settings_from(values)):
                yield pack(views, s, "" if first else None, stream=True)
                first = False
    except ShareExceeded as e:
        yield warn(app, s, UserError(f"Please wait: {e}."))
    except UserError as e:
        gr.Warning(str(e))
        s.notice = (str(e), e.level)
        yield pack({"notice": notice_html(*s.notice)}, s)


def try_advice(app: AppState, s: SessionState, values: dict) -> object:
    """Run the last prompt again with the advised chain; the comparison's line then shows the result."""
    try:
        for _ in advice_turn(app, s, settings_from(values)):
            yield pack(all_views(app, s), s, stream=True)
    except UserError as e:
        yield warn(app, s, e)


def stop(app: AppState, s: SessionState) -> tuple:
    """A streaming answer ends through its own handler, whose last update shows the stop; views made here,
    before the engine delivers it, could reach the page after that update and show the answer unfinished, so
    they are sent only for a step-mode answer, which ends here."""
    streaming = s.active is not None and not s.active.finished and not s.active.manual
    stop_turn(app, s)
    return pack({}, s) if streaming else pack(all_views(app, s), s)


def step(app: AppState, s: SessionState) -> tuple:
    try:
        step_turn(app, s)
    except UserError as e:
        return warn(app, s, e)
    return pack(all_views(app, s, force_charts=True), s)


def show_rejected(s: SessionState, on: bool) -> str:
    """The rejected-drafts toggle: the chat is redrawn now, not at the next answer; a streaming answer picks
    the flag up at its next update."""
    s.show_rejected = bool(on)
    s.shown["chat"] = chat_view(s)
    return s.shown["chat"]


def clear(app: AppState, s: SessionState) -> tuple:
    """A new chat in the same session (the slot's cells stay for whoever needs them)."""
    if s.busy:
        return warn(app, s, UserError("Stop the answer first, then start a new chat."))
    fresh = SessionState()
    for name in CLEARED:
        setattr(s, name, getattr(fresh, name))
    return pack(all_views(app, s, force_charts=True), s, "")


def choose_preset(app: AppState, name: str) -> tuple:
    """The speculation controls of a preset (ui/presets.py), in the order ui.app wires them, and its note."""
    rt = app.runtime
    mod = rt.engine.drafter_params_of("ngram-mod") if rt is not None else None
    p = preset(name, full_chain(rt, app.options.eagle3), getattr(rt, "left_out", {}) or {},
               getattr(mod, "n_match", None), getattr(rt, "trees", None))
    note = "".join(f"<li>{html.escape(n)}</li>" for n in p.notes)
    return (p.types, p.n_max, p.n_min, p.p_min is None, p.p_min if p.p_min is not None else gr.skip(),
            p.adaptive, p.tree_nodes, f'<ul class="preset-note muted small">{note}</ul>' if note else "")


def connect_remote(app: AppState, url: str) -> str:
    """The page's remote-server field: the chat talks to the server at `url` (empty: to this engine again). Only
    where the app is local-only; a server that cannot be reached leaves the chat where it was."""
    from ui.remote_page import header_html, open_url

    if not app.options.remote_from_page:
        return notice_html("This page is reachable from other hosts: the operator names the remote server "
                           "(app.py --remote URL).", "warn")
    url = (url or "").strip()
    if not url:
        app.remote = None
        return notice_html("The chat talks to this playground's own engine.", "info")
    try:
        page = open_url(url)
    except (ValueError, RuntimeError, OSError) as e:
        return notice_html(f"Cannot use {url}: {e}. The chat stays where it was.", "error")
    app.remote = page
    return header_html(page)


def model_status(app: AppState, extra: str = "", level: str = "info") -> str:
    current = app.runtime.describe() if app.runtime is not None else "no model loaded"
    return f'<div class="model-status">{html.escape(current)}</div>' + notice_html(extra, level)


def load(app: AppState, target: str, draft: str, types: list | None) -> tuple:
    """Load models; on failure say why and keep what was loaded. A draft model joins the chain as draft-simple, or
    as draft-uni where its vocabulary is not the target's (the engine's draft_type)."""
    before = app.runtime.target if app.runtime is not None else None
    try:
        status = load_models(app, target, draft)
    except UserError as e:
        gr.Warning(str(e))
        return model_status(app, f"{e} (kept the models that were loaded)", "error"), gr.skip()
    types = list(types or [])
    if app.runtime.draft is not None:
        types = with_draft_type(types, getattr(app.runtime.engine, "draft_type", None) or DRAFT_MODEL_TYPE)
    if app.runtime.target is not before:
        types, note = chain_for_target(types, app.runtime.target)
        status = f"{status}. {note}" if note else status
    return model_status(app, status, "info"), types
