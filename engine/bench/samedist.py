"""Same distribution? One answer token from N speculative answers and N plain ones, side by side, with a test.

Speculative decoding at temperature > 0 does not promise plain decoding's text for a seed; it promises plain
decoding's distribution (Leviathan et al. 2023). This shows the promise where a student can see it: the same
prompt answered N times speculatively and N times plainly (seeds apart, so the two samples are independent), the
token at one position of each answer counted, and a chi-square test of homogeneity on the 2 x K table:

    chi2 = sum over sides s and tokens t of (n_st - E_st)^2 / E_st,   E_st = n_s * n_t / n,

with K - 1 degrees of freedom; p = P(chi2_{K-1} >= chi2) (the regularised upper incomplete gamma function,
Q((K - 1) / 2, chi2 / 2)). Tokens expected fewer than 5 times on a side are pooled into one category, the
test's usual condition. A small p (under 0.001) says the two differ; a large one says this many draws see no
difference. Position 2 is the first token a verification round decides (the first comes from the prefill).

The answers run `width` at a time in the engine's slots (one forward per round for all of them): through a
`Scheduler` for the page (shared with whoever is chatting), or on an `Engine` directly for tests and scripts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from engine.events import ErrorEvent, RoundEvent
from engine.params import GenParams

SEED_GAP = 1_000_003  # the plain side's seeds start this far after the speculative side's: independent samples
MIN_EXPECTED = 5.0  # a token expected fewer times than this on a side is pooled into "other"


@dataclass
class SameDistPlan:
    n: int = 500  # answers per side
    position: int = 2  # the answer token compared, from 1 (2: the first one a verification round decides)
    seed: int = 0  # the speculative side's seeds are seed..seed+n-1, the plain side's SEED_GAP later
    width: int = 4  # answers decoded together (at most the engine's slots)


@dataclass
class SameDistReport:
    spec: Counter = field(default_factory=Counter)  # token -> count among the speculative answers
    plain: Counter = field(default_factory=Counter)  # token -> count among the plain answers
    chi2: float = 0.0
    dof: int = 0
    p_value: float = 1.0
    n_verified: int = 0  # speculative answers whose compared token a round that verified a draft decided
    n_accepted: int = 0  # of those, the ones where it was a draft token the target kept


def chi2_homogeneity(a: Counter, b: Counter) -> tuple[float, int, float]:
    """(chi2, degrees of freedom, p) of the test that samples a and b come from one distribution; tokens expected
    fewer than MIN_EXPECTED times on a side pooled into one category (dropped if that one is still too rare)."""
    n_a, n_b = sum(a.values()), sum(b.values())
    if n_a == 0 or n_b == 0:
        raise ValueError("both samples need at least one draw")
    share = min(n_a, n_b) / (n_a + n_b)
    kept, other = [], (0, 0)
    for tok in set(a) | set(b):
        if (a[tok] + b[tok]) * share >= MIN_EXPECTED:
            kept.append((a[tok], b[tok]))
        else:
            other = (other[0] + a[tok], other[1] + b[tok])
    if sum(other) * share >= MIN_EXPECTED or (not kept and sum(other)):
        kept.append(other)
    if len(kept) < 2:
        return 0.0, 0, 1.0  # one category: both samples are all the same token
    n = n_a + n_b
    chi2 = 0.0
    for x_a, x_b in kept:
        for x, n_side in ((x_a, n_a), (x_b, n_b)):
            expected = n_side * (x_a + x_b) / n
            chi2 += (x - expected) ** 2 / expected
    dof = len(kept) - 1
    p = float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                      torch.tensor(chi2 / 2, dtype=torch.float64)))
    return chi2, dof, p


Runner = Callable[[list[tuple[list[int], GenParams]], int], list[list[RoundEvent]]]


def engine_runner(engine) -> Runner:
    """Run a group of generations on an engine directly (nothing else may use it meanwhile), each stopped once
    it has `position` tokens."""
    def run(group, position):
        seqs = [engine.start(prompt, params).seq for prompt, params in group]
        events: dict[int, list[RoundEvent]] = {seq: [] for seq in seqs}
        while engine.active():
            for ev in engine.step():
                if isinstance(ev, ErrorEvent):
                    raise RuntimeError(ev.message)
                events[ev.seq].append(ev)
                if not ev.done and sum(len(e.emitted) for e in events[ev.seq]) >= position:
                    engine.stop(ev.seq)
        for seq in seqs:
            engine.release(seq)
        return [events[seq] for seq in seqs]
    return run


def scheduler_runner(scheduler, purpose: str = "bench", timeout_s: float = 120.0) -> Runner:
    """Run a group through a running Scheduler, admitted together like the page's live benchmark; each
    generation is cancelled once it has `position` tokens."""
    import queue

    def run(group, position):
        gens = scheduler.submit_group(group, purpose=purpose)
        out: list[list[RoundEvent]] = [[] for _ in gens]
        try:
            for gen, evs in zip(gens, out):
                while sum(len(e.emitted) for e in evs) < position and not (evs and evs[-1].done):
                    try:
                        ev = gen.events.get(timeout=timeout_s)
                    except queue.Empty:
                        raise RuntimeError(f"no round in {timeout_s:.0f} s: the comparison was abandoned") from None
                    if isinstance(ev, ErrorEvent):
                        raise RuntimeError(ev.message)
                    if isinstance(ev, RoundEvent):  # a WaitEvent only says the group is still in line
                        evs.append(ev)
        finally:
            for gen in gens:
                scheduler.cancel(gen.id)
        return out
    return run


def token_at(events: list[RoundEvent], position: int) -> tuple[int, bool, bool]:
    """(the answer's token at `position` (from 1), whether a round that verified a draft decided it, whether it
    was a kept draft token)."""
    made = 0
    for ev in events:
        if position <= made + len(ev.emitted):
            i = position - made - 1
            verified = ev.kind == "spec"
            return ev.emitted[i], verified, verified and i < ev.n_accepted
        made += len(ev.emitted)
    raise RuntimeError(f"an answer ended after {made} tokens, before position {position}")


def sample_side(run: Runner, prompt: list[int], params: GenParams, plan: SameDistPlan, first_seed: int,
                progress: Callable[[int], None] | None = None) -> tuple[Counter, int, int]:
    """(token counts, answers a verification decided, of those a kept draft) over seeds first_seed.. +n."""
    counts: Counter = Counter()
    n_verified = n_accepted = 0
    for start in range(0, plan.n, plan.width):
        seeds = range(first_seed + start, first_seed + min(plan.n, start + plan.width))
        group = [(list(prompt), replace(params, sampling=replace(params.sampling, seed=s))) for s in seeds]
        for events in run(group, plan.position):
            tok, verified, accepted = token_at(events, plan.position)
            counts[tok] += 1
            n_verified += verified
            n_accepted += accepted
        if progress is not None:
            progress(min(plan.n, start + plan.width))
    return counts, n_verified, n_accepted


def compare(run: Runner, prompt: list[int], params: GenParams, plan: SameDistPlan,
            progress: Callable[[int, int], None] | None = None) -> SameDistReport:
    """The plan's N speculative answers (params as given) and N plain ones (the same sampler, no drafter), their
    tokens at the plan's position and the test. progress(done, total) after each group."""
    if params.sampling.temp <= 0:
        raise ValueError("at temperature 0 both sides give one token: compare at a temperature above 0")
    if plan.n < 1 or plan.position < 1 or plan.width < 1:
        raise ValueError("n, position and width must be >= 1")
    # room past the position: a round drafts at most the tokens left but one, so an answer that ended at the
    # position would leave it to a plain round
    fixed = replace(params, max_new_tokens=plan.position + max(1, min(params.spec.n_max, 4)), ignore_eos=True)
    plain = replace(fixed, spec=replace(fixed.spec, types=[]))
    total = 2 * plan.n
    spec_counts, n_verified, n_accepted = sample_side(
        run, prompt, fixed, plan, plan.seed, progress and (lambda d: progress(d, total)))
    plain_counts, _, _ = sample_side(
        run, prompt, plain, plan, plan.seed + SEED_GAP, progress and (lambda d: progress(plan.n + d, total)))
    chi2, dof, p = chi2_homogeneity(spec_counts, plain_counts)
    return SameDistReport(spec=spec_counts, plain=plain_counts, chi2=chi2, dof=dof, p_value=p,
                          n_verified=n_verified, n_accepted=n_accepted)
