"""`python -m engine.bench`: plain vs speculative decoding on the same prompts and seeds, into traces.csv.

For every prompt it runs our plain decoding and our speculative decoding with the same seed, checks that the
outputs are identical (the lossless check comes before any speed claim), and writes one row per prompt and
configuration with the columns of seed 004's schema. `--compare hf` adds transformers' own generate() greedy
and prompt-lookup decoding on the same prompts. Exit status: 0 ok, 1 if any lossless check failed, 2 on bad
arguments or models (with a one-line reason on stderr).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

from engine.benchrun import BenchConfig, RunResult, run_hf, run_ours

COLUMNS = [
    "prompt_id", "spec_decode", "spec_types", "n_max", "temp", "seed", "concurrency", "ctx_len", "quant_bits",
    "n_gen", "tps", "tps_baseline", "speedup", "lossless_ok", "mean_acc_len", "draft_accept_rate",
    "acc_rate_pos", "verify_cost_c", "rollback_mode", "n_rounds", "n_drafted", "n_accepted", "t_draft_ms",
    "t_verify_ms", "t_rollback_ms", "t_round_ms", "t_plain_step_ms", "model", "prompt_kind",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", required=True, help="JSONL: {id, messages} or {id, prompt}")
    ap.add_argument("--out", default="traces.csv")
    ap.add_argument("--target", default="embedded")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--spec", default="ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod,ngram-cache",
                    help="drafter types in relay order, comma-separated ('none' = baseline only)")
    ap.add_argument("--n-max", type=int, default=16)
    ap.add_argument("--n-min", type=int, default=0)
    ap.add_argument("--p-min", type=float, default=0.75)
    ap.add_argument("--no-adaptive", action="store_true", help="verify whatever the drafter offers")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--ctx-len", type=int, default=0, help="tokens of filler context put before each prompt")
    ap.add_argument("--n-ctx", type=int, default=4096, help="cells of the KV cache")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--rollback", choices=["auto", "checkpoint"], default="auto")
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


def make_row(cfg: BenchConfig, prompt: dict, res: list[RunResult], base: list[RunResult] | None,
             spec_types: str, model: str) -> dict:
    pid = prompt["id"]
    r0 = res[0]
    tps = _median([r.tps for r in res])
    tps_base = _median([b.tps for b in base]) if base else tps
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
    }


def geomean(xs: list[float]) -> float:
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def print_summary(rows: list[dict]) -> None:
    head = f"{'prompt':<22} {'config':<18} {'n_gen':>5} {'tok/s':>7} {'speedup':>7} {'acc len':>7} {'acc':>5} {'c':>5} lossless"
    print(head)
    print("-" * len(head))
    for r in rows:
        cfg = r["spec_types"] or "plain"
        print(f"{str(r['prompt_id'])[:22]:<22} {cfg[:18]:<18} {r['n_gen']:>5} {r['tps']:>7.2f} "
              f"{float(r['speedup'] or 0):>7.3f} {r['mean_acc_len']:>7.2f} {r['draft_accept_rate']:>5.2f} "
              f"{r['verify_cost_c']:>5.2f} {r['lossless_ok']}")
    by_cfg: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r["spec_decode"] == "on" or r["spec_types"].startswith("hf-"):
            for kind in {"all", r["prompt_kind"]} - {""}:
                by_cfg.setdefault((r["spec_types"], kind), []).append(float(r["speedup"] or 0))
    for (name, kind), xs in by_cfg.items():
        print(f"geomean speedup {name} [{kind}]: {geomean(xs):.3f}x over our plain decoding ({len(xs)} prompts)")


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return 2 if e.code not in (0, None) else 0
    try:
        prompts = load_prompts(args.prompts)
        cfg = BenchConfig.from_args(args)
        ctx = cfg.build()
    except (ValueError, RuntimeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = run_all(cfg, ctx, prompts, args)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print_summary(rows)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 1 if any(r["lossless_ok"] is False for r in rows) else 0


def run_all(cfg: BenchConfig, ctx, prompts: list[dict], args) -> list[dict]:
    from tqdm import tqdm

    rows = []
    groups = [prompts[i:i + cfg.parallel] for i in range(0, len(prompts), cfg.parallel)]
    spec_name = ",".join(cfg.spec.types)
    model = args.target
    run_ours(cfg, ctx, groups[0][:1], spec=False, warmup=True)
    bar = tqdm(total=len(groups) * args.repeat, desc="bench", file=sys.stderr, disable=None)
    for group in groups:
        base_runs: list[list[RunResult]] = [[] for _ in group]
        spec_runs: list[list[RunResult]] = [[] for _ in group]
        for _ in range(args.repeat):
            for i, r in enumerate(run_ours(cfg, ctx, group, spec=False)):
                base_runs[i].append(r)
            if cfg.spec.types:
                for i, r in enumerate(run_ours(cfg, ctx, group, spec=True, reference=[b[0] for b in base_runs])):
                    spec_runs[i].append(r)
            bar.update(1)
        for i, p in enumerate(group):
            rows.append(make_row(cfg, p, base_runs[i], None, "", model))
            if cfg.spec.types:
                rows.append(make_row(cfg, p, spec_runs[i], base_runs[i], spec_name, model))
            if args.compare == "hf":
                for kind in ("hf-generate", "hf-prompt-lookup"):
                    hf = [run_hf(cfg, ctx, p, kind, base_runs[i][0]) for _ in range(args.repeat)]
                    rows.append(make_row(cfg, p, hf, base_runs[i], kind, model))
    bar.close()
    return rows


if __name__ == "__main__":
    sys.exit(main())
