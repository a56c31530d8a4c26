"""The page's views postprocessed in the handler's thread (ui/wire.py) are what Gradio's own postprocess sends."""

from __future__ import annotations

import pytest

gr = pytest.importorskip("gradio")

from ui.charts import plotly_figure  # noqa: E402
from ui.wire import wire_values  # noqa: E402


def test_values_are_what_gradios_postprocess_gives():
    with gr.Blocks():
        html, plot, box = gr.HTML(), gr.Plot(), gr.Textbox()
    figure = plotly_figure({"data": [{"type": "bar", "x": [1, 2], "y": [3, 4]}], "layout": {}})
    out = wire_values([html, plot, box], ("<b>hi</b>", figure, "text"))
    assert out[0] == "<b>hi</b>" and out[2] == "text"
    assert out[1] == plot.postprocess(figure).model_dump()
    assert out[1]["type"] == "plotly" and '"data"' in out[1]["plot"]


def test_skips_and_updates_are_left_to_gradio():
    with gr.Blocks():
        html, plot = gr.HTML(), gr.Plot()
    skip, update = gr.skip(), gr.update(visible=False)
    assert wire_values([html, plot], (skip, update)) == (skip, update)


def test_a_count_that_does_not_match_the_outputs_is_refused():
    with gr.Blocks():
        html = gr.HTML()
    with pytest.raises(ValueError, match="2 values for 1 outputs"):
        wire_values([html], ("a", "b"))
