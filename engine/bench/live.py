"""A small benchmark run through a running Scheduler: what the UI's Benchmark tab starts from the browser.

It submits generations like any chat session does (Scheduler.submit_group: the N copies are admitted together),
so it shares the engine and its forwards with whoever else is chatting and never touches the engine itself.
Per concurrency N it runs N copies of one prompt plain, then with the drafter chain,
then with synthetic acceptance at each P; the rows are the bench's own (engine.bench.rows.make_row), so the
same plots read them. Other users' slots in the same forwards make these timings noisier than the CLI bench's.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from engine.bench.lossless import lossless_check
from engine.bench.rows import make_row
from engine.bench.run import BenchConfig, RunResult, group_tps
from engine.events import ErrorEvent, RoundEvent
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams

READ_TIMEOUT_S = 120.0  # a round slower than this means the engine is stuck: give up with a message


@dataclass
class LivePlan:
    concurrency: list[int] = field(default_factory=lambda: [1, 2])  # slots decoding the prompt at once
    chain: list[str] = field(default_factory=lambda: ["ngram-simple", "ngram-map-k"])  # real drafters; [] = none
    synthetic: list[float] = field(default_factory=lambda: [0.3, 0.6, 0.9])  # synthetic acceptance runs
    n_max: int = 4  # draft length (exact for synthetic runs, a cap for the chain)
    max_new_tokens: int = 32  # per slot; generation ignores end-of-sequence so every run has this length
    seed: int = 42  # sampler seed of every run (greedy at temp 0: it only seeds synthetic acceptance's coins)


class LiveBenchError(RuntimeError):
    """A message for the user: slots busy, engine failure, timeout."""


def collect_events(scheduler, gens: list) -> list[list[RoundEvent]]:
    """Every generation's round events until its done event; cancels what is left on failure."""
    out: list[list[RoundEvent]] = [[] for _ in gens]
    try:
        for i, gen in enumerate(gens):
            while not out[i] or not out[i][-1].done:
                try:
                    ev = gen.events.get(timeout=READ_TIMEOUT_S)
                except queue.Empty:
                    raise LiveBenchError(f"no round in {READ_TIMEOUT_S:.0f} s: benchmark abandoned") from None
                if isinstance(ev, ErrorEvent):
                    raise LiveBenchError(ev.message)
                if isinstance(ev, RoundEvent):  # a WaitEvent only says the group is still in line
                    out[i].append(ev)
    finally:
        for gen, evs in zip(gens, out):
            if not evs or not evs[-1].done:
                scheduler.cancel(gen.id)
    return out


def run_group(scheduler, prompt: list[int], n: int, spec: SpecParams, plan: LivePlan,
              reference: list[RunResult] | None, purpose: str = "bench") -> list[RunResult]:
    """n copies of the prompt, admitted together so they share every forward, read to the end."""
    params = [GenParams(max_new_tokens=plan.max_new_tokens, sampling=SamplerParams(temp=0.0, seed=plan.seed),
                        spec=SpecParams(**{**vars(spec), "types": list(spec.types)}), ignore_eos=True)
              for _ in range(n)]
    try:
        gens = scheduler.submit_group([(list(prompt), p) for p in params], purpose=purpose)
    except (RuntimeError, ValueError) as e:
        raise LiveBenchError(f"cannot start {n} slot(s): {e}") from e
    events = collect_events(scheduler, gens)
    # from the start of the first prefill to the last round, by the engine's own stamps: a wait in line for a
    # slot is not the engine's speed
    t_start = min(evs[0].t_end - evs[0].t_verify_ms / 1e3 for evs in events)
    seconds = max(evs[-1].t_end for evs in events) - t_start
    out = []
    for i, evs in enumerate(events):
        toks = [t for e in evs for t in e.emitted]
        res = RunResult(tokens=toks, seconds=seconds, spec_on=bool(spec.types), events=evs,
                        rollback_mode=spec.rollback if spec.types else "none")
        if reference is None:
            res.t_plain_step_ms = res.t_verify_ms
        else:
            res.lossless_ok = lossless_check(toks, reference[i].tokens, evs, spec.synthetic_accept is not None)
            res.t_plain_step_ms = reference[i].t_verify_ms + reference[i].t_draft_ms
        out.append(res)
    return out


def run_live(scheduler, prompt: list[int], plan: LivePlan, target, progress=None,
             purpose: str = "bench") -> list[dict]:
    """The plan's runs on the scheduler's engine; traces.csv rows (engine.bench.rows.COLUMNS).

    `target` is the engine's LoadedModel (its name, quant_bits and dtype go into the rows).
    `progress(done, total, what)` is called before each run, for a progress bar. Its generations are counted
    under `purpose` (engine/serve/metrics.py), apart from the chats: synthetic acceptance keeps drafts by a coin."""
    n_slots = scheduler.engine.ctx.n_seq_max
    too_many = [n for n in plan.concurrency if n > n_slots]
    if too_many:
        raise LiveBenchError(f"concurrency {too_many[0]} needs more slots than the engine has ({n_slots})")
    specs = ([("", SpecParams(types=[]))]
             + ([(",".join(plan.chain), SpecParams(types=list(plan.chain), n_max=plan.n_max))] if plan.chain else [])
             + [("synthetic", SpecParams(types=["synthetic"], n_max=plan.n_max, adaptive=False, synthetic_accept=p))
                for p in plan.synthetic])
    total, done, rows = len(plan.concurrency) * len(specs), 0, []
    pid = {"id": "live", "kind": ""}
    for n in plan.concurrency:
        base = None
        for name, spec in specs:
            if progress is not None:
                progress(done, total, f"N={n} {name or 'plain'}")
            runs = run_group(scheduler, prompt, n, spec, plan, base, purpose)
            cfg = BenchConfig(target=target.name, draft=None, spec=spec, sampling=SamplerParams(temp=0.0, seed=plan.seed),
                              max_new_tokens=plan.max_new_tokens, parallel=n, ctx_len=0, n_ctx=0,
                              trust_remote_code=False, quant_bits=target.quant_bits, ignore_eos=True,
                              dtype=target.dtype, dtype_used=target.dtype, dtype_reason=target.dtype_reason)
            rows.append(make_row(cfg, pid, [runs[0]], None if base is None else [base[0]], name, target.name,
                                 group_tps(runs)))
            if base is None:
                base = runs
            done += 1
    return rows
