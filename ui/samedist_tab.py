"""The "Same distribution?" tab: the claim that speculation changes only speed, checked on the page.

At temperature > 0 speculative decoding does not give plain decoding's text for a seed; it gives plain decoding's
distribution. A press of the button answers a short prompt N times speculatively (the sidebar's drafters, tree and
sampler) and N times plainly, through the app's scheduler like a chat, and shows the second answer token of each
side as bars with a chi-square test's p-value (engine/bench/samedist.py). Render functions are pure: a report in,
a figure and HTML out.
"""

from __future__ import annotations

import html

from engine import plotstyle
from ui.limits import text_bound
from ui.settings import settings_from
from ui.visitors import ShareExceeded

PROMPT = "Name one colour."
N_CHOICES = (100, 200, 500, 1000, 2000)
N_DEFAULT = 200
TOP = 12  # tokens shown as bars; the rest in one "other" bar


def figure(report, vocab) -> dict:
    """Side-by-side bars: each token's share among the speculative and the plain answers, the most frequent
    first, the rest pooled."""
    from ui.charts import layout

    if report is None:
        return dict(data=[], layout=layout("Second answer token: speculative and plain", plotstyle.axis("token"),
                                           plotstyle.axis("share of answers"),
                                           annotations=[plotstyle.message("press Sample both")]))
    n_spec, n_plain = sum(report.spec.values()), sum(report.plain.values())
    ranked = sorted(set(report.spec) | set(report.plain), key=lambda t: -(report.spec[t] + report.plain[t]))
    shown, rest = ranked[:TOP], ranked[TOP:]
    labels = [repr(vocab.raw(t)) if vocab is not None else f"#{t}" for t in shown] + (["other"] if rest else [])

    def shares(counts, n):
        return [counts[t] / n for t in shown] + ([sum(counts[t] for t in rest) / n] if rest else [])

    data = [dict(type="bar", name=f"speculative ({n_spec})", x=labels, y=shares(report.spec, n_spec),
                 marker=dict(color=plotstyle.GREEN), hovertemplate="%{x}: %{y:.1%}<extra>speculative</extra>"),
            dict(type="bar", name=f"plain ({n_plain})", x=labels, y=shares(report.plain, n_plain),
                 marker=dict(color=plotstyle.BLUE), hovertemplate="%{x}: %{y:.1%}<extra>plain</extra>")]
    return dict(data=data, layout=layout("Second answer token: speculative and plain", plotstyle.axis("token"),
                                         plotstyle.axis("share of answers", tickformat=".0%"), barmode="group",
                                         bargap=0.2))


def verdict_html(report, temp: float, drafters: list[str]) -> str:
    """The test's result in words, what it tested, and what a small p would mean."""
    n = sum(report.spec.values())
    if report.dof == 0:
        finding = "Every answer gave the same token on both sides: nothing to test at this temperature."
    elif report.p_value < 0.001:
        finding = (f"p = {report.p_value:.2g}: the two differ. A lossless verifier does not do this; "
                   f"report it with the settings.")
    else:
        finding = (f"p = {report.p_value:.3f}: {n} draws a side see no difference"
                   f"{' (p under 0.01 happens by chance about once in a hundred checks)' if report.p_value < 0.01 else ''}.")
    return (f'<div class="samedist"><p><b>{html.escape(finding)}</b></p>'
            f'<p class="muted">Chi-square test of homogeneity on the 2 x {report.dof + 1} table of tokens (rare '
            f'tokens pooled), {report.dof} degrees of freedom, chi2 = {report.chi2:.2f}. Temperature {temp:g}, '
            f'drafters {html.escape(", ".join(drafters) or "none")}. Of the speculative answers, '
            f'{report.n_verified} had their second token decided by a verification round and {report.n_accepted} '
            f'of those kept a draft token there. The sides use different seeds: independent samples, so the '
            f'texts differ and only the distributions are compared.</p></div>')


def run_check(app, visitor: str, values: dict, prompt: str, n: int, progress=None) -> tuple[object, str]:
    """(report or None, HTML): the comparison on the loaded model through its scheduler, counted against the
    visitor's share as a turn is."""
    from engine import SameDistPlan, compare_distributions, group_runner

    runtime = app.runtime
    if runtime is None:
        return None, '<div class="muted">No model is loaded: load a target model first.</div>'
    settings = settings_from(values)
    if not settings.types:
        return None, '<div class="muted">No drafter is chosen in the sidebar: nothing speculative to compare.</div>'
    try:
        params = settings.gen_params(speculative=True)
        params.client = visitor
        text = (prompt or "").strip() or PROMPT
        if len(text) > text_bound(runtime):
            raise ValueError(f"the prompt holds {len(text)} characters: more than the context can hold")
        ids = runtime.target.encode_chat([{"role": "user", "content": text}])
        plan = SameDistPlan(n=int(n), width=max(1, runtime.engine.ctx.n_seq_max))
        with app.limits.holding(visitor):
            report = compare_distributions(group_runner(runtime.scheduler), ids, params, plan, progress)
    except ShareExceeded as e:
        return None, f'<div class="notice notice-warn">Please wait: {html.escape(str(e))}.</div>'
    except (ValueError, RuntimeError) as e:
        return None, f'<div class="notice notice-warn">{html.escape(str(e))}</div>'
    return report, verdict_html(report, settings.temp, settings.types)


def build(app, controls: dict) -> None:
    """The tab's components and events; call inside a gr.Tab. controls: the sidebar's inputs by Settings field."""
    import gradio as gr

    from ui.charts import plotly_figure

    gr.Markdown("Speculative decoding at temperature > 0 promises the target's **distribution**, not its text for "
                "a seed. Sample both: N answers with the sidebar's drafters and sampler, N without, and compare "
                "their second token (the first one a verification decides). Set a temperature above 0 first.")
    with gr.Row():
        prompt = gr.Textbox(label="Prompt", value=PROMPT, lines=1, scale=4, elem_id="samedist-prompt")
        n = gr.Dropdown(list(N_CHOICES), value=N_DEFAULT, label="Answers a side", scale=1, elem_id="samedist-n")
        run = gr.Button("Sample both", variant="primary", scale=1, elem_id="samedist-run")
    plot = gr.Plot(plotly_figure(figure(None, None)), show_label=False, elem_id="samedist-plot")
    verdict = gr.HTML(elem_id="samedist-verdict")

    # gradio hands Progress only to a positional parameter: it comes before the sidebar's values
    def on_run(request, text, count, progress=gr.Progress(), *values):
        def tick(done: int, total: int) -> None:
            progress(done / total, desc=f"{done}/{total} answers")

        report, words = run_check(app, app.visitor(request), dict(zip(controls, values)), text, count, tick)
        vocab = app.runtime.vocab if app.runtime is not None else None
        return (plotly_figure(figure(report, vocab)) if report is not None else gr.skip()), words

    on_run.__annotations__ = {"request": gr.Request}
    run.click(on_run, [prompt, n] + list(controls.values()), [plot, verdict], concurrency_limit=2,
              api_name="same_distribution")
