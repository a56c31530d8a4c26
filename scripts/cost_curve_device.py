"""The forward's cost curve c(n) = t(n rows) / t(1 row) of a SmolLM2-135M-shaped model on whatever device torch
has (a GPU where there is one), after a context of --ctx tokens: the figure that decides whether draft rows
are nearly free (then long drafts and wide trees pay) or cost a share of a forward each (the CPUs here).

Random weights from the model's config (no download): only the shapes matter for the time.

    python scripts/cost_curve_device.py [--device cuda] [--dtype bfloat16] [--ctx 512]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, max_position_embeddings=8192, rope_theta=100000.0,
                    tie_word_embeddings=True, rms_norm_eps=1e-5)
ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.inference_mode()
def time_rows(model, cache, ctx: int, n: int, device: str, reps: int) -> float:
    """Median seconds of a forward of n rows after the ctx-token context (the cache cropped back each time)."""
    ids = torch.randint(0, SMOLLM2_135M["vocab_size"], (1, n), device=device)
    pos = torch.arange(ctx, ctx + n, device=device)[None]
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids, position_ids=pos, past_key_values=cache, use_cache=True, logits_to_keep=n)
        sync(device)
        times.append(time.perf_counter() - t0)
        cut_back(cache, ctx)
    return statistics.median(times)


def cut_back(cache, ctx: int) -> None:
    """The cache back to its first ctx tokens (newer transformers take the count to remove, as a negative
    number; older ones the length to keep)."""
    extra = cache.get_seq_length() - ctx
    try:
        cache.crop(-extra)
    except ValueError:
        cache.crop(ctx)
    if cache.get_seq_length() != ctx:
        raise RuntimeError(f"the cache holds {cache.get_seq_length()} tokens after the cut, not {ctx}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_135M)).to(a.device, getattr(torch, a.dtype)).eval()
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.randint(0, 49152, (1, a.ctx), device=a.device), past_key_values=cache, use_cache=True,
              logits_to_keep=1)
    for n in ROWS[:3]:  # warm the kernels
        time_rows(model, cache, a.ctx, n, a.device, 3)
    base = time_rows(model, cache, a.ctx, 1, a.device, a.reps)
    name = torch.cuda.get_device_name(0) if a.device.startswith("cuda") else "cpu"
    print(f"{name}, {a.dtype}, context {a.ctx}: one row {base * 1e3:.2f} ms")
    for n in ROWS:
        t = time_rows(model, cache, a.ctx, n, a.device, a.reps)
        print(f"  {n:>3} rows {t * 1e3:7.2f} ms  c = {t / base:5.2f}")


if __name__ == "__main__":
    main()
