"""The lossless check of a speculative run against the plain run with the same seed, and why some rows have none.

Plain decoding and sample-and-match verification take one uniform per emitted token from the same seeded
stream, so at any temperature a lossless speculative run reproduces the plain run token for token: the bench
compares tokens. Two kinds of run cannot be judged that way; their lossless_ok is "n/a" and never fails the run:

* rejection sampling (a drafter that gives its distribution q, at temperature > 0: draft-simple, draft-head)
  keeps a draft token with probability min(1, p/q) and draws a correction from norm(max(0, p - q)). Its output
  is distributed exactly as plain sampling's, but it draws other numbers from the stream, so the same seed
  gives other tokens. What it promises is a distribution, checked by `python -m engine.bench.dist`.
* synthetic acceptance keeps draft tokens whatever the target says: not lossless by design.
"""

from __future__ import annotations

from typing import Iterable

from engine.events import RoundEvent

NA = "n/a"

WHY_NA = {
    "rejection": "verified by rejection sampling: lossless in distribution, not token for token with the same "
                 "seed (check it with `python -m engine.bench.dist`)",
    "synthetic": "synthetic acceptance keeps tokens the target did not choose: not lossless by design",
    "other": "another implementation (transformers' generate in float32, llama.cpp on the GGUF's quantised "
             "weights): other numerics, other tokens; match_plain counts its leading tokens equal to our plain run's",
}


def verify_modes(events: Iterable[RoundEvent]) -> list[str]:
    """How the drafts of a run were verified ("match", "rejection", "synthetic"), each mode once."""
    return sorted({e.verify_mode for e in events if e.kind == "spec"})


def lossless_check(tokens: list[int], reference: list[int], events: list[RoundEvent],
                   synthetic: bool = False) -> bool | str:
    """True/False: the run's tokens equal the plain run's; NA where equal tokens are not what the run promises."""
    modes = verify_modes(events)
    if synthetic or "synthetic" in modes or "rejection" in modes:
        return NA
    return tokens == reference


def why_na(row: dict) -> str | None:
    """The reason a traces.csv row's lossless_ok is "n/a" (None for a checked row); rows read back hold strings."""
    if str(row.get("lossless_ok")) != NA:
        return None
    if row.get("spec_types") in ("hf-generate", "hf-prompt-lookup", "llama.cpp"):
        return "other"
    modes = str(row.get("verify_mode") or "").split(";")
    if "synthetic" in modes or row.get("synthetic_accept") not in (None, ""):
        return "synthetic"
    return "rejection" if "rejection" in modes else None
