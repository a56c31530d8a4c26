"""`--compare remote:URL`: the same prompts through our engine and another server, side by side.

Each prompt runs here plainly and speculatively (the first configuration of the sweep), and on the server with
its speculation, then without it: asked per request where the server takes it (llama-server's
`speculative.n_max: 0`, this playground's `speculative: false`), else on a second server of the same model started
without speculation (`--compare remote-plain:URL`, for vLLM and SGLang). Both sides are read the same way, as
vLLM's counters are: acceptance at position i = rounds that kept a token there / drafted rounds, mean acceptance
length = 1 + accepted / drafted rounds, and decode tokens/s (the server's own `predicted_per_second` where it
gives one, else as the client times it). A server whose text differs from its own plain run is flagged: at
temperature 0 that is a lossy speculation or a nondeterministic server. The server's key: SPECPLAY_REMOTE_KEY.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from engine.bench.run import BenchConfig, reach_and_kept, run_ours
from engine.remote.client import RemoteClient, RemoteConfig
from engine.remote.counters import SpecDelta
from engine.remote.observe import observe_whole, plain_answer, read_server_info
from engine.remote.reading import read_remote

KEY_ENV = "SPECPLAY_REMOTE_KEY"
N_POSITIONS = 8  # acceptance columns acc_pos_1..acc_pos_8
COLUMNS = ["prompt_id", "side", "tps", "plain_tps", "speedup", "mean_acc_len", "accept_rate",
           *[f"acc_pos_{i}" for i in range(1, N_POSITIONS + 1)], "text_vs_plain", "suggested_n_max", "note"]


@dataclass(frozen=True)
class RemoteTargets:
    """The servers named by --compare."""

    url: str  # the server with its speculation on
    plain_url: str | None = None  # the same model served without speculation, where no request can turn it off


def split_remote(text: str | None) -> tuple[str | None, RemoteTargets | None]:
    """(the --compare list without its remote items, the servers they name)."""
    rest, url, plain = [], None, None
    for item in [k.strip() for k in (text or "").split(",") if k.strip()]:
        kind, _, value = item.partition(":")
        if kind == "remote" and value:
            url = value
        elif kind == "remote-plain" and value:
            plain = value
        else:
            rest.append(item)
    if plain and not url:
        raise ValueError("--compare remote-plain:URL goes with remote:URL (the server with speculation)")
    return (",".join(rest) or None), (RemoteTargets(url, plain) if url else None)


@dataclass
class Side:
    """One side's figures for one prompt."""

    prompt_id: str
    side: str  # "ours" or the server's kind
    tps: float | None  # decode tokens/s with speculation
    plain_tps: float | None  # and without
    spec: SpecDelta | None  # its speculation, counted as vLLM counts it
    text_vs_plain: str  # "same", "DIFFERS" or "n/a"
    note: str = ""

    def row(self) -> dict:
        reading = read_remote(self.tps, self.plain_tps, self.spec)
        spec, pos = self.spec, (self.spec.per_position if self.spec is not None else ())
        row = {"prompt_id": self.prompt_id, "side": self.side, "tps": self.tps, "plain_tps": self.plain_tps,
               "speedup": reading.speedup, "mean_acc_len": spec.mean_acceptance_length if spec else None,
               "accept_rate": spec.acceptance_rate if spec else None, "text_vs_plain": self.text_vs_plain,
               "suggested_n_max": reading.suggested_n_max, "note": self.note}
        row.update({f"acc_pos_{i + 1}": pos[i] if i < len(pos) else None for i in range(N_POSITIONS)})
        return row


def ours(cfg: BenchConfig, engine, p: dict) -> Side:
    plain = run_ours(cfg, engine, [p], spec=False)[0]
    res = run_ours(cfg, engine, [p], spec=True, reference=[plain])[0]
    spec_rounds = [e for e in res.events if e.kind == "spec"]
    _, kept = reach_and_kept(res.events)
    counts = SpecDelta("ours", len(spec_rounds), sum(len(e.drafted) for e in spec_rounds),
                       sum(e.n_accepted for e in spec_rounds), tuple(kept), None)
    same = {True: "same", False: "DIFFERS"}.get(res.lossless_ok, "n/a")
    return Side(p["id"], "ours", res.tps_decode, plain.tps_decode, counts, same)


def body_of(cfg: BenchConfig, p: dict) -> dict:
    messages = p.get("messages") or [{"role": "user", "content": p["prompt"]}]
    return {"messages": messages, "max_tokens": cfg.max_new_tokens, "temperature": cfg.sampling.temp,
            "seed": cfg.sampling.seed}


class Server:
    """The server (and its plain twin) the bench compares with."""

    def __init__(self, targets: RemoteTargets):
        key = os.environ.get(KEY_ENV) or None
        self.client = RemoteClient(RemoteConfig(targets.url, key=key))
        self.plain = RemoteClient(RemoteConfig(targets.plain_url, key=key)) if targets.plain_url else None
        self.info = read_server_info(self.client)

    def side(self, cfg: BenchConfig, p: dict) -> Side:
        body = body_of(cfg, p)
        seen = observe_whole(self.client, body)
        plain, why = plain_answer(self.client, body, self.info, self.plain)
        notes = [x for x in (seen.answer.error, seen.note, why and why + " (remote-plain:URL)") if x]
        same = "n/a" if plain is None or plain.error or seen.answer.error else (
            "same" if plain.text == seen.answer.text else "DIFFERS")
        return Side(p["id"], self.info.kind, seen.answer.tokens_per_second,
                    plain.tokens_per_second if plain is not None else None,
                    seen.spec if seen.alone is not False else None, same, "; ".join(notes))


