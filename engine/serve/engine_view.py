"""What the page reads of an engine: the `Engine` (engine/serve/engine.py) as the page types it.

The page (ui/) holds an engine only to show what it is and to ask it a few questions; it drives it through the
Scheduler. Typing it as this protocol instead of `object` says which of its names the page may read, and a
type checker holds the page to them: the rest of the engine (its slots, relay, budget) is not the page's.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol


class EngineView(Protocol):
    """The engine's names the page reads: its load and probe verdicts, its memory and cost curve for the status
    line and the bench, the drafters a load gave, and a plain generation for the presets' probe."""

    probe: Any  # engine.memory.probe.ProbeResult: whether and how the memory rolls back drafts
    ctx: Any  # engine.memory.context.ModelContext: its n_ctx and n_seq_max for the status line
    cost: Any  # engine.cost.curve.CostModel: the calibrated forward by rows, for the roofline
    threads: Any  # engine.serve.threads.ThreadGovernor: how many threads forwards run on
    load_check: Any  # engine.memory.self_check.SelfCheck: the load's check against transformers' forward
    draft_mismatch: str | None  # why the draft model's vocabulary is not the target's (None: it is)

    @property
    def draft_type(self) -> str | None: ...

    @property
    def prompt_limit(self) -> int: ...

    @property
    def supports_trees(self) -> bool: ...

    def drafter_params_of(self, name: str) -> Any: ...

    def generate(self, prompt: list[int], params: Any, seq: int | None = None) -> Iterator[Any]: ...
