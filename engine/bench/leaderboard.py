"""The arena's leaderboard: one row per contender over all prompts, its columns, its CSV and its text table.

Tokens per forward is decoded tokens over decode rounds (each round is one target forward), so plain decoding
scores 1 and the oracle n_max + 1 where the answer leaves room for a whole draft. Acceptance per position is
the share of drafts that reached position i and were kept there. The speedup is plain decoding's decode time
over the contender's, both after the prefill, summed over the prompts. A round's cost is split by the engine's
own timings (RoundEvent): drafting, the target's forward, and the rest of the round's wall time (verification,
sampling, rollback, the drafters' bookkeeping, the answer's text).
"""

from __future__ import annotations

import csv
from pathlib import Path

from engine.bench.contest import ArenaResult, Entry
from engine.bench.png import write_png as write_figure_png
from engine.bench.run import reach_and_kept
from engine.plotstyle import BLUE, GREEN, RULE, axis, layout, message

N_POSITIONS = 8  # acceptance per position: the first this many draft positions get a column
PNG_WIDTH = 720  # pixels; the height grows with the contenders (png_height)

COLUMNS = (["rank", "drafter", "kind", "types", "tokens_per_forward", "accept_rate"]
           + [f"acc_pos_{i}" for i in range(1, N_POSITIONS + 1)]
           + ["speedup", "draft_ms", "forward_ms", "other_ms", "round_ms", "n_rounds", "n_tokens", "lossless"])


def _decode_seconds(runs) -> float:
    return sum(max(0.0, t1 - t0) for t0, t1 in (r.decode_span for r in runs))


def _positions(entry: Entry) -> list[float | str]:
    """Kept / reached at each of the first N_POSITIONS draft positions, over every verified draft ("" unreached)."""
    reach, kept = reach_and_kept([e for run in entry.runs for e in run.events])
    reach, kept = reach + [0] * N_POSITIONS, kept + [0] * N_POSITIONS
    return [round(k / r, 4) if r else "" for k, r in zip(kept[:N_POSITIONS], reach[:N_POSITIONS])]


def _lossless(entry: Entry) -> str:
    marks = [r.lossless_ok for r in entry.runs]
    if any(m is False for m in marks):
        return "False"
    return "True" if marks and all(m is True for m in marks) else "n/a"


def _cost(entry: Entry, n_rounds: int) -> dict:
    """Mean milliseconds per decode round: drafting, the forward, the rest of the round's wall time."""
    rounds = [e for r in entry.runs for e in r.events if e.kind != "prefill"]
    if not rounds or not n_rounds:
        return dict(draft_ms="", forward_ms="", other_ms="", round_ms="")
    draft = sum(e.t_draft_ms for e in rounds) / len(rounds)
    forward = sum(e.t_forward_ms for e in rounds) / len(rounds)
    wall = _decode_seconds(entry.runs) * 1e3 / n_rounds
    return dict(draft_ms=round(draft, 3), forward_ms=round(forward, 3),
                other_ms=round(max(0.0, wall - draft - forward), 3), round_ms=round(wall, 3))


def entry_row(entry: Entry) -> dict:
    """One contender's line of the leaderboard (rank filled by `leaderboard`)."""
    n_tokens = sum(r.n_decoded for r in entry.runs)
    n_rounds = sum(r.n_rounds for r in entry.runs)
    drafted = sum(r.n_drafted for r in entry.runs)
    accepted = sum(r.n_accepted for r in entry.runs)
    own, plain = _decode_seconds(entry.runs), _decode_seconds(entry.plains)
    c = entry.contender
    row = dict(rank=0, drafter=c.name, kind=c.kind, types=",".join(c.types),
               tokens_per_forward=round(n_tokens / n_rounds, 4) if n_rounds else "",
               accept_rate=round(accepted / drafted, 4) if drafted else "",
               speedup=round(plain / own, 4) if own > 0 and plain > 0 else "",
               n_rounds=n_rounds, n_tokens=n_tokens, lossless=_lossless(entry))
    row.update({f"acc_pos_{i + 1}": v for i, v in enumerate(_positions(entry))})
    row.update(_cost(entry, n_rounds))
    return {k: row[k] for k in COLUMNS}


def _order(row: dict) -> tuple:
    """The oracle on top (it is the ceiling, not a rival), then by tokens per forward, plain decoding last of
    its equals (a drafter that never drafted ties with it), then by speed."""
    def num(v) -> float:
        return float(v) if v not in ("", None) else 0.0
    return (row["kind"] != "oracle", -num(row["tokens_per_forward"]), row["kind"] == "plain", -num(row["speedup"]))


def leaderboard(result: ArenaResult) -> list[dict]:
    rows = sorted((entry_row(e) for e in result.entries), key=_order)
    for i, row in enumerate(rows, 1):
        row["rank"] = i
    return rows


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def tokens_per_forward_figure(rows: list[dict]) -> dict:
    """Tokens per forward by contender, one bar each in the leaderboard's order (top to bottom): the oracle grey
    (the ceiling), the chain green, plain decoding's 1.0 grey too, the value written beside each bar."""
    colours = {"oracle": RULE, "plain": RULE, "chain": GREEN}
    values = [float(r["tokens_per_forward"] or 0.0) for r in rows]
    bars = dict(type="bar", orientation="h", x=values, y=[f"{r['rank']}. {r['drafter']}" for r in rows],
                marker=dict(color=[colours.get(r["kind"], BLUE) for r in rows]), text=[f"{v:.2f}" for v in values])
    ticks = {} if rows else dict(tickvals=[])
    return dict(data=[bars] if rows else [],
                layout=layout("Tokens per target forward", axis("tokens per forward", rangemode="tozero"),
                              axis("", autorange="reversed", showgrid=False, **ticks), showlegend=False,
                              annotations=[] if rows else [message("no contenders")]))


def png_height(n_rows: int) -> int:
    """Pixels: the title and the axis, then 34 a bar."""
    return 110 + 34 * max(1, n_rows)


def write_png(rows: list[dict], path: str | Path) -> Path:
    return write_figure_png(tokens_per_forward_figure(rows), path, PNG_WIDTH, png_height(len(rows)))


def _fmt(v, spec: str) -> str:
    return "-" if v in ("", None) else format(v, spec)


def format_table(rows: list[dict]) -> list[str]:
    """The leaderboard as text lines for a terminal."""
    head = (f"{'#':>2} {'drafter':<14} {'tok/fwd':>7} {'acc':>5} {'speedup':>7} "
            f"{'draft/fwd/other ms':>20} {'lossless':>8}  acceptance at d1..d{N_POSITIONS}")
    out = [head, "-" * len(head)]
    for r in rows:
        split = f"{_fmt(r['draft_ms'], '.2f')}/{_fmt(r['forward_ms'], '.1f')}/{_fmt(r['other_ms'], '.2f')}"
        pos = " ".join(_fmt(r[f"acc_pos_{i}"], ".2f") for i in range(1, N_POSITIONS + 1))
        out.append(f"{r['rank']:>2} {r['drafter'][:14]:<14} {_fmt(r['tokens_per_forward'], '.2f'):>7} "
                   f"{_fmt(r['accept_rate'], '.2f'):>5} {_fmt(r['speedup'], '.3f'):>7} {split:>20} "
                   f"{r['lossless']:>8}  {pos}")
    return out
