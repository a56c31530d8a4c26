"""Gradio wiring: build(state) -> gr.Blocks. Layout and event handlers only; pictures come from ui.views."""

from __future__ import annotations

import html
from pathlib import Path

import gradio as gr

from ui.charts import acceptance_figure, speed_figure
from ui.examples import load_examples
from ui.loader import load_models
from ui.render import legend_html, notice_html
from ui.session import UserError, converse, release, step_turn, stop_turn
from ui.settings import ALL_TYPES, DRAFT_MODEL_TYPE, Settings, settings_from
from ui.state import AppState, SessionState
from ui.views import CHART_VIEWS, TEXT_VIEWS, all_views

STYLE = Path(__file__).resolve().parent.parent / "assets" / "style.css"
VIEWS = TEXT_VIEWS + CHART_VIEWS


def launch_options() -> dict:
    """Keyword arguments for Blocks.launch(): Gradio 6 takes the stylesheet at launch."""
    return {"css_paths": [STYLE], "theme": gr.themes.Soft(), "show_error": True}


def model_status(app: AppState, extra: str = "", level: str = "info") -> str:
    current = app.runtime.describe() if app.runtime is not None else "no model loaded"
    line = f'<div class="model-status">{html.escape(current)}</div>'
    return line + notice_html(extra, level)


def header_html() -> str:
    return ('<div class="header"><h1>Speculative decoding playground</h1><p>A small model drafts, the target '
            'verifies the whole draft in one forward, the cache drops what it refused. Watch every round.</p></div>')


def sidebar_controls(app: AppState) -> tuple[dict, list]:
    """The model loader and every generation setting; returns (named components, settings inputs in
    Settings field order)."""
    d = Settings()
    c: dict = {}
    with gr.Sidebar(open=True, width=360):
        gr.Markdown("### Models")
        rt = app.runtime
        c["target"] = gr.Textbox(label="Target model", value=rt.target.name if rt else "embedded",
                                 info="embedded, a HF hub id, a local directory or a .gguf file")
        c["draft"] = gr.Textbox(label="Draft model", value=rt.draft.name if rt and rt.draft else "",
                                placeholder="none", info="same vocabulary as the target; enables draft-simple")
        c["load"] = gr.Button("Load models", variant="secondary", elem_id="load-btn")
        c["model_status"] = gr.HTML(model_status(app), elem_id="model-status")
        gr.Markdown("### Speculation")
        types = gr.Dropdown(ALL_TYPES, value=d.types, multiselect=True, label="Drafter chain, in relay order",
                            info="the first drafter with a proposal wins the round; order = order of selection; "
                                 "empty = plain decoding", elem_id="drafters")
        n_max = gr.Slider(0, 32, value=d.n_max, step=1, label="n_max: draft tokens per round at most")
        n_min = gr.Slider(0, 32, value=d.n_min, step=1, label="n_min: shorter drafts are dropped")
        p_min = gr.Slider(0, 1, value=d.p_min, step=0.05, label="p_min: a draft model stops below this")
        adaptive = gr.Checkbox(value=d.adaptive, label="Adaptive draft length (cut drafts that do not pay)",
                               elem_id="adaptive")
        gr.Radio(["auto", "checkpoint"], value="auto", label="Rollback", interactive=False,
                 info="auto: seq_rm where the cache allows. checkpoint: coming with the checkpoint issue")
        gr.Markdown("### Sampling")
        temp = gr.Slider(0, 2, value=d.temp, step=0.05, label="temperature (0 = greedy)")
        top_k = gr.Slider(0, 200, value=d.top_k, step=1, label="top-k (0 = off)")
        top_p = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="top-p")
        min_p = gr.Slider(0, 0.95, value=d.min_p, step=0.01, label="min-p")
        seed = gr.Number(value=d.seed, precision=0, label="seed")
        max_new = gr.Slider(1, 1024, value=d.max_new_tokens, step=1, label="max new tokens", elem_id="max-new")
        cmp = gr.Checkbox(value=d.compare, label="Compare with plain decoding afterwards (speedup, lossless)",
                          elem_id="compare")
    return c, [types, n_max, n_min, p_min, adaptive, temp, top_k, top_p, min_p, seed, max_new, cmp]


def filler(text: str):
    """A handler that puts `text` into the message box (an example button)."""
    return lambda: text


