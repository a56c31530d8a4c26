"""The curves of a sweep, from traces.csv rows: pure functions shared by the bench summary, the plots and the UI.

Rows may come straight from the bench (numbers) or from a CSV file (strings); every reader goes through
`num`. Speedups here are decode speedups (`speedup_decode`: tokens/s after the prefill, speculative over
plain in the same group), because at a long context the prefill, identical in both runs, would flatten every
curve towards 1. Rows written before the sweep columns existed fall back to `speedup`.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass


@dataclass
class SyntheticPoint:
    p: float  # synthetic acceptance asked for
    alpha: float  # realised acceptance (accept_p), mean over prompts
    speedup: float  # decode speedup, geometric mean over prompts
    c: float  # measured verify cost (a round = c + 1 plain steps), median over prompts
    n_max: int  # draft length k
    concurrency: int
    ctx_len: int


def num(value, default: float = 0.0) -> float:
    """A cell as a float: '' / None / 'n/a' -> default."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def geomean(xs: list[float]) -> float:
    """Geometric mean of the positive values (a failed run's 0 would zero it); 0.0 if there are none."""
    xs = [x for x in xs if x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else 0.0


def is_synthetic(r: dict) -> bool:
    return r.get("synthetic_accept") not in (None, "") or r.get("spec_types") == "synthetic"


OTHER_IMPLEMENTATIONS = ("hf-generate", "hf-prompt-lookup", "llama.cpp")  # rows of engine.bench.compare


def is_other(r: dict) -> bool:
    """A row of another implementation (transformers' generate, llama.cpp), not of this engine."""
    return str(r.get("spec_types", "")) in OTHER_IMPLEMENTATIONS


def is_chain(r: dict) -> bool:
    """A speculative row of real drafters (not synthetic, not another implementation)."""
    return r.get("spec_decode") == "on" and not is_synthetic(r) and not is_other(r)


def short_name(spec_types: str) -> str:
    """A legend-sized name of a drafter chain: 'ngram-simple +4 more' for the default five."""
    names = [n for n in str(spec_types).split(",") if n]
    return names[0] + (f" +{len(names) - 1} more" if len(names) > 1 else "") if names else "plain"


def speedup_of(r: dict) -> float:
    return num(r.get("speedup_decode")) or num(r.get("speedup"))


def formula(alpha: float, k: int, c: float) -> float:
    """speedup = (1 - a^(k+1)) / ((1 - a)(c + 1)): a round emits (1 - a^(k+1)) / (1 - a) tokens on average
    when each of k draft tokens is kept with chance a given the ones before it were, and costs (c + 1) plain
    steps. The a -> 1 limit is (k + 1) / (c + 1)."""
    tokens = k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    return tokens / (c + 1.0)


def concurrency_curves(rows: list[dict]) -> dict[tuple[str, int, int], list[tuple[int, float, int]]]:
    """(drafters, ctx_len, n_max) -> [(concurrency, geomean decode speedup over prompts, n prompts)]."""
    acc: dict[tuple[str, int, int], dict[int, list[float]]] = {}
    for r in rows:
        if is_chain(r):
            key = (r["spec_types"], int(num(r["ctx_len"])), int(num(r["n_max"])))
            acc.setdefault(key, {}).setdefault(int(num(r["concurrency"])), []).append(speedup_of(r))
    return {key: [(n, geomean(xs), len(xs)) for n, xs in sorted(by_n.items())] for key, by_n in sorted(acc.items())}


def plain_scaling(rows: list[dict]) -> dict[int, list[tuple[int, float]]]:
    """ctx_len -> [(concurrency, aggregate decode tokens/s of plain decoding with that many slots)]."""
    acc: dict[int, dict[int, list[float]]] = {}
    for r in rows:
        if r.get("spec_decode") == "off" and num(r.get("tps_group")) > 0:
            acc.setdefault(int(num(r["ctx_len"])), {}).setdefault(int(num(r["concurrency"])), []).append(
                num(r["tps_group"]))
    return {ctx: [(n, statistics.mean(xs)) for n, xs in sorted(by_n.items())] for ctx, by_n in sorted(acc.items())}


def synthetic_name(r: dict) -> str:
    """A synthetic row's name: its P, or its rates per position."""
    p = str(r.get("synthetic_accept", ""))
    return f"synthetic {p}" if "/" in p else f"synthetic P={num(p):g}" if p else "synthetic"


def synthetic_points(rows: list[dict]) -> list[SyntheticPoint]:
    """One point per synthetic P and configuration, over its prompts (rates per position have no one P for the
    formula: their rows are listed, not fitted)."""
    acc: dict[tuple, list[dict]] = {}
    for r in rows:
        if is_synthetic(r) and r.get("spec_decode") == "on" and "/" not in str(r.get("synthetic_accept", "")):
            key = (num(r["synthetic_accept"]), int(num(r["n_max"])), int(num(r["concurrency"])),
                   int(num(r["ctx_len"])))
            acc.setdefault(key, []).append(r)
    return [SyntheticPoint(p=p, alpha=statistics.mean(num(r["accept_p"]) for r in rs),
                           speedup=geomean([speedup_of(r) for r in rs]),
                           c=statistics.median(num(r["verify_cost_c"]) for r in rs), n_max=k, concurrency=n,
                           ctx_len=ctx)
            for (p, k, n, ctx), rs in sorted(acc.items())]


def config_c(points: list[SyntheticPoint]) -> dict[tuple[int, int, int], float]:
    """(n_max, concurrency, ctx_len) -> median measured c of its synthetic runs: the formula's c for that curve."""
    acc: dict[tuple[int, int, int], list[float]] = {}
    for pt in points:
        acc.setdefault((pt.n_max, pt.concurrency, pt.ctx_len), []).append(pt.c)
    return {key: statistics.median(cs) for key, cs in acc.items()}


def formula_fit(points: list[SyntheticPoint]) -> list[tuple[SyntheticPoint, float]]:
    """Each point with the formula's prediction at its realised alpha and its configuration's median c."""
    cs = config_c(points)
    return [(pt, formula(pt.alpha, pt.n_max, cs[(pt.n_max, pt.concurrency, pt.ctx_len)])) for pt in points]


def acceptance_by_position(rows: list[dict]) -> dict[str, list[float]]:
    """Label -> mean acceptance at each draft position (acc_rate_pos: kept / drafts that reached it)."""
    acc: dict[str, list[list[float]]] = {}
    for r in rows:
        if r.get("spec_decode") != "on" or not r.get("acc_rate_pos"):
            continue
        label = synthetic_name(r) if is_synthetic(r) else short_name(r["spec_types"])
        label += f", k={int(num(r['n_max']))}"
        rates = [num(x) for x in str(r["acc_rate_pos"]).split(";") if x != ""]
        acc.setdefault(label, []).append(rates)
    out = {}
    for label, lists in acc.items():
        depth = max(len(x) for x in lists)
        out[label] = [statistics.mean(x[i] for x in lists if i < len(x)) for i in range(depth)]
    return out


def sweep_summary(rows: list[dict]) -> list[str]:
    """The lines print_sweep_summary prints: plain scaling, speedup by concurrency, the formula against the
    synthetic points."""
    out = []
    for ctx, pts in plain_scaling(rows).items():
        one = dict(pts).get(1)
        cells = ", ".join(f"N={n}: {t:.1f} tok/s" + (f" ({t / one:.2f}x)" if one else "") for n, t in pts)
        out.append(f"plain decoding, ctx {ctx}: aggregate decode {cells}")
    for (name, ctx, k), pts in concurrency_curves(rows).items():
        cells = ", ".join(f"N={n}: {s:.2f}x" for n, s, _ in pts)
        out.append(f"decode speedup {short_name(name)} k<={k} ctx {ctx}: {cells}")
    fit = formula_fit(synthetic_points(rows))
    for pt, pred in fit:
        out.append(f"synthetic P={pt.p:g} k={pt.n_max} N={pt.concurrency} ctx={pt.ctx_len}: alpha {pt.alpha:.2f}, "
                   f"c {pt.c:.2f}, speedup {pt.speedup:.2f}x, formula {pred:.2f}x")
    if fit:
        err = statistics.mean(abs(pt.speedup - pred) / pred for pt, pred in fit if pred > 0)
        out.append(f"formula vs measured (synthetic points): mean relative error {err:.1%} over {len(fit)} points")
    return out


def print_sweep_summary(rows: list[dict]) -> None:
    print()
    for line in sweep_summary(rows):
        print(line)
