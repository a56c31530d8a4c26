"""What would pay most for this prompt on this machine, predicted from an answer that was compared.

For each drafter that drafted in the answer, and each draft length k, a chain round would emit
1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens (a_i: that drafter's measured acceptance at draft position i given
the ones before were kept; positions it never reached count as refused), and cost a forward of k + 1 rows
(this machine's curve, engine/cost/roofline.py), the drafter's measured time per drafted token times k, and
what a plain step spends beside its forward, all scaled by how much dearer the answer's own rounds ran than
that model of them. Its speedup is the tokens over that cost in plain steps. The best pair wins, or plain
decoding where none reaches 1. Trees are not predicted: the advice is a chain, as
llama.cpp drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ui.charts import stats_from_events

K_MAX = 16  # the longest draft the advisor weighs
PAYS = 1.02  # a predicted speedup below this is called no gain: the prediction's own noise is larger


@dataclass(frozen=True)
class Advice:
    drafter: str | None  # None: plain decoding
    n_max: int  # draft tokens a round at most (0 with plain decoding)
    predicted: float  # speedup over plain decoding the numbers predict
    why: str  # one sentence


def chain_tokens(acceptance: list[float], k: int) -> float:
    """Tokens a round emits on average with drafts of k: the target's own plus each draft token kept."""
    tokens, kept = 1.0, 1.0
    for i in range(k):
        kept *= acceptance[i] if i < len(acceptance) else 0.0
        tokens += kept
    return tokens


def draft_ms_per_token(events, drafter: str) -> float:
    """The drafter's time per token it proposed, over the rounds it won."""
    won = [ev for ev in events if ev.drafter == drafter and ev.drafted]
    n = sum(len(ev.drafted) for ev in won)
    return sum(ev.t_draft_ms for ev in won) / n if n else 0.0


def anchor(spec, roof, beside_ms: float) -> float:
    """How much dearer this answer's rounds ran than the load's curve says (the machine busier, the context
    longer): its measured time per round over the modelled one, 1 without rounds."""
    rounds = [ev for ev in spec.events if ev.kind != "prefill" and ev.emitted]
    if not rounds or not spec.decode_seconds:
        return 1.0
    modelled = sum(roof.ratio(len(ev.drafted) + 1) * roof.seconds[0] * 1e3 + ev.t_draft_ms + beside_ms
                   for ev in rounds) / len(rounds)
    return spec.decode_seconds * 1e3 / len(rounds) / modelled if modelled > 0 else 1.0


def advise(spec, plain, roof) -> Advice | None:
    """The best chain setting for this prompt here, from the compared runs; None without the numbers. The
    curve's costs are scaled to what this answer's own rounds took (`anchor`)."""
    steps = [ev for ev in plain.events if ev.kind != "prefill" and ev.emitted]
    if roof is None or not roof.rows or not steps or not plain.decode_seconds:
        return None
    step_ms = plain.decode_seconds * 1e3 / len(steps)
    beside_ms = max(0.0, step_ms - roof.seconds[0] * 1e3)  # a plain step's time outside its forward
    scale = anchor(spec, roof, beside_ms)
    best = Advice(None, 0, 1.0, "plain decoding: no drafter's acceptance here pays for its rows on this machine")
    for name, stats in sorted(stats_from_events(spec.events).items()):
        if name == "oracle":
            continue
        acceptance = stats.acc_rate_pos_conditional()
        per_token = draft_ms_per_token(spec.events, name)
        for k in range(1, min(K_MAX, max(len(acceptance), 1)) + 1):
            cost = (roof.ratio(k + 1) * roof.seconds[0] * 1e3 + per_token * k + beside_ms) * scale
            predicted = chain_tokens(acceptance, k) * step_ms / cost
            if predicted > best.predicted * (1 + 1e-9) and predicted >= PAYS:
                best = Advice(name, k, predicted, f"{name} alone with n_max {k}: {chain_tokens(acceptance, k):.2f} "
                                                  f"tokens a round for {cost / step_ms:.2f} plain steps")
    return best


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
