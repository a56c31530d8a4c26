"""The advisor's suggestion under an answer: the arithmetic is engine/bench/advice.py's, over the page's
compared runs (its records carry `events` and `decode_seconds` as that module asks)."""

from __future__ import annotations

from engine import Advice, advise, anchor, chain_tokens

__all__ = ["Advice", "advice_html", "advise", "anchor", "chain_tokens"]


def advice_html(advice: Advice | None, measured: float | None = None) -> str:
    """The advice under an answer's explanation; with `measured`, the prediction against the result."""
    if advice is None:
        return ""
    if advice.drafter is None:
        head = f"<b>Advice here:</b> {advice.why}."
    else:
        head = (f"<b>Advice here:</b> {advice.why}, predicted <b>{advice.predicted:.2f}&times;</b> "
                f"(Try the advice runs it).")
    result = "" if measured is None else (f" Run with it: <b>{measured:.2f}&times;</b> measured against "
                                          f"{advice.predicted:.2f}&times; predicted.")
    return f'<div class="lesson advice">{head}{result}</div>'
