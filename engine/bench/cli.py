"""`python -m engine.bench`: plain vs speculative decoding on the same prompts and seeds, into traces.csv.

For every prompt it runs our plain decoding and our speculative decoding with the same seed, checks that the
outputs are identical (the lossless check comes before any speed claim), and writes one row per prompt and
configuration with the columns of engine.bench.rows.COLUMNS. A run with a drafter that gives its distribution
(draft-simple, draft-head) at --temp > 0 is verified by rejection sampling, which is lossless in distribution
but draws differently from plain sampling, so the same seed gives other tokens: its `lossless_ok` is "n/a"
(`python -m engine.bench.dist` checks the distribution instead); n-gram drafters and draft-uni (a --draft model of
another vocabulary, drafting through text) at --temp > 0 are verified by sample-and-match and are still compared
token for token. `--compare hf,llama.cpp` adds other implementations
on the same prompt ids (engine.bench.compare): transformers' generate and prompt lookup on a stock float32
copy, and llama.cpp on the same GGUF; `--compare remote:URL` runs the prompts on another server too, side by side
(engine.bench.remote_side); `--dtype` picks our weights' dtype (engine.load.dtype). `--n-max`, `--parallel`, `--ctx-len` and
`--synthetic-accept` take comma-separated lists and the bench runs their cross product (engine.bench.sweep);
synthetic-acceptance rows keep tokens the target did not choose, so they are not lossless by design: their
`lossless_ok` is "n/a" and never fails the run. `--plots DIR` writes the speedup curves (engine.bench.plot).
Exit status: 0 ok, 1 if any lossless check failed ("n/a" rows are not checks), 2 on bad arguments or models
(with a one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from engine.bench.compare import Comparators, parse_compare
from engine.bench.lossless import WHY_NA, why_na
from engine.bench.provenance import provenance
from engine.bench.remote_side import Server, split_remote
from engine.bench.remote_side import report as report_side_by_side
from engine.bench.rows import write_rows
from engine.bench.inputs import prompt_grammar
from engine.bench.run import BenchConfig
from engine.bench.stats import OTHER_IMPLEMENTATIONS, geomean, is_other, print_sweep_summary, synthetic_name
from engine.bench.sweep import cells_needed, run_sweep, sweep_from_args
from engine.bench.trend import describe, trends
from engine.draft.registry import PRIORITY
from engine.forward.device import DEVICE_HELP
from engine.load.dtype import CHOICES


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="JSONL: {id, messages} or {id, prompt}")
    ap.add_argument("--out", default="traces.csv")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default=None, help="draft model (draft-simple; of another vocabulary: draft-uni), or an "
                    "EAGLE-3 head's directory (EAGLE's or speculators' layout: draft-eagle3 in draft-simple's place), "
                    "or a DFlash or DSpark checkpoint, directory or GGUF (draft-dflash or draft-dspark in "
                    "draft-simple's place)")
    ap.add_argument("--spec", default="ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache",
                    help="drafter types in relay order, comma-separated ('none' = baseline only); known: "
                         + ", ".join(PRIORITY))
    ap.add_argument("--n-max", default="16", help="draft tokens per round at most; a list sweeps: 2,4,8")
    ap.add_argument("--n-min", type=int, default=0)
    ap.add_argument("--p-min", type=float, default=None,
                    help="model drafters stop below this top probability (default: each drafter's own)")
    ap.add_argument("--no-adaptive", action="store_true", help="verify whatever the drafter offers")
    ap.add_argument("--tree", choices=["on", "off"], default="off",
                    help="on: every drafter proposes and one forward checks the merged tree (engine/draft/tree.py)")
    ap.add_argument("--tree-nodes", type=int, default=16, help="with --tree on: draft nodes per slot and round at most")
    ap.add_argument("--head-tree", default=None, metavar="BRANCH,WIDTH,MIN_SCORE",
                    help="with --tree on: the draft head's tree shape, children per node, nodes expanded per depth "
                         "and the score below which a node is not expanded (default 4,4,0.2)")
    ap.add_argument("--temp", type=float, default=0.0, help="> 0 with draft-simple or draft-head: verified by "
                    "rejection sampling, lossless in distribution but not token for token, so lossless_ok is n/a "
                    "(python -m engine.bench.dist checks the distribution)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--parallel", default="1", help="prompts decoded at once (slots); a list sweeps: 1,2,4")
    ap.add_argument("--ctx-len", default="0", help="tokens of filler context put before each prompt; a list sweeps")
    ap.add_argument("--synthetic-accept", default=None,
                    help="also run the 'synthetic' drafter (k = n_max, adaptive off) keeping each draft token with "
                         "probability P; a list sweeps: 0.2,0.5,0.8; P per draft position joined by /: 0.9/0.7/0.5 "
                         "(the last for the positions past it). Not lossless by design (lossless_ok n/a)")
    _add_run_args(ap)
    return ap.parse_args(argv)


def _add_run_args(ap: argparse.ArgumentParser) -> None:
    """How the bench runs what it runs: lengths, caches, budgets, other implementations, the machine's side."""
    ap.add_argument("--ignore-eos", action="store_true", help="generate --max-new-tokens whatever the text")
    ap.add_argument("--plots", default=None, metavar="DIR", help="write the speedup curves (HTML, PNG) here")
    ap.add_argument("--n-ctx", type=int, default=4096, help="cells of the KV cache (raised to fit the sweep)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rollback", choices=["auto", "checkpoint"], default="auto")
    ap.add_argument("--n-rs", type=int, default=0,
                    help="recurrent targets: undo rejected tails of up to N tokens from kept states (RS)")
    ap.add_argument("--budget", choices=["fair", "goodput"], default="fair",
                    help="with --parallel > 1: fair (default) keeps every answer at plain decoding's speed or better; "
                         "goodput lets the batch's tokens per second alone choose the draft rows")
    ap.add_argument("--compare", default=None, metavar="hf,llama.cpp",
                    help="also run other implementations on the same prompt ids: hf (transformers' generate and "
                         "prompt lookup on a stock float32 copy), llama.cpp (the same GGUF through llama-cpp-python, "
                         "optional: ./scripts/setup.sh --llamacpp); their rows' lossless_ok is n/a, match_plain "
                         "counts their leading tokens equal to ours. remote:URL: the prompts on that server too, "
                         "side by side (remote-plain:URL: the same model served without speculation; key: "
                         "SPECPLAY_REMOTE_KEY)")
    ap.add_argument("--threads", type=int, default=None, help="forwards on this many threads; default: all cores, "
                    "fewer while another process holds some (engine/serve/threads.py)")
    ap.add_argument("--dtype", choices=list(CHOICES), default="auto",
                    help="weights of target and draft (auto: for a GGUF with Q4_1 / Q8_0 blocks, int8 where its "
                         "integer kernel is faster, else float32 read from the blocks; for others, bfloat16 where "
                         "this CPU computes it natively and it is faster, by a timed forward); plain and "
                         "speculative runs share it")
    ap.add_argument("--device", default="auto", help=DEVICE_HELP)
    fmt = ap.add_mutually_exclusive_group()
    fmt.add_argument("--json-schema", default=None, metavar="FILE",
                     help="constrain every answer to this JSON schema (a prompt's own json_schema or regex wins)")
    fmt.add_argument("--regex", default=None, metavar="R", help="constrain every answer to this regex")
    fmt.add_argument("--grammar", default=None, metavar="FILE",
                     help="constrain every answer to this Lark grammar (a .gbnf file: llama.cpp's GBNF)")
    ap.add_argument("--trust-remote-code", action="store_true")


