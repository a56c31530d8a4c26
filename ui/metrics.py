"""/metrics: the engine's counters (engine/serve/metrics.py) in Prometheus' text format.

A collector reads the counters at each scrape, into a registry of the app's own (not prometheus_client's global
one, so two apps in one process, as in the tests, never mix). Counters take vLLM's spec_decode_* names; the
exposition adds `_total` to each. The speed is a gauge over the last finished generations (TPS_WINDOW), beside a
counter of the tokens given out, whose rate() over any window a dashboard can take instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ui.state import AppState


@dataclass(eq=False)  # the registry keeps its collectors in a dict: hashed by identity
class SpecCollector:
    app: AppState

    def collect(self):
        t = self.app.counters.snapshot()
        for name, value, doc in (
                ("spec_decode_num_drafts", t.drafts, "Rounds that verified a non-empty draft."),
                ("spec_decode_num_draft_tokens", t.draft_tokens, "Draft tokens proposed and verified."),
                ("spec_decode_num_accepted_tokens", t.accepted_tokens, "Draft tokens the target kept."),
                ("prompt_tokens", t.prompt_tokens, "Prompt tokens forwarded (a prefix reused from the cache is not)."),
                ("generation_tokens", t.generation_tokens, "Tokens given out, page and API alike.")):
            yield CounterMetricFamily(name, doc, value=value)
        per_pos = CounterMetricFamily("spec_decode_num_accepted_tokens_per_pos",
                                      "Draft tokens kept, by their position in the draft (0-based).",
                                      labels=["position"])
        for pos, n in enumerate(t.accepted_per_pos):
            per_pos.add_metric([str(pos)], n)
        yield per_pos
        yield GaugeMetricFamily("tokens_per_second", "Decode tokens per second over the last finished "
                                "generations (step mode left out).", value=t.tokens_per_second)
        yield from self.load()

    def load(self):
        runtime = self.app.runtime
        busy, waiting = runtime.scheduler.load() if runtime is not None else (0, 0)
        yield GaugeMetricFamily("slots_busy", "Slots generating now.", value=busy)
        yield GaugeMetricFamily("slots_total", "Slots of the engine (--parallel).", value=self.app.options.parallel)
        yield GaugeMetricFamily("requests_waiting", "Requests waiting in line for a slot.", value=waiting)


def registry_for(app: AppState) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SpecCollector(app))
    return registry


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """(body, content type) of a scrape."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
