"""How much busy Python threads in the engine's own process slow its decoding (the GIL's convoy effect).

The engine's round calls many C functions (torch's ops, the kernels through ctypes); each releases the GIL and
must take it back. A Python thread that never waits (a web server's request handling) holds the GIL until the
switch interval asks it to let go, and then any waiting thread may get it: each hand-back can cost a whole
interval. Prints plain decoding's tokens/s with 0, 1 and 4 such threads, at Python's 5 ms switch interval and at
0.5 ms.

    .venv/bin/python scripts/gil_convoy.py
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from round_cost import generate  # noqa: E402
from engine.load.models import load_model  # noqa: E402
from engine.serve.engine import Engine  # noqa: E402


def busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


def tokens_per_second(engine: Engine, prompt: dict, n_busy: int, interval: float) -> float:
    sys.setswitchinterval(interval)
    stop = threading.Event()
    threads = [threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(n_busy)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    n = len(generate(engine, prompt, [], 0, 48))
    seconds = time.perf_counter() - t0
    stop.set()
    for t in threads:
        t.join()
    return n / seconds


def main() -> None:
    engine = Engine(load_model("embedded", dtype="auto"), n_ctx=4096, n_seq_max=1, n_draft=16)
    prompt = json.loads((ROOT / "assets" / "prompts" / "unseen.jsonl").read_text().splitlines()[0])
    generate(engine, prompt, [], 0, 8)  # warm the kernels
    for interval in (0.005, 0.0005):
        for n_busy in (0, 1, 4):
            tps = tokens_per_second(engine, prompt, n_busy, interval)
            print(f"switch interval {interval * 1e3:.1f} ms, {n_busy} busy Python threads: {tps:6.1f} tokens/s",
                  flush=True)


if __name__ == "__main__":
    main()
