"""`python -m engine.bench.advise`: for each prompt of a file, the chain predicted to pay most here, then tried.

    python -m engine.bench.advise --prompts FILE [--target embedded] [--limit N] [--max-new-tokens 128]
                                  [--n-max 8] [--chain a,b,c] [--out advice.csv]

Per prompt, on one engine: plain greedy decoding (the reference and the plain speed), the chain (default: the
page's starting chain, n_max --n-max, adaptive) whose rounds give each drafter's acceptance per position and its
cost, the advice from those two runs and this machine's cost curve (engine/bench/advice.py), and a run with the
advised setting (that drafter alone, its n_max, no adaptive policy). Printed: the chain's speedup, the advice, its
predicted and measured speedup (decode tokens/s over plain's), and whether the measurement lands within 15% of
the prediction. Every run is checked token for token against the plain one. Exit status: 0 ok, 1 if a run was
not lossless, 2 on bad arguments or models.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import dataclass

from engine.bench.advice import K_MAX, advise, decode_seconds
from engine.bench.arena import load
from engine.bench.cli import load_prompts
from engine.bench.contest import engine_runner
from engine.bench.run import prompt_ids_of
from engine.draft.lin_path import PATHS
from engine.draft.registry import parse_types, starting_chain
from engine.forward.device import DEVICE_HELP
from engine.load.dtype import CHOICES
from engine.params import GenParams, SpecParams
from engine.sampling import SamplerParams

WITHIN = 0.15  # a measurement within this share of its prediction counts as the prediction holding


@dataclass
class Timed:
    """One run as the advisor reads it: its events and its decode time."""
    tokens: list[int]
    events: list
    decode_seconds: float

    @property
    def tps(self) -> float:
        n = sum(len(ev.emitted) for ev in self.events if ev.kind != "prefill")
        return n / self.decode_seconds if self.decode_seconds > 0 else 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.advise", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="JSONL: {id, messages} or {id, prompt}")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts of the file")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default=None, help="a draft model (its drafter joins the chain)")
    ap.add_argument("--n-max", type=int, default=8, help="draft tokens per round at most in the chain's run")
    ap.add_argument("--chain", default=None, help="the chain that measures, comma-separated in relay order "
                    "(default: the page's starting chain)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=4096, help="cells of the KV cache")
    ap.add_argument("--dtype", choices=list(CHOICES), default="auto")
    ap.add_argument("--head-dtype", choices=list(PATHS), default="auto",
                    help="linears of draft-eagle3, draft-mtp, draft-dflash, draft-dspark (auto: timed at load)")
    ap.add_argument("--threads", type=int, default=None, help="forwards on this many threads (default: all)")
    ap.add_argument("--device", default="auto", help=DEVICE_HELP)
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--out", default=None, help="also the table as CSV")
    return ap.parse_args(argv)


def gen_params(types: list[str], n_max: int, adaptive: bool, max_new_tokens: int) -> GenParams:
    return GenParams(max_new_tokens=max_new_tokens, sampling=SamplerParams(temp=0.0, seed=0),
                     spec=SpecParams(types=list(types), n_max=n_max, adaptive=adaptive))


def timed(runner, ids: list[int], gp: GenParams) -> Timed:
    result = runner(ids, gp)
    return Timed(result.tokens, result.events, decode_seconds(result.events))


def advise_prompt(runner, ids: list[int], chain: list[str], args, roof) -> dict:
    """The four runs of one prompt and what they say, as one row."""
    plain = timed(runner, ids, gen_params([], 0, False, args.max_new_tokens))
    spec = timed(runner, ids, gen_params(chain, args.n_max, True, args.max_new_tokens))
    advice = advise(spec, plain, roof)
    row = {"chain": ",".join(chain), "chain_speedup": spec.tps / plain.tps if plain.tps else 0.0,
           "advice": "plain" if advice is None or advice.drafter is None else advice.drafter,
           "n_max": 0 if advice is None else advice.n_max,
           "predicted": 1.0 if advice is None else advice.predicted, "measured": 1.0,
           "lossless": spec.tokens == plain.tokens}
    if advice is not None and advice.drafter is not None:
        tried = timed(runner, ids, gen_params([advice.drafter], advice.n_max, False, args.max_new_tokens))
        row["measured"] = tried.tps / plain.tps if plain.tps else 0.0
        row["lossless"] = row["lossless"] and tried.tokens == plain.tokens
    row["within"] = abs(row["measured"] / row["predicted"] - 1) <= WITHIN
    return row


def measure_roofline(target, engine):
    from engine.cost.roofline import roofline

    cost = engine.cost
    return roofline(target.model, list(cost.sizes), list(cost.seconds)) if len(cost.sizes) >= 2 else None


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    try:
        if args.n_max < 1 or args.max_new_tokens < 1:
            raise ValueError("--n-max and --max-new-tokens must be >= 1")
        prompts = load_prompts(args.prompts)[:args.limit]
        target, draft, engine = load(args, max(args.n_max, K_MAX))
        chain = parse_types(args.chain) if args.chain else starting_chain(target)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    roof, runner = measure_roofline(target, engine), engine_runner(engine)
    ids = [prompt_ids_of(target, p, 0) for p in prompts]
    runner(ids[0], gen_params([], 0, False, args.max_new_tokens))  # warm-up: a process's first forwards are slow
    rows = []
    for p, prompt_ids in zip(prompts, ids):
        rows.append({"id": p.get("id", len(rows)), **advise_prompt(runner, prompt_ids, chain, args, roof)})
        r = rows[-1]
        print(f"{str(r['id'])[:24]:24} chain {r['chain_speedup']:.2f}x  advice {r['advice']} n_max {r['n_max']}: "
              f"predicted {r['predicted']:.2f}x measured {r['measured']:.2f}x "
              f"{'within' if r['within'] else 'outside'} {WITHIN:.0%}{'' if r['lossless'] else '  NOT LOSSLESS'}")
    held = sum(r["within"] for r in rows)
    print(f"the prediction held within {WITHIN:.0%} on {held} of {len(rows)} prompts")
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        print(f"wrote {args.out}")
    return 0 if all(r["lossless"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
