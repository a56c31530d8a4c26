"""The Arena tab: every drafter alone, the page's starting chain and an oracle on one prompt, ranked.

It is `python -m engine.bench.arena` on the loaded models (the same leaderboard, CSV and PNG). Like the
Benchmark tab's live run it goes through the app's Scheduler like a chat session: chats keep going, share its
forwards and slow its timings; it never owns the engine, and one arena runs at a time.
"""

from __future__ import annotations

import html
from pathlib import Path

from engine import (ARENA_POSITIONS, ArenaParams, LiveBenchError, arena_leaderboard, run_arena, scheduler_runner,
                    write_arena_csv, write_arena_png)
from ui.limits import text_bound
from ui.visitors import ShareExceeded

DEFAULT_PROMPT = ("Repeat the following list exactly, one item a line: red apple, green pear, yellow banana, "
                  "purple plum, orange peach, red cherry, green grape, yellow lemon.")
HEADERS = (["#", "drafter", "tokens/forward", "acceptance"] + [f"d{i}" for i in range(1, ARENA_POSITIONS + 1)]
           + ["speedup", "draft ms", "forward ms", "other ms", "lossless"])
KEYS = (["rank", "drafter", "tokens_per_forward", "accept_rate"]
        + [f"acc_pos_{i}" for i in range(1, ARENA_POSITIONS + 1)]
        + ["speedup", "draft_ms", "forward_ms", "other_ms", "lossless"])


def table(rows: list[dict]) -> list[list]:
    """The leaderboard as the table's rows, in HEADERS' order ("" where a contender has no value)."""
    return [[r.get(k, "") for k in KEYS] for r in rows]


def run_arena_tab(app, prompt: str, n_max: int = 8, max_new_tokens: int = 64,
                  progress=None) -> tuple[list[dict], str, Path | None, Path | None]:
    """The arena on the loaded models through their scheduler: (leaderboard rows, note, CSV path, PNG path)."""
    from ui.settings import full_chain

    runtime = app.runtime
    eagle3 = getattr(getattr(app, "options", None), "eagle3", None)  # an EAGLE-3 head given as --draft
    dflash = getattr(getattr(app, "options", None), "dflash", None)  # a DFlash or DSpark checkpoint given so
    if runtime is None:
        return [], "No model is loaded: load a target model first.", None, None
    engine = runtime.engine
    if not engine.probe.can_speculate:
        return [], f"Speculation is off for this model: {engine.probe.reason}", None, None
    text = (prompt or "").strip() or DEFAULT_PROMPT
    if len(text) > text_bound(runtime):
        return [], f"The prompt holds {len(text)} characters: more than the context can hold.", None, None
    ids = runtime.target.encode_chat([{"role": "user", "content": text}])
    capacity = engine.limits.per_seq - 1  # draft rows the shared engine holds per slot
    params = ArenaParams(n_max=max(1, min(int(n_max), capacity)), max_new_tokens=max(1, int(max_new_tokens)),
                         chain=full_chain(runtime, eagle3), eagle3=eagle3, dflash=dflash)
    try:
        result = run_arena(scheduler_runner(runtime.scheduler), [ids], runtime.target, runtime.draft, params,
                           progress)
    except LiveBenchError as e:
        return [], f"Arena stopped: {e}", None, None
    rows = arena_leaderboard(result)
    out = app.run_folders.new("arena")
    csv_path, png_path = write_arena_csv(rows, out / "arena.csv"), write_arena_png(rows, out / "arena.png")
    skipped = "; ".join(result.skipped)
    note = (f"{runtime.target.name}: {len(rows)} runs of {len(ids)} prompt tokens, n_max {params.n_max}, up to "
            f"{params.max_new_tokens} tokens, greedy; chain = {', '.join(params.chain)}. Shared with any chat "
            f"running meanwhile." + (f" Not run: {skipped}." if skipped else ""))
    return rows, note, csv_path, png_path


def note_html(note: str) -> str:
    return f'<div class="muted">{html.escape(note)}</div>'


def build(app) -> None:
    """The tab's components and events; call inside a gr.Tab of the page's Blocks."""
    import gradio as gr

    from ui.charts import arena_figure, plotly_figure

    gr.Markdown("Which drafter would serve this prompt best? Each drafter runs alone, then the starting chain, "
                "then an **oracle** that drafts the plain answer itself (the ceiling), all greedy and checked "
                "against plain decoding token for token. Runs share the engine with the chats "
                "(`python -m engine.bench.arena` does the same on a prompts file).")
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=DEFAULT_PROMPT, lines=2, scale=4, elem_id="arena-prompt")
        with gr.Column(scale=1, min_width=160):
            n_max = gr.Slider(1, 16, value=8, step=1, label="n_max", elem_id="arena-n-max")
            max_new = gr.Slider(8, 256, value=64, step=8, label="max new tokens", elem_id="arena-max-new")
    run = gr.Button("Run the arena", variant="primary", elem_id="arena-run")
    note = gr.HTML(note_html("Press Run the arena: about one answer per drafter."), elem_id="arena-note")
    board = gr.Dataframe(headers=HEADERS, value=[], interactive=False, wrap=True, elem_id="arena-table")
    chart = gr.Plot(plotly_figure(arena_figure([], ARENA_POSITIONS)), show_label=False, elem_id="arena-chart")
    with gr.Row():
        csv_file = gr.DownloadButton("Download arena.csv", value=None, elem_id="arena-csv")
        png_file = gr.DownloadButton("Download arena.png", value=None, elem_id="arena-png")

    def on_run(request, text, k, n_new, progress=gr.Progress()):
        def tick(done: int, total: int, what: str) -> None:
            progress(done / total, desc=f"run {done + 1}/{total}: {what}")

        try:
            with app.limits.holding(app.visitor(request)):  # counts against the visitor's share, as a turn does
                rows, message, csv_path, png_path = run_arena_tab(app, text, k, n_new, tick)
        except ShareExceeded as e:
            rows, message, csv_path, png_path = [], f"Please wait: {e}.", None, None
        if not rows:
            gr.Warning(message)
        return (note_html(message), table(rows), plotly_figure(arena_figure(rows, ARENA_POSITIONS)),
                str(csv_path) if csv_path else gr.skip(), str(png_path) if png_path else gr.skip())

    # gradio is imported here, not at the module's top: the annotation that asks for the request is the class
    on_run.__annotations__ = {"request": gr.Request}
    run.click(on_run, [prompt, n_max, max_new], [note, board, chart, csv_file, png_file],
              concurrency_limit=1, api_name="arena")  # one arena at a time
