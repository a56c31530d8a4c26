"""Held-out evaluation of the draft head: `python -m training.eval`.

On prompts the head was never trained on (assets/prompts/heldout.jsonl by default; `prompts.check_disjoint`
keeps them out of the training set), through the real engine, one prompt at a time:
* acceptance: the head alone with fixed 4-token drafts (n_max 4, no length policy), once with p_min 0 (a draft
  every round, however unsure) and once at each --p-min (the head stops where it is unsure, and skips a round
  when even its first token is): acceptance at each draft position and the mean acceptance length (1 + accepted
  tokens per round with a draft), and the share of rounds with a draft;
* speed: plain decoding, the head alone, the n-gram chain, and the n-gram chain then the head, each with the
  engine's adaptive length policy, timed back to back so the ratios share the machine's load (`--no-speed`
  leaves these out: a p_min sweep of acceptance, whose counts do not depend on the machine's load);
* lossless: every speculative run must give plain decoding's tokens (temperature 0), or the exit status is 1;
* cost: the head's draft time per drafted token against a one-token target forward, and the estimate
  speedup = (1 - a^(k+1)) / ((1 - a)(c + 1)) with the measured a and c, with where it stops paying: the expected
  walltime improvement factor of Leviathan et al., "Fast Inference from Transformers via Speculative Decoding"
  (arXiv:2211.17192), with c the whole round's extra cost in one-token target forwards.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.bench.stats import formula, geomean
from engine.draft.registry import NGRAM_CHAIN
from engine.load.dtype import CHOICES as DTYPES

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Config:
    name: str  # column title
    types: list[str]  # drafter chain
    adaptive: bool  # the engine's length policy on
    p_min: float  # model drafters stop below this top probability
    acceptance: bool = False  # an acceptance run (fixed drafts), counted in AcceptStats


def configs(n_max: int, p_mins: list[float], speed: bool = True) -> list[Config]:
    """The acceptance runs (fixed drafts at p_min 0 and at each p_min), then the speed runs (unless not)."""
    head, chain = ["draft-head"], list(NGRAM_CHAIN)
    out = [Config(f"head-fix{n_max}", head, False, 0.0, True)]
    out += [Config(f"head-fix{n_max}@{p}", head, False, p, True) for p in p_mins if p > 0]
    if not speed:
        return out
    out.append(Config("ngram", chain, True, 0.0))
    for p in p_mins:
        out += [Config(f"head@{p}", head, True, p), Config(f"ngram+head@{p}", chain + head, True, p)]
    return out


def run(engine, ids, types, adaptive, n_new, n_max, p_min):
    from engine.params import GenParams, SpecParams

    params = GenParams(max_new_tokens=n_new, spec=SpecParams(types=types, n_max=n_max, adaptive=adaptive,
                                                             p_min=p_min))
    t0 = time.perf_counter()
    events = list(engine.generate(ids, params))
    return events, time.perf_counter() - t0


@dataclass
class AcceptStats:
    """Acceptance counters of the head's rounds in one configuration."""
    n_max: int
    n_steps: int = 0  # target forwards of the run (rounds with or without a draft)
    n_emitted: int = 0  # tokens the runs produced
    n_rounds: int = 0  # rounds in which the head drafted
    n_accepted: int = 0  # draft tokens kept, over those rounds
    n_drafted: int = 0  # draft tokens proposed
    t_draft_ms: float = 0.0  # time spent drafting, catch-up included
    reached: list[int] = field(default_factory=list)  # rounds with a draft token at position i
    kept: list[int] = field(default_factory=list)  # ... whose token at position i was kept

    def add(self, events) -> None:
        if not self.reached:
            self.reached, self.kept = [0] * self.n_max, [0] * self.n_max
        for e in events:
            self.n_steps += e.kind in ("spec", "plain")
            self.n_emitted += len(e.emitted)
            if e.kind != "spec" or e.drafter != "draft-head" or not e.drafted:
                continue
            self.n_rounds += 1
            self.n_accepted += e.n_accepted
            self.n_drafted += len(e.drafted)
            self.t_draft_ms += e.t_draft_ms
            for i in range(len(e.drafted)):
                self.reached[i] += 1
                self.kept[i] += i < e.n_accepted

    def rates(self) -> list[float]:
        return [k / r if r else 0.0 for k, r in zip(self.kept, self.reached)]

    def rates_given_previous(self) -> list[float]:
        before = [self.n_rounds] + self.kept[:-1]
        return [k / b if b else 0.0 for k, b in zip(self.kept, before)]

    def mean_len(self) -> float:
        return 1 + self.n_accepted / max(1, self.n_rounds)


