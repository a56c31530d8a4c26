"""Gradio wiring: build(state) -> gr.Blocks. Layout and event handlers only; pictures come from ui.views."""

from __future__ import annotations

import time
from pathlib import Path

import gradio as gr

from engine import packaged_names
from ui import arena_tab, bench_tab, formula_play, handlers, lesson, samedist_tab
from ui.charts import acceptance_figure, plotly_figure, speed_figure
from ui.examples import load_examples
from ui.handlers import VIEWS, model_status
from ui.remote_page import header_html as remote_header_html
from ui.render import legend_html
from ui.turns import close_turn
from ui.presets import PRESETS
from ui.settings import (ALL_TYPES, FORMAT_EXAMPLES, FORMATS, Settings, default_chain, default_tree_nodes, format_box,
                         own_p_min_text)
from ui.state import SESSION_TTL_S, AppOptions, AppState, SessionState, session_capacity
from ui.views import all_views
from ui.wire import wire_values

STYLE = Path(__file__).resolve().parent.parent / "assets" / "style.css"


SPARE_THREADS = 32  # worker threads beyond one per slot and queue place: Stop, Step, page loads, charts


UPLOAD_MAX = 10 << 20  # bytes a file uploaded to the page may hold (app.py --max-upload)
# Gradio's own temporary files (uploads, cached outputs): every hour, those older than an hour are removed
DELETE_CACHE = (3600, 3600)


def launch_options(options: AppOptions | None = None, upload_max: int = UPLOAD_MAX) -> dict:
    """Keyword arguments for Blocks.launch(): Gradio 6 takes the stylesheet at launch.

    Gradio runs each step of a handler in one of `max_threads` worker threads (40 by default), and a streaming
    answer waiting for its slot or its next round holds one: with every slot busy and the queue full, that is
    parallel + queue threads, and Stop, Step and page loads need more on top or they wait behind them."""
    options = options or AppOptions()
    return {"css_paths": [STYLE], "theme": gr.themes.Default(), "show_error": True,
            "max_threads": options.parallel + options.queue_max + SPARE_THREADS, "max_file_size": upload_max,
            "state_session_capacity": session_capacity(options)}


def header_html() -> str:
    return ('<div class="header"><h1>Speculative decoding playground</h1><p>A drafter guesses the next tokens, '
            'the target checks the whole guess in one forward, the cache drops what it refused. Watch every round.'
            '</p></div>')


