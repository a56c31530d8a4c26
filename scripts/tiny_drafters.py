"""The tiny targets and drafters docs/draft-head.md's round costs are measured on, written to OUT:

- OUT/mtp2, OUT/mtp1: a tiny GLM-4 MoE target with two MTP layers fitted briefly to its own text, and the same
  with one (tests/tiny_mtp.py, as tests/test_mtp.py makes them);
- OUT/deep, OUT/eagle3: a tiny Llama target of 8 layers and a random EAGLE-3 head in the authors' layout
  (tests/test_eagle3.py's);
- OUT/dfl: the tiny Qwen3 target and its DFlash and DSpark drafts in both layouts (tests/tiny_dflash.py);
- OUT/p.jsonl: the tests' first three prompts as text.

    .venv/bin/python scripts/tiny_drafters.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PROMPTS = [[1, 5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [1, 10, 11, 12, 13, 14, 15, 16, 17], [1, 40, 41, 40, 41, 42]]


def main(out: str) -> int:
    import torch

    import tiny_dflash
    from test_eagle3 import N_LAYERS, reference_weights, write_eagle
    from tiny import WORDS, save_tiny
    from tiny_mtp import fewer_layers, save_tiny_mtp

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "p.jsonl", "w") as f:
        for i, p in enumerate(PROMPTS):
            f.write(json.dumps({"id": f"p{i}", "prompt": " ".join(WORDS[t] for t in p)}) + "\n")
    torch.set_num_threads(1)
    two, _ = save_tiny_mtp(root / "mtp2", seed=0, n_mtp=2, prompts=PROMPTS, train_steps=20)
    fewer_layers(two, root / "mtp1", 1)
    save_tiny(root / "deep", seed=0, layers=N_LAYERS)
    write_eagle(root / "eagle3", reference_weights("midlayer.", 2), "safetensors")
    tiny_dflash.main(str(root / "dfl"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
