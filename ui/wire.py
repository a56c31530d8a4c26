"""Page updates in the form Gradio sends them, made in the handler's own thread.

For an event with postprocessing on, Gradio turns each output value into what goes on the wire
(`Component.postprocess`) in a worker thread of its own, one hop from the web server's event loop to a thread
and back per output, one after the other. A streaming answer's update has eleven outputs; while forty requests
arrived, each of those hops waited its turn on the busy event loop, and the streams' handlers were resumed
0.9-1.3 s after their last update (scripts/arrival_burst.py, timed in the handler). The page's events that
update the views therefore run with `postprocess=False`, and their handlers return values already
postprocessed here, in the thread that made them: one hop per update instead of twelve.
"""

from __future__ import annotations

from gradio.data_classes import GradioModel, GradioRootModel
from gradio.utils import is_prop_update


def wire_values(components: list, values: tuple) -> tuple:
    """Each value as its component's postprocess gives it (a model as its dict); a gr.skip() or gr.update()
    stays as it is, for Gradio's own handling of component updates."""
    if len(values) != len(components):
        raise ValueError(f"{len(values)} values for {len(components)} outputs")
    out = []
    for component, value in zip(components, values):
        if is_prop_update(value):
            out.append(value)
            continue
        value = component.postprocess(value)
        out.append(value.model_dump() if isinstance(value, (GradioModel, GradioRootModel)) else value)
    return tuple(out)
