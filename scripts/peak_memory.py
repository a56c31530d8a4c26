"""Peak resident memory of the engine generating with a model (the embedded one by default): the process's
ru_maxrss, load included, and its resident memory once loaded.

Loads the model, builds the engine with a 4096-cell cache and 4 slots, and generates plain and speculative answers
(the default n-gram chain). Prints one line: dtype, the linears' paths, load seconds, resident GiB after the load,
plain decoding's tokens a second, peak RSS in GiB, tokens generated.

    .venv/bin/python scripts/peak_memory.py [--target embedded|FILE.gguf] [--dtype auto|float32|bfloat16|int8]
        [--n-ctx 4096] [--max-new 96] [--plain-only]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def rss_gib() -> float:
    """The process's resident memory now (VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="embedded", help="a model name or a .gguf file (scripts/random_gguf.py)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "int8"])
    ap.add_argument("--plain-only", action="store_true", help="plain decoding alone, no n-gram chain after it")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--max-new", type=int, default=96)
    a = ap.parse_args(argv)

    from engine.draft.registry import NGRAM_CHAIN
    from engine.load.models import load_model
    from engine.params import GenParams, SpecParams
    from engine.serve.engine import Engine

    from engine.forward.prepack import linear_paths

    t0 = time.perf_counter()
    target = load_model(a.target, dtype=a.dtype)
    load_s, loaded_gib = time.perf_counter() - t0, rss_gib()
    engine = Engine(target, n_ctx=a.n_ctx, n_seq_max=4, calibrate=not a.plain_only)  # plain needs no cost curve
    ids = target.encode_chat([{"role": "user", "content": "Write a short poem about the sea at night."}])
    n, plain_tok_s = 0, 0.0
    for types in ([], list(NGRAM_CHAIN))[:1 if a.plain_only else 2]:
        params = GenParams(max_new_tokens=a.max_new, spec=SpecParams(types=types), ignore_eos=True)
        t0 = time.perf_counter()
        got = sum(len(ev.emitted) for ev in engine.generate(ids, params))
        plain_tok_s = plain_tok_s or got / (time.perf_counter() - t0)  # the prompt's prefill included
        n += got
    print(f"dtype {target.dtype} linears [{linear_paths(target.model)}] load_s {load_s:.0f} "
          f"rss_loaded_gib {loaded_gib:.3f} plain_tok_s {plain_tok_s:.2f} peak_rss_gib {peak_gib():.3f} "
          f"tokens {n} cells {a.n_ctx}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
