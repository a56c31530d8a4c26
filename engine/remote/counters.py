"""A server's speculation counters read from its Prometheus `/metrics`, and their change over one answer.

Three name families carry the same four counters: llama-server's (`llamacpp:`), vLLM's (`vllm:`) and this
playground's (no prefix, ui/metrics.py). vLLM labels each sample by engine and model, so samples of one name
are summed over their other labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FAMILIES = ("llamacpp:", "vllm:", "")  # llama-server, vLLM, this playground
DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
ACCEPTED = "spec_decode_num_accepted_tokens_total"
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
# tokens given out, to tell whether anyone else's answer moved the counters between two scrapes
GENERATED = {"llamacpp:": "llamacpp:tokens_predicted_total", "vllm:": "vllm:generation_tokens_total",
             "": "generation_tokens_total"}

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text: str) -> list[tuple[str, dict, float]]:
    """(name, labels, value) of every sample line of Prometheus' text format; comments and bad lines skipped."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or line.startswith("#"):
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


@dataclass(frozen=True)
class SpecCounts:
    """One scrape's speculation counters, summed over the labels other than the draft position."""

    family: str  # the name prefix the server uses: "llamacpp:", "vllm:" or "" (this playground)
    drafts: float  # rounds that verified a non-empty draft
    draft_tokens: float  # draft tokens verified
    accepted: float  # draft tokens the target kept
    accepted_per_pos: tuple[float, ...]  # kept tokens by 0-based draft position (empty: not published)
    generated: float | None  # tokens given out (None: not published)


def read_counts(text: str) -> SpecCounts | None:
    """The counters of the first family present in `text`; None when the server publishes none (speculation
    off, or a server without them)."""
    samples = parse_samples(text)
    names = {name for name, _, _ in samples}
    for family in FAMILIES:
        if family + DRAFTS not in names:
            continue

        def total(name: str) -> float:
            return sum(v for n, _, v in samples if n == name)

        per_pos: dict[int, float] = {}
        for name, labels, value in samples:
            if name == family + PER_POS and labels.get("position", "").isdigit():
                pos = int(labels["position"])
                per_pos[pos] = per_pos.get(pos, 0.0) + value
        generated = GENERATED[family]
        return SpecCounts(family=family, drafts=total(family + DRAFTS), draft_tokens=total(family + DRAFT_TOKENS),
                          accepted=total(family + ACCEPTED),
                          accepted_per_pos=tuple(per_pos.get(i, 0.0) for i in range(max(per_pos, default=-1) + 1)),
                          generated=total(generated) if generated in names else None)
    return None


@dataclass(frozen=True)
class SpecDelta:
    """What the counters moved by between two scrapes: one answer's speculation when nobody else was served."""

    family: str  # as SpecCounts.family
    drafts: float  # rounds with a draft
    draft_tokens: float  # draft tokens verified
    accepted: float  # of those, kept
    accepted_per_pos: tuple[float, ...]  # kept tokens by 0-based draft position
    generated: float | None  # tokens given out meanwhile, every client's

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / draft tokens."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens a drafted round gives, the target's own (bonus) token counted, as vLLM
        logs it."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """accepted_per_pos[i] / drafts: the share of drafted rounds that kept a token at position i (vLLM's
        per-position rate; it falls along the draft, and also where drafts were shorter than i + 1)."""
        return tuple(a / self.drafts for a in self.accepted_per_pos) if self.drafts else ()


def delta(before: SpecCounts | None, after: SpecCounts | None) -> SpecDelta | None:
    """after - before; None when either scrape had no counters, the families differ, or a counter went down
    (the server restarted between them)."""
    if before is None or after is None or before.family != after.family:
        return None
    n = max(len(before.accepted_per_pos), len(after.accepted_per_pos))
    pad = (lambda xs: tuple(xs) + (0.0,) * (n - len(xs)))
    per_pos = tuple(a - b for a, b in zip(pad(after.accepted_per_pos), pad(before.accepted_per_pos)))
    moved = (after.drafts - before.drafts, after.draft_tokens - before.draft_tokens, after.accepted - before.accepted)
    if min(moved + per_pos, default=0.0) < 0:
        return None
    generated = (after.generated - before.generated
                 if after.generated is not None and before.generated is not None else None)
    return SpecDelta(before.family, *moved, accepted_per_pos=per_pos, generated=generated)
