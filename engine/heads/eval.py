"""Held-out evaluation of the draft head: `python -m engine.heads.eval`.

On prompts the head was never trained on (assets/prompts/heldout.jsonl by default; `prompts.check_disjoint`
keeps them out of the training set), through the real engine, one prompt at a time:
* acceptance: the head alone with fixed 4-token drafts (n_max 4, no length policy, p_min 0): acceptance at each
  draft position and the mean acceptance length (1 + accepted tokens per verified round);
* speed: plain decoding, the head alone, the n-gram chain, and the n-gram chain then the head, each with the
  engine's adaptive length policy, timed back to back so the ratios share the machine's load;
* lossless: every speculative run must give plain decoding's tokens (temperature 0), or the exit status is 1;
* cost: the head's draft time per drafted token against a one-token target forward, and seed 004's estimate
  speedup = (1 - a^(k+1)) / ((1 - a)(c + 1)) with the measured a and c, with where it stops paying.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from engine.drafters.chain import NGRAM_CHAIN

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {  # name -> (drafter types, adaptive length policy)
    "head-fixed4": (["draft-head"], False),
    "head": (["draft-head"], True),
    "ngram": (list(NGRAM_CHAIN), True),
    "ngram+head": (list(NGRAM_CHAIN) + ["draft-head"], True),
}


def run(engine, ids, types, adaptive, n_new, n_max, p_min):
    from engine.params import GenParams, SpecParams

    params = GenParams(max_new_tokens=n_new, spec=SpecParams(types=types, n_max=n_max, adaptive=adaptive,
                                                             p_min=p_min))
    t0 = time.perf_counter()
    events = list(engine.generate(ids, params))
    return events, time.perf_counter() - t0


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def seed_formula(a: float, c: float, k: int) -> float:
    """Seed 004: tokens per round (1 - a^(k+1)) / (1 - a) over a round's cost (c + 1) plain steps."""
    return (k + 1 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)) / (c + 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Held-out acceptance and speed of the draft head.")
    ap.add_argument("--prompts", type=Path, nargs="+", default=[ROOT / "assets" / "prompts" / "heldout.jsonl"])
    ap.add_argument("--weights", type=Path, default=None, help="head weights (default: the shipped ones)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--n-max", type=int, default=4, help="longest draft (acceptance and speed runs)")
    ap.add_argument("--p-min", type=float, default=None,
                    help="p_min of the speed runs (default: the engine's, SpecParams.p_min)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    from engine.drafters.draft_head import DraftHeadParams
    from engine.models import load_model
    from engine.slots import Engine

    from engine.params import SpecParams

    if args.p_min is None:
        args.p_min = SpecParams().p_min
    rows = [json.loads(line) for p in args.prompts for line in p.read_text().splitlines() if line.strip()]
    target = load_model("embedded")
    extra = {"draft-head": DraftHeadParams(weights=args.weights)} if args.weights else None
    engine = Engine(target, n_ctx=4096, n_seq_max=1, drafter_params=extra)
    t1 = engine.cost.seconds[0]
    print(f"{len(rows)} held-out prompts: " + ", ".join(r["id"] for r in rows))
    print(f"speed runs: adaptive length policy, n_max {args.n_max}, p_min {args.p_min}; acceptance runs: "
          f"fixed {args.n_max}-token drafts, p_min 0")
    print(f"one-token target forward: {t1 * 1e3:.1f} ms; verify cost c(k+1) = "
          + ", ".join(f"k={k}: {engine.cost.c(k + 1):.2f}" for k in range(1, args.n_max + 1)))
    acc_pos = [0] * args.n_max
    reach_pos = [0] * args.n_max
    n_rounds = n_acc = 0
    t_draft_ms = n_drafted = 0.0
    speed: dict[str, dict[str, list[float]]] = {}
    lossless = True
    print(f"{'prompt':22s} {'kind':5s} {'n':>4s} {'plain':>6s} " + " ".join(f"{c:>11s}" for c in CONFIGS))
    for row in rows:
        ids = target.encode_chat(row["messages"])
        plain_ev, plain_s = run(engine, ids, [], False, args.max_new_tokens, args.n_max, 0.0)
        plain = [t for e in plain_ev for t in e.emitted]
        cells = []
        for name, (types, adaptive) in CONFIGS.items():
            p_min = 0.0 if name == "head-fixed4" else args.p_min
            events, secs = run(engine, ids, types, adaptive, args.max_new_tokens, args.n_max, p_min)
            ok = [t for e in events for t in e.emitted] == plain
            lossless &= ok
            ratio = plain_s / secs
            speed.setdefault(name, {}).setdefault(row.get("kind", "all"), []).append(ratio)
            cells.append(f"{ratio:10.2f}x" + ("" if ok else "!"))
            if name == "head-fixed4":
                for e in events:
                    if e.kind != "spec" or e.drafter != "draft-head":
                        continue
                    n_rounds += 1
                    n_acc += e.n_accepted
                    t_draft_ms += e.t_draft_ms
                    n_drafted += len(e.drafted)
                    for i in range(len(e.drafted)):
                        reach_pos[i] += 1
                        acc_pos[i] += i < e.n_accepted
        print(f"{row['id'][:22]:22s} {row.get('kind', ''):5s} {len(plain):4d} {len(plain) / plain_s:5.1f}/s "
              + " ".join(cells), flush=True)
    rates = [a / r if r else 0.0 for a, r in zip(acc_pos, reach_pos)]
    mean_len = 1 + n_acc / max(1, n_rounds)
    per_tok = t_draft_ms / max(1, n_drafted)
    print("\nacceptance by draft position (conditional on reaching it): "
          + ", ".join(f"{i + 1}: {rates[i]:.3f}"
                      for i in range(args.n_max)))
    uncond = [a / max(1, n_rounds) for a in acc_pos]
    print(f"acceptance at draft position 1: {rates[0]:.3f}; mean acceptance length (n_max {args.n_max}, "
          f"fixed drafts): {mean_len:.2f} tokens per round; rounds {n_rounds}")
    print(f"draft cost: {per_tok:.2f} ms per drafted token (catch-up included) = "
          f"{per_tok / (t1 * 1e3):.3f} of a one-token target forward")
    # a: the per-position rate that gives the measured mean acceptance length at k = n_max
    k = args.n_max
    a = next((x / 1000 for x in range(1, 1000) if seed_formula(x / 1000, 0, k) >= mean_len), 0.999)
    print(f"seed 004: a = {a:.3f} (fits the mean length; per-position unconditional "
          f"{', '.join(f'{u:.2f}' for u in uncond)})")
    for kk in range(1, k + 1):
        c = engine.cost.c(kk + 1) - 1 + kk * per_tok / (t1 * 1e3)
        even = next((x / 1000 for x in range(1, 1000) if seed_formula(x / 1000, c, kk) >= 1.0), 1.0)
        print(f"  k={kk}: c = {c:.2f}, estimated speedup {seed_formula(a, c, kk):.2f}x, pays while a > {even:.2f}")
    print("\nmeasured speedup over plain decoding (geometric mean per prompt kind; timings noisy, ratios "
          "measured back to back):")
    for name, kinds in speed.items():
        print(f"  {name:11s} " + "  ".join(f"{kind}: {geomean(v):.2f}x ({len(v)})" for kind, v in kinds.items()))
    print("lossless: " + ("yes, every run token-identical to plain decoding" if lossless else "NO"))
    return 0 if lossless else 1


if __name__ == "__main__":
    raise SystemExit(main())
