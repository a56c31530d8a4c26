"""The Benchmark tab: the speedup curves from a traces.csv, its download, and a small live run on the loaded model.

The pictures are engine.bench.plot's figures (the same ones `python -m engine.bench --plots` writes), so what
the tab shows and what the bench writes cannot drift apart. The live run goes through the app's Scheduler
like a chat session (engine.bench.live): concurrent chats keep going and share its forwards, which also makes
its timings noisier than the command-line bench's. Render functions are pure: rows in, figures / HTML out.
"""

from __future__ import annotations

import csv
import html
from pathlib import Path

from engine import FIGURES, figures, load_rows, sweep_summary, write_rows
from ui.limits import text_bound
from ui.visitors import ShareExceeded

SHIPPED = Path(__file__).resolve().parent.parent / "assets" / "bench" / "traces.csv"
LIVE_PROMPT = ("Repeat the following list exactly, one item a line: red apple, green pear, yellow banana, "
               "purple plum, orange peach, red cherry, green grape, yellow lemon.")
TITLES = {"speedup_concurrency": "speedup vs concurrency", "speedup_acceptance": "speedup vs acceptance",
          "acceptance_position": "acceptance by position", "plain_scaling": "plain slots"}


def read_traces(path: str | Path | None) -> tuple[list[dict], str]:
    """Rows of a traces.csv and a one-line note; a missing or unreadable file gives no rows and says why."""
    if not path:
        return [], "No traces.csv: run `scripts/bench_curves.sh`, upload one, or press Run."
    p = Path(path)
    try:
        rows = load_rows(p)
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return [], f"Cannot read {p.name}: {e}"
    if rows and "spec_decode" not in rows[0]:
        return [], f"{p.name} is not a traces.csv from python -m engine.bench (no spec_decode column)"
    return rows, f"{len(rows)} rows from {p.name}"


def summary_html(rows: list[dict], note: str) -> str:
    """The note, then the sweep's summary lines (plain scaling, speedups by concurrency, formula vs points)."""
    lines = sweep_summary(rows) if rows else []
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return (f'<div class="bench-summary"><div class="muted">{html.escape(note)}</div>'
            + (f"<ul>{items}</ul>" if items else "") + "</div>")


def tab_views(rows: list[dict], note: str) -> tuple:
    """(summary HTML, then one plotly figure dict per FIGURES entry): everything the tab redraws."""
    figs = figures(rows)
    return (summary_html(rows, note),) + tuple(figs[name] for name in FIGURES)


def write_traces(rows: list[dict], directory: str | Path) -> Path:
    """rows -> directory/traces.csv with the bench's columns (a download for the user)."""
    path = Path(directory) / "traces.csv"
    write_rows(rows, path)
    return path


def run_live_bench(app, prompt: str, progress=None) -> tuple[list[dict], str, Path | None]:
    """A small benchmark on the loaded model through its scheduler: (rows, note, CSV path or None)."""
    from engine import LiveBenchError, LivePlan, run_live

    runtime = app.runtime
    if runtime is None:
        return [], "No model is loaded: load a target model first.", None
    if not runtime.engine.probe.can_speculate:
        return [], f"Speculation is off for this model: {runtime.engine.probe.reason}", None
    text = (prompt or "").strip() or LIVE_PROMPT
    if len(text) > text_bound(runtime):
        return [], f"The prompt holds {len(text)} characters: more than the context can hold.", None
    ids = runtime.target.encode_chat([{"role": "user", "content": text}])
    plan = LivePlan(concurrency=[n for n in (1, 2) if n <= runtime.engine.ctx.n_seq_max])
    try:
        rows = run_live(runtime.scheduler, ids, plan, runtime.target, progress)
    except LiveBenchError as e:
        return [], f"Benchmark stopped: {e}", None
    path = write_traces(rows, app.run_folders.new("bench"))
    return rows, (f"live run on {runtime.target.name} in {runtime.target.dtype} ({runtime.target.dtype_reason}): "
                  f"{len(rows)} rows, concurrency {plan.concurrency}, "
                  f"k={plan.n_max}, {plan.max_new_tokens} tokens; shared with any chat running meanwhile"), path


def build(app) -> None:
    """The tab's components and events; call inside a gr.Tab of the page's Blocks."""
    import gradio as gr

    from ui.charts import plotly_figure

    shipped = SHIPPED if SHIPPED.is_file() else None
    rows, note = read_traces(shipped)
    views = tab_views(rows, note)
    gr.Markdown("When does speculation pay? Curves from a `traces.csv` of "
                "`python -m engine.bench` (shipped: `assets/bench/traces.csv`, made by `scripts/bench_curves.sh`), "
                "an uploaded one, or a short run on the loaded model.")
    with gr.Row():
        upload = gr.File(label="Show another traces.csv", file_types=[".csv"], type="filepath",
                         elem_id="bench-upload", scale=2)
        download = gr.DownloadButton("Download traces.csv", value=str(shipped) if shipped else None,
                                     elem_id="bench-download", scale=1)
    with gr.Row():
        prompt = gr.Textbox(label="Prompt of the live run", value=LIVE_PROMPT, lines=2, scale=4,
                            elem_id="bench-prompt")
        run = gr.Button("Run a small benchmark", variant="primary", elem_id="bench-run", scale=1)
    summary = gr.HTML(views[0], elem_id="bench-summary")
    plots = []
    for name, fig in zip(FIGURES, views[1:]):
        plots.append(gr.Plot(plotly_figure(fig), label=TITLES[name], elem_id=f"bench-{name.replace('_', '-')}"))

    def redraw(rows: list[dict], note: str, path) -> tuple:
        out = tab_views(rows, note)
        return (out[0],) + tuple(plotly_figure(f) for f in out[1:]) + (str(path) if path else gr.skip(),)

    def on_upload(path):
        rows, note = read_traces(path)
        return redraw(rows, note, path if rows else None)

    def on_run(request, text, progress=gr.Progress()):
        def tick(done: int, total: int, what: str) -> None:
            progress(done / total, desc=f"run {done + 1}/{total}: {what}")

        try:
            with app.limits.holding(app.visitor(request)):  # counts against the visitor's share, as a turn does
                rows, note, path = run_live_bench(app, text, tick)
        except ShareExceeded as e:
            rows, note, path = [], f"Please wait: {e}.", None
        if not rows:
            gr.Warning(note)
        return redraw(rows, note, path)

    outputs = [summary] + plots + [download]
    upload.upload(on_upload, upload, outputs)
    # gradio is imported here, not at the module's top: the annotation that asks for the request is the class
    on_run.__annotations__ = {"request": gr.Request}
    run.click(on_run, prompt, outputs, concurrency_limit=1)  # one live benchmark at a time