def run_side_by_side(cfg: BenchConfig, engine, prompts: list[dict], server: Server) -> list[Side]:
    sides = []
    for p in prompts:
        sides += [ours(cfg, engine, p), server.side(cfg, p)]
    return sides


def overall(sides: list[Side]) -> list[str]:
    """Each side's reading over all prompts: its counters summed, its tokens/s averaged."""
    out = []
    for name in dict.fromkeys(s.side for s in sides):
        mine = [s for s in sides if s.side == name]
        counted = [s.spec for s in mine if s.spec is not None]
        total = None
        if counted:
            n = max(len(c.accepted_per_pos) for c in counted)
            per_pos = tuple(sum(c.accepted_per_pos[i] for c in counted if i < len(c.accepted_per_pos))
                            for i in range(n))
            total = SpecDelta(counted[0].family, *(sum(getattr(c, f) for c in counted)
                                                   for f in ("drafts", "draft_tokens", "accepted")), per_pos, None)
        tps = [s.tps for s in mine if s.tps]
        plain = [s.plain_tps for s in mine if s.plain_tps]
        reading = read_remote(sum(tps) / len(tps) if tps else None, sum(plain) / len(plain) if plain else None, total)
        out += [f"{name}: {line}" for line in reading.lines("these prompts")]
    return out


def _fmt(v, spec: str) -> str:
    return "-" if v in ("", None) else format(v, spec)


def format_table(rows: list[dict]) -> list[str]:
    head = (f"{'prompt':<14} {'side':<13} {'tok/s':>7} {'plain':>7} {'speedup':>7} {'L':>5} {'acc':>5} "
            f"{'n_max':>5} {'text':>7}  acceptance at d1..d{N_POSITIONS} (rounds keeping it / drafted rounds)")
    out = [head, "-" * len(head)]
    for r in rows:
        pos = " ".join(_fmt(r[f"acc_pos_{i}"], ".2f") for i in range(1, N_POSITIONS + 1))
        out.append(f"{r['prompt_id'][:14]:<14} {r['side'][:13]:<13} {_fmt(r['tps'], '.1f'):>7} "
                   f"{_fmt(r['plain_tps'], '.1f'):>7} {_fmt(r['speedup'], '.3f'):>7} {_fmt(r['mean_acc_len'], '.2f'):>5} "
                   f"{_fmt(r['accept_rate'], '.2f'):>5} {_fmt(r['suggested_n_max'], 'd'):>5} "
                   f"{r['text_vs_plain']:>7}  {pos}" + (f"  ({r['note']})" if r["note"] else ""))
    return out


def write_csv(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    return path


def position_figure(rows: list[dict]) -> dict:
    """Mean acceptance at each draft position over the prompts, one line per side."""
    from engine.plotstyle import COLORS, axis, layout, message

    data = []
    for i, side in enumerate(dict.fromkeys(r["side"] for r in rows)):
        cols = [[float(r[f"acc_pos_{j}"]) for r in rows if r["side"] == side and r[f"acc_pos_{j}"] not in ("", None)]
                for j in range(1, N_POSITIONS + 1)]  # rows as written, or read back from the CSV
        ys = [sum(c) / len(c) for c in cols if c]
        if ys:
            data.append(dict(type="scatter", mode="lines+markers", name=side, x=list(range(1, len(ys) + 1)), y=ys,
                             line=dict(color=COLORS[i % len(COLORS)], width=2.5)))
    return dict(data=data, layout=layout("Acceptance by draft position: ours and the server's",
                                         axis("draft position", dtick=1),
                                         axis("rounds keeping it / drafted rounds", range=[0, 1.05],
                                              tickformat=".0%"), height=420,
                                         annotations=[] if data else [message("no drafted rounds")]))


def write_png(rows: list[dict], path: str | Path) -> Path:
    from engine.bench.png import write_png as write_figure_png

    return write_figure_png(position_figure(rows), path, 980, 420)


def report(cfg: BenchConfig, engine, prompts: list[dict], server: Server, out: str, plots: str | None) -> list[str]:
    """Run the side by side, write its CSV beside --out (and its PNG into --plots), and return the lines to print."""
    sides = run_side_by_side(cfg, engine, prompts, server)
    rows = [s.row() for s in sides]
    path = write_csv(rows, Path(out).with_name(Path(out).stem + "-remote.csv"))
    lines = [f"side by side with {server.client.config.base}: {server.info.describe()}", *format_table(rows),
             *overall(sides)]
    differs = [r["prompt_id"] for r in rows if r["side"] != "ours" and r["text_vs_plain"] == "DIFFERS"]
    if differs:
        lines.append(f"FLAG: the server's text differs from its own plain run on {', '.join(differs)}")
    lines.append(f"wrote {len(rows)} rows to {path}")
    if plots:
        Path(plots).mkdir(parents=True, exist_ok=True)
        lines.append(f"wrote {write_png(rows, Path(plots) / 'remote_acceptance.png')}")
    return lines