def load_prompts(path: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"prompts file not found: {path}")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from e
        if "messages" not in obj and "prompt" not in obj:
            raise ValueError(f"{path}:{n}: needs 'messages' or 'prompt'")
        obj.setdefault("id", str(n))
        out.append(obj)
    if not out:
        raise ValueError(f"no prompts in {path}")
    return out


def setup_grammar(cfg, engine, prompts: list[dict], args) -> None:
    """Check every output format of the run against the target's tokenizer (a bad one stops the run before it
    starts) and put the grammar drafter first in the chain when any prompt has a format."""
    specs = [s for s in [cfg.grammar] + [prompt_grammar(p) for p in prompts] if s is not None]
    if not specs:
        return
    if args.compare or args.synthetic_accept:
        # generate() is unconstrained and synthetic acceptance keeps tokens the grammar may forbid: neither
        # would be compared with constrained plain decoding
        raise ValueError("a grammar does not go with --compare or --synthetic-accept")
    if args.ignore_eos:
        raise ValueError("a grammar and --ignore-eos do not go together: the grammar ends the answer")
    for spec in specs:
        spec.validate(engine.grammar_tokenizer())
    if cfg.spec.types and "grammar" not in cfg.spec.types:
        cfg.spec.types.insert(0, "grammar")  # free drafts of the forced tokens; other prompts skip it


