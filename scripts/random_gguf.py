"""Write (or find in the cache) a GGUF of random weights in a real model's shape (engine/load/random_gguf.py) and
print its path, for `--target` anywhere a GGUF is taken. Nothing written here belongs in the repository.

    .venv/bin/python scripts/random_gguf.py --model llama-3.2-1b --type Q4_0 [--seed 0] [--small]
    .venv/bin/python -m engine.bench --target "$(.venv/bin/python scripts/random_gguf.py --type Q8_0)" ...
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    from engine.load.random_gguf import SHAPES, SMALL_LAYERS, TYPES, random_gguf, random_gguf_path

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.2-1b", choices=sorted(SHAPES))
    ap.add_argument("--type", default="Q4_K_M", choices=TYPES)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--small", action="store_true", help=f"the model's widths with {SMALL_LAYERS} layers")
    a = ap.parse_args(argv)

    layers = SMALL_LAYERS if a.small else None
    cached = random_gguf_path(a.model, a.type, a.seed, layers).is_file()
    t0 = time.perf_counter()
    path = random_gguf(a.model, a.type, a.seed, layers)
    if not cached:
        print(f"wrote {path.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
