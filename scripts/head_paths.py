"""What a drafter's linears cost in each path engine/draft/lin_path.py weighs, on a head of a chosen width.

The shapes are an EAGLE-3 head's (fc over three hidden states, q-k-v over 2 x hidden, o, gate-up, down, the
draft vocabulary's LM head); the defaults are the embedded model's width (SmolLM2-135M: hidden 576, 9 heads of
64, 3 key-value heads, MLP 1536) with a 32000-row draft vocabulary. The times are `lin_path.time_paths`'s, the
ones `--head-dtype auto` chooses by: one zero-weight linear per shape, fastest of its interleaved timings.

    .venv/bin/python scripts/head_paths.py [--hidden 576 --heads 9 --kv-heads 3 --intermediate 1536
        --draft-vocab 32000] [--rows 1,4] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--heads", type=int, default=9)
    ap.add_argument("--kv-heads", type=int, default=3)
    ap.add_argument("--intermediate", type=int, default=1536)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--rows", default="1,4", help="row counts, each timed alone")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)

    import torch
    from torch import nn

    from engine.draft.lin_path import runs_here, time_paths

    torch.set_num_threads(a.threads)
    h, d = a.hidden, a.hidden // a.heads
    q, kv = a.heads * d, a.kv_heads * d
    shapes = [(h, 3 * h), (q + 2 * kv, 2 * h), (2 * kv, 2 * h), (h, q), (2 * a.intermediate, h),
              (h, a.intermediate), (a.draft_vocab, h)]
    linears = [nn.Linear(i, o, bias=False) for o, i in shapes]
    paths = [p for p in ("torch", "float32", "bfloat16", "int8") if runs_here(p)]
    print(f"hidden {h}, {len(shapes)} linears, {torch.get_num_threads()} thread(s); ms per head step")
    print(f"{'rows':>5} " + " ".join(f"{p:>9}" for p in paths))
    for rows in (int(r) for r in a.rows.split(",")):
        ms = time_paths(linears, paths, (rows,))
        print(f"{rows:>5} " + " ".join(f"{ms[p]:>9.3f}" for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
