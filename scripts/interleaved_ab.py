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
        --repeat 2 [--versus ngram-simple,ngram-mod] [-- BENCH OPTIONS, e.g. --spec ngram-simple,draft-head]

--versus steps a second speculative configuration (its drafters; the other options the same) in the same turns:
whether a chain is at least as fast as one of its parts, prompt by prompt, is then read from rounds timed
side by side, not from two runs minutes apart.
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
    ap.add_argument("--versus", default="", help="drafters of a second speculative configuration (a --spec value)")
    ap.add_argument("bench", nargs="*", help="options for engine.bench's configuration (after --)")
    a = ap.parse_args(argv)

    from engine.bench.cli import load_prompts, parse_args
    from engine.bench.run import BenchConfig, prompt_ids
    from engine.bench.sweep import cells_needed, sweep_from_args
    from engine.params import GenParams, SpecParams
    from engine.sampling import SamplerParams

    def bench_args(spec: str | None) -> list[str]:
        opts = list(a.bench)
        if spec is not None:
            at = opts.index("--spec") if "--spec" in opts else None
            opts = opts[:at] + opts[at + 2:] if at is not None else opts
            opts += ["--spec", spec]
        return parse_args(["--prompts", a.prompts, "--max-new-tokens", str(a.max_new_tokens), "--tree", "on",
                           "--parallel", str(a.parallel)] + opts)

    args = bench_args(None)
    sweep = sweep_from_args(args)
    cfg = BenchConfig.from_args(args, min(sweep.n_max), a.parallel, 0)
    target, draft = cfg.load()
    prompts = [p for p in load_prompts(a.prompts) if a.kind == "all" or p.get("kind") == a.kind]
    cfg.n_ctx = max(cfg.n_ctx, cells_needed(target, prompts, sweep, a.max_new_tokens))
    configs = {"plain": cfg, "spec": cfg}  # name -> its configuration; "plain" drafts nothing
    if a.versus:
        configs[a.versus] = BenchConfig.from_args(bench_args(a.versus), min(sweep.n_max), a.parallel, 0)
        configs[a.versus].n_ctx = cfg.n_ctx
    engines = {name: c.build(target, draft, n_seq_max=a.parallel, n_draft=max(sweep.n_max))
               for name, c in configs.items()}
    cost = engines["spec"].cost  # what the speculative engine's budget believes a forward costs (its calibration)
    print("cost curve, relative to a plain forward of the group: "
          + ", ".join(f"{n} rows {cost.c(n) / cost.c(a.parallel):.3f}" for n in (a.parallel + 1, a.parallel + 2,
                                                                            2 * a.parallel, 4 * a.parallel)))
    groups = [prompts[i:i + a.parallel] for i in range(0, len(prompts) - a.parallel + 1, a.parallel)]

    def params(name: str) -> GenParams:
        c = configs[name]
        sp = SpecParams(types=[]) if name == "plain" else c.spec
        return GenParams(max_new_tokens=a.max_new_tokens, sampling=SamplerParams(**vars(c.sampling)),
                         spec=SpecParams(**{**vars(sp), "types": list(sp.types)}), ignore_eos=c.ignore_eos)

    by_kind: dict[str, list[RoundPair]] = {}
    per_prompt: dict[tuple[str, str], list[float]] = {}  # (configuration, prompt id) -> its own speed ratio per run
    names = list(engines)
    for group in groups:
        ids = [prompt_ids(engines["plain"], p, 0) for p in group]
        ratios: dict[str, list[float]] = {name: [] for name in names if name != "plain"}
        for rep in range(a.repeat):
            for name, engine in engines.items():
                for seq, toks in enumerate(ids):
                    engine.start(toks, params(name), seq=seq)
            seconds, tokens = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
            # per prompt: its tokens and the time of the rounds it was generating in (its latency's share)
            own_s = {(name, seq): 0.0 for name in names for seq in range(len(ids))}
            own_n = dict.fromkeys(own_s, 0)
            order = names[rep % len(names):] + names[:rep % len(names)]  # who steps first turns with the repeats
            while any(e.active() for e in engines.values()):
                pair = {}
                for name in order:
                    if not engines[name].active():
                        continue
                    t0 = time.perf_counter()
                    events = engines[name].step()
                    dt = time.perf_counter() - t0
                    if any(getattr(e, "kind", "") == "prefill" for e in events):
                        continue
                    seconds[name] += dt
                    tokens[name] += sum(len(getattr(e, "emitted", [])) for e in events)
                    for e in events:
                        if hasattr(e, "emitted"):
                            own_s[(name, e.seq)] += dt
                            own_n[(name, e.seq)] += len(e.emitted)
                    pair[name] = (dt, events)
                if "spec" in pair and "plain" in pair:
                    (dt_s, ev_s), (dt_p, ev_p) = pair["spec"], pair["plain"]
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
            for name in ratios:
                ratios[name].append((tokens[name] / seconds[name]) / (tokens["plain"] / seconds["plain"]))
            for name in ratios:
                for seq in range(len(ids)):
                    if own_s[(name, seq)] > 0 and own_s[("plain", seq)] > 0:
                        speed = own_n[(name, seq)] / own_s[(name, seq)]
                        plain = own_n[("plain", seq)] / own_s[("plain", seq)]
                        per_prompt.setdefault((name, group[seq]["id"]), []).append(speed / plain)
        for name, runs in ratios.items():
            own = [statistics.median(per_prompt[(name, p["id"])]) for p in group if (name, p["id"]) in per_prompt]
            label = "speculative" if name == "spec" else name
            print(f"{', '.join(p['id'] for p in group)}: {label} / plain {statistics.median(runs):.3f} "
                  f"(runs: {', '.join(f'{r:.3f}' for r in runs)}); each prompt's own: "
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
