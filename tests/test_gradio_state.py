"""Gradio's per-visitor state built lazily (ui/gradio_state.py) equals Gradio's own, and costs nothing until read."""

from __future__ import annotations

import pytest

pytest.importorskip("gradio")

from gradio.blocks import BlocksConfig  # noqa: E402
from gradio.state_holder import SessionState, StateHolder  # noqa: E402

from ui.gradio_state import LazySessionState, LazyStateHolder, use_lazy_sessions  # noqa: E402


@pytest.fixture(scope="module")
def page():
    from ui.app import build
    from ui.state import AppOptions, AppState

    return build(AppState(runtime=None, options=AppOptions(parallel=1)))


def test_the_lazy_state_has_gradios_attributes_and_configs(page):
    eager, lazy = SessionState(page), LazySessionState(page)
    assert set(vars(lazy)) == set(vars(eager))
    assert lazy.STATE_TTL_WHEN_CLOSED == eager.STATE_TTL_WHEN_CLOSED
    assert len(lazy.config_values) == len(eager.config_values) > 50
    assert list(lazy.components) == list(eager.components)
    assert dict(lazy.config_values.items()) == eager.config_values


def test_a_new_visitor_builds_no_config_until_one_is_read(page, monkeypatch):
    calls = []
    real = BlocksConfig.config_for_block
    monkeypatch.setattr(BlocksConfig, "config_for_block",
                        staticmethod(lambda *a, **k: calls.append(a[0]) or real(*a, **k)))
    lazy, eager = LazySessionState(page), SessionState(page)
    calls.clear()
    keys = [k for k, b in page.blocks.items() if hasattr(b, "value") and not b.stateful][:3]
    for i, key in enumerate(keys):  # what Gradio does with every input and output of every request
        for state in (lazy, eager):
            state._update_value_in_config(key, f"written {i}")
            state._update_value_in_config(key, f"written again {i}")
    assert calls == [] and all(key in lazy.config_values for key in keys)
    assert lazy.config_values[keys[0]]["props"]["value"] == "written again 0" and calls == [keys[0]]
    assert list(lazy.components) == list(eager.components)


def test_an_output_updated_with_new_props_gets_gradios_config(page):
    """Gradio's postprocess of gr.update(...) / gr.skip(): a new component in the session, its config rebuilt,
    the value written in."""
    key = next(k for k, b in page.blocks.items() if type(b).__name__ == "Textbox")
    lazy, eager = LazySessionState(page), SessionState(page)
    for state in (lazy, eager):
        state._update_value_in_config(key, "before")
        state[key] = type(page.blocks[key])(value="replaced", label="new", render=False)
        state._update_config(key)
        state._update_value_in_config(key, "after")
    assert lazy.config_values[key] == eager.config_values[key]
    assert lazy.config_values[key]["props"]["label"] == "new"
    assert lazy.config_values[key]["props"]["value"] == "after"
    assert dict(lazy.config_values.items()) == eager.config_values


def test_the_holder_hands_out_lazy_states_and_keeps_the_sessions_it_replaces(page):
    class Server:
        state_holder = StateHolder()

    server = Server()
    server.state_holder.set_blocks(page)
    before = server.state_holder["early"]
    use_lazy_sessions(server)
    holder = server.state_holder
    assert isinstance(holder, LazyStateHolder) and page.state_holder is holder
    assert holder["early"] is before
    late = holder["late"]
    assert isinstance(late, LazySessionState) and holder["late"] is late
    assert list(holder.session_data) == ["early", "late"]
