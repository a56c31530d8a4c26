"""The traces.csv row: its columns, one row built from the runs of a prompt, the file written and read back.

Every producer of rows (the command-line sweep, the UI's live run) builds them with make_row, so the plots and
the summaries read one schema. Rows read back from a file hold strings; engine.bench.stats.num reads either.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from engine.bench.provenance import COLUMNS as PROVENANCE

if TYPE_CHECKING:  # annotations only: reading a traces.csv must not load torch
    from engine.bench.run import BenchConfig, RunResult

COLUMNS = [
    "prompt_id", "spec_decode", "spec_types", "n_max", "temp", "seed", "concurrency", "ctx_len", "quant_bits",
    "n_gen", "tps", "tps_baseline", "speedup", "lossless_ok", "mean_acc_len", "draft_accept_rate",
    "acc_rate_pos", "verify_cost_c", "rollback_mode", "n_rounds", "n_drafted", "n_accepted", "t_draft_ms",
    "t_verify_ms", "t_rollback_ms", "t_round_ms", "t_plain_step_ms", "model", "prompt_kind",
    # sweeps: decode-only speeds (the prefill excluded), the group's aggregate, the formula's alpha, synthetic P
    "tps_decode", "tps_decode_baseline", "speedup_decode", "tps_group", "accept_p", "synthetic_accept",
    # how the drafts were verified (match;rejection;synthetic): why lossless_ok is "n/a" (engine.bench.lossless)
    "verify_mode",
    # structured output: the grammar's kind ("" unconstrained) and the tokens accepted from the grammar drafter
    "grammar", "forced_tokens",
    # the weights' dtype and why (engine/load/dtype.py); another implementation's leading tokens equal to our plain run's
    "dtype", "dtype_reason", "match_plain",
    # trees of drafts: the node limit (0: chains), mean nodes verified per drafted round, mean rows per forward;
    # tokens per target forward over all decode rounds (drafted or not)
    "tree", "tree_nodes", "rows_per_forward", "tokens_per_forward",
    # where and how it was measured (engine/bench/provenance.py): commit, CPU model and vector extensions, threads,
    # date, device, the model file's sha256, the launch command, repeats and untimed warm-up runs
    *PROVENANCE,
]


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _ratio(a: float, b: float):
    return round(a / b, 4) if a > 0 and b > 0 else ""


def make_row(cfg: BenchConfig, prompt: dict, res: list[RunResult], base: list[RunResult] | None,
             spec_types: str, model: str, tps_group: float = 0.0) -> dict:
    """One prompt under one configuration: `res` its repeats, `base` the plain runs it is compared with (None:
    this is the plain run), `tps_group` what its group's slots decoded together."""
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
        "synthetic_accept": (synthetic_label(cfg.spec.synthetic_accept)
                             if r0.spec_on and cfg.spec.synthetic_accept is not None else ""),
        "verify_mode": ";".join(r0.verify_modes),
        "grammar": _grammar_kind(cfg, prompt), "forced_tokens": r0.forced_tokens,
        "dtype": cfg.dtype_used, "dtype_reason": cfg.dtype_reason, "match_plain": r0.match_plain,
        "tree": cfg.spec.tree_nodes if r0.spec_on else 0, "tree_nodes": round(r0.tree_nodes, 3),
        "rows_per_forward": round(r0.rows_per_forward, 3), "tokens_per_forward": round(r0.tokens_per_forward, 4),
    }


def synthetic_label(p: float | tuple[float, ...]) -> str:
    """How a synthetic run's acceptance is written in traces.csv: 0.8, or per position 0.9/0.7/0.5."""
    return "/".join(str(float(r)) for r in p) if isinstance(p, tuple) else str(float(p))


def _grammar_kind(cfg: BenchConfig, prompt: dict) -> str:
    spec = cfg.grammar_of(prompt)
    return spec.kind if spec is not None else ""


def write_rows(rows: list[dict], path: str | Path, measured: dict | None = None) -> None:
    """rows -> a traces.csv; a column a row lacks is left empty, a key that is no column is dropped. Rows
    without provenance get this host's now (`measured`: engine.bench.provenance.provenance(), taken when
    None)."""
    from engine.bench.provenance import provenance

    measured = provenance() if measured is None else measured
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, restval="", extrasaction="ignore")
        w.writeheader()
        w.writerows({**measured, **row} for row in rows)


def load_rows(path: str | Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
