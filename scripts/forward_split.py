"""What a target forward of n rows costs, split into the decoder layers and the lm_head (the linear over the
vocabulary), beside the engine's calibrated curve c(n).

One sequence after a prefix of a chat turn's length; each size is timed in turn, `--passes` times, the prefix's
cache restored after each. Medians, as a round meets them (the calibration keeps each size's fastest timing).
A row beyond the first costs what its arithmetic costs: where the layers' share grows by a tenth of a one-row
forward per row, trees of a few nodes are dear on that machine whatever the drafters.

    .venv/bin/python scripts/forward_split.py [--rows 1,2,4,8,12,16] [--prefix 300] [--passes 25]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.batch import Batch  # noqa: E402
from engine.forward import lean_fused, prepack  # noqa: E402
from engine.load.models import load_model  # noqa: E402
from engine.serve.engine import Engine  # noqa: E402


def timer(owner, name: str, key: str, spent: dict[str, float]) -> None:
    """Replace owner.name by a wrapper that adds its time to spent[key]."""
    inner = getattr(owner, name)

    def timed(*args, **kwargs):
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[key] = spent.get(key, 0.0) + time.perf_counter() - t
    setattr(owner, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=None, help="default: the embedded model")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--rows", default="1,2,4,8,12,16")
    ap.add_argument("--prefix", type=int, default=300, help="cells the rows attend to")
    ap.add_argument("--passes", type=int, default=25)
    ap.add_argument("--tree", action="store_true", help="the rows as a draft tree's chain (each row names its parent, "
                    "the tree-masked attention of a tree round) instead of plain causal rows")
    a = ap.parse_args()
    sizes = [int(n) for n in a.rows.split(",")]
    if not sizes or min(sizes) < 1:
        ap.error("--rows: positive row counts, comma separated")

    engine = Engine(load_model(a.target or "embedded", dtype=a.dtype), n_ctx=a.prefix + max(sizes) + 8,
                    n_seq_max=1, n_draft=max(sizes))
    ctx, vocab = engine.ctx, engine.ctx.n_vocab
    spent: dict[str, float] = {}
    timer(lean_fused.FusedLayers, "__call__", "layers", spent)  # all decoder layers in one C call
    timer(prepack, "linear", "lm_head", spent)  # the lm_head (the only prepacked linear the forward calls by name)

    prefix = Batch()
    for i in range(a.prefix):
        prefix.add((7 * i + 10) % vocab, i, 0, i == a.prefix - 1)
    ctx.decode(prefix)
    saved = ctx.cache.state_save(0)
    timings: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
    for rep in range(a.passes + 1):  # the first pass warms the kernels up and is not kept
        for n in sizes:
            spent.clear()
            b = Batch()
            for i in range(n):
                parent = i - 1 if a.tree and i > 0 else None
                b.add((100 + 13 * i) % vocab, a.prefix + i, 0, True, parent=parent)
            t = time.perf_counter()
            ctx.decode(b)
            spent["forward"] = time.perf_counter() - t
            ctx.cache.state_restore(0, saved, a.prefix)
            if rep > 0:
                for key, seconds in spent.items():
                    timings[n].setdefault(key, []).append(seconds)

    med = {n: {k: statistics.median(v) for k, v in parts.items()} for n, parts in timings.items()}
    one = med[sizes[0]]
    keys = [k for k in ("forward", "layers", "lm_head") if k in one]
    if "layers" not in one:
        print("the decoder layers ran in torch here (no fused C layers): their column is left out")
    print(f"rows  {'  '.join(f'{k:>16}' for k in keys)}  calibrated c(n)   (ms, and over {sizes[0]} row(s))")
    for n in sizes:
        cells = "  ".join(f"{med[n][k] * 1e3:7.2f} ({med[n][k] / one[k]:5.2f}x)" for k in keys)
        print(f"{n:>4}  {cells}  {engine.cost.c(n) / engine.cost.c(sizes[0]):>15.3f}")


if __name__ == "__main__":
    main()
