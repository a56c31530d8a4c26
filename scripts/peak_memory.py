"""Peak resident memory of the engine generating with the embedded model: the process's ru_maxrss, load included.

Loads the embedded model, builds the engine with a 4096-cell cache and 4 slots, and generates plain and
speculative answers (the default n-gram chain). Prints one line: dtype, peak RSS in GiB, tokens generated.

    .venv/bin/python scripts/peak_memory.py [--dtype auto|float32|bfloat16] [--n-ctx 4096] [--max-new 96]
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8"])
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--max-new", type=int, default=96)
    a = ap.parse_args(argv)

    from engine.draft.registry import NGRAM_CHAIN
    from engine.load.models import load_model
    from engine.params import GenParams, SpecParams
    from engine.serve.engine import Engine

    target = load_model("embedded", dtype=a.dtype)
    engine = Engine(target, n_ctx=a.n_ctx, n_seq_max=4)
    ids = target.encode_chat([{"role": "user", "content": "Write a short poem about the sea at night."}])
    n = 0
    for types in ([], list(NGRAM_CHAIN)):
        params = GenParams(max_new_tokens=a.max_new, spec=SpecParams(types=types), ignore_eos=True)
        n += sum(len(ev.emitted) for ev in engine.generate(ids, params))
    print(f"dtype {target.dtype} peak_rss_gib {peak_gib():.3f} tokens {n} cells {a.n_ctx}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