def _label(r: dict) -> str:
    name = r["spec_types"] or "plain"
    return synthetic_name(r) if r.get("synthetic_accept") not in (None, "") else name


def _own_column(r: dict) -> str:
    return f" {float(r['speedup_decode'] or 0):>6.3f}" if r.get("speedup_decode") not in (None, "") else f" {'':>6}"


def print_summary(rows: list[dict]) -> None:
    """One line per row; a sweep adds its concurrency (N), context length and n_max columns."""
    sweeping = len({(r["concurrency"], r["ctx_len"]) for r in rows}) > 1 or \
        len({r["n_max"] for r in rows if r["spec_decode"] == "on"}) > 1
    extra = f" {'N':>2} {'ctx':>5} {'k':>3}" if sweeping else ""
    # several slots: `speedup` is the group's (its slots' tokens over its time), `own` the prompt's own decode
    # speed over its plain run's: what its user sees
    shared = any(int(r["concurrency"]) > 1 for r in rows)
    head = (f"{'prompt':<22} {'config':<18}{extra} {'n_gen':>5} {'tok/s':>7} {'speedup':>7}"
            f"{' ' + format('own', '>6') if shared else ''} {'acc len':>7} {'acc':>5} {'c':>5} lossless")
    print(head)
    print("-" * len(head))
    for r in rows:
        cols = f" {r['concurrency']:>2} {r['ctx_len']:>5} {r['n_max']:>3}" if sweeping else ""
        print(f"{str(r['prompt_id'])[:22]:<22} {_label(r)[:18]:<18}{cols} {r['n_gen']:>5} {r['tps']:>7.2f} "
              f"{float(r['speedup'] or 0):>7.3f}{_own_column(r) if shared else ''} "
              f"{r['mean_acc_len']:>7.2f} {r['draft_accept_rate']:>5.2f} "
              f"{r['verify_cost_c']:>5.2f} {r['lossless_ok']}")
    by_cfg: dict[tuple[str, str], list[float]] = {}
    per_forward: dict[tuple[str, str], list[int]] = {}  # (config, kind) -> [decoded tokens, decode rounds]
    for r in rows:
        if (r["spec_decode"] == "on" or is_other(r)) and not r.get("synthetic_accept"):
            name = r["spec_types"] + (f" (N={r['concurrency']}, ctx={r['ctx_len']}, k={r['n_max']})"
                                      if sweeping else "")
            for kind in {"all", r["prompt_kind"]} - {""}:
                by_cfg.setdefault((name, kind), []).append(float(r["speedup"] or 0))
                if not is_other(r) and r.get("tokens_per_forward") not in (None, ""):
                    acc = per_forward.setdefault((name, kind), [0, 0])
                    acc[0] += max(0, int(r["n_gen"]) - 1)
                    acc[1] += int(r["n_rounds"])
    for (name, kind), xs in by_cfg.items():
        line = f"geomean speedup {name} [{kind}]: {geomean(xs):.3f}x over our plain decoding ({len(xs)} prompts)"
        n_tok, n_fwd = per_forward.get((name, kind), (0, 0))
        print(line + (f"; {n_tok / n_fwd:.2f} tokens per target forward" if n_fwd else ""))
    if shared:
        for name in sorted({r["spec_types"] for r in rows if r["spec_decode"] == "on"}):
            own = [r for r in rows if r["spec_types"] == name and r["speedup_decode"] not in (None, "")]
            if own:
                low = min(own, key=lambda r: float(r["speedup_decode"]))
                print(f"slowest prompt under {name}: {low['prompt_id']} at {float(low['speedup_decode']):.3f}x "
                      f"its plain decode speed ({len(own)} prompts sharing forwards)")
    for other in OTHER_IMPLEMENTATIONS:
        xs = [float(r["speedup"] or 0) for r in rows if r["spec_types"] == other]
        if xs:
            print(f"our plain decoding ({rows[0]['dtype']}) is {1 / geomean(xs):.3f}x {other} (geomean over "
                  f"{len(xs)} prompts)")
    for reason in sorted({why_na(r) for r in rows} - {None}):
        print(f"lossless n/a: {WHY_NA[reason]}")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    try:
        prompts = load_prompts(args.prompts)
        sweep = sweep_from_args(args)
        args.compare, remote = split_remote(args.compare)
        kinds = parse_compare(args.compare, args.target)
        cfg = BenchConfig.from_args(args, n_max=min(sweep.n_max), parallel=sweep.parallel[0], ctx_len=sweep.ctx_len[0])
        target, draft = cfg.load()
        cfg.n_ctx = max(cfg.n_ctx, cells_needed(target, prompts, sweep, cfg.max_new_tokens))
        engine = cfg.build(target, draft, n_seq_max=max(sweep.parallel), n_draft=max(sweep.n_max))
        setup_grammar(cfg, engine, prompts, args)
        compare = Comparators.load(kinds, cfg, cfg.n_ctx) if kinds else None
        server = Server(remote) if remote else None  # asked what it runs: an unreachable server stops us here
    except (ValueError, RuntimeError, OSError) as e:  # engine.remote's RemoteError is a RuntimeError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"dtype: {cfg.dtype_used} ({cfg.dtype_reason}); forward: "
          f"{engine.ctx.describe_forward()}", file=sys.stderr)
    rows = run_sweep(cfg, engine, prompts, sweep, args.repeat, compare, args.target)
    argv = sys.argv[1:] if argv is None else argv
    write_rows(rows, args.out, measured=provenance(
        device=str(engine.ctx.device), model=args.target, command=shlex.join(["python", "-m", "engine.bench", *argv]),
        repeats=args.repeat, warmups=1 + bool(cfg.spec.types)))  # run_sweep's untimed runs: plain, then spec
    print_summary(rows)
    if len(sweep.n_max) * len(sweep.parallel) * len(sweep.ctx_len) > 1 or sweep.synthetic:
        print_sweep_summary(rows)
        for trend in trends(rows):  # the measurement guide's test: does the gain fall at high concurrency?
            print(describe(trend))
    print(f"wrote {len(rows)} rows to {args.out}")
    if args.plots:
        from engine.bench.plot import write_plots  # plotly and matplotlib: only when plots are asked for

        for line in write_plots(rows, args.plots):
            print(line)
    if server is not None:
        print("\n".join(report_side_by_side(cfg, engine, prompts, server, args.out, args.plots)))
    return 1 if any(r["lossless_ok"] is False for r in rows) else 0