def fastest(repeat: int, fn, *args):
    """fn(*args) -> (events, seconds), run `repeat` times: the first run's events and the shortest time (the
    runs are deterministic, so the events are the same every time)."""
    events, best = fn(*args)
    for _ in range(repeat - 1):
        best = min(best, fn(*args)[1])
    return events, best


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Held-out acceptance and speed of the draft head.")
    ap.add_argument("--prompts", type=Path, nargs="+", default=[ROOT / "assets" / "prompts" / "heldout.jsonl"])
    ap.add_argument("--weights", type=Path, default=None, help="head weights (default: the shipped ones)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=4, help="longest draft (acceptance and speed runs)")
    ap.add_argument("--p-min", type=float, nargs="+", default=None,
                    help="p_min values of the speed runs and of the acceptance runs (default: the head's own, "
                         "DraftHeadParams.p_min)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="the target's weights (default float32; auto: bfloat16 where this CPU computes it "
                         "natively). Plain and speculative runs share it: both decode on the one loaded model")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--repeat", type=int, default=1, help="time every run this often and keep the fastest "
                    "(timings on a shared machine wander)")
    ap.add_argument("--no-speed", action="store_true", help="acceptance runs only (a quick p_min sweep: the "
                    "acceptance counts do not depend on the machine's load)")
    return ap.parse_args(argv)


def load_engine(dtype: str, weights: Path | None):
    """(target, engine): the embedded model, and an engine of one slot on it with the head's weights."""
    from engine.draft.head.drafter import DraftHeadParams
    from engine.load.models import load_model
    from engine.serve.engine import Engine

    target = load_model("embedded", dtype=dtype)
    extra = {"draft-head": DraftHeadParams(weights=weights)} if weights else None
    return target, Engine(target, n_ctx=4096, n_seq_max=1, drafter_params=extra)


def print_setup(args: argparse.Namespace, target, engine, rows: list[dict], p_mins: list[float], t1: float) -> None:
    print(f"target: {target.dtype} ({target.dtype_reason}), plain and speculative runs alike")
    print(f"{len(rows)} held-out prompts: " + ", ".join(r["id"] for r in rows))
    speed_runs = ("none (--no-speed)" if args.no_speed
                  else f"adaptive length policy, n_max {args.n_max}, p_min {p_mins}")
    print(f"speed runs: {speed_runs}; acceptance runs: fixed {args.n_max}-token drafts, p_min 0 and {p_mins}")
    print(f"one-token target forward: {t1 * 1e3:.1f} ms; verify cost c(k+1) = "
          + ", ".join(f"k={k}: {engine.cost.c(k + 1):.2f}" for k in range(1, args.n_max + 1)))


def run_prompts(args: argparse.Namespace, target, engine, runs: list[Config], rows: list[dict]):
    """Every prompt in plain decoding and in every configuration, one line each with the speedups ("!": not
    plain decoding's tokens). Returns (acceptance counters by configuration, speedups by configuration and prompt
    kind, whether every run was lossless)."""
    stats = {c.name: AcceptStats(args.n_max) for c in runs if c.acceptance}
    speed: dict[str, dict[str, list[float]]] = {}
    lossless = True
    print(f"{'prompt':22s} {'kind':5s} {'n':>4s} {'plain':>6s} " + " ".join(f"{c.name:>14s}" for c in runs))
    for row in rows:
        ids = target.encode_chat(row["messages"])
        plain_ev, plain_s = fastest(args.repeat, run, engine, ids, [], False, args.max_new_tokens, args.n_max, 0.0)
        plain = [t for e in plain_ev for t in e.emitted]
        cells = []
        for c in runs:
            name = c.name
            events, secs = fastest(args.repeat, run, engine, ids, c.types, c.adaptive, args.max_new_tokens,
                                   args.n_max, c.p_min)
            ok = [t for e in events for t in e.emitted] == plain
            lossless &= ok
            ratio = plain_s / secs
            speed.setdefault(name, {}).setdefault(row.get("kind", "all"), []).append(ratio)
            cells.append(f"{ratio:13.2f}x" + ("" if ok else "!"))
            if name in stats:
                stats[name].add(events)
        print(f"{row['id'][:22]:22s} {row.get('kind', ''):5s} {len(plain):4d} {len(plain) / plain_s:5.1f}/s "
              + " ".join(cells), flush=True)
    return stats, speed, lossless