def speculation_controls(app: AppState, c: dict, d: Settings) -> dict:
    """The preset, the drafter chain and the draft-length controls (inside the sidebar); returns them by
    Settings field name, and puts the preset's radio and note into `c`."""
    rt = app.runtime
    gr.Markdown("### Speculation")
    left_out = getattr(rt, "left_out", None) or {}
    # the page starts on the default chain: without the drafters the load's probe found unable to pay here, in
    # trees only where the probe timed them faster than chains here
    start = "fastest here" if left_out else "playground"
    c["preset"] = gr.Radio(list(PRESETS), value=start, label="Preset", elem_id="preset",
                           info="playground: every drafter the models allow, in trees where they pay here; "
                                "llama.cpp: its chains and defaults; fastest here (the default where a drafter "
                                "cannot pay on this machine): without those drafters; plain: none")
    c["preset_note"] = gr.HTML(handlers.choose_preset(app, start)[-1] if rt is not None else "",
                               elem_id="preset-note")
    types = gr.Dropdown(ALL_TYPES, value=default_chain(rt, app.options.eagle3), multiselect=True,
                        label="Drafter chain, in relay order",
                        info="the first drafter with a proposal wins the round (with a tree of drafts: every "
                             "drafter proposes); order = order of selection; empty = plain decoding",
                        elem_id="drafters")
    n_max = gr.Slider(0, 32, value=d.n_max, step=1, label="n_max: draft tokens per round at most",
                      elem_id="n-max")
    n_min = gr.Slider(0, 32, value=d.n_min, step=1, label="n_min: shorter drafts are dropped", elem_id="n-min")
    p_min_own = gr.Checkbox(value=d.p_min_own, label=f"p_min: each model drafter's own ({own_p_min_text()})",
                            elem_id="p-min-own")
    p_min = gr.Slider(0, 1, value=d.p_min, step=0.05, label="p_min: a model drafter stops below this",
                      interactive=not d.p_min_own, elem_id="p-min")
    p_min_own.change(lambda own: gr.update(interactive=not own), p_min_own, p_min)
    adaptive = gr.Checkbox(value=d.adaptive, label="Adaptive draft length (cut drafts that do not pay)",
                           elem_id="adaptive")
    tree_nodes = gr.Slider(0, 32, value=default_tree_nodes(rt) if rt is not None else d.tree_nodes, step=1,
                           elem_id="tree-nodes",
                           label="Tree of drafts: nodes per round at most (0 = one chain)",
                           info="every drafter proposes, the draft head branches, and one forward checks the "
                                "whole tree; with adaptive length one budget keeps the nodes that pay")
    rollback = gr.Radio(["auto", "checkpoint"], value="auto", label="Rollback", elem_id="rollback",
                        info="auto: seq_rm cuts a chain's rejected tail, a tree's branches are freed cell by "
                             "cell, and a memory that can do neither restores a checkpoint. checkpoint: always "
                             "restore the state saved before drafting, then replay the accepted tokens "
                             "(llama.cpp's FULL path)")
    return dict(types=types, n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive, rollback=rollback,
                p_min_own=p_min_own, tree_nodes=tree_nodes)


def sidebar_controls(app: AppState) -> tuple[dict, dict]:
    """The model loader and every generation setting; returns (named components, the settings' inputs by
    Settings field name, in the order the page's send event takes them)."""
    d = Settings()
    c: dict = {}
    with gr.Sidebar(open=True, width=360):
        gr.Markdown("### Models")
        rt = app.runtime
        # the packaged models offline, or any name typed in (a hub id, a directory, a .gguf file)
        choices = list(app.options.model_choices or packaged_names())
        c["target"] = gr.Dropdown(choices=choices, value=rt.target.name if rt else "embedded",
                                  allow_custom_value=True, label="Target model", elem_id="target-box",
                                  info="embedded (SmolLM2-135M), gemma3-270m, or a model of the host's model "
                                       "folder (--model-dir) by its name")
        c["draft"] = gr.Textbox(label="Draft model", value=rt.draft.name if rt and rt.draft else "",
                                placeholder="none", info="enables draft-simple; another vocabulary: draft-uni",
                                elem_id="draft-box")
        # a shared demo (not loopback) keeps its model unless the host allows loading (--allow-model-load)
        allowed = app.options.allow_model_load
        c["load"] = gr.Button("Load models" if allowed else "Loading models is off on this shared demo",
                              variant="secondary", elem_id="load-btn", interactive=allowed)
        c["model_status"] = gr.HTML(model_status(app), elem_id="model-status")
        with gr.Row():
            c["remote_url"] = gr.Textbox(label="Remote server", scale=3, elem_id="remote-url",
                                         value=app.remote.client.config.base if app.remote is not None else "",
                                         placeholder="http://127.0.0.1:8080 (empty: this engine)",
                                         interactive=app.options.remote_from_page,
                                         info="an OpenAI-compatible server (llama-server, vLLM, another playground) "
                                              "for the chat; this machine's page only")
            c["remote_go"] = gr.Button("Use", scale=1, min_width=60, elem_id="remote-go",
                                       interactive=app.options.remote_from_page)
        c["remote_status"] = gr.HTML(elem_id="remote-status")
        spec = speculation_controls(app, c, d)
        gr.Markdown("### Sampling")
        temp = gr.Slider(0, 2, value=d.temp, step=0.05, label="temperature (0 = greedy)")
        top_k = gr.Slider(0, 200, value=d.top_k, step=1, label="top-k (0 = off)")
        top_p = gr.Slider(0.05, 1, value=d.top_p, step=0.05, label="top-p")
        min_p = gr.Slider(0, 0.95, value=d.min_p, step=0.01, label="min-p")
        seed = gr.Number(value=d.seed, precision=0, label="seed")
        max_new = gr.Slider(1, 1024, value=d.max_new_tokens, step=1, label="max new tokens", elem_id="max-new")
        cmp = gr.Checkbox(value=d.compare, label="Compare with plain decoding afterwards (speedup, lossless)",
                          elem_id="compare")
        gr.Markdown("### Output format")
        c["format"] = gr.Radio(FORMATS, value=d.output_format, label="Output format", elem_id="output-format",
                               info="constrains every token to the format; the grammar drafter then leads the "
                                    "chain with the tokens the format forces")
        c["format_text"] = gr.Textbox(value=d.format_text, lines=8, max_lines=20, label="Schema, regex or grammar",
                                      visible=False, elem_id="format-text")
        # .input, not .change: an example that sets the format and its schema must not have it replaced here
        c["format"].input(format_box, [c["format"], c["format_text"]], c["format_text"], show_progress="hidden")
    controls = dict(**spec, temp=temp, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, max_new_tokens=max_new,
                    compare=cmp, output_format=c["format"], format_text=c["format_text"])
    # in Settings' field order: an API client of the page (gradio_client) passes them by position
    return c, {name: controls[name] for name in Settings.__dataclass_fields__}


