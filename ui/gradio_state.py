"""Gradio's per-visitor state, built when it is read instead of all at once on the web server's thread.

Gradio makes a `SessionState` for each new browser tab or API client the first time it sends a request, on the
event loop that also carries every streaming answer. Its constructor writes a config for every block of the
page (`BlocksConfig.config_for_block`, which calls `inspect.signature` per block): about 6 ms for this page on
an idle machine, 10-20 ms while the engine decodes. Forty clients arriving at once made the streams wait over
a second for the web thread (a py-spy profile of the arrival: 309 of 458 samples of that thread holding the
GIL were in that constructor). The configs are read only for a deep link (`SessionState.components`) or when
a value of a block is written into them, so `LazySessionState` builds each on first use, and
`LazyStateHolder` hands those out. The resulting configs equal Gradio's own (tests/test_gradio_state.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from copy import copy

from gradio.components import State
from gradio.state_holder import SessionState, StateHolder

_UNSET = object()  # no value written into a block's config since it was last built


class LazyConfigs(dict):
    """The per-block configs of one session. A block's config is built from the session's current block when
    first read or listed; until then a value written into it is kept aside and put in when it is built."""

    def __init__(self, blocks_config, ids: list[int]):
        super().__init__()
        self._blocks_config = blocks_config
        self._order = list(ids)
        # block id -> the last value written since (_UNSET: none); the last only, since each write replaces the
        # one before and a streaming answer writes every view of every update
        self._pending: dict[int, object] = dict.fromkeys(ids, _UNSET)

    def stale(self, key: int) -> None:
        """The block changed: build its config again when next read (values written before it stay lost, as
        a rebuilt config in Gradio loses them too)."""
        dict.pop(self, key, None)
        self._pending[key] = _UNSET

    def write_value(self, key: int, value) -> bool:
        """Keep a value for a config not built yet; False when it is built (the caller writes it in)."""
        if key not in self._pending:
            return False
        self._pending[key] = value
        return True

    def _build(self, key: int) -> None:
        if key not in self._pending:
            return
        value = self._pending.pop(key)
        config = self._blocks_config.config_for_block(key, [], self._blocks_config.blocks[key])
        if value is not _UNSET and "props" in config:
            config["props"]["value"] = value
        dict.__setitem__(self, key, config)

    def _build_all(self) -> None:
        """Build what is left, then list the configs in the page's order, as Gradio's eager dict does."""
        if not self._pending:
            return
        for key in list(self._pending):
            self._build(key)
        ordered = {k: dict.__getitem__(self, k) for k in self._order if dict.__contains__(self, k)}
        later = {k: v for k, v in dict.items(self) if k not in ordered}
        dict.clear(self)
        dict.update(self, ordered)
        dict.update(self, later)

    def __missing__(self, key: int) -> dict:
        self._build(key)
        return dict.__getitem__(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self._pending or dict.__contains__(self, key)

    def __setitem__(self, key: int, value: dict) -> None:
        self._pending.pop(key, None)
        dict.__setitem__(self, key, value)

    def __len__(self) -> int:
        return dict.__len__(self) + sum(1 for k in self._pending if not dict.__contains__(self, k))

    def __iter__(self) -> Iterator[int]:
        self._build_all()
        return dict.__iter__(self)

    def get(self, key: int, default=None):
        return self[key] if key in self else default

    def keys(self):
        self._build_all()
        return dict.keys(self)

    def values(self):
        self._build_all()
        return dict.values(self)

    def items(self):
        self._build_all()
        return dict.items(self)


class LazySessionState(SessionState):
    """Gradio's SessionState, its block configs built on first use. Gradio writes every input's and output's
    value into the configs on every request and rebuilds the config of an output updated with gr.skip() or
    gr.update(); here those writes are kept aside until a config is read."""

    def __init__(self, blocks):
        super().__init__(_EmptyPage())  # every attribute and default of Gradio's, with no config to build
        self.blocks_config = copy(blocks.default_config)
        self.config_values = LazyConfigs(self.blocks_config,
                                         [k for k in self.blocks_config.blocks if k in blocks.blocks])

    def __setitem__(self, key: int, value) -> None:
        if isinstance(self.blocks_config.blocks.get(key), State):
            super().__setitem__(key, value)
            return
        if key in self.blocks_config.blocks:
            self.config_values.stale(key)
        self.blocks_config.blocks[key] = value

    def _update_config(self, key: int) -> None:
        if self[key] is not None:
            self.config_values.stale(key)

    def _update_value_in_config(self, key: int, value) -> None:
        if not self.config_values.write_value(key, value):
            super()._update_value_in_config(key, value)


class _EmptyConfig:
    blocks: dict = {}


class _EmptyPage:
    """What SessionState.__init__ reads of a page (its default config and its blocks), for a page of none."""

    default_config = _EmptyConfig()
    blocks: dict = {}


class LazyStateHolder(StateHolder):
    """Hands out LazySessionState; everything else (capacity, expiry, the lock) is Gradio's."""

    def __getitem__(self, session_id: str) -> SessionState:
        if session_id not in self.session_data:
            self.session_data[session_id] = LazySessionState(self.blocks)
        return super().__getitem__(session_id)


def use_lazy_sessions(server_app) -> None:
    """Swap a launched Gradio app's state holder for a LazyStateHolder, keeping any session it already holds."""
    old = server_app.state_holder
    holder = LazyStateHolder()
    holder.set_blocks(old.blocks)
    holder.session_data.update(old.session_data)
    holder.time_last_used.update(old.time_last_used)
    server_app.state_holder = holder
