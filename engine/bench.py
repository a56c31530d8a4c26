"""`python -m engine.bench`: plain vs speculative decoding on the same prompts and seeds, into traces.csv.

For every prompt it runs our plain decoding and our speculative decoding with the same seed, checks that the
outputs are identical (the lossless check comes before any speed claim), and writes one row per prompt and
configuration with the columns of seed 004's schema. `--compare hf` adds transformers' own generate() greedy
and prompt-lookup decoding on the same prompts. `--n-max`, `--parallel`, `--ctx-len` and `--synthetic-accept`
take comma-separated lists and the bench runs their cross product (engine.benchsweep); synthetic-acceptance
rows keep tokens the target did not choose, so they are not lossless by design: their `lossless_ok` is "n/a"
and never fails the run. `--plots DIR` writes the speedup curves (engine.benchplot). Exit status: 0 ok, 1 if
any lossless check failed, 2 on bad arguments or models (with a one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from engine.benchrun import BenchConfig, RunResult
from engine.benchsweep import cells_needed, run_sweep, sweep_from_args

COLUMNS = [
    "prompt_id", "spec_decode", "spec_types", "n_max", "temp", "seed", "concurrency", "ctx_len", "quant_bits",
    "n_gen", "tps", "tps_baseline", "speedup", "lossless_ok", "mean_acc_len", "draft_accept_rate",
    "acc_rate_pos", "verify_cost_c", "rollback_mode", "n_rounds", "n_drafted", "n_accepted", "t_draft_ms",
    "t_verify_ms", "t_rollback_ms", "t_round_ms", "t_plain_step_ms", "model", "prompt_kind",
    # sweeps: decode-only speeds (the prefill excluded), the group's aggregate, seed 004's alpha, synthetic P
    "tps_decode", "tps_decode_baseline", "speedup_decode", "tps_group", "accept_p", "synthetic_accept",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="JSONL: {id, messages} or {id, prompt}")
    ap.add_argument("--out", default="traces.csv")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--spec", default="ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache",
                    help="drafter types in relay order, comma-separated ('none' = baseline only)")
    ap.add_argument("--n-max", default="16", help="draft tokens per round at most; a list sweeps: 2,4,8")
    ap.add_argument("--n-min", type=int, default=0)
    ap.add_argument("--p-min", type=float, default=None,
                    help="model drafters stop below this top probability (default: each drafter's own)")
    ap.add_argument("--no-adaptive", action="store_true", help="verify whatever the drafter offers")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--parallel", default="1", help="prompts decoded at once (slots); a list sweeps: 1,2,4")
    ap.add_argument("--ctx-len", default="0", help="tokens of filler context put before each prompt; a list sweeps")
    ap.add_argument("--synthetic-accept", default=None,
                    help="also run the 'synthetic' drafter (k = n_max, adaptive off) keeping each draft token with "
                         "probability P; a list sweeps: 0.2,0.5,0.8. Not lossless by design (lossless_ok n/a)")
    ap.add_argument("--ignore-eos", action="store_true", help="generate --max-new-tokens whatever the text")
    ap.add_argument("--plots", default=None, metavar="DIR", help="write the speedup curves (HTML, PNG) here")
    ap.add_argument("--n-ctx", type=int, default=4096, help="cells of the KV cache (raised to fit the sweep)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rollback", choices=["auto", "checkpoint"], default="auto")
    ap.add_argument("--n-rs", type=int, default=0,
                    help="recurrent targets: undo rejected tails of up to N tokens from kept states (RS)")
    ap.add_argument("--compare", choices=["hf"], default=None)
    ap.add_argument("--trust-remote-code", action="store_true")
    return ap.parse_args(argv)


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


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _ratio(a: float, b: float):
    return round(a / b, 4) if a > 0 and b > 0 else ""


def make_row(cfg: BenchConfig, prompt: dict, res: list[RunResult], base: list[RunResult] | None,
             spec_types: str, model: str, tps_group: float = 0.0) -> dict:
    pid = prompt["id"]
    r0 = res[0]
    tps = _median([r.tps for r in res])
    tps_base = _median([b.tps for b in base]) if base else tps
    tpd = _median([r.tps_decode for r in res])
    tpd_base = _median([b.tps_decode for b in base]) if base else tpd
    return {
        "prompt_id": pid, "spec_decode": "on" if r0.spec_on else "off", "spec_types": spec_types,
        "n_max": cfg.spec.n_max if r0.spec_on else 0, "temp": cfg.sampling.temp, "seed": cfg.sampling.seed,
        "concurrency": cfg.parallel, "ctx_len": cfg.ctx_len, "quant_bits": cfg.quant_bits, "n_gen": len(r0.tokens),
        "tps": round(tps, 3), "tps_baseline": round(tps_base, 3),
        "speedup": round(tps / tps_base, 4) if tps_base > 0 else "",
        "lossless_ok": r0.lossless_ok, "mean_acc_len": round(r0.mean_acc_len, 4),
        "draft_accept_rate": round(r0.accept_rate, 4),
        "acc_rate_pos": ";".join(f"{a:.3f}" for a in r0.acc_rate_pos), "verify_cost_c": round(r0.verify_cost_c, 4),
        "rollback_mode": r0.rollback_mode, "n_rounds": r0.n_rounds, "n_drafted": r0.n_drafted,
        "n_accepted": r0.n_accepted, "t_draft_ms": round(r0.t_draft_ms, 2), "t_verify_ms": round(r0.t_verify_ms, 2),
        "t_rollback_ms": round(r0.t_rollback_ms, 3), "t_round_ms": round(r0.t_round_ms, 2),
        "t_plain_step_ms": round(r0.t_plain_step_ms, 2), "model": model, "prompt_kind": prompt.get("kind", ""),
        "tps_decode": round(tpd, 3), "tps_decode_baseline": round(tpd_base, 3), "speedup_decode": _ratio(tpd, tpd_base),
        "tps_group": round(tps_group, 3), "accept_p": round(r0.accept_p, 4),
        "synthetic_accept": cfg.spec.synthetic_accept if r0.spec_on and cfg.spec.synthetic_accept is not None else "",
    }


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def _label(r: dict) -> str:
    name = r["spec_types"] or "plain"
    return f"synthetic P={float(r['synthetic_accept']):g}" if r.get("synthetic_accept") not in (None, "") else name


def print_summary(rows: list[dict]) -> None:
    """One line per row; a sweep adds its concurrency (N), context length and n_max columns."""
    sweeping = len({(r["concurrency"], r["ctx_len"]) for r in rows}) > 1 or \
        len({r["n_max"] for r in rows if r["spec_decode"] == "on"}) > 1
    extra = f" {'N':>2} {'ctx':>5} {'k':>3}" if sweeping else ""
    head = (f"{'prompt':<22} {'config':<18}{extra} {'n_gen':>5} {'tok/s':>7} {'speedup':>7} {'acc len':>7} "
            f"{'acc':>5} {'c':>5} lossless")
    print(head)
    print("-" * len(head))
    for r in rows:
        cols = f" {r['concurrency']:>2} {r['ctx_len']:>5} {r['n_max']:>3}" if sweeping else ""
        print(f"{str(r['prompt_id'])[:22]:<22} {_label(r)[:18]:<18}{cols} {r['n_gen']:>5} {r['tps']:>7.2f} "
              f"{float(r['speedup'] or 0):>7.3f} {r['mean_acc_len']:>7.2f} {r['draft_accept_rate']:>5.2f} "
              f"{r['verify_cost_c']:>5.2f} {r['lossless_ok']}")
    by_cfg: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if (r["spec_decode"] == "on" or r["spec_types"].startswith("hf-")) and not r.get("synthetic_accept"):
            name = r["spec_types"] + (f" (N={r['concurrency']}, ctx={r['ctx_len']}, k={r['n_max']})"
                                      if sweeping else "")
            for kind in {"all", r["prompt_kind"]} - {""}:
                by_cfg.setdefault((name, kind), []).append(float(r["speedup"] or 0))
    for (name, kind), xs in by_cfg.items():
        print(f"geomean speedup {name} [{kind}]: {geomean(xs):.3f}x over our plain decoding ({len(xs)} prompts)")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    try:
        prompts = load_prompts(args.prompts)
        sweep = sweep_from_args(args)
        cfg = BenchConfig.from_args(args, n_max=min(sweep.n_max), parallel=sweep.parallel[0], ctx_len=sweep.ctx_len[0])
        target, draft = cfg.load()
        cfg.n_ctx = max(cfg.n_ctx, cells_needed(target, prompts, sweep, cfg.max_new_tokens))
        engine = cfg.build(target, draft, n_seq_max=max(sweep.parallel), n_draft=max(sweep.n_max))
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = run_sweep(cfg, engine, prompts, sweep, args.repeat, args.compare, make_row, args.target)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print_summary(rows)
    if len(sweep.n_max) * len(sweep.parallel) * len(sweep.ctx_len) > 1 or sweep.synthetic:
        from engine.benchstats import print_sweep_summary

        print_sweep_summary(rows)
    print(f"wrote {len(rows)} rows to {args.out}")
    if args.plots:
        from engine.benchplot import write_plots

        for line in write_plots(rows, args.plots):
            print(line)
    return 1 if any(r["lossless_ok"] is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