def filler(text: str):
    """A handler that puts `text` into the message box (an example button)."""
    return lambda: text


def example_filler(ex):
    """An example button's handler: the message box, and the output format where the example has one (the
    others leave the format as the user set it)."""
    if not ex.format:
        return lambda: (ex.prompt, gr.skip(), gr.skip())
    box = gr.update(value=ex.format_text, visible=ex.format in FORMAT_EXAMPLES)  # json (any) takes no text
    return lambda: (ex.prompt, ex.format, box)


def chat_column(examples: list, v: dict) -> dict:
    """Legend, chat, message box, buttons, examples, speed summary. Returns the input widgets by name."""
    w: dict = {}
    gr.HTML(legend_html())
    w["show_rej"] = gr.Checkbox(value=True, label="Show rejected drafts (off: the answer as plain coloured text)",
                                elem_id="show-rej", container=False)
    v["chat"] = gr.HTML(elem_id="chat")
    v["notice"] = gr.HTML(elem_id="notice")
    # lines=1 is what makes Gradio submit on Enter; max_lines lets the box grow, and Shift+Enter is then the
    # textarea's own new line
    w["msg"] = gr.Textbox(show_label=False, lines=1, max_lines=10, elem_id="msg",
                          placeholder="Your message… Enter sends, Shift+Enter starts a new line "
                                      "(or click an example below)")
    with gr.Row():
        w["send"] = gr.Button("Send", variant="primary", elem_id="send-btn", scale=2, min_width=90)
        w["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn", scale=1, min_width=70)
        w["step_mode"] = gr.Checkbox(label="Step mode", value=False, elem_id="step-mode", scale=1, min_width=110)
        w["step"] = gr.Button("Step", elem_id="step-btn", scale=1, min_width=70)
        w["clear"] = gr.Button("New chat", elem_id="clear-btn", scale=1, min_width=90)
        w["advise"] = gr.Button("Try the advice", elem_id="advise-btn", scale=1, min_width=110)
    w["examples"] = []
    with gr.Row(elem_classes=["examples"]):
        for ex in examples:
            label = ("\u2713 " if ex.pays else "\u2717 ") + ex.title
            btn = gr.Button(label, size="sm", min_width=60, elem_classes=["ex-pays" if ex.pays else "ex-nopay"])
            w["examples"].append((btn, ex))
    gr.HTML('<div class="muted small">\u2713 the answer copies the prompt: drafts get accepted. '
            '\u2717 open writing: nothing to copy; only the draft head (embedded model) guesses.</div>')
    v["summary"] = gr.HTML(elem_id="summary")
    return w


