"""Speculative over plain decoding for groups of slots, timed round by round in turn.

The bench (`python -m engine.bench --parallel N --repeat R`) times whole runs, plain then speculative; on a
shared 2-core machine a pair of runs moves by 5 to 10%. Here two engines share the loaded model, one plain and
one speculative, start the same prompts, and step in turn: a round of one, then a round of the other, so a slow
second of the machine falls on both. Each group's figure is the ratio of decode throughputs (tokens over the
time of the rounds after the prefills); repeats alternate which engine steps first. Pairs of rounds are also
sorted by what the speculative one did (verified a tree or a chain, drafted nothing, ...), with their cost over
the plain round beside it. Each prompt's own figure divides its tokens by the time of the rounds it was
generating in: the speed its user sees.

    .venv/bin/python scripts/interleaved_ab.py --prompts assets/prompts/unseen.jsonl --kind open --parallel 4 \\
        --repeat 2 [-- BENCH OPTIONS, e.g. --spec ngram-simple,draft-head]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass
class RoundPair:
    """A speculative round and the plain round beside it."""

    cost: float  # its time over the plain round's
    rows: int  # rows of its forward
    tokens: int  # tokens it emitted, all slots
    plain_tokens: int  # tokens the plain round emitted
    draft_ms: float  # time in the drafters, all slots
    verify_ms: float  # the forward and the walk
    plain_verify_ms: float  # the plain round's forward
    other_ms: float  # the rest of the round: planning, the budget, events, text
    plain_other_ms: float  # the same in the plain round


def kind_of_round(events) -> str:
    modes = {getattr(e, "verify_mode", "") for e in events}
    if "tree" in modes:
        return "verified a tree"
    if any(getattr(e, "kind", "") == "spec" for e in events):
        return "verified a chain"
    return "verified no draft"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--kind", default="all", help="only prompts of this kind (copy, open); 'all' keeps every one")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("bench", nargs="*", help="options for engine.bench's configuration (after --)")
    a = ap.parse_args(argv)

    from engine.bench.cli import load_prompts, parse_args
    from engine.bench.run import BenchConfig, prompt_ids
    from engine.bench.sweep import cells_needed, sweep_from_args
    from engine.params import GenParams, SpecParams
    from engine.sampling import SamplerParams

    args = parse_args(["--prompts", a.prompts, "--max-new-tokens", str(a.max_new_tokens), "--tree", "on",
                       "--parallel", str(a.parallel)] + a.bench)
    sweep = sweep_from_args(args)
    cfg = BenchConfig.from_args(args, min(sweep.n_max), a.parallel, 0)
    target, draft = cfg.load()
    prompts = [p for p in load_prompts(a.prompts) if a.kind == "all" or p.get("kind") == a.kind]
    cfg.n_ctx = max(cfg.n_ctx, cells_needed(target, prompts, sweep, a.max_new_tokens))
    engines = {spec: cfg.build(target, draft, n_seq_max=a.parallel, n_draft=max(sweep.n_max))
               for spec in (False, True)}
    cost = engines[True].cost  # what the speculative engine's budget believes a forward costs (its calibration)
    print("cost curve, relative to a plain forward of the group: "
          + ", ".join(f"{n} rows {cost.c(n) / cost.c(a.parallel):.3f}" for n in (a.parallel + 1, a.parallel + 2,
                                                                            2 * a.parallel, 4 * a.parallel)))
    groups = [prompts[i:i + a.parallel] for i in range(0, len(prompts) - a.parallel + 1, a.parallel)]

    def params(spec: bool) -> GenParams:
        sp = cfg.spec if spec else SpecParams(types=[])
        return GenParams(max_new_tokens=a.max_new_tokens, sampling=SamplerParams(**vars(cfg.sampling)),
                         spec=SpecParams(**{**vars(sp), "types": list(sp.types)}), ignore_eos=cfg.ignore_eos)

    by_kind: dict[str, list[float]] = {}
    per_prompt: dict[str, list[float]] = {}  # prompt id -> its own speed ratio per run
    for group in groups:
        ids = [prompt_ids(engines[False], p, 0) for p in group]
        ratios = []
        for rep in range(a.repeat):
            for spec, engine in engines.items():
                for seq, toks in enumerate(ids):
                    engine.start(toks, params(spec), seq=seq)
            seconds, tokens = {False: 0.0, True: 0.0}, {False: 0, True: 0}
            # per prompt: its tokens and the time of the rounds it was generating in (its latency's share)
            own_s = {(spec, seq): 0.0 for spec in engines for seq in range(len(ids))}
            own_n = dict.fromkeys(own_s, 0)
            order = [False, True] if rep % 2 == 0 else [True, False]
            while any(e.active() for e in engines.values()):
                pair = {}
                for spec in order:
                    if not engines[spec].active():
                        continue
                    t0 = time.perf_counter()
                    events = engines[spec].step()
                    dt = time.perf_counter() - t0
                    if any(getattr(e, "kind", "") == "prefill" for e in events):
                        continue
                    seconds[spec] += dt
                    tokens[spec] += sum(len(getattr(e, "emitted", [])) for e in events)
                    for e in events:
                        if hasattr(e, "emitted"):
                            own_s[(spec, e.seq)] += dt
                            own_n[(spec, e.seq)] += len(e.emitted)
                    pair[spec] = (dt, events)
                if len(pair) == 2:
                    (dt_s, ev_s), (dt_p, ev_p) = pair[True], pair[False]
                    draft_ms = sum(e.t_draft_ms for e in ev_s)
                    verify_ms = max((e.t_verify_ms for e in ev_s), default=0.0)
                    plain_verify_ms = max((e.t_verify_ms for e in ev_p), default=0.0)
                    by_kind.setdefault(kind_of_round(ev_s), []).append(RoundPair(
                        dt_s / dt_p, max((e.batch_rows for e in ev_s), default=0),
                        sum(len(e.emitted) for e in ev_s), sum(len(e.emitted) for e in ev_p),
                        draft_ms, verify_ms, plain_verify_ms, dt_s * 1e3 - draft_ms - verify_ms,
                        dt_p * 1e3 - sum(e.t_draft_ms for e in ev_p) - plain_verify_ms))
            for engine in engines.values():
                for seq in range(len(ids)):
                    engine.release(seq)
            ratios.append((tokens[True] / seconds[True]) / (tokens[False] / seconds[False]))
            for seq in range(len(ids)):
                speed = {spec: own_n[(spec, seq)] / own_s[(spec, seq)] for spec in engines if own_s[(spec, seq)] > 0}
                if len(speed) == 2:
                    per_prompt.setdefault(group[seq]["id"], []).append(speed[True] / speed[False])
        own = [statistics.median(per_prompt[p["id"]]) for p in group if p["id"] in per_prompt]
        print(f"{', '.join(p['id'] for p in group)}: speculative / plain {statistics.median(ratios):.3f} "
              f"(runs: {', '.join(f'{r:.3f}' for r in ratios)}); each prompt's own: "
              f"{', '.join(f'{r:.3f}' for r in own)}", flush=True)
    for kind, pairs in sorted(by_kind.items()):
        def mean(field: str) -> float:
            return statistics.mean(getattr(r, field) for r in pairs)
        print(f"rounds that {kind}: {len(pairs)}, mean cost {mean('cost'):.3f}x the plain round beside it; "
              f"{mean('rows'):.1f} rows, {mean('tokens'):.2f} tokens against {mean('plain_tokens'):.2f}; "
              f"drafting {mean('draft_ms'):.1f} ms, forward and walk {mean('verify_ms'):.1f} ms against "
              f"{mean('plain_verify_ms'):.1f}; the rest {mean('other_ms'):.2f} ms against {mean('plain_other_ms'):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
