"""`python -m engine.bench.arena`: every drafter alone, the default chain and an oracle on the same prompts, ranked.

    python -m engine.bench.arena --prompts FILE [--target embedded] [--draft MODEL] [--n-max 8]
                                 [--max-new-tokens 128] [--limit N] --out arena.csv --png arena.png

For each prompt a plain greedy run gives the reference answer and the plain time; then each contender replays
the prompt on the same engine (engine/bench/contest.py): every drafter the loaded models allow (the others are
listed with the reason), the default chain, and the oracle that drafts the reference answer itself (the ceiling).
Each run is checked against the plain answer token for token. The leaderboard (engine/bench/leaderboard.py)
ranks them by tokens per target forward, the oracle on top, with acceptance per position, the speedup over
plain decoding and a round's cost split into drafting, forward and the rest; --out writes it as CSV, --png as a
bar chart of tokens per forward. Exit status: 0 ok, 1 if a run was not lossless, 2 on bad arguments or models.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.bench.cli import load_prompts
from engine.bench.contest import ArenaParams, engine_runner, run_arena
from engine.bench.leaderboard import format_table, leaderboard, write_csv, write_png
from engine.bench.run import prompt_ids_of
from engine.draft.lin_path import PATHS
from engine.draft.registry import parse_types
from engine.forward.device import DEVICE_HELP
from engine.load.dtype import CHOICES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench.arena", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="JSONL: {id, messages} or {id, prompt}")
    ap.add_argument("--limit", type=int, default=None, help="only the first N prompts of the file")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default=None, help="a draft model (draft-simple or, of another vocabulary, draft-uni "
                    "competes), a directory holding an EAGLE-3 head (draft-eagle3 competes) or a DFlash or DSpark "
                    "checkpoint, a directory or a GGUF (draft-dflash or draft-dspark competes)")
    ap.add_argument("--n-max", type=int, default=8, help="draft tokens per round at most, every contender")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--chain", default=None,
                    help="the chain contender, comma-separated in relay order (default: the page's starting "
                         "chain, the n-gram drafters and draft-head where its head fits the target)")
    ap.add_argument("--no-adaptive", action="store_true", help="real drafters verify whatever they offer")
    ap.add_argument("--ignore-eos", action="store_true", help="generate --max-new-tokens whatever the text")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--n-ctx", type=int, default=4096, help="cells of the KV cache")
    ap.add_argument("--dtype", choices=list(CHOICES), default="auto", help="weights of target and draft")
    ap.add_argument("--head-dtype", choices=list(PATHS), default="auto",
                    help="linears of draft-eagle3, draft-mtp, draft-dflash, draft-dspark (auto: timed at load)")
    ap.add_argument("--threads", type=int, default=None, help="forwards on this many threads (default: all)")
    ap.add_argument("--device", default="auto", help=DEVICE_HELP)
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--out", default="arena.csv", help="the leaderboard as CSV")
    ap.add_argument("--png", default=None, help="also a bar chart of tokens per forward, as PNG")
    return ap.parse_args(argv)


def params_from(args: argparse.Namespace) -> ArenaParams:
    if args.n_max < 1 or args.max_new_tokens < 1 or (args.limit is not None and args.limit < 1):
        raise ValueError("--n-max, --max-new-tokens and --limit must be >= 1")
    chain = parse_types(args.chain) if args.chain else None
    if chain is not None and ({"oracle", "synthetic"} & set(chain)):
        raise ValueError("--chain takes real drafters only")
    return ArenaParams(n_max=args.n_max, max_new_tokens=args.max_new_tokens, seed=args.seed,
                       adaptive=not args.no_adaptive, chain=chain, ignore_eos=args.ignore_eos)


def load(args: argparse.Namespace, n_max: int):
    """Target, draft (or None) and the engine every run shares: one slot, logits rows for n_max drafts."""
    from engine.load.models import load_model
    from engine.serve.engine import Engine

    from engine.draft.dflash import DFlashParams
    from engine.draft.head.eagle3 import Eagle3Params
    from engine.draft.mtp import MtpParams
    from engine.load.dflash import dflash_kind
    from engine.load.eagle3 import is_eagle3_dir

    target = load_model(args.target, device=args.device, trust_remote_code=args.trust_remote_code,
                        dtype=args.dtype)
    eagle3 = args.draft if args.draft and is_eagle3_dir(args.draft) else None
    block = dflash_kind(args.draft) if args.draft else None  # a DFlash or DSpark checkpoint: no model either
    draft = (load_model(args.draft, device=args.device, trust_remote_code=args.trust_remote_code,
                        dtype=args.dtype)
             if args.draft and not eagle3 and not block else None)
    drafter_params = {"draft-mtp": MtpParams(dtype=args.head_dtype)}
    if eagle3:
        drafter_params["draft-eagle3"] = Eagle3Params(weights=Path(eagle3), dtype=args.head_dtype)
    if block:
        drafter_params[block] = DFlashParams(weights=Path(args.draft), dtype=args.head_dtype)
    engine = Engine(target, draft=draft, n_ctx=args.n_ctx, n_seq_max=1, n_draft=n_max, threads=args.threads,
                    drafter_params=drafter_params)
    if not engine.probe.can_speculate:
        raise RuntimeError(f"speculation is off for this model: {engine.probe.reason}")
    return target, draft, engine


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    try:
        params = params_from(args)
        prompts = load_prompts(args.prompts)[:args.limit]
        target, draft, engine = load(args, params.n_max)
        if draft is None and args.draft:
            from engine.load.dflash import dflash_kind

            params.dflash, params.eagle3 = (args.draft, None) if dflash_kind(args.draft) else (None, args.draft)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ids = [prompt_ids_of(target, p, 0) for p in prompts]
    print(f"target {target.name} ({target.dtype}); draft {draft.name if draft else 'none'}; {len(ids)} prompts, "
          f"n_max {params.n_max}, up to {params.max_new_tokens} tokens, greedy", file=sys.stderr)

    def tick(done: int, total: int, what: str) -> None:
        print(f"  run {done + 1}/{total}: {what}", file=sys.stderr)

    result = run_arena(engine_runner(engine), ids, target, draft, params, tick)
    rows = leaderboard(result)
    for line in format_table(rows):
        print(line)
    for line in result.skipped:
        print(f"skipped {line}")
    for name, d in engine.pool.items():
        if getattr(d, "lin_path", None) is not None:
            print(f"{name} linears: {d.lin_path.reason}")
    print(f"wrote {write_csv(rows, args.out)}")
    if args.png:
        print(f"wrote {write_png(rows, args.png)}")
    return 1 if any(r["lossless"] == "False" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