def report_acceptance(n_max: int, runs: list[Config], stats: dict[str, AcceptStats]) -> None:
    for c in [c for c in runs if c.acceptance]:
        st = stats[c.name]
        print(f"\nfixed {n_max}-token drafts, p_min {c.p_min}: the head drafted in {st.n_rounds} of "
              f"{st.n_steps} rounds")
        print("  kept at each draft position, of the rounds that drafted it: "
              + ", ".join(f"{i + 1}: {r:.3f}" for i, r in enumerate(st.rates())))
        print("  kept at each draft position, given the one before was kept: "
              + ", ".join(f"{i + 1}: {r:.3f}" for i, r in enumerate(st.rates_given_previous())))
        print(f"  acceptance at draft position 1: {st.rates()[0]:.3f}; mean acceptance length: "
              f"{st.mean_len():.2f} tokens per round with a draft")
    print(f"\n{'p_min':>6s} {'rounds drafted':>15s} {'position 1':>10s} {'mean acc len':>12s} "
          f"{'tokens per forward':>18s}")
    for c in [c for c in runs if c.acceptance]:
        st = stats[c.name]
        print(f"{c.p_min:6.2f} {st.n_rounds / max(1, st.n_steps):15.3f} {st.rates()[0]:10.3f} "
              f"{st.mean_len():12.2f} {st.n_emitted / max(1, st.n_steps):18.2f}")
    print("  (mean acc len: over rounds with a draft; tokens per forward: over all rounds of the run)")


def report_cost(n_max: int, engine, fixed: AcceptStats, t1: float) -> None:
    """The head's draft cost, and the speedup the formula expects from the fixed drafts' acceptance at each k."""
    mean_len, n_rounds = fixed.mean_len(), fixed.n_rounds
    per_tok = fixed.t_draft_ms / max(1, fixed.n_drafted)
    uncond = [k / max(1, n_rounds) for k in fixed.kept]
    print(f"\ndraft cost: {per_tok:.2f} ms per drafted token (catch-up included) = "
          f"{per_tok / (t1 * 1e3):.3f} of a one-token target forward")
    # a: the per-position rate that gives the measured mean acceptance length at k = n_max
    k = n_max
    a = next((x / 1000 for x in range(1, 1000) if formula(x / 1000, k, 0) >= mean_len), 0.999)
    print(f"estimate: a = {a:.3f} (fits the mean length; per-position unconditional "
          f"{', '.join(f'{u:.2f}' for u in uncond)})")
    for kk in range(1, k + 1):
        c = engine.cost.c(kk + 1) - 1 + kk * per_tok / (t1 * 1e3)
        even = next((x / 1000 for x in range(1, 1000) if formula(x / 1000, kk, c) >= 1.0), 1.0)
        print(f"  k={kk}: c = {c:.2f}, estimated speedup {formula(a, kk, c):.2f}x, pays while a > {even:.2f}")


def report_speed(speed: dict[str, dict[str, list[float]]], lossless: bool) -> None:
    print("\nmeasured speedup over plain decoding (geometric mean per prompt kind; timings noisy, ratios "
          "measured back to back):")
    for name, kinds in speed.items():
        print(f"  {name:15s} " + "  ".join(f"{kind}: {geomean(v):.2f}x ({len(v)})" for kind, v in kinds.items()))
    print("lossless: " + ("yes, every run token-identical to plain decoding" if lossless else "NO"))


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from engine.draft.head.drafter import DraftHeadParams

    p_mins = args.p_min or [DraftHeadParams().p_min]
    runs = configs(args.n_max, p_mins, speed=not args.no_speed)
    rows = [json.loads(line) for p in args.prompts for line in p.read_text().splitlines() if line.strip()]
    target, engine = load_engine(args.dtype, args.weights)
    t1 = engine.cost.seconds[0]
    print_setup(args, target, engine, rows, p_mins, t1)
    stats, speed, lossless = run_prompts(args, target, engine, runs, rows)
    report_acceptance(args.n_max, runs, stats)
    report_cost(args.n_max, engine, stats[runs[0].name], t1)
    report_speed(speed, lossless)
    return 0 if lossless else 1


if __name__ == "__main__":
    raise SystemExit(main())
