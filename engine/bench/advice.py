"""What would pay most for a prompt on this machine, predicted from a speculative and a plain run of it.

For each drafter that drafted in the speculative run, and each draft length k, a chain round would emit
1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens (a_i: that drafter's measured acceptance at draft position i given
the ones before were kept; positions it never reached count as refused), and cost a forward of k + 1 rows
(this machine's curve, engine/cost/roofline.py), the drafter's measured time per drafted token times k, and
what a plain step spends beside its forward, all scaled by how much dearer the run's own rounds ran than
that model of them. A drafter finds something to propose in only some rounds (an n-gram needs a match): with f
the share of rounds it drafted among those it was asked in (the rounds it won and those where no drafter had
anything), a round averages f tokens(k) + (1 - f) tokens for f cost(k) + (1 - f) plain steps. Its speedup is
the tokens over that cost in plain steps. The best pair wins, or plain decoding where none reaches 1. Trees are not predicted: the advice is a chain, as llama.cpp drafts.

A run here is anything with `events` (the RoundEvents of one generation, prefill first) and `decode_seconds`
(wall time from the end of the prefill round to the end of the last round): the page's record and the bench's.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.draft.stats import stats_from_events

K_MAX = 16  # the longest draft the advisor weighs
PAYS = 1.02  # a predicted speedup below this is called no gain: the prediction's own noise is larger


@dataclass(frozen=True)
class Advice:
    drafter: str | None  # None: plain decoding
    n_max: int  # draft tokens a round at most (0 with plain decoding)
    predicted: float  # speedup over plain decoding the numbers predict
    why: str  # one sentence


def decode_seconds(events) -> float:
    """From the end of the prefill round to the end of the last round (perf_counter stamps of the engine)."""
    ends = [ev.t_end for ev in events if ev.kind != "prefill" and ev.t_end]
    start = [ev.t_end for ev in events if ev.kind == "prefill" and ev.t_end]
    return max(ends) - start[0] if ends and start else 0.0


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
    """How much dearer this run's rounds ran than the load's curve says (the machine busier, the context
    longer): its measured time per round over the modelled one, 1 without rounds."""
    rounds = [ev for ev in spec.events if ev.kind != "prefill" and ev.emitted]
    if not rounds or not spec.decode_seconds:
        return 1.0
    modelled = sum(roof.ratio(len(ev.drafted) + 1) * roof.seconds[0] * 1e3 + ev.t_draft_ms + beside_ms
                   for ev in rounds) / len(rounds)
    return spec.decode_seconds * 1e3 / len(rounds) / modelled if modelled > 0 else 1.0


def advise(spec, plain, roof) -> Advice | None:
    """The best chain setting for this prompt here, from the two runs; None without the numbers. The curve's
    costs are scaled to what the speculative run's own rounds took (`anchor`)."""
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
        acceptance, f = stats.acc_rate_pos_conditional(), coverage(spec.events, name)
        per_token = draft_ms_per_token(spec.events, name)
        for k in range(1, min(K_MAX, max(len(acceptance), 1)) + 1):
            cost = (roof.ratio(k + 1) * roof.seconds[0] * 1e3 + per_token * k + beside_ms) * scale / step_ms
            tokens = f * chain_tokens(acceptance, k) + (1 - f)
            predicted = tokens / (f * cost + (1 - f))
            if predicted > best.predicted * (1 + 1e-9) and predicted >= PAYS:
                best = Advice(name, k, predicted, f"{name} alone with n_max {k}: it drafts in {f:.0%} of rounds, "
                                                  f"{chain_tokens(acceptance, k):.2f} tokens a drafted round for "
                                                  f"{cost:.2f} plain steps")
    return best


def coverage(events, drafter: str) -> float:
    """The share of rounds the drafter drafted in, of those it was asked in: the rounds it won and those in
    which no drafter proposed anything (a drafter before it in the chain may have taken the others)."""
    rounds = [ev for ev in events if ev.kind != "prefill" and ev.emitted]
    won = sum(1 for ev in rounds if ev.drafter == drafter and ev.drafted)
    idle = sum(1 for ev in rounds if not ev.drafted)
    return won / (won + idle) if won else 0.0
