"""Plain decoding on the embedded model with and without one other busy process on the cores, and what
`--dtype auto` chooses at each of several starts under that load.

    .venv/bin/python scripts/busy_cpu.py --answers 3 --starts 5

For each condition the same prompts are answered (plain decoding, temperature 0, 96 tokens): quiet with every
core, then beside a process that spins on one core, once with the engine's thread governor (the default) and
once with the thread count fixed at all cores (what a forward ran on before the governor). Tokens per second
are the answers' tokens over their wall time; the ratio to the quiet figure is what the busy process cost.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = ["Explain how a refrigerator keeps food cold.", "Write a short story about a fox and a crow.",
           "What are the main causes of the French Revolution?", "Describe how to bake bread at home."]


def spin(stop) -> None:
    while not stop.is_set():
        pass


def tokens_per_second(engine, model, answers: int, max_new: int) -> tuple[float, str]:
    from engine import GenParams, SamplerParams, SpecParams

    n, t = 0, 0.0
    for i in range(answers):
        ids = model.encode_chat([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
        params = GenParams(max_new_tokens=max_new, ignore_eos=True, sampling=SamplerParams(temp=0.0),
                           spec=SpecParams(types=[]))
        t0 = time.perf_counter()
        n += sum(len(ev.emitted) for ev in engine.generate(ids, params, seq=0))
        t += time.perf_counter() - t0
        engine.release(0)
    return n / t, engine.threads.describe()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--answers", type=int, default=3, help="answers per condition")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--starts", type=int, default=5, help="`--dtype auto` choices made under load")
    args = ap.parse_args()
    import torch

    from engine import Engine, load_model

    model = load_model("embedded", dtype="auto")
    print(f"dtype quiet: {model.dtype} ({model.dtype_reason})")
    governed = Engine(model, n_ctx=2048, n_seq_max=1)
    fixed = Engine(model, n_ctx=2048, n_seq_max=1, threads=torch.get_num_threads())
    tokens_per_second(governed, model, 1, 16)  # warm-up
    quiet, _ = tokens_per_second(governed, model, args.answers, args.max_new_tokens)
    print(f"quiet: {quiet:.1f} tok/s")
    stop = multiprocessing.Event()
    hog = multiprocessing.Process(target=spin, args=(stop,), daemon=True)
    hog.start()
    try:
        time.sleep(1.0)
        for name, engine in (("governed", governed), ("fixed", fixed)):
            tps, threads = tokens_per_second(engine, model, args.answers, args.max_new_tokens)
            print(f"busy, {name}: {tps:.1f} tok/s = {tps / quiet:.2f}x quiet ({threads})")
        choices = []
        for _ in range(args.starts):
            m = load_model("embedded", dtype="auto")
            choices.append(m.dtype)
            print(f"dtype under load: {m.dtype} ({m.dtype_reason})")
        print(f"dtype auto under load: {choices.count(model.dtype)} of {len(choices)} starts chose {model.dtype}")
    finally:
        stop.set()
        hog.join(timeout=5)


if __name__ == "__main__":
    main()