def stats_column(v: dict) -> None:
    v["kpis"] = gr.HTML(elem_id="kpis")
    v["acc_plot"] = gr.Plot(plotly_figure(acceptance_figure({})), show_label=False, elem_id="acc-plot")
    v["speed_plot"] = gr.Plot(plotly_figure(speed_figure([], [], [])), show_label=False, elem_id="speed-plot")


def lesson_views(app: AppState) -> tuple:
    """The free-lunch tab's figure and text for the loaded model (after a model load, the new one's)."""
    roof = app.runtime.roofline if app.runtime is not None else None
    return plotly_figure(lesson.curve_figure(roof)), lesson.free_lunch_text(roof)


def detail_tabs(v: dict, app: AppState, controls: dict, session: gr.State) -> tuple:
    """The tabs under the chat; returns the free-lunch tab's (plot, text), refreshed at each page load."""
    with gr.Tabs():
        with gr.Tab("Rounds", elem_id="tab-rounds"):
            v["timeline"] = gr.HTML(elem_id="timeline")
        with gr.Tab("KV cache", elem_id="tab-kv"):
            v["kv"] = gr.HTML(elem_id="kv")
        with gr.Tab("Step mode", elem_id="tab-step"):
            v["step"] = gr.HTML(elem_id="step")
        with gr.Tab("Counters (llama.cpp)", elem_id="tab-counters"):
            v["counters"] = gr.HTML(elem_id="counters")
        with gr.Tab("Benchmark", elem_id="tab-bench"):
            bench_tab.build(app)
        with gr.Tab("Arena", elem_id="tab-arena"):
            arena_tab.build(app)
        with gr.Tab("Same distribution?", elem_id="tab-samedist"):
            samedist_tab.build(app, controls)
        with gr.Tab("Why it pays here", elem_id="tab-lesson"):
            figure, text = lesson_views(app)
            plot = gr.Plot(figure, show_label=False, elem_id="lesson-plot")
            words = gr.HTML(text, elem_id="lesson-text")
            gr.HTML('<div class="muted small">After each answer, the line under its speedup gives its acceptance '
                    'a, its round\'s cost c, the formula\'s prediction beside the measured speedup and the '
                    'acceptance at which speculation breaks even on this machine.</div>')
            formula_play.build(session)
    return plot, words


def build(state: AppState, remote=None) -> gr.Blocks:
    """The whole page for this app state (models, engine, scheduler shared by every browser session); with
    `remote` (ui/remote_page.py RemotePage) the chat talks to that server instead."""
    with gr.Blocks(title="Speculative decoding playground", fill_width=True, delete_cache=DELETE_CACHE) as demo:
        # every tab's value is a deep copy of this one: what must differ per tab (its prefix-cache salt) is drawn
        # at its first turn (SessionState.salt)
        session = gr.State(SessionState(), delete_callback=lambda s: close_turn(state, s),
                           time_to_live=SESSION_TTL_S)
        state.remote = remote if remote is not None else state.remote
        c, controls = sidebar_controls(state)
        gr.HTML(header_html())
        c["remote_header"] = gr.HTML(remote_header_html(state.remote) if state.remote is not None else "",
                                     elem_id="remote-header")
        v: dict = {}
        with gr.Row(equal_height=False):
            with gr.Column(scale=6, min_width=480):
                w = chat_column(load_examples(), v)
            with gr.Column(scale=5, min_width=420):
                stats_column(v)
        lesson_outputs = detail_tabs(v, state, controls, session)
        wire(state, demo, session, c, controls, v, w, remote)
        demo.load(lambda: lesson_views(state), None, list(lesson_outputs), show_progress="hidden")
    return demo


