"""The arena's runs: who competes, and each contender replayed on the same prompts and the same engine.

For every prompt the plain run comes first: its answer is the reference every other run must reproduce token for
token (greedy decoding: lossless means identical), and the oracle's draft source. Then each contender runs
alone: every drafter the loaded models allow, the default chain, and the oracle (engine/draft/oracle.py), which
drafts the plain answer itself and so shows the ceiling of drafting at this n_max on this engine. Drafts are
chains, one drafter's per round, so tokens per forward measures the drafter and not a tree's merge.

Runs go through a runner, (prompt ids, GenParams) -> RunResult: the command line owns an engine
(`engine_runner`), the page shares the app's through its scheduler (`scheduler_runner`), like a chat.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from engine.bench.live import LiveBenchError, collect_events
from engine.bench.lossless import lossless_check
from engine.bench.run import RunResult
from engine.draft.registry import PRIORITY, starting_chain
from engine.draft.head.drafter import head_fits
from engine.events import ErrorEvent, RoundEvent
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams

Runner = Callable[[list[int], GenParams], RunResult]
Progress = Callable[[int, int, str], None]  # (runs done, runs in all, the next run's name)


@dataclass
class ArenaParams:
    n_max: int = 8  # draft tokens per round at most, for every contender
    max_new_tokens: int = 128  # the answer's length at most (the plain run's; every other run repeats it)
    seed: int = 42  # the sampler's seed: greedy decoding draws nothing with it, but a run is fully described
    adaptive: bool = True  # real drafters under the length policy, as the app runs them; the oracle never is
    chain: list[str] | None = None  # the chain contender in relay order; None: starting_chain(target)
    ignore_eos: bool = False  # answers of exactly max_new_tokens, past end-of-sequence
    eagle3: str | None = None  # a directory holding an EAGLE-3 head the engine was given: draft-eagle3 competes
    dflash: str | None = None  # a DFlash or DSpark checkpoint the engine was given: draft-dflash or draft-dspark


@dataclass
class Contender:
    name: str  # the leaderboard's label: a drafter type, "chain", "oracle" or "plain"
    kind: str  # "plain" | "drafter" | "chain" | "oracle"
    types: list[str] = field(default_factory=list)  # drafter types it runs, in relay order ([] for plain)


@dataclass
class Entry:
    contender: Contender  # who ran
    runs: list[RunResult] = field(default_factory=list)  # one per prompt, lossless_ok set against the plain run
    plains: list[RunResult] = field(default_factory=list)  # the plain run of the same prompt, for the speedup


@dataclass
class ArenaResult:
    entries: list[Entry]  # plain first, then the contenders in the order they ran
    skipped: list[str]  # "drafter: why it could not run here", one line each


def why_not(name: str, target, draft, eagle3: str | None = None, dflash: str | None = None) -> str | None:
    """Why a drafter cannot compete with these models (None: it can)."""
    from engine.load.errors import VocabMismatchError
    from engine.load.models import check_vocab_compatible

    if name == "grammar":
        return "drafts only the tokens an output format forces; the arena's answers are free text"
    if name in ("draft-simple", "draft-uni"):
        if draft is None:
            return "needs a draft model (--draft); none is loaded"
        try:
            check_vocab_compatible(target, draft)
            shared = True
        except VocabMismatchError:
            shared = False
        if shared and name == "draft-uni":
            return "the draft model shares the target's vocabulary: draft-simple drafts with it"
        if not shared and name == "draft-simple":
            return "the draft model's vocabulary is not the target's: draft-uni drafts with it"
    if name == "draft-head" and not head_fits(target):
        return "its head was trained for another target"
    if name == "draft-eagle3" and not eagle3:
        return "needs an EAGLE-3 head (--draft DIR); none is loaded"
    if name in ("draft-dflash", "draft-dspark"):
        from engine.load.dflash import dflash_kind

        if not dflash:
            return "needs a DFlash or DSpark checkpoint (--draft DIR or FILE.gguf); none is loaded"
        kind = dflash_kind(dflash)
        return None if kind == name else f"the checkpoint given drafts as {kind}"
    if name == "draft-mtp":
        from engine.load.mtp import mtp_reason

        return mtp_reason(target)
    return None


def contenders(target, draft, params: ArenaParams) -> tuple[list[Contender], list[str]]:
    """Plain, every drafter that can run alone, the chain, the oracle; and the skipped drafters, each with why."""
    out, skipped = [Contender("plain", "plain")], []
    for name in PRIORITY:
        why = why_not(name, target, draft, params.eagle3, params.dflash)
        if why:
            skipped.append(f"{name}: {why}")
        else:
            out.append(Contender(name, "drafter", [name]))
    chain = [t for t in (params.chain or starting_chain(target))
             if why_not(t, target, draft, params.eagle3, params.dflash) is None]
    if chain:
        out.append(Contender("chain", "chain", chain))
    out.append(Contender("oracle", "oracle", ["oracle"]))
    return out, skipped


def gen_params(c: Contender, params: ArenaParams, reference: list[int] | None) -> GenParams:
    spec = SpecParams(types=list(c.types), n_max=params.n_max,
                      # the oracle's drafts are all kept: its ceiling is a full draft every round
                      adaptive=params.adaptive and c.kind != "oracle",
                      reference=reference if c.kind == "oracle" else None)
    return GenParams(max_new_tokens=params.max_new_tokens, sampling=SamplerParams(temp=0.0, seed=params.seed),
                     spec=spec, ignore_eos=params.ignore_eos)


def result_of(events: list[RoundEvent], spec_on: bool, seconds: float) -> RunResult:
    tokens = [t for e in events for t in e.emitted]
    return RunResult(tokens=tokens, seconds=seconds, spec_on=spec_on, events=events)


def engine_runner(engine, seq: int = 0) -> Runner:
    """Runs on an engine this process owns, one at a time in slot `seq`."""
    def run(ids: list[int], gp: GenParams) -> RunResult:
        t0 = time.perf_counter()
        engine.start(ids, gp, seq=seq)
        events: list[RoundEvent] = []
        try:
            while engine.active():
                for ev in engine.step():
                    if isinstance(ev, ErrorEvent):
                        raise RuntimeError(ev.message)
                    events.append(ev)
        finally:
            engine.release(seq)
        return result_of(events, bool(gp.spec.types), time.perf_counter() - t0)
    return run


def scheduler_runner(scheduler, purpose: str = "arena") -> Runner:
    """Runs through a running Scheduler like a chat (other generations share its forwards), counted apart from
    the chats under `purpose` (its oracle's drafts are kept by construction); LiveBenchError with a message for
    the user when it cannot start or stops."""
    def run(ids: list[int], gp: GenParams) -> RunResult:
        try:
            gen = scheduler.submit(list(ids), gp, purpose=purpose)
        except (RuntimeError, ValueError) as e:
            raise LiveBenchError(f"cannot start a run: {e}") from e
        t0 = time.perf_counter()
        events = collect_events(scheduler, [gen])[0]
        return result_of(events, bool(gp.spec.types), time.perf_counter() - t0)
    return run


def run_arena(runner: Runner, prompts: list[list[int]], target, draft, params: ArenaParams,
              progress: Progress | None = None) -> ArenaResult:
    """Every contender on every prompt (token ids), plain first on each; returns the runs and the skipped."""
    lineup, skipped = contenders(target, draft, params)
    entries = [Entry(c) for c in lineup]
    # a whole plain run first, its timings thrown away: the first forwards of a process are slow for a while
    # (allocations, kernel choices, caches), and the plain reference, which runs next, would pay for them
    runner(prompts[0], gen_params(Contender("warm-up", "plain"), params, None))
    total, done = len(prompts) * len(entries), 0
    for ids in prompts:
        plain = None
        for entry in entries:
            if progress is not None:
                progress(done, total, entry.contender.name)
            reference = list(ids) + plain.tokens if plain is not None else None
            res = runner(ids, gen_params(entry.contender, params, reference))
            plain = plain or res
            res.lossless_ok = lossless_check(res.tokens, plain.tokens, res.events)
            entry.runs.append(res)
            entry.plains.append(plain)
            done += 1
    return ArenaResult(entries=entries, skipped=skipped)
