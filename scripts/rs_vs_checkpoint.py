"""Rollback paths on a recurrent model: FULL (checkpoint + restore + replay) against RS (stepped mixers, kept
states), on a random Mamba2 of moderate size with synthetic acceptance (the text does not matter here, only
where the time goes). Prints ms per generated token and the rounds each path ran.

    .venv/bin/python scripts/rs_vs_checkpoint.py [--accept 0.6] [--n-max 4] [--tokens 96]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--accept", type=float, default=0.6)
    ap.add_argument("--n-max", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=96)
    a = ap.parse_args()
    import torch
    import transformers as tf

    from engine.load.models import load_model
    from engine.params import GenParams, SpecParams
    from engine.serve.engine import Engine
    from tiny import make_tokenizer, WORDS

    torch.manual_seed(0)
    cfg = tf.Mamba2Config(vocab_size=len(WORDS), hidden_size=512, num_hidden_layers=8, state_size=64, expand=2,
                          n_groups=1, head_dim=64, num_heads=16, chunk_size=64, tie_word_embeddings=False)
    path = Path(tempfile.mkdtemp()) / "mamba2"
    tf.Mamba2ForCausalLM(cfg).eval().save_pretrained(path)
    make_tokenizer(WORDS).save_pretrained(path)
    target = load_model(str(path), device="cpu")
    prompt = [1] + list(range(5, 45))
    runs = [("plain", 0, []), ("FULL: checkpoint", 0, ["synthetic"]), ("RS: n_rs = n_max", a.n_max, ["synthetic"])]
    for label, n_rs, types in runs:
        engine = Engine(target, n_ctx=512, n_seq_max=1, calibrate=False, n_rs=n_rs)
        params = GenParams(max_new_tokens=a.tokens, ignore_eos=True,
                           spec=SpecParams(types=types, n_max=a.n_max, adaptive=False,
                                           synthetic_accept=a.accept if types else None))
        list(engine.generate(prompt, GenParams(max_new_tokens=8, ignore_eos=True), seq=0))  # warm-up
        engine.release(0)
        t0 = time.perf_counter()
        events = [e for e in engine.generate(prompt, params, seq=0) if e.kind != "prefill"]
        dt = time.perf_counter() - t0
        n = sum(len(e.emitted) for e in events)
        kinds = {k: sum(e.kind == k for e in events) for k in ("plain", "spec", "replay")}
        paths = {p: sum(e.rollback == p and e.kind == "spec" for e in events) for p in ("seq_rm", "checkpoint")}
        print(f"{label:18s} probe {engine.probe.kind:4s} {1e3 * dt / n:7.2f} ms/token  rounds {kinds}  "
              f"rollbacks {paths}")


if __name__ == "__main__":
    main()
