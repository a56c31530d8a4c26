"""What each drafter cost and gained in one answer, and why the gate or the budget left it out of a round.

A drafter pays when the tokens it adds to a round are worth more than its drafting time and the rows it adds
to the forward. The llama.cpp counters give its time and its accepted tokens; the answer's events give the
rounds it won, what each of them emitted, and the reasons a round was drafted without it (the gate's estimate
of what only it finds against what it costs, a rest after refused drafts, the budget's veto).
"""

from __future__ import annotations

import html
from dataclasses import dataclass


@dataclass
class DrafterCost:
    name: str
    ms_per_round: float  # its drafting time per round it was asked in
    rounds_won: int  # rounds verified on its draft (chains) or credited to it (trees)
    tokens_per_forward: float  # tokens those rounds emitted, per round (1 = only the target's own)
    rounds_out: int  # rounds of this answer drafted without it, and the latest reason
    why_out: str


def left_out(events: list) -> dict[str, list[str]]:
    """drafter -> the reasons, round by round, the answer's events give for drafting without it."""
    out: dict[str, list[str]] = {}
    for ev in events:
        for reason in getattr(ev, "not_drafted", []):
            out.setdefault(reason.split(":", 1)[0], []).append(reason)
    return out


def drafter_costs(seq_stats: dict, events: list) -> list[DrafterCost]:
    """One row per drafter of the answer's chain."""
    won: dict[str, list[int]] = {}
    for ev in events:
        if getattr(ev, "kind", "") == "spec" and ev.drafter:
            won.setdefault(ev.drafter, []).append(len(ev.emitted))
    out = left_out(events)
    rows = []
    for name, s in seq_stats.items():
        emitted = won.get(name, [])
        reasons = out.get(name, [])
        ms = s.t_draft_us / 1e3 / s.n_call_draft if s.n_call_draft else 0.0
        per_forward = sum(emitted) / len(emitted) if emitted else 0.0
        rows.append(DrafterCost(name=name, ms_per_round=ms, rounds_won=len(emitted), tokens_per_forward=per_forward,
                                rounds_out=len(reasons), why_out=reasons[-1] if reasons else ""))
    return rows


def drafter_costs_html(seq_stats: dict, events: list) -> str:
    rows = drafter_costs(seq_stats or {}, events)
    if not rows:
        return ""
    body = "".join(
        f"<tr><td>{html.escape(r.name)}</td><td>{r.ms_per_round:.2f}</td><td>{r.rounds_won}</td>"
        f"<td>{r.tokens_per_forward:.2f}</td><td>{r.rounds_out}</td><td>{html.escape(r.why_out)}</td></tr>"
        for r in rows)
    return ('<table class="drafter-costs"><thead><tr><th>drafter</th><th>ms drafting / round</th>'
            '<th>rounds won</th><th>tokens / forward in them</th><th>rounds left out</th><th>latest reason</th>'
            f'</tr></thead><tbody>{body}</tbody></table>')