def wire_remote(app: AppState, c: dict) -> None:
    """The sidebar's remote-server field (local-only apps): the chat's server, and the header that names it."""
    def on_remote(url):
        status = handlers.connect_remote(app, url)
        return status, remote_header_html(app.remote) if app.remote is not None else ""

    c["remote_go"].click(on_remote, c["remote_url"], [c["remote_status"], c["remote_header"]],
                         concurrency_limit=1, show_progress="hidden")


def wire(app: AppState, demo: gr.Blocks, session: gr.State, c: dict, controls: dict, v: dict, w: dict,
         remote=None) -> None:
    """Event handlers. Each is a thin closure over the app state around ui.handlers."""
    outputs = [v[name] for name in VIEWS] + [w["msg"]]

    def wired(values: tuple) -> tuple:
        return wire_values(outputs, values)

    def on_send(request: gr.Request, s, text, stepping, *values):
        s.visitor = app.visitor(request)
        values = dict(zip(controls, values))
        page = app.remote  # read at each send: the page's remote field may have changed it
        turn = (handlers.send(app, s, text, stepping, values) if page is None
                else handlers.remote_send(app, page, s, text, values))
        for update in turn:
            yield wired(update)

    def on_open(request: gr.Request, s):
        s.visitor = app.visitor(request)
        if request is not None and request.session_hash:
            app.opened(request.session_hash, s, time.monotonic())  # so a closed tab's slot can be freed
        return wired(handlers.pack(all_views(app, s, force_charts=True), s))

    def on_close(request: gr.Request):
        s = app.closed(getattr(request, "session_hash", None))
        if s is not None:
            close_turn(app, s)

    inputs = [session, w["msg"], w["step_mode"]] + list(controls.values())
    # the scheduler, not Gradio, limits sessions; the handlers postprocess their views themselves (ui/wire.py)
    stream = dict(concurrency_limit=None, show_progress="hidden", postprocess=False)
    # one event for both triggers: while its answer streams, another Enter or Send click is dropped by the
    # page instead of racing it to start a second turn
    gr.on([w["send"].click, w["msg"].submit], on_send, inputs, outputs, trigger_mode="once", api_name="send",
          **stream)
    for btn, ex in w["examples"]:
        btn.click(example_filler(ex), None, [w["msg"], c["format"], c["format_text"]],
                  show_progress="hidden").then(on_send, inputs, outputs, **stream)
    def on_advice(request: gr.Request, s, *values):
        s.visitor = app.visitor(request)
        for update in handlers.try_advice(app, s, dict(zip(controls, values))):
            yield wired(update)

    w["advise"].click(on_advice, [session] + list(controls.values()), outputs, api_name="advice", **stream)
    w["stop"].click(lambda s: wired(handlers.stop(app, s)), session, outputs, api_name="stop", **stream)
    w["step"].click(lambda s: wired(handlers.step(app, s)), session, outputs, api_name="step", **stream)
    w["clear"].click(lambda s: wired(handlers.clear(app, s)), session, outputs, api_name="clear", **stream)
    named = ("types", "n_max", "n_min", "p_min_own", "p_min", "adaptive", "tree_nodes")
    c["preset"].input(lambda name: handlers.choose_preset(app, name), c["preset"],
                      [controls[k] for k in named] + [c["preset_note"]], show_progress="hidden")
    w["show_rej"].change(handlers.show_rejected, [session, w["show_rej"]], v["chat"], show_progress="hidden")
    wire_remote(app, c)
    c["load"].click(lambda t, d, types: handlers.load(app, t, d, types), [c["target"], c["draft"], controls["types"]],
                    [c["model_status"], controls["types"]], concurrency_limit=1, api_name="load_models")
    demo.load(on_open, session, outputs, show_progress="hidden", postprocess=False)
    demo.unload(on_close)
