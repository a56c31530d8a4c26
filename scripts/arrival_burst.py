"""How long streaming chats wait while many requests arrive in one instant.

Starts the app (the embedded model, 3 slots), streams two long answers, then lets N clients that connected
earlier send a short chat each at the same instant. Prints the longest waits of the streaming chats for their
next update, split into those that began within --arrival-s of the instant and those after, and the app's CPU
seconds over the first 6 s. --opened makes every client send one request first, as a page that is already
open has (Gradio then holds its session state before the burst).

    .venv/bin/python scripts/arrival_burst.py --clients 45 [--opened] [-- APP OPTIONS, e.g. --threads 1]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from loadclient import connect, free_port, new_client, run_regular, serving  # noqa: E402
from test_load_long import stream_gaps  # noqa: E402

STREAMS = ("Write a long story about a lighthouse keeper.", "Explain how tides work, at length.")


def app_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()
    return (int(fields[11]) + int(fields[12])) / 100


def burst(url: str, pid: int, n: int, opened: bool, arrival_s: float) -> None:
    api = connect(url)
    with ThreadPoolExecutor(8) as pool:
        clients = list(pool.map(new_client, [url] * n))
        if opened:
            list(pool.map(lambda c: c.predict(api_name="/clear"), clients))
    released: list[float] = []
    start = threading.Barrier(n, action=lambda: released.append(time.monotonic()), timeout=120)
    done = threading.Event()
    with ThreadPoolExecutor(n + 2) as pool:
        flags = [threading.Event() for _ in STREAMS]
        watchers = [pool.submit(stream_gaps, api, p, f, done) for p, f in zip(STREAMS, flags)]
        for f in flags:
            f.wait(240)
        time.sleep(1)
        cpu0 = app_cpu_seconds(pid)
        waiting = [pool.submit(run_regular, api, f"Say the number {i}.", 0.0, 3, 240, start, role="waiting",
                               client=clients[i]) for i in range(n)]
        time.sleep(6)
        cpu = app_cpu_seconds(pid) - cpu0
        for w in waiting:
            w.result()
        done.set()
        streams = [w.result() for w in watchers]
    gaps = [(g, when - released[0]) for _, stream in streams for g, when in stream]
    during = max((g for g, end in gaps if end - g <= arrival_s), default=0.0)
    after = max((g for g, end in gaps if end - g > arrival_s), default=0.0)
    print(f"{n} requests at once: the longest wait {during:.2f} s at the arrival, {after:.2f} s after it; "
          f"the app's CPU {cpu:.2f} s in the 6 s after the arrival")


def main() -> None:
    argv = sys.argv[1:]
    app_args = argv[argv.index("--") + 1:] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=45)
    ap.add_argument("--opened", action="store_true", help="each client sends one request before the burst")
    ap.add_argument("--arrival-s", type=float, default=4.0, help="waits that begin this soon count as the arrival's")
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args = ["--port", str(free_port()), "--parallel", "3", "--n-ctx", "8192"] + app_args
    log = Path("/tmp") / f"arrival-burst-{time.time():.0f}.log"
    gen = serving(args, log, 300)
    url, proc, _ = next(gen)
    try:
        burst(url, proc.pid, a.clients, a.opened, a.arrival_s)
    finally:
        gen.close()


if __name__ == "__main__":
    main()