def build(state: AppState) -> gr.Blocks:
    """The whole page for this app state (models, engine, scheduler shared by every browser session)."""
    app = state
    examples = load_examples()
    with gr.Blocks(title="Speculative decoding playground", fill_width=True) as demo:
        session = gr.State(SessionState(), delete_callback=release)
        c, controls = sidebar_controls(app)
        gr.HTML(header_html())
        v: dict = {}
        with gr.Row(equal_height=False):
            with gr.Column(scale=6, min_width=480):
                gr.HTML(legend_html())
                v["chat"] = gr.HTML(elem_id="chat", min_height=260)
                v["notice"] = gr.HTML(elem_id="notice")
                msg = gr.Textbox(show_label=False, lines=2, max_lines=10, elem_id="msg",
                                 placeholder="Your message… (or click an example below)")
                with gr.Row():
                    send = gr.Button("Send", variant="primary", elem_id="send-btn", scale=2)
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1)
                    step_mode = gr.Checkbox(label="Step mode", value=False, elem_id="step-mode", scale=1)
                    step_btn = gr.Button("Step", elem_id="step-btn", scale=1)
                    clear = gr.Button("New chat", elem_id="clear-btn", scale=1)
                ex_buttons = []
                with gr.Row(elem_classes=["examples"]):
                    for ex in examples:
                        label = ("\u2713 " if ex.pays else "\u2717 ") + ex.title
                        btn = gr.Button(label, size="sm", elem_classes=["ex-pays" if ex.pays else "ex-nopay"])
                        ex_buttons.append((btn, ex.prompt))
                gr.HTML('<div class="muted small">\u2713 the answer copies the prompt: drafts get accepted. '
                        '\u2717 open writing: little to draft.</div>')
                v["summary"] = gr.HTML(elem_id="summary")
            with gr.Column(scale=5, min_width=420):
                v["kpis"] = gr.HTML(elem_id="kpis")
                v["acc_plot"] = gr.Plot(acceptance_figure({}), show_label=False, elem_id="acc-plot")
                v["speed_plot"] = gr.Plot(speed_figure([], [], []), show_label=False, elem_id="speed-plot")
        with gr.Tabs():
            with gr.Tab("Rounds", elem_id="tab-rounds"):
                v["timeline"] = gr.HTML(elem_id="timeline")
            with gr.Tab("KV cache", elem_id="tab-kv"):
                v["kv"] = gr.HTML(elem_id="kv")
            with gr.Tab("Step mode", elem_id="tab-step"):
                v["step"] = gr.HTML(elem_id="step")
            with gr.Tab("Counters (llama.cpp)", elem_id="tab-counters"):
                v["counters"] = gr.HTML(elem_id="counters")

        outputs = [v[name] for name in VIEWS] + [msg]

        def pack(views: dict, msg_value=None) -> tuple:
            """Views in output order; a view not given is left as the page shows it."""
            return tuple(views.get(name, gr.skip()) for name in VIEWS) + (gr.skip() if msg_value is None
                                                                           else msg_value,)

        def warn(session_state: SessionState, e: UserError) -> tuple:
            gr.Warning(str(e))
            session_state.notice = (str(e), e.level)
            return pack(all_views(app, session_state))

        def on_send(s, text, stepping, types, n_max, n_min, p_min, adaptive, temp, top_k, top_p, min_p, seed,
                    max_new, compare):
            settings = settings_from([types, n_max, n_min, p_min, adaptive, temp, top_k, top_p, min_p, seed,
                                      max_new, compare])
            first = True
            try:
                for _ in converse(app, s, text, settings, bool(stepping)):
                    yield pack(all_views(app, s), "" if first else None)
                    first = False
            except UserError as e:
                yield warn(s, e)

        def on_stop(s):
            stop_turn(app, s)
            return pack(all_views(app, s))

        def on_step(s):
            try:
                step_turn(app, s)
            except UserError as e:
                return warn(s, e)
            return pack(all_views(app, s, force_charts=True))

        def on_clear(s):
            if s.busy:
                return warn(s, UserError("Stop the answer first, then start a new chat."))
            fresh = SessionState()
            for name in ("history", "turns_html", "pending_user", "run", "plain", "compare_html", "notice",
                         "seq_stats", "charts_key"):
                setattr(s, name, getattr(fresh, name))
            return pack(all_views(app, s, force_charts=True), "")

        def on_load(target, draft, types):
            try:
                status = load_models(app, target, draft)
            except UserError as e:
                gr.Warning(str(e))
                return model_status(app, f"{e} (kept the models that were loaded)", "error"), gr.skip()
            if app.runtime.draft is not None and DRAFT_MODEL_TYPE not in (types or []):
                types = list(types or []) + [DRAFT_MODEL_TYPE]  # a draft model is only used through draft-simple
            return model_status(app, status, "info"), types

        def on_open(s, request: gr.Request):
            if request is not None and request.session_hash:
                app.sessions[request.session_hash] = s
            return pack(all_views(app, s, force_charts=True))

        def on_close(request: gr.Request):
            s = app.sessions.pop(getattr(request, "session_hash", None), None)
            if s is not None:
                release(s)

        inputs = [session, msg, step_mode] + controls
        send.click(on_send, inputs, outputs, concurrency_limit=None, show_progress="hidden")
        msg.submit(on_send, inputs, outputs, concurrency_limit=None, show_progress="hidden")
        for btn, prompt in ex_buttons:
            btn.click(filler(prompt), None, msg, show_progress="hidden").then(
                on_send, inputs, outputs, concurrency_limit=None, show_progress="hidden")
        stop_btn.click(on_stop, session, outputs, concurrency_limit=None, show_progress="hidden")
        step_btn.click(on_step, session, outputs, concurrency_limit=None, show_progress="hidden")
        clear.click(on_clear, session, outputs, concurrency_limit=None, show_progress="hidden")
        c["load"].click(on_load, [c["target"], c["draft"], controls[0]], [c["model_status"], controls[0]],
                        concurrency_limit=1)
        demo.load(on_open, session, outputs, show_progress="hidden")
        demo.unload(on_close)
    return demo
